"""Runtime fingerprint: one hash over everything that can change the bits of a KV state.

Exactness of a graft holds only within one model file, one build and one set of context
settings (batch shapes and kernels change float rounding). Every block records the fingerprint
it was captured under; a block whose fingerprint differs is re-read, never grafted silently.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from galahad_desktop.system import digests

FINGERPRINT_SCHEME = 1


def model_sha256(path: Path, cache_file: Path | None) -> str:
    """SHA-256 of the model file, computed once for its exact bytes: remembered in the data
    directory's cache file and the user's (system/digests.py), and for this process."""
    shared = digests.shared_cache_file()
    return digests.file_sha256(path, [cache_file, shared] if cache_file else [shared])


def runtime_fingerprint(details: dict[str, Any]) -> str:
    canonical = json.dumps(
        {"scheme": FINGERPRINT_SCHEME, **details}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def cpu_count() -> int:
    return os.cpu_count() or 1
