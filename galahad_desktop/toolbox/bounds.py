"""What an MCP server may send, held while it is read — not after.

The SDK's transports read a message whole before anyone looks at it: a server streaming an
endless body grew `tools show` to 4 GB in 16 s, a 90 MB result of 3 million content parts to
5.8 GB, and a tool list nested 900 deep failed inside the SDK's parser (a traceback, then a
90 s wait). So the stdio transport here reads a line at most MAX_MESSAGE_BYTES long and looks
at its JSON before the SDK's models are built; an HTTP server's responses go through a
transport that counts their bytes and looks at each JSON body or event the same way. The
first bound passed stops the session at once, and the message names it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import anyio

if TYPE_CHECKING:
    import httpx2
    from anyio.abc import Process
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.shared.message import SessionMessage

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a line on stdio, a response body over HTTP
MAX_DEPTH = 100  # JSON nesting of a message (a tool schema within it: the engine allows 64)
MAX_PARTS = 1_000  # content parts of one tool result
MAX_LISTED = 1_000  # tools in one list (the first 128 are offered; past this it is refused)
EXIT_GRACE_S = 2.0  # a stdio server's time to exit once its input closes, then its group is killed

log = logging.getLogger(__name__)


class Guard:
    """One session's bounds: the first one a server passes is kept, to be named, and the
    session is stopped (the scope armed by the caller is cancelled)."""

    def __init__(self) -> None:
        self.hit = ""
        self._stop: Callable[[], None] | None = None

    def arm(self, stop: Callable[[], None]) -> None:
        self._stop = stop

    def exceeded(self, what: str) -> None:
        if not self.hit:
            self.hit = what
            log.info("a tool server passed a bound: %s", what)  # the error names it
        if self._stop is not None:
            self._stop()

    def look(self, raw: bytes | str) -> Any:
        """A message's JSON, or None when it passes a bound (said) or is not JSON (its
        parse error is raised: the SDK's session reports what it cannot read)."""
        try:
            data = json.loads(raw)
        except RecursionError:
            self.exceeded(f"what it sent nests deeper than {MAX_DEPTH} levels")
            return None
        problem = message_problem(data)
        if problem:
            self.exceeded(problem)
            return None
        return data


def message_problem(data: Any) -> str:
    """The bound a parsed message passes, in words ('' when it passes none)."""
    depth = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            depth = max(depth, level)
            if depth > MAX_DEPTH:
                return f"what it sent nests deeper than {MAX_DEPTH} levels"
            stack.extend((child, level + 1) for child in node if isinstance(child, dict | list))
    result = data.get("result") if isinstance(data, dict) else None
    if isinstance(result, dict):
        parts, tools = result.get("content"), result.get("tools")
        if isinstance(parts, list) and len(parts) > MAX_PARTS:
            return f"a result of {len(parts):,} content parts (at most {MAX_PARTS:,} are read)"
        if isinstance(tools, list) and len(tools) > MAX_LISTED:
            return f"a list of {len(tools):,} tools (at most {MAX_LISTED:,} are read)"
    return ""


def too_long() -> str:
    return f"a message longer than {MAX_MESSAGE_BYTES // (1024 * 1024)} MiB"


# -- stdio -------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def stdio_transport(
    command: Sequence[str], errlog: TextIO, guard: Guard
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """Run a server in its own process group and exchange JSON-RPC lines with it. When the
    session ends its input is closed; whatever of its group is left EXIT_GRACE_S later is
    killed (a background child the server started goes with it)."""
    import mcp_types
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(
        list(command), env=get_default_environment(), stderr=errlog, start_new_session=True
    )
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def deliver(line: bytes) -> bool:
        """Hand one line to the session; False once the session should hear no more."""
        if not line.strip():
            return True
        try:
            data = guard.look(line)
        except ValueError as exc:  # not JSON: the session says what it could not read
            await to_session.send(exc)
            return True
        if data is None:
            return False
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_python(data, by_name=False)
        except ValueError as exc:
            await to_session.send(exc)
            return True
        await to_session.send(SessionMessage(message))
        return True

    async def read() -> None:
        assert process.stdout is not None
        pending = bytearray()
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with to_session:
                async for chunk in process.stdout:
                    *lines, rest = chunk.split(b"\n")
                    for line in lines:
                        pending += line
                        if len(pending) > MAX_MESSAGE_BYTES:
                            guard.exceeded(too_long())
                            return
                        if not await deliver(bytes(pending)):
                            return
                        pending.clear()
                    pending += rest
                    if len(pending) > MAX_MESSAGE_BYTES:
                        guard.exceeded(too_long())
                        return

    async def write() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for outgoing in from_session:
                    text = outgoing.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the server stopped reading: the session hears it

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        group.start_soon(write)
        try:
            yield from_server, to_server
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            group.cancel_scope.cancel()


async def _stop(process: Process) -> None:
    """Close the server's input, give it EXIT_GRACE_S to exit, then end its whole group
    (SIGTERM, and SIGKILL a second later): members left after its exit are killed too."""
    if process.stdin is not None:
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(EXIT_GRACE_S):
        while process.returncode is None:
            await anyio.sleep(0.01)
    for sent in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sent)
        except (ProcessLookupError, PermissionError):
            break  # the group is empty
        if process.returncode is None:
            with anyio.move_on_after(1.0):
                while process.returncode is None:
                    await anyio.sleep(0.01)
        elif sent == signal.SIGTERM:
            await anyio.sleep(0.05)  # a member that catches SIGTERM gets SIGKILL next
    with anyio.move_on_after(1.0), contextlib.suppress(OSError, anyio.BrokenResourceError):
        await process.aclose()


# -- streamable HTTP ---------------------------------------------------------------------------
def http_transport(guard: Guard) -> httpx2.AsyncBaseTransport:
    """An HTTP transport whose responses are read at most MAX_MESSAGE_BYTES long, each JSON
    body and event looked at before the SDK reads it."""
    import httpx2

    class Bounded(httpx2.AsyncByteStream):
        def __init__(self, inner: httpx2.AsyncByteStream, events: bool) -> None:
            self._inner = inner
            self._events = events  # text/event-stream: each event's data is one message

        async def __aiter__(self) -> AsyncIterator[bytes]:
            total = 0
            body = bytearray()
            async for part in self._inner:
                total += len(part)
                if total > MAX_MESSAGE_BYTES:
                    guard.exceeded(too_long())
                    raise httpx2.ReadError(guard.hit)
                body += part
                if self._events:
                    *events, rest = bytes(body).replace(b"\r\n", b"\n").split(b"\n\n")
                    body = bytearray(rest)
                    for event in events:
                        self._look_at_event(event)
                yield part
            if not self._events and body.strip():
                with contextlib.suppress(ValueError):  # not JSON: the SDK says so
                    if guard.look(bytes(body)) is None:
                        raise httpx2.ReadError(guard.hit)

        def _look_at_event(self, event: bytes) -> None:
            data = b"\n".join(
                line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
            )
            if data.strip():
                with contextlib.suppress(ValueError):
                    if guard.look(data) is None:
                        raise httpx2.ReadError(guard.hit)

        async def aclose(self) -> None:
            await self._inner.aclose()

    class Transport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            response = await self._inner.handle_async_request(request)
            stream = response.stream
            assert isinstance(stream, httpx2.AsyncByteStream)
            events = "text/event-stream" in response.headers.get("content-type", "")
            return httpx2.Response(
                status_code=response.status_code,
                headers=response.headers,
                stream=Bounded(stream, events),
                extensions=response.extensions,
            )

        async def aclose(self) -> None:
            await self._inner.aclose()

    return Transport()
