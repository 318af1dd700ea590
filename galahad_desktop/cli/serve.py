"""`galahad serve`: the local OpenAI-compatible server from the terminal."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from galahad_desktop.cli.common import Output
from galahad_desktop.server import DEFAULT_PORT

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.memory.galahad import Galahad


def cmd_serve(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    if args.show_key or args.rotate_key:
        key = core.api_key(rotate=args.rotate_key)
        out.result({"api_key": key}, key)
        return 0
    from galahad_desktop.server.app import ServerIdentity
    from galahad_desktop.server.lane import ThreadLane
    from galahad_desktop.server.running import LocalServer, check_host, check_port, quiet_uvicorn

    host = check_host(args.host, args.allow_network)
    check_port(args.port)  # before the model loads
    lane = ThreadLane(core)
    try:
        key = lane.call(lambda c: c.api_key())
        info = lane.call(lambda c: c.info())
        identity = ServerIdentity(info.model.name, lambda: key, context_length=info.n_ctx)
        server = LocalServer(lane, identity, host, args.port)
        quiet_uvicorn()
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        access = logging.getLogger("galahad.server.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False

        def ready(address: Any) -> None:
            if not address.host.startswith("127.") and address.host != "::1":
                out.info(f"Warning: {address.host} is reachable from other computers.")
            if out.as_json:
                print(json.dumps({"base_url": address.base_url, "api_key": key}), flush=True)
            else:
                out.info(
                    f"Serving {info.model.name} at {address.base_url} (OpenAI-compatible). "
                    f"API key: {key}\nCtrl+C stops."
                )

        with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C: already shut down gracefully
            server.serve(ready)
        out.info("Server stopped.")
        return 0
    finally:
        lane.close()


def register(add: Any) -> None:
    p = add(
        "serve",
        "an OpenAI-compatible server on 127.0.0.1 whose prompt memory survives restarts",
        cmd_serve,
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"default {DEFAULT_PORT}; 0 picks a free port",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (loopback)")
    p.add_argument(
        "--allow-network",
        action="store_true",
        help="allow a --host other computers can reach (anyone with the key can use it)",
    )
    p.add_argument("--show-key", action="store_true", help="print the API key and exit")
    p.add_argument("--rotate-key", action="store_true", help="make a new API key, print it, exit")
