"""Bounded child processes: hostile input is parsed where it can only hurt itself.

On POSIX the child gets address-space and CPU limits (resource.setrlimit); everywhere it gets
a wall-clock deadline, can be cancelled, and inherits no secrets from our environment.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_SECRET = re.compile(r"PASSPHRASE|PASSWORD|SECRET|TOKEN|API_KEY|CREDENTIAL", re.IGNORECASE)


def clean_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment without anything that looks like a secret (GALAHAD_PASSPHRASE,
    HF_TOKEN, …): a child parsing a document never needs one."""
    source = dict(os.environ if environ is None else environ)
    return {k: v for k, v in source.items() if not _SECRET.search(k)}


def _limiter(memory_bytes: int, cpu_seconds: int) -> Callable[[], None] | None:
    try:
        import resource
    except ImportError:  # Windows: no rlimits; the deadline still holds
        return None

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))

    return limit


@dataclass(frozen=True)
class ChildResult:
    returncode: int | None  # None: killed (deadline or cancel)
    stdout: bytes
    timed_out: bool
    cancelled: bool


def run_bounded(
    command: Sequence[str],
    timeout_s: float,
    memory_mb: int,
    cancel: threading.Event | None = None,
) -> ChildResult:
    """Run `command` with limits; read all of its stdout."""
    limiter = _limiter(memory_mb * 1024 * 1024, int(timeout_s) + 1)
    child = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=clean_environment(),
        preexec_fn=limiter,
    )
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    reader = threading.Thread(
        target=lambda: chunks.append(child.stdout.read() if child.stdout else b""), daemon=True
    )
    reader.start()
    while reader.is_alive():
        reader.join(0.05)
        stop = None
        if cancel is not None and cancel.is_set():
            stop = "cancelled"
        elif time.monotonic() > deadline:
            stop = "timed_out"
        if stop is not None:
            child.kill()
            child.wait()
            reader.join(1.0)
            return ChildResult(None, b"", stop == "timed_out", stop == "cancelled")
    code = child.wait()
    return ChildResult(code, b"".join(chunks), False, False)
