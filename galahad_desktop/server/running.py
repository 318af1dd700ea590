"""Starting the server on uvicorn: loopback by default, one port, graceful stop.

What a client can hold is bounded here, before the application sees a request
(`GuardedH11Protocol`): a request head must arrive whole within `Limits.head_timeout_s` of the
connection opening (or of the last response), or the connection gets a 408 and is closed; a
connection whose request has not arrived yet is the first to be closed when too many wait,
so connections that never authenticate cannot hold the room an authenticated client needs;
past `Limits.max_connections` a new connection is answered 429 in OpenAI's shape. Idle keep-alive
connections close after a few seconds, an incomplete head is capped in size, and a
response sent before the client finished its body closes the connection. uvicorn's own
access log is off (it would name client addresses); ours (app.py) holds times, sizes and
status codes only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import h11
import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from galahad_desktop.errors import InputError
from galahad_desktop.server import DEFAULT_PORT
from galahad_desktop.server.app import Limits, ServerIdentity, build_app
from galahad_desktop.server.lane import CoreLane
from galahad_desktop.server.protocol import ApiError
from galahad_desktop.sockets import listen

# A connection waiting this long for its head may be closed to make room: a real client
# sends its head within milliseconds of connecting, so a burst of them is never cut off.
HEAD_GRACE_S = 0.5


def _raw_response(status: str, error: ApiError) -> bytes:
    """A whole HTTP response in OpenAI's error shape, written where h11 has no request to
    answer (before one arrived): the connection is closed after it."""
    body = json.dumps(error.body()).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def overloaded(limits: Limits) -> ASGIApp:
    """The application a connection past `max_connections` gets: its body read (bounded),
    then 429 in OpenAI's shape with Retry-After, and the connection closed."""
    error = ApiError(
        429,
        f"The server holds {limits.max_connections} connections already; try again shortly.",
        kind="rate_limit_error",
        code="server_overloaded",
    ).body()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        async def drain() -> None:
            while (await receive()).get("more_body"):
                pass

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drain(), limits.body_timeout_s)
        headers = {"Retry-After": str(limits.retry_after_s), "Connection": "close"}
        await JSONResponse(error, status_code=429, headers=headers)(scope, receive, send)

    return app


def _late(message: str) -> ApiError:
    return ApiError(408, message, code="request_timeout")


