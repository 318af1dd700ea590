"""Questions that need more than one part: which parts to answer from together.

A question such as "what do the falcon and the heron eat?" has its words in two documents;
the single-part gate either refuses (two documents match about as well, or neither holds
enough of the question) or answers from one and misses the other. Here the best part is
joined by those that hold what it lacks — each further part must add at least
`ACROSS_GAIN` of the question's weight, counted once over the parts together — and by any
other document about as strong as it. The parts are then stacked into one context and the
answer cites each. The gate still refuses when the parts together hold too little.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from galahad_desktop.memory.retrieval.router import Candidate, RouteDecision

# Share of the question's weight a further part must hold that the chosen ones lack: a
# name or a rare word of the question's, not a common one every part has.
ACROSS_GAIN = 0.2
ACROSS_MAX_PARTS = 3
POOL = 8  # retrieval's best candidates looked at

CoverageOf = Callable[[Sequence[str]], float]


def _close_rivals(pool: list[Candidate], min_strength: float, min_margin: float) -> list[Candidate]:
    """Other documents' parts about as strong as the best (where the gate saw a tie)."""
    first = pool[0]
    return [
        c
        for c in pool[1:ACROSS_MAX_PARTS]
        if c.document_id != first.document_id
        and c.coverage >= min_strength
        and c.coverage * min_margin >= first.coverage
    ]


def across(
    decision: RouteDecision,
    coverage_of: CoverageOf,
    min_strength: float,
    min_margin: float,
) -> RouteDecision | None:
    """The decision to answer from several parts together, or None when one part (or
    none) is the answer: the parts together must hold at least `min_strength` of the
    question, and each must add to the others."""
    pool = list(decision.candidates[:POOL])
    if len(pool) < 2:
        return None
    chosen = [pool[0]]
    held = coverage_of([pool[0].part_id])
    while len(chosen) < ACROSS_MAX_PARTS:
        gains = [
            (coverage_of([*(c.part_id for c in chosen), other.part_id]) - held, i)
            for i, other in enumerate(pool)
            if other not in chosen
        ]
        gain, i = max(gains, default=(0.0, -1))
        if gain < ACROSS_GAIN:
            break
        chosen.append(pool[i])
        held += gain
    for rival in _close_rivals(pool, min_strength, min_margin):
        if rival not in chosen and len(chosen) < ACROSS_MAX_PARTS:
            chosen.append(rival)
    if len(chosen) < 2:
        return None
    together = coverage_of([c.part_id for c in chosen])
    if together < min_strength:
        return None
    each = [coverage_of([c.part_id]) for c in chosen]
    rest = [c for c in decision.candidates if c not in chosen]
    return replace(
        decision,
        candidates=chosen + rest,
        confident=True,
        reason="",
        strength=together,
        cited=chosen,
        extra={**decision.extra, "across": {"together": together, "each": each}},
    )
