"""Turns of a conversation: send, regenerate, branch, rewind, resume — each turn a
checkpoint at its boundary.

A turn appends tokens to the ledger (never re-renders the history): the user's text, the end
of the user turn, the generation prompt, the reply, the turn's close and the next turn's
opening (the proof probe). A thinking turn's thoughts are streamed and shown but not kept:
the context returns to the start of the reply and re-reads only the answer, so the stored
history is what the model's template renders for history, and a resumed conversation holds
exactly the tokens an uninterrupted one does. The conversations' records are the store's
(conversations.py); this module only writes turns into them.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec

from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.decoding import Generation
from galahad_desktop.engine.picture import Media
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import (
    MAX_TITLE_CHARS,
    DeviceLostError,
    InputError,
    IntegrityError,
    check_text,
)
from galahad_desktop.faults import crashpoint
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.chains import checkpoint_bytes
from galahad_desktop.memory.chat.conversations import TITLE_CHARS, Conversations
from galahad_desktop.memory.chat.forks import copy_conversation
from galahad_desktop.memory.chat.live import LiveContext, strip_whitespace_tokens
from galahad_desktop.memory.chat.room import check_room
from galahad_desktop.memory.chat.tool_turns import declared
from galahad_desktop.memory.results import GraftReport, TurnResult, TurnStop
from galahad_desktop.vault.names import (
    BlockRow,
    ConversationRow,
    MessageRow,
    VersionRow,
    file_bytes,
)
from galahad_desktop.vault.vault import new_id

P = ParamSpec("P")
# How a reply ended, kept with it where that is not its own end (shown on its card again
# when the conversation is reopened or its versions are paged).
KEPT_STOPS = ("cancelled", "length", "context_full", "device_lost")


def on_another_device_if_lost(
    method: Callable[Concatenate[ConversationTurns, P], TurnResult],
) -> Callable[Concatenate[ConversationTurns, P], TurnResult]:
    """A device server lost before the reply began (while grafting or reading the
    message): nothing was stored or streamed, so the turn runs once more on the engine
    loaded again without the server, and says why. Lost during or after the reply, the turn
    keeps the reply itself (`_reply_elsewhere`)."""

    @functools.wraps(method)
    def run(turns: ConversationTurns, /, *args: P.args, **kwargs: P.kwargs) -> TurnResult:
        try:
            return method(turns, *args, **kwargs)
        except DeviceLostError as lost:
            turns.live.close()  # the lost engine: the next use loads it again without it
            result = method(turns, *args, **kwargs)
            return dataclasses.replace(result, notice=result.notice or str(lost))

    return run


def branch_title(source_title: str, edited: str) -> str:
    """A branch's title starts with its mark and the edited words (what tells branches of
    one conversation apart where the sidebar cuts titles), then where it came from."""
    words = " ".join(edited.split())
    short = words if len(words) <= 40 else words[:39].rstrip() + "…"
    title = f"↳ {short}" + (f" — from {source_title}" if source_title else "")
    return title[:MAX_TITLE_CHARS]


class ConversationTurns:
    """Reads and writes turns on the live context, over the conversations' store."""

    def __init__(self, live: LiveContext, conversations: Conversations) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records
        self.conversations = conversations

    @property
    def engine(self) -> ChatEngine:
        return self.live.engine

    def reply_room(self) -> int:
        """Tokens a turn must leave free after the user's message: the reply (up to
        max_tokens, at most 512 counted here) and the turn's closing and the next opening."""
        longest = self.live.settings.values.max_tokens or self.engine.sampling_defaults().max_tokens
        return int(min(max(longest, 8), 512)) + 16

    def ensure_live(
        self,
        conv: ConversationRow,
        counters: Counters,
        job: Job = NO_JOB,
        seal_checked: bool = False,
        open_turn: bool = False,
    ) -> GraftReport | None:
        """Make the context hold this conversation's head plus the probe (`open_turn`: its
        last reply called tools and the model turn goes on: no probe)."""
        live = self.live
        if not seal_checked:
            self.records.check("conversations", conv)
        if conv["head_block_id"]:
            if live.holds(conv["id"], conv["head_block_id"]):
                return None
            return live.graft(conv["head_block_id"], conv["id"], counters, job, open_turn)
        if conv["document_id"]:
            doc = self.conversations.document_row(conv["document_id"])
            self.records.check("documents", doc)
            if live.holds(doc["id"], doc["block_id"]):
                return None
            return live.graft(doc["block_id"], doc["id"], counters, job)
        if live.holds(conv["id"], None):
            return None
        words, thinking = self.conversations.system_text(conv), bool(conv.get("thinking"))
        tools = self.conversations.system_tools(conv)
        if tools:  # declared in the system turn: read for this conversation alone
            opening = self.engine.turns.start(words, thinking, declared(self.engine, tools))
            live.start(conv["id"], opening, counters)
            return None
        opening = self.engine.turns.start(words, thinking)
        shared, report = self.conversations.shared.open(words, thinking, opening, counters, job)
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
        # A shared prefix was read without tools in its system turn: not for one with them.
        if first_turn and not self.conversations.system_tools(conv):
            words, thinking = self.conversations.system_text(conv), bool(conv.get("thinking"))
            held, report = self.conversations.shared.open_heads(
                words, thinking, prompt, user_tokens, counters, job
            )
        counters.prefill_ms += self.engine.evaluate(user_tokens[held:], job)
        counters.new_tokens += len(user_tokens) - held
        return report

    def resume(self, conversation_id: str, job: Job = NO_JOB) -> GraftReport:
        """Graft a conversation's latest checkpoint into the context (always from disk)."""
        conv = self.conversations.row(conversation_id)
        self.live.drop()
        counters = Counters()
        report = self.ensure_live(conv, counters, job)
        if report is None:
            return GraftReport(conversation_id, "", 0, 0, 0, 0.0, proofs.NO_PROOF)
        return report

    @on_another_device_if_lost
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
        conv = self.conversations.row(conversation_id)
        rows = self.conversations.message_rows(conversation_id)
        if rows and rows[-1].get("stop") == "tool_calls":  # its model turn is still open
            raise InputError(
                "This conversation is waiting for the result of a tool a program asked for "
                "through the local server; it goes on there. Branch it to write here."
            )
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

    @on_another_device_if_lost
    def regenerate(
        self,
        conversation_id: str,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Replace the last reply: restore the checkpoint before the last user message (never
        trim the cache: sliding-window layers cannot roll back) and answer again."""
        conv = self.conversations.row(conversation_id)
        rows = self.conversations.message_rows(conversation_id)
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

    @on_another_device_if_lost
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
        conv = self.conversations.row(conversation_id)
        rows = self.conversations.message_rows(conversation_id)
        if not 0 <= seq < len(rows) or rows[seq]["role"] != "user":
            raise InputError(f"Message {seq} is not a user message of this conversation.")
        if not new_text.strip():
            raise InputError("The message is empty.")
        check_text(new_text, "The message")
        counters = Counters()
        graft, _parent = self.rewind(conv, rows, seq, counters, job)
        branch_id = copy_conversation(
            self.vault, conv, rows, seq, branch_title(self.conversations.title(conv), new_text)
        )
        branch_row = self.conversations.row(branch_id)
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
        prompt = turns.user_text(text, self.conversations.system_text(conv), first_turn)
        thinking = bool(conv.get("thinking")) and turns.supports_thinking
        user_tokens = turns.user_turn(prompt, thinking)
        check_room(engine, len(user_tokens) + self.reply_room(), first_turn)
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        shared = self.read_user_turn(conv, first_turn, prompt, user_tokens, counters, NO_JOB)
        graft = graft or shared
        reply_start = len(engine.tokens)
        generation, reread = self._reply(params, counters, job)
        engine = self.engine  # another one when a device server went away mid-reply
        reply_end = len(engine.tokens)
        persist_start = time.perf_counter()
        try:
            row = self._persist(conv, parent_block, counters)
        except DeviceLostError as lost:  # the reply is out: keep it, store it from the CPU
            self._carry_over(engine.tokens, counters, NO_JOB)
            generation = dataclasses.replace(generation, problem=str(lost))
            engine = self.engine
            row = self._persist(conv, parent_block, counters)
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
            stop=generation.stop_reason if generation.stop_reason in KEPT_STOPS else None,
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
            notice=generation.problem,
        )

    def _persist(
        self, conv: ConversationRow, parent_block: str | None, counters: Counters
    ) -> BlockRow:
        row, _record = self.live.persist(
            "conversation",
            conv["id"],
            self.live_parent(conv, parent_block),
            self.live.next_generation(conv["id"]),
            counters,
        )
        return row

    def _reply(
        self, params: SamplingParams, counters: Counters, job: Job
    ) -> tuple[Generation, int]:
        """Generate the reply and close the turn; returns the generation and how many
        answer tokens were re-read (a thinking reply's thoughts are not history: the context
        goes back to the start of the reply and re-reads only the answer)."""
        engine = self.engine
        reply_start = len(engine.tokens)
        holds_thoughts = engine.turns.thought_open is not None
        if holds_thoughts:
            engine.hold()
        generation = engine.generate(params, job)
        counters.generated_tokens += len(generation.tokens)
        counters.generate_ms += generation.elapsed_ms
        if generation.stop_reason != "device_lost":
            try:
                return generation, self._close_reply(generation, holds_thoughts, counters)
            except DeviceLostError as lost:
                generation = dataclasses.replace(generation, problem=str(lost))
        return self._reply_elsewhere(engine.tokens[:reply_start], generation, params, counters, job)

    def _close_reply(self, generation: Generation, holds_thoughts: bool, counters: Counters) -> int:
        """Close the turn after its reply; returns how many answer tokens were re-read."""
        engine = self.engine
        reread = 0
        if holds_thoughts and generation.thought_tokens:
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
        return reread

    def _reply_elsewhere(
        self,
        ledger: list[int],
        generation: Generation,
        params: SamplingParams,
        counters: Counters,
        job: Job,
    ) -> tuple[Generation, int]:
        """The device server went away mid-reply: the engine is loaded again without it,
        the conversation so far is re-read there, and the reply ends with what was
        streamed (kept and stored like any reply). Lost before the first token, the reply
        is answered on the new engine instead."""
        engine = self._carry_over(ledger, counters, job)
        if not generation.tokens:
            again, reread = self._reply(params, counters, job)
            return dataclasses.replace(again, problem=generation.problem), reread
        # As after any thinking reply, the history keeps the answer, not the thoughts.
        thought = bool(generation.thought_tokens)
        kept = (
            strip_whitespace_tokens(engine, generation.answer_tokens)
            if thought
            else generation.tokens
        )
        close = engine.model_close()
        counters.prefill_ms += engine.evaluate([*kept, *close])
        counters.recomputed_tokens += len(kept)
        counters.new_tokens += len(close)
        return generation, len(kept) if thought else 0

    def _carry_over(self, ledger: list[int], counters: Counters, job: Job) -> ChatEngine:
        """Load the engine again without the lost device server and re-read `ledger` there
        (the lost engine's native memory stays where it is: engine/device_guard.py)."""
        ledger = list(ledger)
        self.live.close()
        engine = self.engine
        counters.prefill_ms += engine.evaluate(ledger, job)
        counters.recomputed_tokens += len(ledger)
        return engine

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
        picture: Media | None = None,
        seed: int | None = None,
        keep_version: MessageRow | None = None,
        stop: str | None = None,
        reply_content: str = "",
    ) -> None:
        """One transaction: the turn's block row, its two messages, the sealed new head (and,
        for a regenerated reply, the replaced reply kept as an earlier version).
        `reply_content`: the reply's tool calls (JSON), kept encrypted as its content."""
        user_start, reply_start, reply_end = boundaries
        crashpoint("persist-before-commit")
        records = self.records
        now = time.time()
        released, retired = self._released_blocks(conv, seq, keep_version)
        with self.vault.transaction():
            records.insert("blocks", row)
            if keep_version is not None:
                self.conversations.versions.keep(keep_version)
            records.update_in(
                "reply_versions", {"block_id": None}, "id", [v["id"] for v in released]
            )
            for v in released:
                records.reseal("reply_versions", v["id"])
            records.delete_in("messages", "id", replaced_messages)
            picture_text = (
                base64.b64encode(picture.kept).decode("ascii") if picture is not None else ""
            )
            for offset, (role, message, tok_start, tok_end, block_id, thought) in enumerate(
                (
                    (roles[0], text, user_start, reply_start, None, ""),
                    (roles[1], reply, reply_start, reply_end, row["id"], thoughts),
                )
            ):
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
                        "stop": stop if offset == 1 else None,
                        "created_at": now,
                    },
                    message,
                    thought,
                    content if offset == 0 else reply_content,
                    picture_text if offset == 0 else "",
                )
            records.update("conversations", conv["id"], self._head(conv, row, seq, text, now))
            records.update_in("messages", {"block_id": None}, "block_id", retired)
            self.vault.delete_block_rows(retired)
            records.reseal("conversations", conv["id"])
        crashpoint("persist-after-commit")
        self.vault.unlink_block_files(retired)
        self.live.mark(conv["id"], row["id"])

    def _head(
        self, conv: ConversationRow, row: BlockRow, seq: int, text: str, now: float
    ) -> dict[str, Any]:
        """The conversation's changes when `row` is its new head (a first turn titles it)."""
        changes: dict[str, Any] = {
            "head_block_id": row["id"],
            "n_tokens": row["pos_end"],
            "n_messages": seq + 2,
            "model_sha256": self.engine.model_sha256,
            "updated_at": now,
        }
        if seq == 0 and not self.conversations.title(conv):
            changes["title_enc"] = self.records.encrypt(
                "conversations", "title_enc", conv, " ".join(text.split())[:TITLE_CHARS]
            )
        return changes

    def _released_blocks(
        self, conv: ConversationRow, seq: int, keep_version: MessageRow | None
    ) -> tuple[list[VersionRow], list[str]]:
        """The reply versions that let their blocks go at this turn, and the blocks to
        delete. Earlier replies' versions keep their text; only the last reply's versions
        keep their blocks (only they can be chosen again). Whole-state turns also keep only
        the newest `checkpoints` of them."""
        versions = self.records.versions(conv["id"])
        released = [v for v in versions if v["block_id"] and v["seq"] < seq + 1]
        if keep_version is not None:  # a regenerate: the reply's versions, by bytes too
            released += self._versions_past_bytes(versions, seq + 1, keep_version)
        retired = [
            str(v["block_id"]) for v in released if not self.vault.children(str(v["block_id"]))
        ]
        if not self.live.settings.values.chain_blocks:
            keep = {v["block_id"] for v in versions if v not in released}
            if keep_version is not None:
                keep.add(keep_version["block_id"])
            owned = self.records.blocks("generation desc", owner_id=conv["id"])
            kept = [r["id"] for r in owned if r["id"] not in retired and r["id"] not in keep]
            retired += [
                b
                for b in kept[self.live.settings.values.checkpoints - 1 :]
                if not self.vault.children(b)
            ]
        return released, retired

    def _versions_past_bytes(
        self, versions: list[VersionRow], seq: int, newest: MessageRow
    ) -> list[VersionRow]:
        """The reply's earlier versions whose blocks no longer fit, the newest kept first:
        together with the one just replaced, at most what kept checkpoints may take (on a
        31B model a long reply's block is 0.8 GB). What is given up: such a version keeps
        its words, and choosing it again says to regenerate instead."""
        limit = checkpoint_bytes(self.live.settings.values.disk_budget)

        def size(block_id: object) -> int:
            block = self.records.block(str(block_id)) if block_id else None
            return file_bytes(block) if block is not None else 0

        total, past = size(newest["block_id"]), []
        earlier = [v for v in versions if v["seq"] == seq and v["block_id"]]
        for version in sorted(earlier, key=lambda v: v["created_at"], reverse=True):
            total += size(version["block_id"])
            if total > limit:
                past.append(version)
        return past


class TurnRoom:
    """A room that writes turns into conversations (continuation, the verified library,
    documents, the API's stateless chats): the live context, the conversations' store and
    the turns, given by the façade."""

    def __init__(
        self, live: LiveContext, conversations: Conversations, turns: ConversationTurns
    ) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records
        self.conversations = conversations
        self.turns = turns

    def stored_turn(
        self,
        conversation_id: str,
        reply: str,
        stop: TurnStop,
        counters: Counters,
        graft: GraftReport | None,
        image_tokens: int = 0,
        audio_tokens: int = 0,
    ) -> TurnResult:
        """What a turn stored without sampling a reply says (a document read into the
        conversation, an answer from the verified library)."""
        engine = self.live.engine
        proof = graft.proof if graft else proofs.NO_PROOF
        return TurnResult(
            conversation_id,
            reply,
            stop,
            counters,
            proof,
            graft,
            len(engine.tokens),
            engine.n_ctx,
            0.0,
            image_tokens=image_tokens,
            audio_tokens=audio_tokens,
        )
