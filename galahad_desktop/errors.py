"""User-facing errors. Each message is written for a person and names the problem.

Every error the core raises on bad input is a `GalahadError`; the CLI prints its message on
stderr and exits with its `exit_code`, the app shows it in a dialog.
"""

from __future__ import annotations

import os
from pathlib import Path


class GalahadError(Exception):
    """Base class: a problem the user can understand and usually fix.

    Where the fix is a command, it is given apart from the message: the terminal shows
    the message and the command (`str`), the window the message and its own way to the
    same fix (`in_window`): no terminal command inside a window's refusal."""

    exit_code = 1

    def __init__(self, message: str = "", *, command: str = "", window: str = "") -> None:
        super().__init__(message)
        self.message, self.command, self.window = message, command, window

    def __str__(self) -> str:
        return f"{self.message} Run: {self.command}" if self.command else self.message

    def in_window(self) -> str:
        return f"{self.message} {self.window}" if self.window else self.message


# The fix for damage, in each front end's words (`**AUDIT` where damage is refused).
AUDIT = {
    "command": "galahad audit",
    "window": "View → Security… → Run audit names every damaged record.",
}


class NotFoundError(GalahadError):
    """An id that names no conversation, document or block."""

    exit_code = 3


class InputError(GalahadError):
    """A document or argument that cannot be used (unreadable, too long, wrong type)."""

    exit_code = 4


class IntegrityError(GalahadError):
    """A stored file failed its checks: tampered, truncated, swapped or rolled back."""

    exit_code = 5


class KeyAccessError(GalahadError):
    """The master key is missing, wrong, or the keyring cannot be used."""

    exit_code = 6


class ModelError(GalahadError):
    """The model file cannot be loaded or does not fit the request."""

    exit_code = 7


class DeviceLostError(ModelError):
    """A device server (llama.cpp's RPC backend) went away while a model was on it: the
    model's calls on it can never finish, and the model is loaded again without it."""


class BusyError(GalahadError):
    """Another Galahad process holds the data directory."""

    exit_code = 8


class ContextFullError(GalahadError):
    """The next turn does not fit the context; the message lists the choices."""

    exit_code = 12


class StorageError(GalahadError):
    """The data directory cannot be written or read (permissions, not a directory, I/O)."""

    exit_code = 10


class DiskFullError(StorageError):
    """No space left: nothing was half-written, but nothing new could be stored."""

    exit_code = 11


class WontFitError(DiskFullError):
    """A document's memory would not fit the disk budget or the disk: nothing was read or
    stored, and the person may read it anyway."""


class CancelledError(GalahadError):
    """The user cancelled a long operation; nothing was stored."""

    exit_code = 130


MAX_TITLE_CHARS = 200  # a conversation's title, typed (rename) or imported


def check_text(text: str, what: str) -> str:
    """Refuse text the model or the catalog cannot hold faithfully: NUL characters (C
    strings end there, so the model would read less than is stored) and lone surrogates
    (not encodable: from broken JSON escapes or undecodable command-line bytes)."""
    at = text.find("\x00")
    if at >= 0:
        raise InputError(f"{what} contains a NUL character (at character {at:,}); remove it.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{what} is not valid Unicode text (an unpaired surrogate at character {exc.start:,})."
        ) from None
    return text


def as_user_error(exc: BaseException) -> GalahadError | None:
    """The user-facing error for an OS or SQLite failure (disk full, a damaged catalog, a
    file that cannot be read); None for anything else, which is a bug."""
    import errno
    import sqlite3

    if isinstance(exc, GalahadError):
        return exc
    if isinstance(exc, OSError):
        if exc.errno == errno.ENOSPC:
            return DiskFullError(
                "The disk is full: nothing new could be stored (what was stored before is "
                "intact). Free some space and try again."
            )
        detail = exc.strerror or type(exc).__name__
        where = f": {exc.filename}" if exc.filename else ""
        return StorageError(f"A file could not be read or written ({detail}{where}).")
    if isinstance(exc, sqlite3.DatabaseError):
        text = str(exc).lower()
        if "full" in text or "disk i/o" in text:
            return DiskFullError(
                "The catalog could not be written (the disk is full or failing); nothing was "
                "changed. Free some space and try again."
            )
        if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
            return StorageError("The catalog is locked by another program; try again.")
        return IntegrityError(
            f"The catalog is damaged ({type(exc).__name__}); nothing was changed. Check it, "
            "or restore a backup.",
            **AUDIT,
        )
    if isinstance(exc, RecursionError | MemoryError):
        return InputError(f"The input is too large or too deeply nested ({type(exc).__name__}).")
    return None


def user_path(value: str | os.PathLike[str]) -> Path:
    """A path as the user wrote it, `~` and `~name` expanded; a home that does not exist is
    a clear error naming the path (Python raises RuntimeError), never a crash."""
    path = Path(value)
    try:
        return path.expanduser()
    except RuntimeError:
        raise InputError(
            f"'{path}' names the home folder of a user this computer does not have."
        ) from None
