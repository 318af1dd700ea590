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

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from galahad_desktop.engine.grammar import json_grammar
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import InputError, check_text
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.forks import copy_conversation
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.chat.system_prompt import CUSTOM, MAX_SYSTEM_CHARS
from galahad_desktop.memory.chat.turning import ConversationTurns, TurnRoom
from galahad_desktop.memory.results import ChatCompletion, ChatMessage, ReplyShape, TurnResult
from galahad_desktop.vault.vault import new_id

API_ORIGIN = "api"
TAG_PURPOSE = "api-history"
TAG_VERSION = 2
AddPicture = Callable[[str, str, bytes, Job], TurnResult]
FINISH = {"end": "stop", "stop_text": "stop", "length": "length", "context_full": "length"}
PLAIN_REPLY = ReplyShape()
NO_TOOLS_YET = (
    "Tool calls are not supported by this server yet: send the request without 'tools' "
    "(or with tool_choice 'none')."
)


def reply_grammar(reply: ReplyShape) -> str:
    """The grammar (GBNF) a reply is held to: "" for free text."""
    if reply.tools and reply.tool_choice != "none":
        raise InputError(NO_TOOLS_YET)
    if reply.json_schema is not None:
        return json_grammar(reply.json_schema, "'response_format.json_schema.schema'")
    return json_grammar(None) if reply.json_object else ""


@dataclass(frozen=True)
class UserTurn:
    """A user message of a request: its text and the pictures it holds (type, bytes)."""

    text: str
    pictures: tuple[tuple[str, bytes], ...] = ()

    @property
    def digests(self) -> list[str]:
        return [hashlib.sha256(data).hexdigest() for _kind, data in self.pictures]

    @property
    def picture_names(self) -> list[str]:
        """Each picture's name in the conversation (its digest: the same bytes, the same
        name, so a history resent with its pictures is found again)."""
        return [
            f"picture-{digest[:12]}.{kind}"
            for digest, (kind, _data) in zip(self.digests, self.pictures, strict=True)
        ]


@dataclass(frozen=True)
class ChatShape:
    """A request as turns: the system prompt, the earlier (user, reply) pairs, the new
    user message."""

    system: str
    pairs: tuple[tuple[UserTurn, str], ...]
    question: UserTurn


