"""Graft proof: compare the logits of a fixed continuation after a restore with those recorded
at capture.

At capture we keep the SHA-256 of the raw float32 logits and, for a graded verdict, the top-K
logits with their ids and the log-sum-exp of the whole vector (a few KB instead of 1 MB).
Verdict: `exact` (same SHA-256), `close` (same argmax, KL below threshold; max |Δlogit| and
KL reported), or `diverged`.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

Verdict = Literal["exact", "close", "diverged", "none"]

TOP_K = 256
CLOSE_KL = 1e-3


@dataclass(frozen=True)
class ProofRecord:
    probe_tokens: list[int]
    logits_sha256: str
    top_ids: list[int]
    top_logits: list[float]
    logsumexp: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ProofRecord:
        return cls(
            probe_tokens=[int(t) for t in raw["probe_tokens"]],
            logits_sha256=str(raw["logits_sha256"]),
            top_ids=[int(t) for t in raw["top_ids"]],
            top_logits=[float(v) for v in raw["top_logits"]],
            logsumexp=float(raw["logsumexp"]),
        )


@dataclass(frozen=True)
class ProofResult:
    verdict: Verdict
    max_abs_delta: float
    kl: float
    argmax_agree: bool
    proof_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.verdict == "exact":
            return "byte-exact"
        if self.verdict == "none":
            return "no proof"
        return (
            f"{self.verdict} (max Δ {self.max_abs_delta:.1e}, KL {self.kl:.1e}, "
            f"argmax {'agrees' if self.argmax_agree else 'differs'})"
        )


NO_PROOF = ProofResult("none", 0.0, 0.0, True, 0.0)


def logits_sha256(logits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(logits, dtype=np.float32).tobytes()).hexdigest()


def _logsumexp(values: np.ndarray) -> float:
    peak = float(np.max(values))
    return peak + float(np.log(np.sum(np.exp(values.astype(np.float64) - peak))))


def make_record(probe_tokens: list[int], logits: np.ndarray) -> ProofRecord:
    top = np.argpartition(logits, -TOP_K)[-TOP_K:]
    top = top[np.argsort(-logits[top], kind="stable")]
    return ProofRecord(
        probe_tokens=list(probe_tokens),
        logits_sha256=logits_sha256(logits),
        top_ids=[int(i) for i in top],
        top_logits=[float(logits[i]) for i in top],
        logsumexp=_logsumexp(logits),
    )


def compare(record: ProofRecord, logits: np.ndarray, proof_ms: float) -> ProofResult:
    if logits_sha256(logits) == record.logits_sha256:
        return ProofResult("exact", 0.0, 0.0, True, proof_ms)
    ids = np.asarray(record.top_ids)
    ref = np.asarray(record.top_logits, dtype=np.float64)
    new = logits[ids].astype(np.float64)
    max_abs = float(np.max(np.abs(new - ref)))
    log_p = ref - record.logsumexp
    log_q = new - _logsumexp(logits)
    kl = max(0.0, float(np.sum(np.exp(log_p) * (log_p - log_q))))
    agree = int(np.argmax(logits)) == record.top_ids[0]
    verdict: Verdict = "close" if agree and kl <= CLOSE_KL else "diverged"
    return ProofResult(verdict, max_abs, kl, agree, proof_ms)
