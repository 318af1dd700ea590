"""The device worker: llama.cpp's RPC server on a private loopback port, in its own process.

`galahad serve-device` starts it and passes one client at a time through to it
(devices.serve_rpc); llama.cpp's serving loop never returns to Python, so it runs here,
where the parent can stop it. `python -m galahad_desktop.engine.device_worker HOST:PORT
THREADS` (the frozen app: `--device-worker HOST:PORT THREADS`).
"""

from __future__ import annotations

import os
import sys
import threading

from galahad_desktop.engine.devices import serve_rpc_here
from galahad_desktop.errors import GalahadError


def _exit_with_parent() -> None:
    """The parent holds this process's stdin open; when it goes (however it ends: Ctrl+C,
    SIGTERM, kill -9), stdin reaches its end and the worker goes with it, never left
    serving a device on its own."""
    sys.stdin.buffer.read()
    os._exit(0)


def run(endpoint: str, threads: str) -> int:
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    try:
        serve_rpc_here(endpoint, int(threads))
    except GalahadError as exc:
        print(f"galahad: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(run(*sys.argv[1:3]))
