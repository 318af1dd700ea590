"""When the context is full: never fail or drop silently — say so, and offer what fits grafts.

Three choices, each with what it re-reads:
- stop: nothing is sent (re-reads nothing);
- a summary: the model writes a summary of the conversation (from as much of its text as
  fits a fresh context), and a new conversation starts from it;
- the documents and the last turns: a new conversation on the same document (its block is
  grafted, not re-read) holding the latest turns that fit with room for the new message.
The original conversation is never changed.
"""

from __future__ import annotations

import time

from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import InputError, check_text
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.forks import own_choices
from galahad_desktop.memory.chat.room import message_too_long
from galahad_desktop.memory.chat.turning import TurnRoom
from galahad_desktop.memory.results import ContextFull, ContextOption, Continued
from galahad_desktop.vault.names import ConversationRow
from galahad_desktop.vault.vault import new_id

SUMMARY_TOKENS = 384
SUMMARY_PROMPT = (
    "Summarize the conversation below for someone who will continue it: the topics, the "
    "facts and decisions, and any open questions. Be concise.\n\n"
)
SUMMARY_OPENING = "A summary of our earlier conversation:\n\n"
SUMMARY_ACK = "Thank you; I have the summary. Let us continue."
SUMMARY_TURNS = 64  # the summary's opening and acknowledgement, as turns, at most


PICTURE = "\x00picture:"  # marks a picture's turn among the pairs (never a message's text)


