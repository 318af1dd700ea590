"""Atomic file writes: private temp file in the same directory, fsync, rename, fsync the directory.

A reader sees either the old file or the new one, never a half-written file, even if the
process is killed mid-write. Temp files start with '.tmp-' so the audit can find leftovers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".tmp-"


def fsync_dir(directory: Path) -> None:
    """Make a rename durable. Windows cannot open a directory (NTFS journals renames), so
    there it is a no-op."""
    flags = getattr(os, "O_DIRECTORY", None)
    if flags is None or os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces `path` atomically when the block exits cleanly.

    The temp file is created 0600 before any byte is written (never world-readable, even
    for a moment), and removed if the block raises.
    """
    tmp = path.parent / f"{TMP_PREFIX}{path.name}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_file(path) as handle:
        handle.write(data)


def create_private_file(path: Path) -> None:
    """Create an empty 0600 file if missing (so tools that later open it inherit the mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