def shape(messages: Sequence[ChatMessage]) -> ChatShape:
    """Check a request's messages and put them in turns. System messages are taken at the
    start only; consecutive messages of one role are joined (as one turn)."""
    if not messages:
        raise InputError("'messages' is empty: a chat request needs at least one message.")
    system_parts: list[str] = []
    index = 0
    while index < len(messages) and messages[index].role == "system":
        system_parts.append(messages[index].text)
        index += 1
    turns: list[tuple[str, UserTurn]] = []
    for number, message in enumerate(messages[index:], start=index):
        check_text(message.text, f"messages[{number}].content")
        if message.role == "tool" or message.calls:
            raise InputError(f"messages[{number}]: {NO_TOOLS_YET}")
        if message.role == "system":
            raise InputError(
                f"messages[{number}] is a system message after the conversation started; "
                "system messages are taken at the start only."
            )
        said = UserTurn(message.text, message.pictures)
        if turns and turns[-1][0] == message.role:
            before = turns[-1][1]
            said = UserTurn(before.text + "\n\n" + said.text, before.pictures + said.pictures)
            turns[-1] = (message.role, said)
        else:
            turns.append((message.role, said))
    if not turns or turns[-1][0] != "user":
        raise InputError("The last message must be the user's (there is nothing to answer).")
    if turns[0][0] != "user":
        raise InputError("The conversation must start with a user message (after any system).")
    if not turns[-1][1].text.strip():
        raise InputError("The last user message has no text (a picture needs a question).")
    system = "\n\n".join(system_parts).strip()
    if len(system) > MAX_SYSTEM_CHARS:
        raise InputError(f"A system prompt can be at most {MAX_SYSTEM_CHARS:,} characters.")
    pairs = tuple((turns[i][1], turns[i + 1][1].text) for i in range(0, len(turns) - 1, 2))
    return ChatShape(check_text(system, "The system prompt"), pairs, turns[-1][1])


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

    def tag(self, system: str, pairs: Sequence[tuple[UserTurn, str]]) -> str:
        turns = [[user.text, user.digests, reply] for user, reply in pairs]
        key = json.dumps([TAG_VERSION, system, turns], ensure_ascii=False)
        return self.records.lookup_tag(key, TAG_PURPOSE)

    # -- finding the stored history ------------------------------------------------------
    def find(self, request: ChatShape) -> Found | None:
        """The stored conversation holding the longest run of the request's turns."""
        for turns in range(len(request.pairs), 0, -1):
            tag = self.tag(request.system, request.pairs[:turns])
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
        said = [(m.role, m.text) for m in self.conversations.messages(conversation_id)[:seq]]
        wanted: list[tuple[str, str | None]] = []
        for user, reply in request.pairs[:turns]:
            for name in user.picture_names:  # a picture's turn: the app's acknowledgement
                wanted += [("document", name), ("model", None)]
            wanted += [("user", user.text), ("model", reply)]
        return len(said) == len(wanted) and all(
            role == want_role and (want is None or text == want)
            for (role, text), (want_role, want) in zip(said, wanted, strict=True)
        )

    # -- one request ---------------------------------------------------------------------
    def check_fits(self, request: ChatShape) -> None:
        """Refuse at once a history that cannot fit the context: its words alone, counted
        in tokens, with two markers a turn (fewer than any chat format adds). Without this a
        long history was read turn by turn until the context filled, minutes later."""
        engine = self.live.engine
        texts = [request.system, request.question.text]
        texts += [text for user, reply in request.pairs for text in (user.text, reply)]
        needed = sum(len(engine.encode_text(text)) for text in texts if text) + 2 * len(texts)
        if needed + self.turns.reply_room() > engine.n_ctx:
            raise InputError(
                f"The messages need at least {needed:,} tokens, more than the model's "
                f"{engine.n_ctx:,}-token context leaves with room for a reply "
                "(context_length_exceeded); send a shorter history."
            )

    def complete(
        self, request: ChatShape, params: SamplingParams, job: Job = NO_JOB
    ) -> ChatCompletion:
        self.check_fits(request)
        found = self.find(request)
        counters = Counters()
        made: str | None = None
        held = 0  # the history already in the context (this process answered it last)
        try:
            if found is None:
                conversation_id = made = self._create(request.system)
                turns = 0
            else:
                conversation_id, turns = found.conversation_id, found.turns
                conv = self.conversations.row(conversation_id)
                if conv["n_messages"] > found.seq:
                    conversation_id = made = self._fork(conversation_id, found.seq, counters, job)
                elif self.live.holds(conversation_id, conv["head_block_id"]):
                    held = len(self.live.engine.tokens)
            for user, reply in request.pairs[turns:]:
                self._read_pictures(conversation_id, user, counters, job)
                self._read_pair(conversation_id, user.text, reply, counters, job)
                turns += 1
                self._index(conversation_id, request.system, request.pairs[:turns])
            self._read_pictures(conversation_id, request.question, counters, job)
            question = request.question.text
            result = self.turns.send(conversation_id, question, params, job)
        except BaseException:
            # What the context holds is no longer any stored turn (a read stopped part way).
            self.live.drop()
            if made is not None:
                self.forget(made)
            raise
        if result.stop_reason != "cancelled":
            self._index(
                conversation_id, request.system, (*request.pairs, (request.question, result.reply))
            )
        counters.restored_tokens += held
        return self._completion(result, counters, found.turns if found else 0)

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

    def _create(self, system: str) -> str:
        """A new API conversation, its system prompt the request's own words (no preset)."""
        conversation_id = self.conversations.create(system_prompt="none", thinking=False)
        changes: dict[str, object] = {"origin": API_ORIGIN}
        if system:
            row = self.conversations.row(conversation_id)
            changes["system_prompt"] = CUSTOM
            changes["system_enc"] = self.records.encrypt("conversations", "system_enc", row, system)
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
        self, conversation_id: str, user: str, reply: str, counters: Counters, job: Job
    ) -> None:
        """Read one earlier turn the client sent (its reply as written, nothing generated)
        and store it as the conversation's next link."""
        if not user.strip():
            raise InputError("An earlier user message is empty.")
        conversations = self.conversations
        conv = conversations.row(conversation_id)
        self.turns.ensure_live(conv, counters, job)
        engine = self.live.engine
        seq = conv["n_messages"] or 0
        first = seq == 0 and not conv["document_id"]
        prompt = engine.turns.user_text(user, conversations.system_text(conv), first)
        user_tokens = engine.turns.user_turn(prompt, False)
        reply_tokens = engine.encode_text(reply) + engine.model_close()
        needed = len(user_tokens) + len(reply_tokens)
        if needed + self.turns.reply_room() > engine.room():
            raise InputError(
                f"The messages need more than the model's {engine.n_ctx:,}-token context "
                "(context_length_exceeded); send a shorter history."
            )
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        self.turns.read_user_turn(conv, first, prompt, user_tokens, counters, job)
        reply_start = len(engine.tokens)
        counters.prefill_ms += engine.evaluate(reply_tokens, job)
        counters.new_tokens += len(reply_tokens)
        reply_end = len(engine.tokens)
        row, _record = self.live.persist(
            "conversation",
            conversation_id,
            self.turns.live_parent(conv, conv["head_block_id"]),
            self.live.next_generation(conversation_id),
            counters,
        )
        self.turns.commit_turn(
            conv, row, seq, user, reply, (user_start, reply_start, reply_end), []
        )

    def _index(
        self, conversation_id: str, system: str, pairs: Sequence[tuple[UserTurn, str]]
    ) -> None:
        """Remember where this history ends in the conversation (its tag, sealed)."""
        seq = self.conversations.row(conversation_id)["n_messages"]
        tag = self.tag(system, pairs)
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