class ConnectionGuard:
    """One server's limits, its open connections, and those whose request head has not
    arrived, oldest first."""

    def __init__(self, limits: Limits, key: Callable[[], str] | None = None) -> None:
        self.limits = limits
        self.key = key  # the server's API key (None: every connection counts as keyed)
        self.waiting: dict[GuardedH11Protocol, None] = {}  # insertion order: oldest first
        self.connections: dict[GuardedH11Protocol, None] = {}  # open, oldest first
        self.open = 0

    def holds_key(self, headers: list[tuple[bytes, bytes]]) -> bool:
        if self.key is None:
            return True
        expected = b"bearer " + self.key().encode()
        return any(
            name.lower() == b"authorization"
            and hmac.compare_digest(value.strip().lower()[:7] + value.strip()[7:], expected)
            for name, value in headers
        )

    def evictable(self, newcomer: GuardedH11Protocol) -> GuardedH11Protocol | None:
        """The oldest connection that has sent requests, none of them with the key: what it
        holds is nobody's work (a health check, a refusal), so a new connection takes its
        place rather than being refused. Connections still sending their first request are
        the head deadline's to judge."""
        for connection in self.connections:
            if connection is not newcomer and connection.requests and not connection.keyed:
                return connection
        return None


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on request heads and a cap on the
    connections that have not sent one (see the module's docstring)."""

    guard = ConnectionGuard(Limits())  # replaced per server by `guarded_protocol`
    waiting_since = 0.0  # the event loop's time its current wait for a head began
    requests = 0  # request heads it has sent
    keyed = False  # one of them carried the server's key
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard, limits = self.guard, self.guard.limits
        guard.open += 1
        guard.connections[self] = None
        crowded = guard.open > limits.max_connections
        oldest = next(iter(guard.waiting), None)
        if (crowded or len(guard.waiting) >= limits.max_waiting_heads) and (
            oldest is not None and self.loop.time() - oldest.waiting_since >= HEAD_GRACE_S
        ):
            oldest.refuse(
                "408 Request Timeout",
                _late(
                    "Too many connections are waiting to send a request; this one waited longest."
                ),
            )
        elif crowded and (victim := guard.evictable(self)) is not None:
            # Connections without the key never lock out one with it (260 clients that
            # pipeline health checks and never read held every place): the oldest goes.
            victim.transport.abort()  # its client reads nothing: a close would wait on it
        elif crowded:
            # Every connection holds a request with the key or has just opened: this one's
            # request is answered 429 once it arrives (read first, so the client sees the
            # answer rather than a reset connection).
            self.app = overloaded(limits)
        self._wait_for_head()

    def _wait_for_head(self) -> None:
        self.guard.waiting[self] = None
        self.waiting_since = self.loop.time()
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.guard.limits.head_timeout_s, self._head_late)

    def _head_arrived(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and self in self.guard.waiting:
            self.refuse(
                "408 Request Timeout",
                _late(
                    f"The request head did not arrive within {self.guard.limits.head_timeout_s:g} s"
                ),
            )

    def refuse(self, status: str, error: ApiError) -> None:
        self._head_arrived()
        if not self.transport.is_closing():
            self.transport.write(_raw_response(status, error))
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE and self in self.guard.waiting:
            self._head_arrived()
            self.requests += 1
            scope = getattr(self, "scope", None)
            if not self.keyed and scope is not None:
                self.keyed = self.guard.holds_key(list(scope.get("headers", [])))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:
            # Answered before its body was read (a refusal): a trickling body must not hold
            # the connection, so it ends here.
            self.transport.close()
        elif self.conn.their_state is h11.IDLE:
            self._wait_for_head()  # kept alive: the next head has its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        self.guard.connections.pop(self, None)
        self.guard.open -= 1
        super().connection_lost(exc)


def guarded_protocol(
    limits: Limits, key: Callable[[], str] | None = None
) -> type[GuardedH11Protocol]:
    """A protocol class with its own guard: one per server."""
    guard = ConnectionGuard(limits, key)
    return type("ServerH11Protocol", (GuardedH11Protocol,), {"guard": guard})


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"


def check_host(host: str, allow_network: bool) -> str:
    """Loopback unless the user asks for more, by flag (a non-loopback address is refused
    without it)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InputError(f"--host {host!r} is not an IP address (e.g. 127.0.0.1).") from None
    if not address.is_loopback and not allow_network:
        raise InputError(
            f"--host {host} is reachable from other computers; the server answers loopback "
            "only unless you add --allow-network (then anyone with the key can use it)."
        )
    return host


def check_port(port: int) -> int:
    """A port number the server can listen on (0: any free port)."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port {port} is not a port number; use 1 to 65535 (0: any free).")
    return port


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the server starts (so the port is known, and a
    port in use is a clear error rather than a log line)."""
    return listen(host, check_port(port), 64, f"Cannot listen on {host}:{port}")


class LocalServer:
    """The server on its socket; `serve()` blocks (the command), `start()` runs it on a
    thread (the window, tests); `stop()` ends it gracefully."""

    def __init__(
        self,
        lane: CoreLane,
        identity: ServerIdentity,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        limits: Limits | None = None,
    ) -> None:
        self.socket = bind(host, port)
        self.address = Address(host, int(self.socket.getsockname()[1]))
        limits = limits or Limits()
        config = uvicorn.Config(
            build_app(lane, identity, limits, network=not ipaddress.ip_address(host).is_loopback),
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http=guarded_protocol(limits, identity.key),
            ws="none",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=5,
            h11_max_incomplete_event_size=64 * 1024,
            server_header=False,
        )
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    def serve(self, on_ready: Callable[[Address], None] | None = None) -> None:
        """Serve until Ctrl+C (uvicorn's own signal handling) or stop()."""
        if on_ready is not None:
            ready = self.address

            def watch() -> None:
                while not self.server.started and not self.server.should_exit:
                    threading.Event().wait(0.02)
                if self.server.started:
                    on_ready(ready)

            threading.Thread(target=watch, daemon=True).start()
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def start(self) -> Address:
        """Serve on a thread; returns once it accepts connections."""
        started = threading.Event()
        self.thread = threading.Thread(
            target=self.serve, args=(lambda _a: started.set(),), name="galahad-server", daemon=True
        )
        self.thread.start()
        while not started.wait(0.05):
            if not self.thread.is_alive():
                raise InputError("The local server could not start.")
        return self.address

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)


def quiet_uvicorn() -> None:
    """uvicorn's error log names the client's address for a bad request: kept at warnings."""
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
