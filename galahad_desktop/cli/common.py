"""What every command shares: output (text, or exactly one JSON object), progress on stderr,
Ctrl-C as a cancel, opening the core, and the argument groups."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.errors import (
    BusyError,
    InputError,
    KeyAccessError,
    StorageError,
    user_path,
)
from galahad_desktop.jobs import Job, Progress
from galahad_desktop.memory.results import to_jsonable
from galahad_desktop.paths import DATA_DIR_ENV, default_data_dir

if TYPE_CHECKING:  # imported when a command runs: --help stays quick
    from galahad_desktop.memory.galahad import Galahad

# Terminal control sequences a file name or a model's text could carry, and the bidirectional
# overrides that make a terminal show text in another order (U+202E): never printed raw.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def printable(text: str) -> str:
    """Text safe for a terminal: control and text-direction characters shown as codes."""
    return _CONTROL.sub(lambda m: _code(m.group()), text)


def _code(char: str) -> str:
    value = ord(char)
    return f"\\x{value:02x}" if value < 0x100 else f"\\u{value:04x}"


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def info(self, text: str) -> None:
        """Human progress and status: stderr, so stdout stays clean for --json."""
        print(printable(text), file=sys.stderr, flush=True)

    def result(self, obj: Any, text: str) -> None:
        if self.as_json:
            print(json.dumps(to_jsonable(obj), default=str))
        else:
            print(printable(text) if text else "")

    def stream(self) -> Callable[[str], None] | None:
        if self.as_json:
            return None
        return lambda piece: print(printable(piece).replace("\\x0a", "\n"), end="", flush=True)


def progress_printer(label: str, unit: str = "tokens") -> Callable[[Progress], None]:
    """A progress line on stderr, rewritten in place (`unit`: tokens, or bytes as MB)."""

    def report(p: Progress) -> None:
        end = "\n" if p.done >= p.total else ""
        if unit == "bytes":
            rate = p.done / max(1e-9, p.elapsed_s)
            line = f"{p.done / 1e6:,.0f}/{p.total / 1e6:,.0f} MB · {rate / 1e6:.1f} MB/s"
        else:
            eta = f"{p.eta_s:.0f}s" if p.eta_s != float("inf") else "?"
            line = f"{p.done:,}/{p.total:,} tokens · {p.tokens_per_s:,.0f} tok/s · ETA {eta}"
        print(f"\r{label}: {line}   ", end=end, file=sys.stderr, flush=True)

    return report


@contextmanager
def command_job(
    out: Output, label: str, unit: str = "tokens", answer: bool = False
) -> Iterator[Job]:
    """The command's one job: progress on stderr under `label`; with `answer`, the reply
    streams to stdout (not under --json) and a thinking model's thoughts to stderr.
    Ctrl-C stops the work between tokens (or batches) instead of killing the process
    mid-write; a second Ctrl-C is an ordinary interrupt."""
    thoughts = None if out.as_json else (lambda piece: out.info(f"(thinking) {piece}"))
    job = Job.cancellable(
        out.stream() if answer else None,
        thoughts if answer else None,
        progress_printer(label, unit),
    )
    cancel = job.cancel
    assert cancel is not None

    def handler(signum: int, frame: FrameType | None) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield job
    finally:
        signal.signal(signal.SIGINT, previous)


def parse_pairs(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"'{pair}' is not KEY=VALUE.")
        out[key.strip()] = value.strip()
    return out


def data_dir_of(args: argparse.Namespace) -> Path:
    """The data directory, checked before anything is created in it."""
    path = Path(args.data_dir) if args.data_dir else default_data_dir()
    try:
        path = user_path(path)
        if path.exists() and not path.is_dir():
            raise StorageError(f"The data directory {path} is a file, not a directory.")
        resolved = path.resolve()
    except OSError as exc:
        raise StorageError(f"The data directory {path} cannot be used: {exc.strerror}.") from None
    if str(resolved).startswith(("/proc", "/sys", "/dev")):
        raise StorageError(
            f"{resolved} is a system directory, not a place to store data; choose another "
            f"--data-dir (or {DATA_DIR_ENV})."
        )
    return path


def passphrase_for(args: argparse.Namespace, data_dir: Path) -> str | None:
    """The passphrase when the data directory uses one (or --passphrase asks for it)."""
    from galahad_desktop.vault.keys import keystore_mode_file

    if not (args.passphrase or keystore_mode_file(data_dir).exists()):
        return None
    env = os.environ.get("GALAHAD_PASSPHRASE")
    if env:
        return env
    if not sys.stdin.isatty():
        raise KeyAccessError(
            f"{data_dir} uses a passphrase: set GALAHAD_PASSPHRASE or run interactively."
        )
    import getpass

    return getpass.getpass("Passphrase for Galahad: ")


# Commands that only read: while the window (or another command) holds the data directory
# they are told so at once, with what to do, instead of waiting 10 s for the lock.
READING_COMMANDS = ("list", "show", "info", "routing-log", "storage", "audit")
READING_LOCK_S = 0.5


def reads_only(args: argparse.Namespace) -> bool:
    if getattr(args, "command", None) not in READING_COMMANDS:
        return False
    changes = ("keep", "unkeep", "give_back", "repair")
    return not any(getattr(args, name, None) for name in changes)


def open_core(args: argparse.Namespace) -> Galahad:
    from galahad_desktop.memory.galahad import Galahad

    data_dir = data_dir_of(args)
    reading = reads_only(args)
    try:
        core = Galahad(
            data_dir,
            model_path=args.model,
            overrides=parse_pairs(args.set),
            passphrase=passphrase_for(args, data_dir),
            lock_timeout_s=READING_LOCK_S if reading else 10.0,
        )
    except BusyError:
        if not reading:
            raise
        raise BusyError(
            f"Galahad's window, or another galahad command, is using {data_dir}, and "
            f"`galahad {args.command}` reads it only when nothing else does (one process "
            "at a time keeps every write whole). The window shows the same: its Memory "
            "panel and conversation list. Or close it and run this again."
        ) from None
    for note in core.start_notes():
        print(f"galahad: {note}", file=sys.stderr)
    return core


def sampling_of(core: Galahad, args: argparse.Namespace) -> SamplingParams | None:
    """The sampling flags given, over the settings; None without any (the core then uses
    the conversation's own values over the settings)."""
    given = {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed}
    if all(value is None for value in given.values()):
        return None
    return core.sampling(**given)


def add_common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--data-dir",
        type=Path,
        default=default(None),
        help=f"data directory (default: ${DATA_DIR_ENV} or the user data dir)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=default(None),
        help="GGUF model file (default: the setting, else the embedded Gemma 3 270M demo)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print exactly one JSON object on stdout",
    )
    parser.add_argument(
        "--passphrase",
        action="store_true",
        default=default(False),
        help="protect a new data directory with a passphrase instead of the OS keyring "
        "(asked for, or read from $GALAHAD_PASSPHRASE)",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        default=default([]),
        help="override a setting for this run (e.g. --set n_ctx=4096)",
    )


def add_sampling(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling (default: settings, else the model's own)")
    group.add_argument("--max-tokens", type=int)
    group.add_argument("--temperature", type=float)
    group.add_argument("--seed", type=int)
