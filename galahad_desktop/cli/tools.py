"""MCP tool servers from the terminal: the same list the window's Settings → Tools shows."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

from galahad_desktop.cli.common import Output
from galahad_desktop.errors import InputError

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.memory.galahad import Galahad


def cmd_tools(core: Galahad, out: Output, args: argparse.Namespace) -> int:
    items = list(args.items)
    if args.action == "list":
        servers = core.tool_servers()
        out.result(
            {"servers": servers},
            "\n".join(
                f"{s.name}  {s.target}  (limit {s.timeout_s:.0f} s"
                + (f"; runs without asking: {', '.join(s.always)})" if s.always else ")")
                for s in servers
            )
            or "No tool servers yet: galahad tools add NAME 'COMMAND LINE' (or a URL).",
        )
        return 0
    if not items:
        raise InputError(f"tools {args.action} needs the server's NAME.")
    name = items[0]
    if args.action == "add":
        if len(items) < 2:
            raise InputError("tools add needs NAME and a command line or URL.")
        # One argument is the command line as typed; several are its words.
        target = items[1] if len(items) == 2 else shlex.join(items[1:])
        server = core.add_tool_server(
            name, target, args.timeout, header_lines(args), check=not args.no_check
        )
        offers = (
            "; not started (--no-check)"
            if args.no_check
            else f"; it started and offers {len(server.checked)} tool(s)"
            + (f": {', '.join(server.checked[:8])}" if server.checked else "")
            + (" …" if len(server.checked) > 8 else "")
        )
        out.result(server, f"Added the tool server '{server.name}': {server.target}{offers}")
        return 0
    if args.action == "remove":
        core.remove_tool_server(name)
        out.result({"removed": name}, f"Removed the tool server '{name}'.")
        return 0
    tools = core.server_tools(name)  # show: the server is started (or reached) and asked
    out.result(
        {"server": name, "tools": tools},
        "\n".join(f"{t.name}  {t.description}" for t in tools) or f"{name} offers no tools.",
    )
    return 0


def header_lines(args: argparse.Namespace) -> list[str]:
    """The headers given on the command line, from environment variables and from standard
    input: the last two keep a token out of the process's argument list (`ps` shows it)."""
    lines = list(args.header)
    for variable in args.header_env:
        value = os.environ.get(variable)
        if value is None:
            raise InputError(f"--header-env {variable}: no such environment variable is set.")
        lines.append(value)
    if args.headers_stdin:
        lines += sys.stdin.read(64 * 1024).splitlines()
    return lines


def register(add: Any) -> None:
    p = add(
        "tools",
        "MCP tool servers the window's chats may use: list, add NAME COMMAND-or-URL, "
        "show NAME (its tools), remove NAME",
        cmd_tools,
    )
    p.add_argument("action", choices=["list", "add", "show", "remove"])
    p.add_argument("items", nargs="*", help="NAME, then for add: a command line or URL")
    p.add_argument("--timeout", type=float, default=60.0, help="add: a call's time limit (s)")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="add: store it without starting it first (a server that can only start later)",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="add: a header a URL server needs (repeatable; kept encrypted, never shown; "
        "`ps` shows it while the command runs: --header-env or --headers-stdin do not)",
    )
    p.add_argument(
        "--header-env",
        action="append",
        default=[],
        metavar="VARIABLE",
        help="add: a header ('Name: value') read from this environment variable",
    )
    p.add_argument(
        "--headers-stdin",
        action="store_true",
        help="add: headers read from standard input, one 'Name: value' a line",
    )
