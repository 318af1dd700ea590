"""SHA-256 digests of large files (models, projectors), remembered by the file's identity.

Reading a 250 MB model to hash it costs a quarter of a second at every process start, and
every command is a process. A digest is remembered under the file's identity: its path,
device, inode, size and modification and change times. Any write to the file changes its
change time (which no ordinary user can set back), so a remembered digest is only ever used
for the very bytes it was computed from; anything else is read and hashed again. A cache
file that cannot be read is ignored, never trusted in part.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import platformdirs

from galahad_desktop.system.files import atomic_write_bytes

APP_NAME = "galahad-desktop"
MOST_REMEMBERED = 64  # files; the oldest are forgotten first
_THIS_PROCESS: dict[str, str] = {}


def shared_cache_file() -> Path:
    """The user's digest cache, shared by every data directory (not private: a digest of a
    public model file says nothing about what was read with it)."""
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)) / "file-digests.json"


def identity(path: Path) -> str:
    stat = path.stat()
    return (
        f"{path.resolve()}|{stat.st_dev}|{stat.st_ino}|{stat.st_size}"
        f"|{stat.st_mtime_ns}|{stat.st_ctime_ns}"
    )


def hash_file(path: Path, chunk: int = 8 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _read(cache_file: Path) -> dict[str, str]:
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(cache_file.read_text("utf-8"))
        if isinstance(loaded, dict) and all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in loaded.items()
        ):
            return loaded
    return {}


def _write(cache_file: Path, known: dict[str, str]) -> None:
    kept = dict(list(known.items())[-MOST_REMEMBERED:])
    with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache_file, json.dumps(kept, indent=1).encode("utf-8"))


def remembered(path: Path, cache_files: Sequence[Path]) -> str | None:
    """The digest remembered for these exact bytes, or None."""
    key = identity(path)
    if key in _THIS_PROCESS:
        return _THIS_PROCESS[key]
    for cache_file in cache_files:
        digest = _read(cache_file).get(key)
        if digest is not None:
            _THIS_PROCESS[key] = digest
            return digest
    return None


def remember(path: Path, digest: str, cache_files: Sequence[Path]) -> None:
    key = identity(path)
    _THIS_PROCESS[key] = digest
    for cache_file in cache_files:
        known = _read(cache_file)
        if known.get(key) != digest:
            known.pop(key, None)
            _write(cache_file, {**known, key: digest})


def file_sha256(path: Path, cache_files: Sequence[Path]) -> str:
    """SHA-256 of `path`: remembered (in this process or the cache files) for its exact
    identity, else read and hashed, and remembered in each cache file."""
    key = identity(path)
    if key in _THIS_PROCESS:
        return _THIS_PROCESS[key]
    digest = remembered(path, cache_files)
    if digest is None:
        digest = hash_file(path)
    remember(path, digest, cache_files)
    return digest
