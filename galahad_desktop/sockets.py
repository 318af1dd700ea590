"""A listening socket, bound before anything is served on it: the port is known at once, and
a port in use is a clear error rather than a log line."""

from __future__ import annotations

import socket

from galahad_desktop.errors import InputError


def listen(host: str, port: int, backlog: int, refusal: str) -> socket.socket:
    """Bind and listen on host:port; `refusal` starts the error when that fails ("Cannot
    serve on 127.0.0.1:50052"), the system's reason follows."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"{refusal} ({exc.strerror}).") from None
    sock.listen(backlog)
    return sock
