"""Talking to an MCP server with the official SDK: list its tools, call one.

Each request opens its own connection (a stdio server is started, used and stopped; an
HTTP session is opened and closed): a server that crashed is simply started again next time,
and nothing outlives the call that needed it. A call is stopped by the job's Stop (checked
every 50 ms) or by the server's time limit; a stdio server's whole process group is then
stopped. What a server sends is read within bounds (toolbox/bounds.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO, TypeVar, cast

import anyio

from galahad_desktop.errors import CancelledError, GalahadError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.toolbox.bounds import Guard, http_transport, stdio_transport
from galahad_desktop.toolbox.servers import ToolServer

if TYPE_CHECKING:
    import mcp_types
    from mcp import ClientSession

T = TypeVar("T")
CONNECT_TIMEOUT_S = 30.0  # starting a server and the protocol's handshake
MAX_RESULT_CHARS = 16_000  # what a result may put in the context (the rest is cut, and said)
MAX_TOOLS = 128  # offered from one server (a longer list is cut, and the log says so)
MAX_DESCRIPTION_CHARS = 2_000  # of one tool: it is in the prompt of every chat that offers it


log = logging.getLogger(__name__)


class _OneLine(logging.Handler):
    """The SDK's own log, one line a record: it logs a message it cannot read (a tool list
    nested 900 deep) with its whole traceback, which reached the person's terminal."""

    unreadable = 0  # messages the SDK could not read, so far (a timeout then says so)

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            _OneLine.unreadable += 1
        what = f" ({type(record.exc_info[1]).__name__})" if record.exc_info else ""
        first = record.getMessage().splitlines()[0][:300] if record.getMessage() else ""
        log.log(record.levelno, "the MCP SDK: %s%s", first, what)


_SDK_LOG = logging.getLogger("mcp")
if not any(isinstance(h, _OneLine) for h in _SDK_LOG.handlers):
    _SDK_LOG.addHandler(_OneLine())
    _SDK_LOG.propagate = False


class ToolServerError(GalahadError):
    """An MCP server could not be started, reached or understood, or stopped mid-call."""

    exit_code = 69  # EX_UNAVAILABLE


@dataclass(frozen=True)
class OfferedTool:
    """A tool as a server describes it."""

    name: str
    description: str
    parameters: dict[str, Any]  # the JSON schema of its arguments


@dataclass(frozen=True)
class ToolAnswer:
    text: str  # what goes back to the model (cut to MAX_RESULT_CHARS)
    is_error: bool  # the tool said its call failed (the model is told so)
    elapsed_ms: float


