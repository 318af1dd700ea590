"""An API request's messages as the turns a conversation stores.

A turn is a prompt and a reply. The prompt is the user's message, or the results of the
tools the previous reply called (given back inside that reply's model turn); a reply is the
model's text and the calls it made. Messages of one role in a row are joined (as one turn).
Everything is checked before anything is read, and each problem names its message.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from galahad_desktop.errors import InputError, check_text
from galahad_desktop.memory.chat.system_prompt import MAX_SYSTEM_CHARS
from galahad_desktop.memory.results import ChatMessage, Tool, ToolCall


@dataclass(frozen=True)
class UserTurn:
    """A turn's prompt: the user's text and the pictures it holds (type, bytes) or, for a
    turn that gives tool results back, those results (name, text) and no words."""

    text: str
    pictures: tuple[tuple[str, bytes], ...] = ()
    results: tuple[tuple[str, str], ...] = ()

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

    def key(self) -> list[Any]:
        """What the history's tag holds of it (a plain message as it always has)."""
        if self.results:
            return ["results", [list(r) for r in self.results]]
        return [self.text, self.digests]


@dataclass(frozen=True)
class Reply:
    """A turn's reply: the model's text and the tools it called."""

    text: str
    calls: tuple[ToolCall, ...] = ()

    def key(self) -> Any:
        return [self.text, calls_key(self.calls)] if self.calls else self.text


def calls_key(calls: Sequence[ToolCall]) -> list[list[Any]]:
    """The calls without their ids (a client may renumber them; the tokens do not hold them)."""
    return [[c.name, c.arguments] for c in calls]


@dataclass(frozen=True)
class ChatShape:
    """A request as turns: the system prompt, the tools offered, the earlier (prompt, reply)
    pairs, the new prompt."""

    system: str
    pairs: tuple[tuple[UserTurn, Reply], ...]
    question: UserTurn
    tools: tuple[Tool, ...] = ()


def shape(messages: Sequence[ChatMessage], tools: Sequence[Tool] = ()) -> ChatShape:
    """Check a request's messages and put them in turns. System messages are taken at the
    start only; a tool message answers a call of the assistant message before it."""
    if not messages:
        raise InputError("'messages' is empty: a chat request needs at least one message.")
    system_parts: list[str] = []
    index = 0
    while index < len(messages) and messages[index].role == "system":
        system_parts.append(messages[index].text)
        index += 1
    steps: list[UserTurn | Reply] = []
    pending: dict[str, str] = {}  # the last assistant's calls not yet answered: id -> name
    for number, message in enumerate(messages[index:], start=index):
        where = f"messages[{number}]"
        check_text(message.text, f"{where}.content")
        last = steps[-1] if steps else None
        if message.role == "system":
            raise InputError(
                f"{where} is a system message after the conversation started; "
                "system messages are taken at the start only."
            )
        if message.role == "tool":
            name = pending.pop(message.call_id, None)
            if name is None:
                raise InputError(
                    f"{where} answers the call {message.call_id!r}, which the assistant "
                    "message before it did not make (or another tool message answered)."
                )
            answered = (name, message.text)
            if isinstance(last, UserTurn) and last.results:
                steps[-1] = UserTurn("", (), (*last.results, answered))
            else:
                steps.append(UserTurn("", (), (answered,)))
            continue
        if pending:
            raise InputError(
                f"{where}: the assistant's tool calls before it are not all answered by tool "
                "messages (one for each call, right after it)."
            )
        if message.role == "assistant":
            if isinstance(last, Reply):  # two assistant messages in a row: one reply
                steps[-1] = Reply(last.text + "\n\n" + message.text, message.calls)
            else:
                steps.append(Reply(message.text, message.calls))
            pending = {c.id: c.name for c in message.calls}
            if len(pending) < len(message.calls):
                # Two calls under one id would both be taken as answered by one result.
                ids = [c.id for c in message.calls]
                twice = next(i for i in ids if ids.count(i) > 1)
                raise InputError(
                    f"{where}.tool_calls: the id {twice!r} is given to more than one call; "
                    "each call needs its own id, answered by its own tool message."
                )
            continue
        said = UserTurn(message.text, message.pictures)
        if isinstance(last, UserTurn) and not last.results:
            said = UserTurn(last.text + "\n\n" + said.text, last.pictures + said.pictures)
            steps[-1] = said
        else:
            steps.append(said)
    if pending:
        raise InputError(
            "The last message's tool calls are not answered: add a tool message "
            "for each (there is nothing to answer yet)."
        )
    if not steps or not isinstance(steps[-1], UserTurn):
        raise InputError("The last message must be the user's (there is nothing to answer).")
    if not isinstance(steps[0], UserTurn) or steps[0].results:
        raise InputError("The conversation must start with a user message (after any system).")
    if not steps[-1].results and not steps[-1].text.strip():
        raise InputError("The last user message has no text (a picture needs a question).")
    system = "\n\n".join(system_parts).strip()
    if len(system) > MAX_SYSTEM_CHARS:
        raise InputError(f"A system prompt can be at most {MAX_SYSTEM_CHARS:,} characters.")
    prompts = [s for s in steps[0::2] if isinstance(s, UserTurn)]
    replies = [s for s in steps[1::2] if isinstance(s, Reply)]
    if len(prompts) != len(replies) + 1:  # alternation is what the loop above makes
        raise InputError("The messages do not alternate between user and assistant.")
    pairs = tuple(zip(prompts[:-1], replies, strict=True))
    return ChatShape(check_text(system, "The system prompt"), pairs, prompts[-1], tuple(tools))


def tag_key(version: int, request: ChatShape, turns: int, tools: list[dict[str, Any]]) -> str:
    """The text a history's keyed tag is made of: unchanged for a history without tools."""
    said = [[*user.key(), reply.key()] for user, reply in request.pairs[:turns]]
    if not any(user.results or reply.calls for user, reply in request.pairs[:turns]):
        said = [[user.text, user.digests, reply.text] for user, reply in request.pairs[:turns]]
    key: list[Any] = [version, request.system, said]
    if tools:
        key.append(tools)
    return json.dumps(key, ensure_ascii=False)
