"""The `galahad` command: the same core as the app, scriptable.

Every command takes --data-dir, --model and --json (exactly one JSON object on stdout).
Errors print one clear message on stderr and exit with the error's code; with --json an
{"error": ...} object is printed on stdout as well. No traceback ever reaches the user: an
unexpected failure is reported by type (its message can quote private text) with exit 70.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from galahad_desktop import __version__
from galahad_desktop.cli import chat, documents, measure, models, serve, store, tools, verified
from galahad_desktop.cli.common import Output, add_common, open_core, printable
from galahad_desktop.errors import CancelledError, GalahadError, InputError, as_user_error

INTERNAL_ERROR_EXIT = 70
log = logging.getLogger("galahad.cli")


class CommandParser(argparse.ArgumentParser):
    """A command line that cannot be read is bad input: the usage, the problem and exit 4
    (InputError's code), as any other bad input (argparse's own is 2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(InputError.exit_code, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="galahad",
        description="Private local chat with encrypted, provable KV-cache grafts.",
    )
    parser.add_argument("--version", action="version", version=f"galahad {__version__}")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="deposit, resume and prove a small document in a temp data dir",
    )
    add_common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str, help_text: str, func: Callable[..., int], core: bool = True
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_common(p, suppress=True)
        p.set_defaults(func=func, needs_core=core)
        return p

    for module in (chat, documents, store, models, verified, tools, serve):
        module.register(add)
    return parser


def dispatch(args: argparse.Namespace, out: Output) -> int:
    if args.self_test:
        return measure.self_test(args, out)
    if getattr(args, "func", None) is None:  # no command: the window
        return models.cmd_gui(args, out)
    if not args.needs_core:
        return int(args.func(args, out))
    core = open_core(args)
    try:
        return int(args.func(core, out, args))
    finally:
        core.close()


def _fail(out: Output, message: str, kind: str, code: int) -> int:
    print(f"galahad: {printable(message)}", file=sys.stderr)
    if out.as_json:
        print(json.dumps({"error": message, "kind": kind, "exit_code": code}))
    return code


BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`galahad --json list | head -c 10`): stop quietly, as other
        # command-line tools do, and keep Python from complaining when it flushes at exit.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE_EXIT


def _main(argv: Sequence[str] | None) -> int:
    # Everything this process creates (ours, SQLite's, Qt's, logging's) is private.
    os.umask(0o077)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--extract-worker"] and len(argv) in (2, 3):  # frozen app's reader
        from galahad_desktop.memory.documents.extract_worker import run

        return run(*argv[1:])
    if argv[:1] == ["--device-worker"] and len(argv) == 3:  # frozen app's device server
        from galahad_desktop.engine.device_worker import run as serve_device

        return serve_device(*argv[1:])
    args = build_parser().parse_args(argv)
    out = Output(bool(args.json))
    try:
        return dispatch(args, out)
    except GalahadError as exc:
        return _fail(out, str(exc), type(exc).__name__, exc.exit_code)
    except KeyboardInterrupt:
        return _fail(
            out,
            "Interrupted; nothing half-written was kept.",
            "CancelledError",
            CancelledError.exit_code,
        )
    except BrokenPipeError:
        raise  # not a bug: main() ends quietly
    except Exception as exc:  # a bug: say so, by type only (a message can quote private text)
        error = as_user_error(exc)
        if error is not None:
            return _fail(out, str(error), type(error).__name__, error.exit_code)
        log.debug("internal error", exc_info=True)
        return _fail(
            out,
            f"Internal error ({type(exc).__name__}). Nothing stored was changed by it; "
            "please report it.",
            "InternalError",
            INTERNAL_ERROR_EXIT,
        )


__all__ = ["build_parser", "main"]