class ServerWords:
    """A stdio server's stderr: read as it comes, only its last 4,000 characters kept (a
    server that writes without end fills neither a disk nor memory), its last line named
    when it fails."""

    KEEP = 4000

    def __init__(self) -> None:
        read_end, write_end = os.pipe()
        self.writer = cast(TextIO, os.fdopen(write_end, "w", encoding="utf-8", errors="replace"))
        self._reader = os.fdopen(read_end, "r", encoding="utf-8", errors="replace")
        self._tail = ""
        self._thread = threading.Thread(target=self._drain, name="mcp-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._reader:
            while piece := self._reader.read(4096):
                self._tail = (self._tail + piece)[-self.KEEP :]

    def close(self) -> None:
        self.writer.close()  # the server's copy closes when it exits: then the reader ends
        self._thread.join(2)

    def last_line(self) -> str:
        lines = [line.strip() for line in self._tail.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""


async def _session_run(
    server: ToolServer,
    errlog: TextIO,
    work: Callable[[ClientSession], Awaitable[T]],
    refused: list[int],
    guard: Guard,
) -> T:
    # The SDK is imported when a tool is first used: the app starts without it.
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    if server.url:
        import httpx2

        # Our own client carries the server's headers and reads within the bounds;
        # redirects stay off (the SDK follows those within the endpoint's origin itself).
        async def note(response: httpx2.Response) -> None:
            if response.status_code >= 400:  # the SDK's error does not say which
                refused.append(response.status_code)

        async with (
            httpx2.AsyncClient(
                headers=dict(server.headers),
                follow_redirects=False,
                event_hooks={"response": [note]},
                transport=http_transport(guard),
            ) as http,
            streamable_http_client(server.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            with anyio.fail_after(CONNECT_TIMEOUT_S):
                await session.initialize()
            return await work(session)
    async with (
        stdio_transport(server.command, errlog, guard) as (read, write),
        ClientSession(read, write) as session,
    ):
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            await session.initialize()
        return await work(session)


def _run(
    server: ToolServer, job: Job, what: str, work: Callable[[ClientSession], Awaitable[T]]
) -> T:
    """Run `work` on a fresh session; Stop and the server's time limit end it. Every way it
    can fail becomes a message that names the server."""
    stopped = False
    unreadable = _OneLine.unreadable
    refused: list[int] = []  # HTTP statuses a URL server answered with
    guard = Guard()  # what the server may send: the first bound it passes stops the session
    started: list[bool] = []  # the handshake answered: what times out after is the work

    async def bounded(session: ClientSession) -> T:
        started.append(True)
        with anyio.fail_after(server.timeout_s):  # the tool's limit, listing included
            return await work(session)

    async def main() -> T:
        nonlocal stopped
        result: list[T] = []

        async def watch(scope: anyio.CancelScope) -> None:
            nonlocal stopped
            while not job.cancelled:
                await anyio.sleep(0.05)
            stopped = True
            scope.cancel()

        async def go(scope: anyio.CancelScope) -> None:
            result.append(await _session_run(server, errlog, bounded, refused, guard))
            scope.cancel()

        with anyio.fail_after(server.timeout_s + CONNECT_TIMEOUT_S):
            async with anyio.create_task_group() as group:
                guard.arm(group.cancel_scope.cancel)
                group.start_soon(watch, group.cancel_scope)
                group.start_soon(go, group.cancel_scope)
        if guard.hit:
            raise _passed_bound(server, what, guard)
        if not result:
            raise CancelledError(f"Stopped: {what} was stopped before it answered.")
        return result[0]

    words = ServerWords()  # the server's stderr: its last words name a crash
    errlog = words.writer
    with contextlib.closing(words):
        try:
            return anyio.run(main)
        except Exception as raised:  # the SDK's, the transport's, a server's protocol errors
            exc = _leaf(raised)
            if guard.hit:
                raise _passed_bound(server, what, guard) from None
            if isinstance(exc, GalahadError):
                raise exc from None
            if stopped or job.cancelled:
                raise CancelledError(f"Stopped: {what} was stopped before it answered.") from None
            garbled = _OneLine.unreadable > unreadable
            raise _failed(server, what, exc, bool(started), garbled, refused, words) from None


def _failed(
    server: ToolServer,
    what: str,
    exc: BaseException,
    started: bool,
    garbled: bool,
    refused: list[int],
    words: ServerWords,
) -> ToolServerError:
    """What a session that failed is told: by the way it failed, naming the server.
    `garbled`: it sent what could not be read as MCP; `refused`: HTTP statuses it gave."""
    if isinstance(exc, TimeoutError) and not started:
        return ToolServerError(
            f"The tool server '{server.name}' did not start and answer MCP's "
            f"handshake within {CONNECT_TIMEOUT_S:.0f} s; it was stopped."
        )
    if isinstance(exc, TimeoutError):
        unread = ": what it sent could not be read as MCP (see the log)" if garbled else ""
        return ToolServerError(
            f"The tool server '{server.name}' did not answer within "
            f"{server.timeout_s:.0f} s ({what}){unread}; it was stopped."
        )
    if isinstance(exc, FileNotFoundError):
        return ToolServerError(
            f"The tool server '{server.name}' could not be started: no program "
            f"'{server.command[0] if server.command else server.url}' was found."
        )
    if isinstance(exc, PermissionError):
        return ToolServerError(
            f"The tool server '{server.name}' could not be started: its program may "
            "not be run (permission denied)."
        )
    words.close()  # everything it wrote has been read
    said = words.last_line()
    if refused:
        key = " (it wants a key: add the header it expects)" if refused[-1] in (401, 403) else ""
        return ToolServerError(
            f"The tool server '{server.name}' refused the request ({what}): HTTP "
            f"{refused[-1]}{key}."
        )
    return ToolServerError(
        f"The tool server '{server.name}' failed ({what}): {_reason(exc)}"
        + (f" Its last words: {said}" if said else "")
    )


def _passed_bound(server: ToolServer, what: str, guard: Guard) -> ToolServerError:
    return ToolServerError(
        f"The tool server '{server.name}' sent more than Galahad reads ({what}): "
        f"{guard.hit}; it was stopped."
    )


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside exception groups (task groups wrap what their tasks raise)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reason(exc: BaseException) -> str:
    """What went wrong, in words."""
    text = str(exc).strip() or type(exc).__name__
    if "Connection closed" in text or isinstance(exc, anyio.ClosedResourceError):
        return "it stopped (or closed the connection) before it answered."
    if "ConnectError" in type(exc).__name__ or "connect" in text.lower():
        return f"it could not be reached ({text[:200]})."
    return text[:300] + ("" if text.endswith(".") else ".")


def sdk_version() -> str:
    """The MCP SDK's version, its two transports imported ("" when it cannot be loaded:
    a bundle built without it)."""
    try:
        from importlib.metadata import version

        import mcp.client.stdio
        import mcp.client.streamable_http  # noqa: F401

        return version("mcp")
    except Exception:  # ImportError, a missing distribution's metadata
        return ""


def list_tools(server: ToolServer, job: Job = NO_JOB) -> list[OfferedTool]:
    """The tools a server offers (at most MAX_TOOLS)."""

    async def work(session: ClientSession) -> list[OfferedTool]:
        listed = await session.list_tools()
        if len(listed.tools) > MAX_TOOLS:
            log.warning(
                "the tool server %s offers %d tools: the first %d are used",
                server.name,
                len(listed.tools),
                MAX_TOOLS,
            )
        return [
            OfferedTool(t.name, _cut(t.description or ""), _clean_schema(t.input_schema or {}))
            for t in listed.tools[:MAX_TOOLS]
        ]

    return _run(server, job, "listing its tools", work)


def _cut(description: str) -> str:
    if len(description) <= MAX_DESCRIPTION_CHARS:
        return description
    cut = len(description) - MAX_DESCRIPTION_CHARS
    return description[:MAX_DESCRIPTION_CHARS] + f" … (cut: {cut:,} more characters)"


def call_tool(
    server: ToolServer, name: str, arguments: dict[str, Any], job: Job = NO_JOB
) -> ToolAnswer:
    """Call one tool; a tool that reports an error is an answer (the model is told), not an
    exception. Raises CancelledError on Stop, ToolServerError when the server fails."""
    started = time.perf_counter()

    import mcp_types

    async def work(session: ClientSession) -> mcp_types.CallToolResult:
        called = await session.call_tool(name, arguments)  # _run holds it to its limit
        if not isinstance(called, mcp_types.CallToolResult):
            raise ToolServerError(f"The tool server '{server.name}' asked for more input.")
        return called

    result = _run(server, job, f"the tool '{name}'", work)
    return ToolAnswer(_result_text(result), result.is_error, (time.perf_counter() - started) * 1000)


def _result_text(result: mcp_types.CallToolResult) -> str:
    """A result's content as text: text parts as they are, other parts described."""
    import mcp_types

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4:,} bytes]")
        else:
            parts.append(f"[{block.type}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        cut = len(text) - MAX_RESULT_CHARS
        text = text[:MAX_RESULT_CHARS] + f"\n… (cut: {cut:,} more characters)"
    return text


def _clean_schema(schema: Any) -> dict[str, Any]:
    """A tool's argument schema without the titles SDKs add to every schema (each costs the
    model tokens in every declaration and says nothing the names do not)."""

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "title" and isinstance(value, str):
                    continue
                if key == "properties" and isinstance(value, dict):
                    out[key] = {k: clean(v) for k, v in value.items()}
                else:
                    out[key] = clean(value)
            return out
        if isinstance(node, list):
            return [clean(item) for item in node]
        return node

    cleaned = clean(schema)
    return cleaned if isinstance(cleaned, dict) else {}
