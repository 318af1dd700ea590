"""The values of tool calls and the chat API's messages, which the core, the window and the
server share (re-exported by results.py, where the other values live)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ChatRole = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A function the model called: its arguments as the JSON object it wrote."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Tool:
    """A function a client offers the model (OpenAI's `tools` entry)."""

    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of the arguments


@dataclass(frozen=True)
class ReplyShape:
    """What a reply must be: free text, JSON (to a schema, or any object), or a call of
    the offered tools. `tool_choice`: auto, none, required, or "=NAME" for that tool."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"
    parallel_calls: bool = True


@dataclass(frozen=True)
class ChatMessage:
    """One message of an API client's chat request (OpenAI's roles). An assistant message
    may hold the calls it made; a tool message answers the call `call_id`."""

    role: ChatRole
    text: str
    pictures: tuple[tuple[str, bytes], ...] = ()  # (type: png|jpeg|webp|gif, the file's bytes)
    calls: tuple[ToolCall, ...] = ()
    call_id: str = ""


@dataclass(frozen=True)
class ToolServerInfo:
    """An MCP server the window's chats may use (its command line or URL)."""

    name: str
    target: str
    timeout_s: float
    always: tuple[str, ...]  # its tools the user allowed to run without asking
    checked: tuple[str, ...] = ()  # the tools it offered when it was checked on adding


@dataclass(frozen=True)
class ConversationTool:
    """A tool a conversation offers the model: the name the model calls, where it runs."""

    name: str
    server: str
    tool: str
    description: str


@dataclass(frozen=True)
class ToolRun:
    """A call the window ran (or did not): what goes back to the model as its result."""

    call_id: str
    name: str
    text: str
    is_error: bool = False
    elapsed_ms: float = 0.0
    ran: bool = True  # False: denied, stopped or not reached
