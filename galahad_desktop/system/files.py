"""Atomic file writes: private temp file in the same directory, fsync, rename, fsync the directory.

A reader sees either the old file or the new one, never a half-written file, even if the
process is killed mid-write. Temp files start with '.tmp-' so the audit can find leftovers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TMP_PREFIX = ".tmp-"
# Windows opens files in text mode unless told otherwise, and would write every \n as \r\n:
# a block or a catalog copy would then fail authentication. 0 (no-op) elsewhere.
O_BINARY: int = getattr(os, "O_BINARY", 0)


def open_private(path: Path, exclusive: bool = True) -> int:
    """A write-only binary descriptor on `path`, created 0600 before any byte is written
    (`exclusive`: the file must not exist yet)."""
    flags = os.O_WRONLY | os.O_CREAT | O_BINARY | (os.O_EXCL if exclusive else 0)
    return os.open(path, flags, 0o600)


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
    fd = open_private(tmp)
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
    os.close(open_private(path, exclusive=False))
    os.chmod(path, 0o600)


def read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, counted as they are read (a
    device or a FIFO says it is empty). Anything else is refused at once: a FIFO with no
    writer would block forever, /dev/zero would fill memory."""
    from galahad_desktop.errors import InputError

    nonblocking = getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, os.O_RDONLY | O_BINARY | nonblocking)
    except FileNotFoundError:
        raise InputError(f"{path} does not exist.") from None
    except OSError as exc:
        raise InputError(f"{path} cannot be read: {exc.strerror}.") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path} is not a regular file; {what} must be a file.")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{path} is larger than {limit / 2**20:,.0f} MiB, the limit for {what}.")
    return data


def open_plain_file(path: Path) -> BinaryIO | None:
    """`path` opened for reading if it is a regular file itself, else None: a symbolic link
    is never followed (O_NOFOLLOW; an lstat check where there is none), and a FIFO or a
    device is never opened for reading (the open does not block, the type is checked)."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    nonblocking = getattr(os, "O_NONBLOCK", 0)
    try:
        if not nofollow and stat.S_ISLNK(os.lstat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | O_BINARY | nofollow | nonblocking)
    except OSError:
        return None  # missing, a link (ELOOP), unreadable
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def check_export_destination(path: Path, protected: Path, force: bool) -> Path:
    """Where an export may be written: a new file (or, with `force`, an existing regular
    file), never through a symbolic link, never a device or a FIFO, never inside
    `protected` (the data directory: an export there could replace the catalog)."""
    from galahad_desktop.errors import InputError, user_path

    path = user_path(path)
    if path.is_symlink():
        raise InputError(f"{path} is a symbolic link; give the file itself.")
    if not path.parent.is_dir():
        raise InputError(f"The folder {path.parent} does not exist.")
    target = path.parent.resolve() / path.name
    if target.is_relative_to(Path(protected).resolve()):
        raise InputError(
            f"{path} is inside Galahad's data directory; export somewhere else (writing there "
            "could replace what is stored)."
        )
    if target.exists():
        if target.is_dir():
            raise InputError(f"'{path}' is a directory; give a file name to export to.")
        if not target.is_file():
            raise InputError(f"{path} is not a regular file; give a file name to export to.")
        if not force:
            raise InputError(f"{path} already exists; choose another name or add --force.")
    return target
