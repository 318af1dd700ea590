"""Conversations: turns, regenerate, branch, resume — each turn a checkpoint at its boundary.

A turn appends tokens to the ledger (never re-renders the history): the user's text, the end
of the user turn, the generation prompt, the reply, the turn's close and the next turn's
opening (the proof probe). A thinking turn's thoughts are streamed and shown but not kept:
the context returns to the start of the reply and re-reads only the answer, so the stored
history is what the model's template renders for history, and a resumed conversation holds
exactly the tokens an uninterrupted one does.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from typing import Any

from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.picture import Picture
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import (
    MAX_TITLE_CHARS,
    InputError,
    IntegrityError,
    NotFoundError,
    check_text,
)
from galahad_desktop.faults import crashpoint
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.forks import copy_conversation
from galahad_desktop.memory.chat.live import LiveContext, strip_whitespace_tokens
from galahad_desktop.memory.chat.shared_prompts import SharedPrompts
from galahad_desktop.memory.chat.system_prompt import set_system_prompt, system_text
from galahad_desktop.memory.chat.versions import Versions
from galahad_desktop.memory.results import (
    ConversationSummary,
    GraftReport,
    Message,
    TurnResult,
)
from galahad_desktop.vault.names import (
    BlockRow,
    ConversationRow,
    DocumentRow,
    MessageRow,
)
from galahad_desktop.vault.vault import new_id

TITLE_CHARS = 60
PREVIEW_CHARS = 120


class Conversations:
    def __init__(self, live: LiveContext) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records
        self.versions = Versions(live, self.check)
        self.shared = SharedPrompts(live)

    @property
    def engine(self) -> ChatEngine:
        return self.live.engine

    # -- records -------------------------------------------------------------------------
    def check(self, conversation_id: str) -> None:
        """The conversation's record matches its seal, or IntegrityError names it."""
        self.records.check("conversations", self.row(conversation_id))

    def row(self, conversation_id: str) -> ConversationRow:
        row = self.records.conversation(conversation_id)
        if row is None:
            raise NotFoundError(f"No conversation has the id '{conversation_id}'.")
        return row

    def document_row(self, document_id: str) -> DocumentRow:
        row = self.records.document(document_id)
        if row is None:
            raise NotFoundError(f"No document has the id '{document_id}'.")
        return row

    def title(self, row: ConversationRow) -> str:
        return self.records.decrypt("conversations", "title_enc", row)

    def summary(self, r: ConversationRow) -> ConversationSummary:
        try:
            title, damaged = self.title(r), ""
        except IntegrityError:
            # One damaged title must not hide every other conversation: listed and marked
            # (opening it is still refused; `galahad audit` names the problem).
            title, damaged = "(damaged record)", "its title failed authentication"
        memory, block_bytes = self.memory(r)
        return ConversationSummary(
            r["id"],
            title,
            r["document_id"],
            r["n_tokens"] or 0,
            r["n_messages"] or 0,
            r["updated_at"],
            r["created_at"] or 0.0,
            bool(r.get("thinking")),
            r.get("model_sha256") or "",
            damaged,
            "" if damaged else self.preview(r["id"]),
            "damaged" if damaged else memory,
            block_bytes,
            r.get("origin") or "",
        )

    def preview(self, conversation_id: str) -> str:
        """The start of the last message, on one line (what the sidebar shows under a title)."""
        rows = self.message_rows(conversation_id)
        if not rows:
            return ""
        try:
            text = self.records.decrypt("messages", "text_enc", rows[-1])
        except IntegrityError:
            return ""
        return " ".join(text.split())[:PREVIEW_CHARS]

    def memory(self, row: ConversationRow) -> tuple[str, int]:
        """Whether the conversation's KV is kept and usable under this runtime (a graft), or
        will be re-read once; and its blocks' bytes on disk."""
        head = row["head_block_id"]
        if not head:
            return "not stored", 0
        try:
            chain = self.vault.chain_rows(str(head))
        except (IntegrityError, NotFoundError):
            return "damaged", 0
        # A size is bookkeeping, not sealed: an edited cell counts as nothing, never a crash.
        size = sum(b if isinstance(b := link.get("file_bytes"), int) else 0 for link in chain)
        fingerprint = self.engine.fingerprint
        usable = all(link["fingerprint"] == fingerprint for link in chain)
        return ("stored" if usable else "needs re-reading"), size

    def summaries(self) -> list[ConversationSummary]:
        return [self.summary(r) for r in self.records.conversations("updated_at desc")]

    def message_rows(self, conversation_id: str) -> list[MessageRow]:
        return self.records.messages(conversation_id)

    def first_user_text(self, conv: ConversationRow) -> str | None:
        """The words of the conversation's first message when it is the user's."""
        rows = self.message_rows(conv["id"])[:1]
        if conv["document_id"] or not rows or rows[0]["role"] != "user":
            return None
        return self.records.decrypt("messages", "text_enc", rows[0])

    def messages(self, conversation_id: str) -> list[Message]:
        """The transcript, checked against the conversation's seal first: an edited,
        moved, dropped or reordered message is refused, never shown."""
        self.records.check("conversations", self.row(conversation_id))
        records = self.records
        rows = self.message_rows(conversation_id)
        places = self.versions.places(conversation_id, rows)
        return [
            Message(
                r["id"],
                r["role"],
                records.decrypt("messages", "text_enc", r),
                r["created_at"],
                r["tok_start"],
                r["tok_end"],
                r["block_id"],
                records.decrypt("messages", "thought_enc", r) if r.get("thought_enc") else "",
                base64.b64decode(records.decrypt("messages", "image_enc", r))
                if r.get("image_enc")
                else None,
                r.get("seed"),
                *places.get(r["seq"], (1, 1)),
            )
            for r in rows
        ]

    def message_pictures(self, conversation_id: str, end: int | None = None) -> list[Picture]:
        """The pictures put into a conversation before ledger position `end`, in order."""
        return [
            Picture.from_png(base64.b64decode(self.records.decrypt("messages", "image_enc", r)))
            for r in self.message_rows(conversation_id)
            if r.get("image_enc") and (end is None or r["tok_start"] < end)
        ]

    def document_content(self, row: MessageRow) -> str:
        """The text of a document put into the conversation (kept, encrypted, so the turn
        can be re-read under another model or in a continuation)."""
        if not row.get("content_enc"):
            raise InputError(
                "This conversation holds a document added before its text was kept; it "
                "cannot be re-read. Open it with the model and settings it was made with."
            )
        return self.records.decrypt("messages", "content_enc", row)

    def head_block(self, conversation_id: str) -> str:
        head = self.row(conversation_id)["head_block_id"]
        if not head:
            raise InputError(f"Conversation {conversation_id} has no stored turn yet.")
        return str(head)

    def chain_owners(self, owner_id: str) -> set[str]:
        """Who may own the links of an owner's chains: itself and, for a conversation on a
        document, that document (its block is the chain's root)."""
        owners = {owner_id}
        conv = self.records.conversation(owner_id)
        if conv is not None and conv["document_id"]:
            owners.add(conv["document_id"])
        return owners

    # -- creating, naming ----------------------------------------------------------------
    def create(
        self,
        document_id: str | None = None,
        title: str = "",
        system_prompt: str | None = None,
        thinking: bool | None = None,
    ) -> str:
        if document_id is not None:
            self.document_row(document_id)
        settings = self.live.settings
        thinking = settings.values.thinking if thinking is None else thinking
        conversation_id = new_id("c")
        now = time.time()
        row: dict[str, Any] = {
            "id": conversation_id,
            "document_id": document_id,
            "head_block_id": None,
            "n_tokens": 0,
            "n_messages": 0,
            "system_prompt": settings.values.system_prompt,
            "thinking": 1 if thinking else 0,
            "created_at": now,
            "updated_at": now,
        }
        if system_prompt is not None:
            set_system_prompt(self.records, row, system_prompt)
        row["title_enc"] = self.records.encrypt("conversations", "title_enc", row, title)
        with self.vault.transaction():
            self.records.insert("conversations", row)
        return conversation_id

    def rename(self, conversation_id: str, title: str) -> ConversationSummary:
        title = " ".join(check_text(title, "The title").split())
        if not title:
            raise InputError("A conversation's title cannot be empty.")
        if len(title) > MAX_TITLE_CHARS:
            raise InputError(f"A conversation's title can be at most {MAX_TITLE_CHARS} characters.")
        self.row(conversation_id)
        with self.vault.transaction():
            self.records.update(
                "conversations",
                conversation_id,
                {
                    "title_enc": self.records.encrypt(
                        "conversations", "title_enc", {"id": conversation_id}, title
                    )
                },
            )
        return self.summary(self.row(conversation_id))

    def set_thinking(self, conversation_id: str, enabled: bool) -> None:
        """Thinking is switched on in the conversation's first tokens (Gemma 4's system
        turn), so it can change only before the first turn."""
        conv = self.row(conversation_id)
        if enabled and not self.engine.turns.supports_thinking:
            raise InputError(
                f"This model ({self.engine.turn_format.describe()}) has no thinking mode."
            )
        if bool(conv.get("thinking")) == enabled:
            return
        if conv["n_messages"] or conv["head_block_id"] or conv["document_id"]:
            raise InputError(
                "Thinking is set when a conversation starts; start a new conversation to "
                f"turn it {'on' if enabled else 'off'}."
            )
        with self.vault.transaction():
            self.records.update("conversations", conversation_id, {"thinking": int(enabled)})
            self.records.reseal("conversations", conversation_id)
        self.live.drop({conversation_id})

    def reply_room(self) -> int:
        """Tokens a turn must leave free after the user's message: the reply (up to
        max_tokens, at most 512 counted here) and the turn's closing and the next opening."""
        return int(min(max(self.live.settings.values.max_tokens, 8), 512)) + 16

    def system_text(self, conv: ConversationRow) -> str:
        return system_text(self.records, conv)

    # -- grafting the conversation -------------------------------------------------------
    def ensure_live(
        self,
        conv: ConversationRow,
        counters: Counters,
        job: Job = NO_JOB,
        seal_checked: bool = False,
    ) -> GraftReport | None:
        """Make the context hold this conversation's head plus the probe."""
        live = self.live
        if not seal_checked:
            self.records.check("conversations", conv)
        if conv["head_block_id"]:
            if live.holds(conv["id"], conv["head_block_id"]):
                return None
            return live.graft(conv["head_block_id"], conv["id"], counters, job)
        if conv["document_id"]:
            doc = self.document_row(conv["document_id"])
            self.records.check("documents", doc)
            if live.holds(doc["id"], doc["block_id"]):
                return None
            return live.graft(doc["block_id"], doc["id"], counters, job)
        if live.holds(conv["id"], None):
            return None
        words, thinking = self.system_text(conv), bool(conv.get("thinking"))
        opening = self.engine.turns.start(words, thinking)
        shared, report = self.shared.open(words, thinking, opening, counters, job)
        if shared:  # the system prompt's block: grafted, or read once for all
            live.mark(conv["id"], None)
            return report
        live.start(conv["id"], opening, counters)
        return None

    def read_user_turn(
        self,
        conv: ConversationRow,
        first_turn: bool,
        prompt: str,
        user_tokens: list[int],
        counters: Counters,
        job: Job,
    ) -> GraftReport | None:
        """Read a user turn into the live context; a first turn's shared prefix (a folded
        system prompt, a pasted document) is grafted when stored (its report), and kept
        when not."""
        held, report = 0, None
        if first_turn:
            words, thinking = self.system_text(conv), bool(conv.get("thinking"))
            held, report = self.shared.open_heads(
                words, thinking, prompt, user_tokens, counters, job
            )
        counters.prefill_ms += self.engine.evaluate(user_tokens[held:], job)
        counters.new_tokens += len(user_tokens) - held
        return report

    def resume(self, conversation_id: str, job: Job = NO_JOB) -> GraftReport:
        """Graft a conversation's latest checkpoint into the context (always from disk)."""
        conv = self.row(conversation_id)
        self.live.drop()
        counters = Counters()
        report = self.ensure_live(conv, counters, job)
        if report is None:
            return GraftReport(conversation_id, "", 0, 0, 0, 0.0, proofs.NO_PROOF)
        return report

    # -- turns ---------------------------------------------------------------------------
    def send(
        self,
        conversation_id: str,
        text: str,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Run one turn: user text in, streamed reply out, checkpoint persisted.

        Cancelling stops generation between tokens; what was generated is kept and stored.
        """
        check_text(text, "The message")
        conv = self.row(conversation_id)
        counters = Counters()
        graft = self.ensure_live(conv, counters, job)
        return self.turn(
            conv,
            text,
            counters,
            graft,
            conv["head_block_id"],
            conv["n_messages"] or 0,
            [],
            job,
            params,
        )

    def regenerate(
        self,
        conversation_id: str,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Replace the last reply: restore the checkpoint before the last user message (never
        trim the cache: sliding-window layers cannot roll back) and answer again."""
        conv = self.row(conversation_id)
        rows = self.message_rows(conversation_id)
        if len(rows) < 2 or rows[-1]["role"] != "model":
            raise InputError("There is no reply to regenerate yet.")
        if rows[-2]["role"] != "user":
            raise InputError("The last turn added a document; there is no reply to regenerate.")
        seq = len(rows) - 2
        self.records.check("conversations", conv)
        user_text = self.records.decrypt("messages", "text_enc", rows[seq])
        counters = Counters()
        graft, parent = self.rewind(conv, rows, seq, counters, job)
        replaced = [r["id"] for r in rows[seq:]]
        result = self.turn(
            conv,
            user_text,
            counters,
            graft,
            parent,
            seq,
            replaced,
            job,
            params,
            keep_version=rows[-1],
        )
        versions = sum(v["seq"] == seq + 1 for v in self.records.versions(conv["id"]))
        return dataclasses.replace(result, versions=versions + 1)

    def branch(
        self,
        conversation_id: str,
        seq: int,
        new_text: str,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Edit user message `seq` and continue from there in a new conversation (a branch);
        the original stays as it was. The history before the edit is grafted, not re-read."""
        conv = self.row(conversation_id)
        rows = self.message_rows(conversation_id)
        if not 0 <= seq < len(rows) or rows[seq]["role"] != "user":
            raise InputError(f"Message {seq} is not a user message of this conversation.")
        if not new_text.strip():
            raise InputError("The message is empty.")
        check_text(new_text, "The message")
        counters = Counters()
        graft, _parent = self.rewind(conv, rows, seq, counters, job)
        title = self.title(conv) or " ".join(new_text.split())[:TITLE_CHARS]
        branch_id = copy_conversation(self.vault, conv, rows, seq, f"{title} (edited)")
        branch_row = self.row(branch_id)
        return self.turn(
            branch_row,
            new_text,
            counters,
            graft,
            None,
            seq,
            [],
            job,
            params,
        )

    def rewind(
        self,
        conv: ConversationRow,
        rows: list[MessageRow],
        seq: int,
        counters: Counters,
        job: Job,
    ) -> tuple[GraftReport | None, str | None]:
        """Make the context hold the conversation just before message `seq` (plus the probe),
        from the checkpoint stored at that turn boundary. Returns (graft, checkpoint id)."""
        engine = self.engine
        live = self.live
        self.records.check("conversations", conv)
        live.drop()
        if seq == 0:
            start_conv = conv.copy()
            start_conv["head_block_id"] = None
            return self.ensure_live(start_conv, counters, job, seal_checked=True), None
        checkpoint = rows[seq - 1]["block_id"]
        if checkpoint and self.records.block(checkpoint) is not None:
            return live.graft(checkpoint, conv["id"], counters, job), checkpoint
        # The checkpoint was retired (only the latest ones are kept): re-read the prefix.
        head = conv["head_block_id"]
        if head is None:
            raise IntegrityError(f"Conversation {conv['id']} has messages but no checkpoint.")
        prefix = self.vault.chain_tokens(head)[: rows[seq]["tok_start"]]
        engine.reset()
        counters.prefill_ms += engine.evaluate(prefix, job)
        counters.recomputed_tokens += len(prefix)
        engine.evaluate(engine.probe_tokens)
        counters.new_tokens += len(engine.probe_tokens)
        live.stats.recomputed_tokens += len(prefix)
        report = GraftReport(
            conv["id"],
            "",
            len(prefix),
            0,
            len(prefix),
            0.0,
            proofs.NO_PROOF,
            fallback_reason="that turn's checkpoint is no longer kept",
        )
        return report, None

    def turn(
        self,
        conv: ConversationRow,
        text: str,
        counters: Counters,
        graft: GraftReport | None,
        parent_block: str | None,
        seq: int,
        replaced_messages: list[str],
        job: Job,
        params: SamplingParams,
        keep_version: MessageRow | None = None,
    ) -> TurnResult:
        """Evaluate a user message on the live context, stream the reply, persist the turn
        (`keep_version`: the reply this one replaces, kept as an earlier version)."""
        if not text.strip():
            raise InputError("The message is empty.")
        engine = self.engine
        turns = engine.turns
        first_turn = seq == 0 and not conv["document_id"]
        prompt = turns.user_text(text, self.system_text(conv), first_turn)
        thinking = bool(conv.get("thinking")) and turns.supports_thinking
        user_tokens = turns.user_turn(prompt, thinking)
        if len(user_tokens) + self.reply_room() > engine.room():
            raise InputError(
                f"This conversation has {len(engine.tokens):,} of {engine.n_ctx:,} context "
                f"tokens; the message needs {len(user_tokens):,} more. Start a new "
                "conversation (or continue from a summary)."
            )
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        shared = self.read_user_turn(conv, first_turn, prompt, user_tokens, counters, NO_JOB)
        graft = graft or shared
        reply_start = len(engine.tokens)
        holds_thoughts = turns.thought_open is not None
        if holds_thoughts:
            engine.hold()
        generation = engine.generate(params, job)
        counters.generated_tokens += len(generation.tokens)
        counters.generate_ms += generation.elapsed_ms
        reread = 0
        if holds_thoughts and generation.thought_tokens:
            # Thoughts are not history: back to the start of the reply, re-read the answer.
            engine.return_to_hold()
            answer = strip_whitespace_tokens(engine, generation.answer_tokens)
            reread = len(answer)
            counters.prefill_ms += engine.evaluate(answer)
            counters.new_tokens += len(answer)
        else:
            engine.release_hold()
        close = engine.model_close()
        engine.evaluate(close)
        counters.new_tokens += len(close)
        reply_end = len(engine.tokens)
        persist_start = time.perf_counter()
        row, _record = self.live.persist(
            "conversation",
            conv["id"],
            self.live_parent(conv, parent_block),
            self.live.next_generation(conv["id"]),
            counters,
        )
        self.commit_turn(
            conv,
            row,
            seq,
            text,
            generation.text.strip() if generation.thought_tokens else generation.text,
            (user_start, reply_start, reply_end),
            replaced_messages,
            thoughts=generation.thought,
            seed=generation.seed,
            keep_version=keep_version,
        )
        counters.persist_ms += (time.perf_counter() - persist_start) * 1e3
        return TurnResult(
            conv["id"],
            generation.text.strip() if generation.thought_tokens else generation.text,
            generation.stop_reason,
            counters,
            graft.proof if graft else proofs.NO_PROOF,
            graft,
            len(engine.tokens),
            engine.n_ctx,
            generation.tokens_per_s,
            thoughts=generation.thought,
            thought_tokens=generation.thought_tokens,
            reread_tokens=reread,
            seed=generation.seed,
        )

    def live_parent(self, conv: ConversationRow, grafted: str | None) -> str | None:
        """The block this turn continues (its chain parent): what the context was grafted
        from, when it belongs to this conversation or its document. A branch starts a new
        chain, so forgetting the original never breaks it."""
        holding = self.live.holding
        if holding is None or holding.block_id is None:
            return None
        if grafted is not None and holding.block_id != grafted:
            return None
        if holding.owner_id not in (conv["id"], conv["document_id"]):
            return None
        return holding.block_id

    def commit_turn(
        self,
        conv: ConversationRow,
        row: BlockRow,
        seq: int,
        text: str,
        reply: str,
        boundaries: tuple[int, int, int],
        replaced_messages: list[str],
        roles: tuple[str, str] = ("user", "model"),
        thoughts: str = "",
        content: str = "",
        picture: Picture | None = None,
        seed: int | None = None,
        keep_version: MessageRow | None = None,
    ) -> None:
        """One transaction: the turn's block row, its two messages, the sealed new head (and,
        for a regenerated reply, the replaced reply kept as an earlier version)."""
        user_start, reply_start, reply_end = boundaries
        crashpoint("persist-before-commit")
        records = self.records
        now = time.time()
        versions = records.versions(conv["id"])
        # Earlier replies' versions keep their text; only the last reply's versions keep
        # their blocks (only they can be chosen again), so older ones let theirs go.
        released = [v for v in versions if v["block_id"] and v["seq"] < seq + 1]
        retired = [
            str(v["block_id"]) for v in released if not self.vault.children(str(v["block_id"]))
        ]
        if not self.live.settings.values.chain_blocks:
            # Whole-state turns: keep the newest `checkpoints` of them.
            keep = {v["block_id"] for v in versions if v not in released}
            if keep_version is not None:
                keep.add(keep_version["block_id"])
            owned = records.blocks("generation desc", owner_id=conv["id"])
            kept = [r["id"] for r in owned if r["id"] not in retired and r["id"] not in keep]
            retired += [
                b
                for b in kept[self.live.settings.values.checkpoints - 1 :]
                if not self.vault.children(b)
            ]
        with self.vault.transaction():
            records.insert("blocks", row)
            if keep_version is not None:
                self.versions.keep(keep_version)
            records.update_in(
                "reply_versions", {"block_id": None}, "id", [v["id"] for v in released]
            )
            for v in released:
                records.reseal("reply_versions", v["id"])
            records.delete_in("messages", "id", replaced_messages)
            for offset, (role, message, tok_start, tok_end, block_id, thought) in enumerate(
                (
                    (roles[0], text, user_start, reply_start, None, ""),
                    (roles[1], reply, reply_start, reply_end, row["id"], thoughts),
                )
            ):
                extra = content if offset == 0 else ""
                records.add_message(
                    {
                        "id": new_id("m"),
                        "conversation_id": conv["id"],
                        "seq": seq + offset,
                        "role": role,
                        "tok_start": tok_start,
                        "tok_end": tok_end,
                        "block_id": block_id,
                        "seed": seed if offset == 1 else None,
                        "created_at": now,
                    },
                    message,
                    thought,
                    extra,
                    base64.b64encode(picture.png).decode("ascii")
                    if picture is not None and offset == 0
                    else "",
                )
            changes: dict[str, Any] = {
                "head_block_id": row["id"],
                "n_tokens": row["pos_end"],
                "n_messages": seq + 2,
                "model_sha256": self.engine.model_sha256,
                "updated_at": now,
            }
            if seq == 0 and not self.title(conv):
                changes["title_enc"] = records.encrypt(
                    "conversations", "title_enc", conv, " ".join(text.split())[:TITLE_CHARS]
                )
            records.update("conversations", conv["id"], changes)
            records.update_in("messages", {"block_id": None}, "block_id", retired)
            self.vault.delete_block_rows(retired)
            records.reseal("conversations", conv["id"])
        crashpoint("persist-after-commit")
        self.vault.unlink_block_files(retired)
        self.live.mark(conv["id"], row["id"])
