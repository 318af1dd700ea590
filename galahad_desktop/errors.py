"""User-facing errors. Each message is written for a person and names the problem.

Every error the core raises on bad input is a `GalahadError`; the CLI prints its message on
stderr and exits with its `exit_code`, the app shows it in a dialog.
"""

from __future__ import annotations


class GalahadError(Exception):
    """Base class: a problem the user can understand and usually fix."""

    exit_code = 1


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


class BusyError(GalahadError):
    """Another Galahad process holds the data directory."""

    exit_code = 8


class CancelledError(GalahadError):
    """The user cancelled a long operation; nothing was stored."""

    exit_code = 130