class Continuation(TurnRoom):
    """A full conversation goes on in a new one: from a summary, or its documents and last turns."""

    def reply_room(self) -> int:
        return self.turns.reply_room()

    def summary_tokens(self) -> int:
        return min(SUMMARY_TOKENS, self.live.engine.n_ctx // 4)

    def check(self, conversation_id: str, text: str) -> ContextFull | None:
        """None when the next turn fits (with room for a reply); else the choices."""
        check_text(text, "The message")
        conv = self.conversations.row(conversation_id)
        engine = self.live.engine
        turns = engine.turns
        used = (conv["n_tokens"] or 0) + len(turns.probe)
        if not conv["n_tokens"]:
            used = len(turns.start(self.conversations.system_text(conv)))
        needed = len(turns.user_turn(text)) + self.reply_room()
        if used + needed <= engine.n_ctx:
            return None
        # Only what can work is offered: a new conversation starts with the system words
        # (and a summary's turns), and must still hold the message and a reply.
        fresh = len(turns.start(self.conversations.system_text(conv)))
        if fresh + needed > engine.n_ctx:
            stop = ContextOption(
                "stop",
                "Stop",
                0,
                message_too_long(needed, engine.n_ctx),
            )
            return ContextFull(conversation_id, used, needed, engine.n_ctx, [stop], False)
        summary_cost = self._transcript_budget() + self.summary_tokens()
        recent = self._recent_plan(conv, needed)
        options = [
            ContextOption("stop", "Stop", 0, "Nothing is sent; the conversation stays as it is.")
        ]
        if fresh + self.summary_tokens() + SUMMARY_TURNS + needed <= engine.n_ctx:
            options.append(
                ContextOption(
                    "summary",
                    "Continue from a summary",
                    min(summary_cost, self._transcript_tokens(conv) + self.summary_tokens()),
                    "The model summarizes this conversation; a new conversation starts from "
                    "the summary.",
                )
            )
        if recent is not None:
            options.append(
                ContextOption(
                    "recent",
                    f"Keep the documents and the last {recent[0] // 2} turns",
                    recent[1],
                    "A new conversation with the same documents (grafted, not re-read) and "
                    "the latest turns that fit.",
                )
            )
        return ContextFull(conversation_id, used, needed, engine.n_ctx, options)

    # -- a summary -------------------------------------------------------------------------
    def _transcript_budget(self) -> int:
        engine = self.live.engine
        return max(
            64,
            engine.n_ctx
            - self.summary_tokens()
            - len(engine.turns.start() + engine.turns.user_turn(SUMMARY_PROMPT))
            - 32,
        )

    def _transcript(self, conv: ConversationRow) -> str:
        lines = []
        for m in self.conversations.messages(conv["id"]):
            who = {"user": "User", "model": "Assistant", "document": "Document"}[m.role]
            lines.append(f"{who}: {m.text}")
        return "\n\n".join(lines)

    def _transcript_tokens(self, conv: ConversationRow) -> int:
        return len(self.live.engine.encode_text(self._transcript(conv)))

    def with_summary(
        self,
        conversation_id: str,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> Continued:
        conv = self.conversations.row(conversation_id)
        engine = self.live.engine
        turns = engine.turns
        tokens = engine.encode_text(self._transcript(conv))
        budget = self._transcript_budget()
        text = (
            engine.detokenize(tokens[-budget:]) if len(tokens) > budget else self._transcript(conv)
        )
        self.live.drop()
        engine.reset()
        prompt = turns.start() + turns.user_turn(SUMMARY_PROMPT + text)
        engine.evaluate(prompt, job)
        generation = engine.generate(
            SamplingParams(
                params.temperature,
                params.top_p,
                params.top_k,
                self.summary_tokens(),
                params.seed,
            ),
            # Shown once written, not streamed; its pace says the summary is being written.
            Job(cancel=job.cancel, on_pace=job.on_pace),
        ).check_device()
        summary = generation.text.strip() or "(the model wrote no summary)"
        # The new conversation starts from the source's document (grafted from its block),
        # then the summary.
        pairs = [(SUMMARY_OPENING + summary, SUMMARY_ACK)]
        new_id_ = self._start(conv, pairs, conv["document_id"], job)
        reread = len(prompt) + len(generation.tokens)
        return Continued(new_id_, "summary", reread, 0, summary, len(engine.tokens))

    # -- the documents and the last turns ---------------------------------------------------

    def _recent_plan(self, conv: ConversationRow, needed: int) -> tuple[int, int] | None:
        """(messages kept, tokens re-read) for the most recent whole turns that fit (None for
        a chat with tools: its turns are not pairs; a summary carries it on, without them)."""
        if self.conversations.system_tools(conv):
            return None
        engine = self.live.engine
        turns = engine.turns
        base = conv["document_id"] and self.vault.records.document(conv["document_id"])
        start = (base["n_tokens"] if base else len(turns.start())) + len(turns.probe)
        pairs = self._pairs(conv)
        kept, cost = 0, 0
        for user, reply, size in reversed(pairs):
            del user, reply
            if start + cost + size + needed > engine.n_ctx:
                break
            kept += 2
            cost += size
        return (kept, cost) if kept else None

    def _pairs(self, conv: ConversationRow) -> list[tuple[str, str, int]]:
        turns = self.live.engine.turns
        messages = self.conversations.messages(conv["id"])
        rows = self.conversations.message_rows(conv["id"])
        pairs = []
        for index in range(0, len(messages) - 1, 2):
            user, reply = messages[index], messages[index + 1]
            if user.picture is not None or user.sound is not None:  # marked, refused if kept
                size = user.tok_end - user.tok_start
                pairs.append((PICTURE + user.text, reply.text, size + len(turns.probe)))
                continue
            if user.role == "document":
                text = (
                    f'Document "{user.text}":\n\n{self.conversations.document_content(rows[index])}'
                )
                size = len(turns.document_turn(text, reply.text, opening=False))
            else:
                text = user.text
                size = (
                    len(turns.user_turn(text))
                    + len(self.live.engine.encode_text(reply.text))
                    + len(turns.model_close)
                )
            pairs.append((text, reply.text, size + len(turns.probe)))
        return pairs

    def with_recent(
        self,
        conversation_id: str,
        text: str,
        job: Job = NO_JOB,
    ) -> Continued:
        conv = self.conversations.row(conversation_id)
        if self.conversations.system_tools(conv):
            raise InputError("A chat with tools continues from a summary, not its last turns.")
        needed = len(self.live.engine.turns.user_turn(text)) + self.reply_room()
        plan = self._recent_plan(conv, needed)
        if plan is None:
            raise InputError(
                "Not even the last turn fits with the new message; continue from a summary instead."
            )
        kept, cost = plan
        pairs = [(u, r) for u, r, _size in self._pairs(conv)[-(kept // 2) :]]
        pictures = [u.removeprefix(PICTURE) for u, _r in pairs if u.startswith(PICTURE)]
        if pictures:
            raise InputError(
                f"The turns to keep hold the picture '{pictures[0]}', which a new conversation "
                "cannot carry over yet; continue from a summary instead (it names the "
                "picture), or start a new chat on the picture."
            )
        new_id_ = self._start(conv, pairs, conv["document_id"], job)
        return Continued(new_id_, "recent", cost, kept, "", len(self.live.engine.tokens))

    def with_system_prompt(self, conversation_id: str, words: str, job: Job = NO_JOB) -> Continued:
        """The conversation again from its start under other system words, as a new branch
        (the original stays as it is). The words come first, so every turn is read again:
        what the window says before ("changing it re-reads N tokens")."""
        check_text(words, "The system prompt")
        conv = self.conversations.row(conversation_id)
        if self.conversations.system_tools(conv):
            raise InputError(
                "A chat with tools keeps its system turn (its tools are declared there): start "
                "a new chat with the new system prompt instead."
            )
        sized = self._pairs(conv)
        pictures = [u.removeprefix(PICTURE) for u, _r, _s in sized if u.startswith(PICTURE)]
        if pictures:
            raise InputError(
                f"This conversation holds the picture '{pictures[0]}', which a new branch cannot "
                "carry over yet; start a new chat with the new system prompt instead."
            )
        engine = self.live.engine
        cost = sum(size for _u, _r, size in sized)
        if len(engine.turns.start(words)) + cost + self.reply_room() > engine.n_ctx:
            raise InputError(
                f"This conversation ({cost:,} tokens) does not fit the context again with the "
                "new system prompt; continue it from a summary, then change the new one's."
            )
        source = (self.conversations.title(conv) or "Conversation").removeprefix("↳ ")
        title = f"↳ new system prompt — {source}"
        pairs = [(u, r) for u, r, _size in sized]
        new_id_ = self._start(conv, pairs, conv["document_id"], job, words.strip(), title)
        return Continued(new_id_, "system prompt", cost, 2 * len(pairs), "", len(engine.tokens))

    # -- the new conversation -----------------------------------------------------------
    def _turn_tokens(
        self, pairs: list[tuple[str, str]], words: str, user_start: int
    ) -> tuple[list[int], list[tuple[str, str, int, int, int]]]:
        """The tokens of `pairs` as turns read from `user_start`, and each pair's (user,
        reply, start, reply start, end) positions."""
        engine = self.live.engine
        turns = engine.turns
        tokens: list[int] = []
        ranges: list[tuple[str, str, int, int, int]] = []
        for index, (user, reply) in enumerate(pairs):
            at = user_start + len(tokens)
            if user.startswith('Document "'):
                piece = turns.document_turn(user, reply, opening=False)
                ranges.append((user, reply, at, at + len(piece), at + len(piece)))
            else:
                # A format without a system turn (Gemma 3) holds the words in the first one.
                head = turns.user_turn(turns.user_text(user, words, first=index == 0))
                piece = head + engine.encode_text(reply) + turns.model_close
                ranges.append((user, reply, at, at + len(head), at + len(piece)))
            tokens += piece + turns.probe
        return tokens[: len(tokens) - len(turns.probe)], ranges

    def _start(
        self,
        conv: ConversationRow,
        pairs: list[tuple[str, str]],
        document_id: str | None,
        job: Job,
        system: str | None = None,
        title: str | None = None,
    ) -> str:
        """A new conversation holding `pairs` as prefilled turns (one checkpoint), under the
        source's system prompt unless `system` gives other words."""
        conversations, live = self.conversations, self.live
        engine = live.engine
        turns = engine.turns
        title = title or (conversations.title(conv) or "Conversation") + " (continued)"
        own = conversations.system_text(conv) if conv.get("system_enc") else None
        prompt = system if system is not None else own or conv.get("system_prompt")
        new = conversations.create(document_id, title, prompt)
        with self.vault.transaction():  # it keeps what the person chose for the source
            self.vault.records.update("conversations", new, own_choices(conv))
            self.vault.records.reseal("conversations", new)
        row = conversations.row(new)
        counters = Counters()
        live.drop()
        self.turns.ensure_live(row, counters, job)
        user_start = len(engine.tokens) - len(turns.probe)
        tokens, ranges = self._turn_tokens(pairs, conversations.system_text(row), user_start)
        total = len(tokens)
        engine.evaluate(tokens, job.step(0, total, time.perf_counter()))
        block, _record = live.persist(
            "conversation", new, self.turns.live_parent(row, None), 1, counters
        )
        records = live.records
        now = time.time()
        with self.vault.transaction():
            records.insert("blocks", block)
            for seq, (user, reply, a, b, c) in enumerate(ranges):
                first_role, first_text, content = "user", user, ""
                if user.startswith('Document "') and '":\n\n' in user:
                    name, content = user[len('Document "') :].split('":\n\n', 1)
                    first_role, first_text = "document", name
                for offset, (role, message, lo, hi, block_id) in enumerate(
                    ((first_role, first_text, a, b, None), ("model", reply, b, c, block["id"]))
                ):
                    records.add_message(
                        {
                            "id": new_id("m"),
                            "conversation_id": new,
                            "seq": 2 * seq + offset,
                            "role": role,
                            "tok_start": lo,
                            "tok_end": hi,
                            "block_id": block_id if seq == len(ranges) - 1 else None,
                            "created_at": now,
                        },
                        message,
                        content=content if offset == 0 else "",
                    )
            records.update(
                "conversations",
                new,
                {
                    "head_block_id": block["id"],
                    "n_tokens": block["pos_end"],
                    "n_messages": 2 * len(ranges),
                    "model_sha256": engine.model_sha256,
                    "updated_at": now,
                },
            )
            records.reseal("conversations", new)
        live.mark(new, block["id"])
        return new
