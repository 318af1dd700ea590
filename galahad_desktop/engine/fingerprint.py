"""Runtime fingerprint: one hash over everything that can change the bits of a KV state.

Exactness of a graft holds only within one model file, one build and one set of context
settings (batch shapes and kernels change float rounding). Every block records the fingerprint
it was captured under; a block whose fingerprint differs is re-read, never grafted silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from galahad_desktop.system.files import atomic_write_bytes

FINGERPRINT_SCHEME = 1


def sha256_file(path: Path, chunk: int = 8 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


_DIGESTS: dict[str, str] = {}  # this process's model digests, by (path, size, mtime)


def model_sha256(path: Path, cache_file: Path | None) -> str:
    """SHA-256 of the model file, cached by (path, size, mtime) so it is computed once: in
    the data directory's cache file, and for this process."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if key in _DIGESTS and cache_file is None:
        return _DIGESTS[key]
    cache: dict[str, str] = {}
    if cache_file is not None and cache_file.exists():
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(cache_file.read_text("utf-8"))
            if isinstance(loaded, dict):
                cache = {str(k): str(v) for k, v in loaded.items()}
    if key in cache:
        return cache[key]
    digest = _DIGESTS.get(key) or sha256_file(path)
    _DIGESTS[key] = digest
    if cache_file is not None:
        cache[key] = digest
        with contextlib.suppress(OSError):
            atomic_write_bytes(cache_file, json.dumps(cache, indent=1).encode("utf-8"))
    return digest


def runtime_fingerprint(details: dict[str, Any]) -> str:
    canonical = json.dumps(
        {"scheme": FINGERPRINT_SCHEME, **details}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def cpu_count() -> int:
    return os.cpu_count() or 1
