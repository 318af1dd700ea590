"""Passage vectors kept between runs of the routing evaluation, checked before use.

Embedding the evaluation's documents (882 passages) is most of its cost on a CPU. The
vectors depend only on the embedding model and the text, so they are kept in a file keyed
by both (`benchmarks/routing/vectors-<model>.npz`, refreshed by the evaluation itself).
Before the cache is trusted, a sample of its passages is embedded again and compared: a
model or tokenizer that changed makes the whole cache void, and everything is recomputed.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

SAMPLE = 4  # passages embedded again to check the cache
TOLERANCE = 2e-3  # float16 storage rounds to about 1e-3


class VectorCache:
    def __init__(self, path: Path, identity: str, embed: Callable[[list[str]], np.ndarray]) -> None:
        self.path = path
        self.identity = identity
        self._embed = embed
        self._known: dict[str, np.ndarray] = {}
        self._checked = False
        self.hits = 0
        self.computed = 0
        self.void = False  # the stored vectors did not match the model: all recomputed
        if path.exists():
            with np.load(path) as stored:
                keys, vectors = stored["keys"], stored["vectors"]
            self._known = {str(k): v for k, v in zip(keys, vectors, strict=True)}
        self._added = False

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self.identity}\0{text}".encode()).hexdigest()[:32]

    def _check(self, texts: list[str]) -> None:
        """Embed a few cached passages again; any difference voids the cache."""
        self._checked = True
        cached = [t for t in texts if self._key(t) in self._known][:SAMPLE]
        if not cached:
            return
        fresh = self._embed(cached)
        stored = np.stack([self._known[self._key(t)].astype(np.float32) for t in cached])
        if not np.allclose(fresh, stored, atol=TOLERANCE):
            self._known.clear()
            self.void = True

    def passages(self, texts: list[str]) -> np.ndarray:
        """What the embedder's passages() returns, from the cache where it can."""
        if not self._checked:
            self._check(texts)
        missing = [t for t in texts if self._key(t) not in self._known]
        if missing:
            for text, vector in zip(missing, self._embed(missing), strict=True):
                self._known[self._key(text)] = vector.astype(np.float16)
            self._added = True
        self.computed += len(missing)
        self.hits += len(texts) - len(missing)
        return np.stack([self._known[self._key(t)].astype(np.float32) for t in texts])

    def save(self) -> None:
        """Write the cache atomically (only when something was added)."""
        if not self._added:
            return
        keys = np.array(sorted(self._known))
        vectors = np.stack([self._known[k] for k in keys])
        handle, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".npz")
        os.close(handle)
        try:
            with open(tmp, "wb") as out:
                np.savez_compressed(out, keys=keys, vectors=vectors)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o644)  # a file the repository keeps, not a secret
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
