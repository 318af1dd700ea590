"""Chat for stateless API clients: memory for programs that resend the whole history.

An OpenAI-style client sends every earlier message again with each request. Each completed
request is stored as a conversation turn (a chain link, like any turn made in the window),
and its history is indexed by a keyed tag (`api_prefixes`: a tag of the system prompt and
the turns, never their words). The next request's history is looked up turn boundary by
turn boundary, longest first; the conversation found is checked against its seal and its
decrypted messages, grafted (proof checked), and only what is new is read. A history that
leaves a stored conversation part way is continued in a copy (the original stays as it was);
turns no stored conversation holds are read once and stored, so they are never read again.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from galahad_desktop.engine.decoding import Generation
from galahad_desktop.engine.grammar import json_grammar
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import InputError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.api_shape import (
    ChatShape,
    Reply,
    UserTurn,
    calls_key,
    shape,
    tag_key,
)
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.forks import copy_conversation
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.chat.system_prompt import system_value
from galahad_desktop.memory.chat.tool_turns import (
    CALLED,
    call_tokens,
    calls_json,
    grammar,
    markers_of,
    read_reply,
    result_tokens,
    results_json,
    tool_records,
)
from galahad_desktop.memory.chat.turning import KEPT_STOPS, ConversationTurns, TurnRoom
from galahad_desktop.memory.results import (
    ChatCompletion,
    ChatMessage,
    GraftReport,
    ReplyShape,
    Tool,
    ToolCall,
    TurnResult,
)
from galahad_desktop.vault.names import ConversationRow
from galahad_desktop.vault.vault import new_id

API_ORIGIN = "api"
TAG_PURPOSE = "api-history"
TAG_VERSION = 2
AddPicture = Callable[[str, str, bytes, Job], TurnResult]
FINISH = {"end": "stop", "stop_text": "stop", "length": "length", "context_full": "length"}
PLAIN_REPLY = ReplyShape()


def reply_grammar(reply: ReplyShape) -> str:
    """The JSON grammar (GBNF) a reply is held to: "" for free text (a call's grammar is
    the engine's: tool_turns.grammar)."""
    if reply.json_schema is not None:
        return json_grammar(reply.json_schema, "'response_format.json_schema.schema'")
    return json_grammar(None) if reply.json_object else ""


@dataclass(frozen=True)
class Found:
    conversation_id: str
    turns: int  # how many of the request's pairs it holds
    seq: int  # where they end among its messages


class StatelessChats(TurnRoom):
    """The API server's chat, over the same conversations and turns as the window."""

    def __init__(
        self,
        live: LiveContext,
        conversations: Conversations,
        turns: ConversationTurns,
        forget: Callable[[str], object],
        add_picture: AddPicture,
    ) -> None:
        super().__init__(live, conversations, turns)
        self.forget = forget  # a conversation this request made, when the request fails
        self.add_picture = add_picture  # a picture read into a conversation as its turn

    def tag(self, request: ChatShape, turns: int) -> str:
        key = tag_key(TAG_VERSION, request, turns, tool_records(request.tools))
        return self.records.lookup_tag(key, TAG_PURPOSE)

    # -- finding the stored history ------------------------------------------------------
    def find(self, request: ChatShape) -> Found | None:
        """The stored conversation holding the longest run of the request's turns."""
        for turns in range(len(request.pairs), 0, -1):
            tag = self.tag(request, turns)
            rows = self.records.select("api_prefixes", "created_at desc", lookup=tag)
            for row in rows:
                self.records.check("api_prefixes", row)
                if self._holds(row["conversation_id"], row["seq"], request, turns):
                    return Found(row["conversation_id"], turns, row["seq"])
        return None

    def _holds(self, conversation_id: str, seq: int, request: ChatShape, turns: int) -> bool:
        """Whether the conversation's first `seq` messages are the request's first `turns`
        pairs word for word (the tag says so; the decrypted messages make sure)."""
        conv = self.records.conversation(conversation_id)
        if conv is None or conv.get("document_id") or (conv["n_messages"] or 0) < seq:
            return False
        if self.conversations.system_text(conv) != request.system:
            return False
        if self.conversations.system_tools(conv) != tool_records(request.tools):
            return False
        said = [
            (m.role, m.text, calls_key(m.calls))
            for m in self.conversations.messages(conversation_id)[:seq]
        ]
        wanted: list[tuple[str, str | None, list[list[Any]]]] = []
        for user, reply in request.pairs[:turns]:
            for name in user.picture_names:  # a picture's turn: the app's acknowledgement
                wanted += [("document", name, []), ("model", None, [])]
            if user.results:
                wanted.append(("tool", results_json(user.results), []))
            else:
                wanted.append(("user", user.text, []))
            wanted.append(("model", reply.text, calls_key(reply.calls)))
        return len(said) == len(wanted) and all(
            role == want_role and (want is None or text == want) and calls == want_calls
            for (role, text, calls), (want_role, want, want_calls) in zip(said, wanted, strict=True)
        )

    # -- one request ---------------------------------------------------------------------
    def check_fits(self, request: ChatShape) -> None:
        """Refuse at once a history that cannot fit the context: its words alone, counted
        in tokens, with two markers a turn (fewer than any chat format adds). Without this a
        long history was read turn by turn until the context filled, minutes later."""
        engine = self.live.engine
        turns = [*request.pairs, (request.question, Reply(""))]
        texts = [request.system, *(r[1] for user, _ in turns for r in user.results)]
        texts += [json.dumps(c.arguments) for _, reply in turns for c in reply.calls]
        texts += [text for user, reply in turns for text in (user.text, reply.text)]
        needed = sum(len(engine.encode_text(text)) for text in texts if text) + 2 * len(texts)
        if needed + self.turns.reply_room() > engine.n_ctx:
            raise InputError(
                f"The messages need at least {needed:,} tokens, more than the model's "
                f"{engine.n_ctx:,}-token context leaves with room for a reply "
                "(context_length_exceeded); send a shorter history."
            )

    def complete(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        job: Job = NO_JOB,
        reply: ReplyShape = PLAIN_REPLY,
    ) -> ChatCompletion:
        """One request: its messages put in turns (the tools declared, even under
        tool_choice none), the reply held to its grammar (JSON, or a call that must be
        made)."""
        # Under tool_choice none the tools are still declared (the history keeps them, so
        # the next request, which may call, finds it stored); only a call is not read.
        # A model without tool syntax just answers under none (with any other choice the
        # tools are refused by name below).
        dropped = reply.tool_choice == "none" and self.live.engine.tool_markers is None
        request = shape(messages, () if dropped else reply.tools)
        params = dataclasses.replace(params, grammar=reply_grammar(reply))
        uses_tools = bool(request.tools) or any(
            u.results or r.calls for u, r in (*request.pairs, (request.question, Reply("")))
        )
        if uses_tools:
            # Refused before anything is read or stored: Gemma 3 (no tool syntax), tools
            # that cannot be declared or whose call grammar cannot be made.
            markers_of(self.live.engine)
            tool_records(request.tools)
            params = dataclasses.replace(
                params, grammar=params.grammar or grammar(self.live.engine, reply)
            )
        self.check_fits(request)
        found = self.find(request)
        counters = Counters()
        made: str | None = None
        held = 0  # the history already in the context (this process answered it last)
        calls: tuple[ToolCall, ...] = ()
        try:
            if found is None:
                conversation_id = made = self._create(request.system, request.tools)
                turns = 0
            else:
                conversation_id, turns = found.conversation_id, found.turns
                conv = self.conversations.row(conversation_id)
                if conv["n_messages"] > found.seq:
                    conversation_id = made = self._fork(conversation_id, found.seq, counters, job)
                elif self.live.holds(conversation_id, conv["head_block_id"]):
                    held = len(self.live.engine.tokens)
            for user, earlier in request.pairs[turns:]:
                self._read_pictures(conversation_id, user, counters, job)
                self._read_pair(conversation_id, user, earlier, counters, job)
                turns += 1
                self._index(conversation_id, request, turns)
            self._read_pictures(conversation_id, request.question, counters, job)
            if uses_tools:
                result, calls = self.answer_prompt(
                    conversation_id, request, params, job, reply.tool_choice != "none"
                )
            else:
                result = self.turns.send(conversation_id, request.question.text, params, job)
        except BaseException:
            # What the context holds is no longer any stored turn (a read stopped part way).
            self.live.drop()
            if made is not None:
                self.forget(made)
            raise
        kept = () if result.stop_reason == "length" else calls  # as answer_prompt stored it
        if result.stop_reason != "cancelled":
            answered = dataclasses.replace(
                request, pairs=(*request.pairs, (request.question, Reply(result.reply, kept)))
            )
            self._index(conversation_id, answered, len(answered.pairs))
        counters.restored_tokens += held
        done = self._completion(result, counters, found.turns if found else 0)
        if kept:
            return dataclasses.replace(done, calls=calls, finish_reason="tool_calls")
        return dataclasses.replace(done, calls=calls)  # cut by the limit: "length", its calls

    def _completion(self, result: TurnResult, before: Counters, matched: int) -> ChatCompletion:
        rows = self.conversations.message_rows(result.conversation_id)
        prompt_tokens = rows[-1]["tok_start"]  # the reply starts where the prompt ends
        # Reused, not read: restored from blocks, or still in the context from the last call.
        cached = before.restored_tokens + result.counters.restored_tokens
        return ChatCompletion(
            result.conversation_id,
            result.reply,
            "cancelled"
            if result.stop_reason == "cancelled"
            else FINISH.get(result.stop_reason, "stop"),  # type: ignore[arg-type]
            prompt_tokens,
            result.counters.generated_tokens,
            min(cached, prompt_tokens),
            max(prompt_tokens - cached, 0),
            matched,
            result.seed,
            result,
        )

    def remove_abandoned(self) -> list[str]:
        """At start: API conversations made for a request that never stored its first turn
        (the process was killed or crashed while reading it) are forgotten; an API
        conversation exists for its turns alone, so nothing of the person's goes."""
        abandoned = [
            row["id"]
            for row in self.records.conversations(origin=API_ORIGIN)
            if not row["n_messages"] and not row["head_block_id"]
        ]
        for conversation_id in abandoned:
            self.forget(conversation_id)
        n = len(abandoned)
        if not n:
            return []
        return [f"Removed {n} empty API conversation{'s' if n > 1 else ''} a crash left."]

    def _create(self, system: str, tools: Sequence[Tool] = ()) -> str:
        """A new API conversation, its system prompt the request's own words (no preset),
        and the tools it offers."""
        conversation_id = self.conversations.create(system_prompt="none", thinking=False)
        changes: dict[str, object] = {"origin": API_ORIGIN}
        if system or tools:
            row = self.conversations.row(conversation_id)
            kind, text = system_value(system, tool_records(tools))
            changes["system_prompt"] = kind
            changes["system_enc"] = self.records.encrypt("conversations", "system_enc", row, text)
        with self.vault.transaction():
            self.records.update("conversations", conversation_id, changes)
            self.records.reseal("conversations", conversation_id)
        return conversation_id

    def _fork(self, conversation_id: str, seq: int, counters: Counters, job: Job) -> str:
        """The history leaves this conversation after message `seq`: graft the checkpoint
        stored there and continue in a copy, so the original stays as it was."""
        conv = self.conversations.row(conversation_id)
        rows = self.conversations.message_rows(conversation_id)
        self.turns.rewind(conv, rows, seq, counters, job)
        title = self.conversations.title(conv)
        copy_id = copy_conversation(self.vault, conv, rows, seq, title, API_ORIGIN)
        self.live.mark(copy_id, None)  # the context holds the copy's history: go on from it
        return copy_id

    def _read_pictures(
        self, conversation_id: str, user: UserTurn, counters: Counters, job: Job
    ) -> None:
        """A user message's pictures, each read into the conversation as its own turn
        (checked in the limited child, encoded through the projector, stored as a link)."""
        for (_kind, data), name in zip(user.pictures, user.picture_names, strict=True):
            done = self.add_picture(conversation_id, name, data, job)
            counters.restored_tokens += done.counters.restored_tokens
            counters.new_tokens += done.counters.new_tokens

    def _read_pair(
        self, conversation_id: str, user: UserTurn, reply: Reply, counters: Counters, job: Job
    ) -> None:
        """Read one earlier turn the client sent (its reply as written, nothing generated)
        and store it as the conversation's next link."""
        if not user.results and not user.text.strip():
            raise InputError("An earlier user message is empty.")
        conv = self.conversations.row(conversation_id)
        engine, role, said, user_start, _graft = self.read_prompt(conv, user, counters, job)
        reply_tokens = engine.encode_text(reply.text)
        reply_tokens += call_tokens(engine, reply.calls) if reply.calls else engine.model_close()
        if len(reply_tokens) + self.turns.reply_room() > engine.room():
            raise InputError(
                f"The messages need more than the model's {engine.n_ctx:,}-token context "
                "(context_length_exceeded); send a shorter history."
            )
        reply_start = len(engine.tokens)
        counters.prefill_ms += engine.evaluate(reply_tokens, job)
        counters.new_tokens += len(reply_tokens)
        self.commit_step(
            conv, counters, role, said, reply.text, reply.calls, user_start, reply_start
        )

    def read_prompt(
        self, conv: ConversationRow, user: UserTurn, counters: Counters, job: Job
    ) -> tuple[ChatEngine, str, str, int, GraftReport | None]:
        """Read a turn's prompt into the live context: the user's message, or the results
        of the tools the reply before it called (inside that reply's model turn, so the
        context holds no probe there). Returns (engine, role, the message's text, where the
        turn starts, what was grafted)."""
        open_turn = self.waits_for_results(conv)
        if bool(user.results) != open_turn:
            raise InputError(
                "Tool results must answer the reply that called the tools, and only they can."
            )
        graft = self.turns.ensure_live(conv, counters, job, open_turn=open_turn)
        engine = self.live.engine
        if user.results:
            tokens = result_tokens(engine, user.results)
            prompt, role, start = results_json(user.results), "tool", len(engine.tokens)
            if len(tokens) + self.turns.reply_room() > engine.room():
                raise InputError(
                    f"The tool results need more than the model's {engine.n_ctx:,}-token "
                    "context (context_length_exceeded); send shorter results."
                )
            counters.prefill_ms += engine.evaluate(tokens, job)
            counters.new_tokens += len(tokens)
            return engine, role, prompt, start, graft
        seq = conv["n_messages"] or 0
        first = seq == 0 and not conv["document_id"]
        prompt = engine.turns.user_text(user.text, self.conversations.system_text(conv), first)
        tokens = engine.turns.user_turn(prompt, False)
        if len(tokens) + self.turns.reply_room() > engine.room():
            raise InputError(
                f"The messages need more than the model's {engine.n_ctx:,}-token context "
                "(context_length_exceeded); send a shorter history."
            )
        start = len(engine.tokens) - len(engine.probe_tokens)
        shared = self.turns.read_user_turn(conv, first, prompt, tokens, counters, job)
        return engine, "user", user.text, start, graft or shared

    def waits_for_results(self, conv: ConversationRow) -> bool:
        """Whether the conversation's last reply called tools (its model turn goes on)."""
        rows = self.conversations.message_rows(conv["id"])
        return bool(rows) and rows[-1].get("stop") == CALLED

    def answer_prompt(
        self,
        conversation_id: str,
        request: ChatShape,
        params: SamplingParams,
        job: Job,
        calling: bool = True,
    ) -> tuple[TurnResult, tuple[ToolCall, ...]]:
        """Answer a prompt where tools are offered or given back: the reply is generated,
        its calls read from their token ids; a reply that called tools leaves its model turn
        open (its block ends inside the turn), any other closes it."""
        conv = self.conversations.row(conversation_id)
        counters = Counters()
        engine, role, said, user_start, graft = self.read_prompt(
            conv, request.question, counters, job
        )
        reply_start = len(engine.tokens)
        generation = engine.generate(params, job).check_device()
        counters.generated_tokens += len(generation.tokens)
        counters.generate_ms += generation.elapsed_ms
        text, calls = read_reply(engine, generation, request.tools if calling else ())
        # A reply the limit cut ends in a call's first tokens: its turn is closed and stored
        # without calls (results sent for them later re-read the history, never this turn).
        kept = () if generation.stop_reason == "length" else calls
        if not kept:
            close = engine.model_close()
            engine.evaluate(close)
            counters.new_tokens += len(close)
        self.commit_step(
            conv,
            counters,
            role,
            said,
            text,
            kept,
            user_start,
            reply_start,
            generation,
            generation.stop_reason,
        )
        result = self.stored_turn(conversation_id, text, generation.stop_reason, counters, graft)
        return dataclasses.replace(
            result, seed=generation.seed, tokens_per_s=generation.tokens_per_s
        ), calls

    def commit_step(
        self,
        conv: ConversationRow,
        counters: Counters,
        role: str,
        said: str,
        reply: str,
        calls: Sequence[ToolCall],
        user_start: int,
        reply_start: int,
        generation: Generation | None = None,
        stop: str | None = None,
    ) -> None:
        """Store the turn the context now holds as the conversation's next link (its block
        ends inside the model turn when the reply called tools)."""
        row, _record = self.live.persist(
            "conversation",
            conv["id"],
            self.turns.live_parent(conv, conv["head_block_id"]),
            self.live.next_generation(conv["id"]),
            counters,
            mid_turn=bool(calls),
        )
        self.turns.commit_turn(
            conv,
            row,
            conv["n_messages"] or 0,
            said,
            reply,
            (user_start, reply_start, len(self.live.engine.tokens)),
            [],
            roles=(role, "model"),
            seed=generation.seed if generation else None,
            stop=CALLED if calls else (stop if stop in KEPT_STOPS else None),
            reply_content=calls_json(calls) if calls else "",
        )

    def _index(self, conversation_id: str, request: ChatShape, turns: int) -> None:
        """Remember where this history ends in the conversation (its tag, sealed)."""
        seq = self.conversations.row(conversation_id)["n_messages"]
        tag = self.tag(request, turns)
        if any(
            r["conversation_id"] == conversation_id and r["seq"] == seq
            for r in self.records.select("api_prefixes", lookup=tag)
        ):
            return
        with self.vault.transaction():
            self.records.insert(
                "api_prefixes",
                {
                    "id": new_id("a"),
                    "lookup": tag,
                    "conversation_id": conversation_id,
                    "seq": seq,
                    "created_at": time.time(),
                },
            )
