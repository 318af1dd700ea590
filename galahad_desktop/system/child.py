"""Bounded child processes: hostile input is parsed where it can only hurt itself.

On POSIX the child gets address-space and CPU limits (resource.setrlimit), which it sets on
itself first thing (`apply_own_limits`, read from GALAHAD_CHILD_LIMITS): `preexec_fn` would run
them between fork and exec, which is unsafe in a process with threads (the window's worker
calls this). Everywhere the child gets a wall-clock deadline, can be cancelled, and inherits no
secrets from our environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from galahad_desktop.jobs import NO_JOB, Job

_SECRET = re.compile(r"PASSPHRASE|PASSWORD|SECRET|TOKEN|API_KEY|CREDENTIAL", re.IGNORECASE)


def clean_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment without anything that looks like a secret (GALAHAD_PASSPHRASE,
    HF_TOKEN, …): a child parsing a document never needs one."""
    source = dict(os.environ if environ is None else environ)
    return {k: v for k, v in source.items() if not _SECRET.search(k)}


LIMITS_VARIABLE = "GALAHAD_CHILD_LIMITS"


def apply_own_limits(environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """In a child started by run_bounded: cap this process's address space and CPU time as
    the parent asked. Returns (memory bytes, CPU seconds), or None where there are no rlimits
    (Windows: the parent's deadline still holds) or nothing was asked."""
    value = (os.environ if environ is None else environ).get(LIMITS_VARIABLE, "")
    try:
        import resource
    except ImportError:
        return None
    try:
        memory_bytes, cpu_seconds = (int(part) for part in value.split(":"))
    except ValueError:
        return None
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    return memory_bytes, cpu_seconds


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
    job: Job = NO_JOB,
    stdin: bytes | None = None,
) -> ChildResult:
    """Run `command` (which calls apply_own_limits first) with limits; read all its stdout.
    `stdin`: bytes handed to the child through a pipe (never through a file)."""
    environment = clean_environment()
    environment[LIMITS_VARIABLE] = f"{memory_mb * 1024 * 1024}:{int(timeout_s) + 1}"
    child = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        env=environment,
    )
    if stdin is not None:

        def feed() -> None:
            with contextlib.suppress(OSError):  # a child that stops reading has refused it
                assert child.stdin is not None
                child.stdin.write(stdin)
                child.stdin.close()

        threading.Thread(target=feed, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    reader = threading.Thread(
        target=lambda: chunks.append(child.stdout.read() if child.stdout else b""), daemon=True
    )
    reader.start()
    while reader.is_alive():
        reader.join(0.05)
        stop = None
        if job.cancelled:
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
