"""Starting the server on uvicorn: loopback by default, one port, graceful stop.

uvicorn bounds what a client can hold: `limit_concurrency` answers 503 past that many open
connections, idle keep-alive connections close after a few seconds, and an incomplete
request head is capped. uvicorn's own access log is off (it would name client addresses);
ours (app.py) holds times, sizes and status codes only.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from galahad_desktop.errors import InputError
from galahad_desktop.server import DEFAULT_PORT
from galahad_desktop.server.app import Limits, ServerIdentity, build_app
from galahad_desktop.server.lane import CoreLane
from galahad_desktop.sockets import listen

MAX_CONNECTIONS = 32


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


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the server starts (so the port is known, and a
    port in use is a clear error rather than a log line)."""
    return listen(host, port, 64, f"Cannot listen on {host}:{port}")


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
        config = uvicorn.Config(
            build_app(lane, identity, limits),
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            ws="none",
            limit_concurrency=MAX_CONNECTIONS,
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
