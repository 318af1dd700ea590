"""The data directory lock: one Galahad process per data directory, on every platform.

`filelock` takes an OS-level lock (flock on POSIX, LockFileEx on Windows) that the OS drops
when the process dies, so a crash never leaves the directory locked.
"""

from __future__ import annotations

from pathlib import Path

import filelock

from galahad_desktop.errors import BusyError

LOCK_NAME = ".lock"


class DataDirLock:
    def __init__(self, data_dir: Path, timeout_s: float = 10.0) -> None:
        self.path = Path(data_dir) / LOCK_NAME
        self._lock = filelock.FileLock(str(self.path), timeout=timeout_s, mode=0o600)

    def acquire(self) -> None:
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise BusyError(
                f"Another Galahad process is using {self.path.parent}; close it and retry."
            ) from None

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)

    @property
    def held(self) -> bool:
        return bool(self._lock.is_locked)
