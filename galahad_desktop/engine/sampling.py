"""Token sampling on the logits vector: greedy at temperature 0, else top-k / top-p."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 0.95
    top_k: int = 40
    max_tokens: int = 256
    seed: int | None = None  # None: a fresh seed for every generation
    stop: tuple[str, ...] = ()  # texts that end the reply (not shown): an API client's `stop`
    grammar: str = ""  # GBNF the reply must follow (engine/grammar.py); "" for none


class Sampler:
    def __init__(self, params: SamplingParams, seed: int | None = None) -> None:
        self.params = params
        self._rng = np.random.default_rng(params.seed if seed is None else seed)

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        if p.temperature <= 0.0:
            return int(np.argmax(logits))
        k = p.top_k if 0 < p.top_k < logits.shape[0] else logits.shape[0]
        candidates = np.argpartition(logits, -k)[-k:]
        scaled = logits[candidates].astype(np.float64) / p.temperature
        order = np.argsort(-scaled, kind="stable")
        candidates, scaled = candidates[order], scaled[order]
        probs = np.exp(scaled - scaled[0])
        probs /= probs.sum()
        if 0.0 < p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        return int(self._rng.choice(candidates, p=probs))
