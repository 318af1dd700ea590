"""Scoring tokens and keeping a context in memory: what reranking by the model needs."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Snapshot:
    """What the context held at one moment, in memory only (plain KV: never written): the
    state, its tokens and the logits for the next token, so work resumes from it exactly."""

    state: ctypes.Array[ctypes.c_uint8]
    size: int
    tokens: list[int]
    logits: np.ndarray

    def wipe(self) -> None:
        ctypes.memset(self.state, 0, ctypes.sizeof(self.state))
        self.logits[:] = 0


def log_softmax_at(logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
    """Each row's log-probability of its token (natural log). The exponentials are taken in
    float32 (a vocabulary of 262,144 per row), the sums and the result in float64."""
    rows = np.asarray(logits, dtype=np.float32)
    top = rows.max(axis=1, keepdims=True)
    total = np.exp(rows - top).sum(axis=1, dtype=np.float64)
    picked = rows[np.arange(len(tokens)), np.asarray(tokens, dtype=np.int64)]
    result: np.ndarray = picked.astype(np.float64) - top[:, 0].astype(np.float64) - np.log(total)
    return result
