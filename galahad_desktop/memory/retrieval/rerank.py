"""The chat model reads the candidates: query-likelihood reranking on stored KV blocks.

Retrieval (words, or words and meaning) proposes a few parts; each is grafted at its own
positions (milliseconds, proved exact) and the question is evaluated on top of it, in the
model's turn format, with the log-probability of every question token kept. A part scores
the pointwise mutual information of the question and the part: log p(question | part) minus
log p(question) with no part at all (computed once per question), so a long or generic
question does not win by being long or generic. This is UPR's query-likelihood reranking
(Sachan et al., EMNLP 2022), except that no part is read again: only the question's tokens
are evaluated, once per candidate.

The best candidate's context (its part, the probe and the evaluated question) is kept in
memory as a snapshot, so an answer starts from it without re-reading a token. The gate then
decides on the model's evidence: the best part's PMI, and its lead over the best part of any
*other* document (parts of one document are neighbours, not a doubt).

The model checks the questions retrieval is unsure of (its gate refused): what retrieval is
sure of is answered as before, at no cost. Measured on real documents (`eval routing`), the
embedded 270M model's PMI alone picks the right part less often than the hybrid retrieval
does when retrieval is sure, and rescues questions retrieval cannot place (Japanese without
an embedding model, paraphrases); see docs/evaluations.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from galahad_desktop.engine.scoring import Snapshot
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import IntegrityError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import GraftReport
from galahad_desktop.memory.retrieval.router import RERANKED, Candidate, RouteDecision

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartScore:
    part_id: str
    document_id: str
    part_no: int
    n_parts: int
    pmi: float  # nats: log p(question | part) - log p(question)
    log_likelihood: float  # nats: log p(question | part)
    retrieval_rank: int  # 1 = retrieval's best


@dataclass
class Reranking:
    """What the model made of the candidates (best first), and what it cost."""

    scores: list[PartScore]
    baseline: float  # nats: log p(question) with no part
    question_tokens: int  # the tokens scored (the question's text)
    ms: float
    graft_ms: float = 0.0  # grafting and proving the candidates
    score_ms: float = 0.0  # evaluating the question on them (and without any)
    not_checked: list[str] = field(default_factory=list)  # part ids that could not be read

    @property
    def checked(self) -> int:
        return len(self.scores)

    def describe(self) -> str:
        return f"checked {self.checked} part{'s' if self.checked != 1 else ''} in {self.ms:.0f} ms"

    def as_dict(self) -> dict[str, Any]:
        return {
            "scores": [asdict(s) for s in self.scores],
            "baseline": round(self.baseline, 4),
            "question_tokens": self.question_tokens,
            "checked": self.checked,
            "ms": round(self.ms, 1),
            "graft_ms": round(self.graft_ms, 1),
            "score_ms": round(self.score_ms, 1),
            "not_checked": self.not_checked,
        }


@dataclass
class Scored:
    """A reranking and, while it lives, the best candidate's context and graft report."""

    reranking: Reranking
    kept: Snapshot | None = None  # None: the context itself holds the best candidate
    graft: GraftReport | None = None

    def release(self) -> None:
        if self.kept is not None:
            self.kept.wipe()
            self.kept = None


def candidates_to_check(
    retrieved: list[Candidate], scope_parts: list[Candidate], limit: int
) -> list[Candidate]:
    """Retrieval's best `limit`; when the whole scope has no more than `limit` parts, every
    part (a question that shares no word with a small library is still checked)."""
    chosen = list(retrieved[:limit])
    if len(scope_parts) <= limit:
        have = {c.part_id for c in chosen}
        chosen += [c for c in scope_parts if c.part_id not in have]
    return chosen


class Reranker:
    def __init__(self, live: LiveContext) -> None:
        self.live = live

    def baseline(self, text_tokens: list[int]) -> tuple[float, float]:
        """log p(question) with no part: the question's text after the model's opening of a
        user turn, as it follows a part's block and the probe. Returns (nats, ms)."""
        engine = self.live.engine
        self.live.clear(wipe=False)
        engine.evaluate(engine.bos() + engine.turns.user_open)
        logprobs, ms = engine.score(text_tokens)
        return float(logprobs.sum()), ms

    def rerank(
        self,
        question: str,
        candidates: list[Candidate],
        counters: Counters,
        job: Job = NO_JOB,
    ) -> Scored:
        """Graft each candidate, evaluate the question on it, and keep the best context."""
        start = time.perf_counter()
        engine = self.live.engine
        text_tokens = engine.encode_text(question.strip())
        question_tokens = engine.turns.question(question)
        baseline, baseline_ms = self.baseline(text_tokens)
        counters.new_tokens += len(text_tokens)
        reranking = Reranking([], baseline, len(text_tokens), 0.0, score_ms=baseline_ms)
        scored = Scored(reranking)
        best: float | None = None
        last_is_best = False
        try:
            for rank, candidate in enumerate(candidates, 1):
                job.check()
                last_is_best = False
                part = self.live.records.part(candidate.part_id)
                if part is None:
                    continue
                begin = time.perf_counter()
                try:
                    self.live.records.check("parts", part)
                    if not self.live.graftable(part["block_id"]):
                        # Stored under other settings or another model: checking it would
                        # mean re-reading it (asked directly, it is re-read, with the reason).
                        reranking.not_checked.append(candidate.part_id)
                        continue
                    graft = self.live.graft(part["block_id"], part["document_id"], counters, job)
                except IntegrityError as exc:
                    log.warning("a candidate part was not checked: %s", exc)
                    reranking.not_checked.append(candidate.part_id)
                    self.live.clear(wipe=False)
                    continue
                reranking.graft_ms += (time.perf_counter() - begin) * 1e3
                if len(question_tokens) + 64 > engine.room():
                    self.live.drop()
                    reranking.not_checked.append(candidate.part_id)
                    continue
                self.live.drop()  # the context now holds this one-off question
                logprobs, ms = engine.score(question_tokens, job)
                counters.new_tokens += len(question_tokens)
                counters.prefill_ms += ms
                reranking.score_ms += ms
                likelihood = float(logprobs[: len(text_tokens)].sum())
                reranking.scores.append(
                    PartScore(
                        candidate.part_id,
                        candidate.document_id,
                        candidate.part_no,
                        candidate.n_parts,
                        round(likelihood - baseline, 4),
                        round(likelihood, 4),
                        rank,
                    )
                )
                last_is_best = best is None or likelihood > best
                if last_is_best:
                    best = likelihood
                    scored.graft = graft
                    if rank < len(candidates):  # another graft will replace this context
                        scored.release()
                        scored.kept = engine.snapshot()
            if last_is_best:
                scored.release()  # the context itself holds the best candidate
        except BaseException:
            scored.release()
            raise
        reranking.scores.sort(key=lambda s: (-s.pmi, s.retrieval_rank))
        reranking.ms = (time.perf_counter() - start) * 1e3
        return scored

    def continue_from_best(self, scored: Scored) -> float:
        """Make the context hold the best candidate with the question evaluated (nothing
        re-read); returns ms."""
        if scored.kept is None:
            return 0.0
        try:
            return self.live.engine.resume(scored.kept)
        finally:
            scored.release()


def decide_reranked(
    decision: RouteDecision,
    reranking: Reranking,
    min_pmi: float,
    min_margin: float,
    alone_pmi: float,
    one_document: bool | None = None,
) -> RouteDecision:
    """The gate on the model's evidence: the best part must make the question at least
    `min_pmi` nats more likely than no part does, and lead the best part of any other
    document by `min_margin` nats (asking within one document, or a library of one, its
    next part: the only alternative there). When retrieval ranked another part first, the
    model's choice alone must reach `alone_pmi`: two rankers agreeing is evidence, one
    overruling the other needs more. A neighbour (same document) about as good is cited
    too. `one_document` defaults to whether the question was asked of one document."""
    by_id = {c.part_id: c for c in decision.candidates}
    retrieval_best = decision.candidates[0].part_id if decision.candidates else None
    scores = reranking.scores
    checked = [by_id[s.part_id] for s in scores if s.part_id in by_id]
    rest = [c for c in decision.candidates if c.part_id not in {s.part_id for s in scores}]
    method = RERANKED[decision.method]
    extra = {**decision.extra, "rerank": reranking.as_dict()}
    base = replace(
        decision,
        candidates=checked + rest,
        method=method,
        extra=extra,
        confident=False,
        cited=[],
        reason="",
    )
    if not scores:
        unread = len(reranking.not_checked)
        why = (
            f" ({unread} stored under other settings or another model, to be re-read first)"
            if unread
            else ""
        )
        return replace(base, reason=f"no candidate part could be checked by the model{why}")
    first = scores[0]
    if one_document is None:
        one_document = decision.scope != "library"
    rival = next(
        (s for s in scores[1:] if one_document or s.document_id != first.document_id), None
    )
    margin = first.pmi - rival.pmi if rival is not None else float("inf")
    base = replace(base, best_score=first.pmi, margin=margin, strength=first.pmi)
    refusal = _refusal(first, margin, retrieval_best, min_pmi, min_margin, alone_pmi, one_document)
    if refusal:
        return replace(base, reason=refusal)
    cited = [by_id[first.part_id]] + [
        by_id[s.part_id]
        for s in scores[1:3]
        if s.document_id == first.document_id
        and s.part_id in by_id
        and first.pmi - s.pmi < min_margin
        and not one_document
    ]
    return replace(base, confident=True, cited=cited)


def _refusal(
    first: PartScore,
    margin: float,
    retrieval_best: str | None,
    min_pmi: float,
    min_margin: float,
    alone_pmi: float,
    one_document: bool,
) -> str:
    """Why the model's evidence does not settle the question, in words ("": it does)."""
    # Plain words for the window; the model's scores themselves are in --json ("rerank").
    if first.pmi < min_pmi:
        return (
            f"the model finds no part that explains the question: even the best, part "
            f"{first.part_no} of {first.n_parts}, falls short of the bar set in Settings"
        )
    if margin < min_margin:
        alike = "two parts" if one_document else "parts of two documents"
        return f"{alike} explain the question about as well, so the answer could come from either"
    if first.part_id != retrieval_best and first.pmi < alone_pmi:
        return (
            f"the model leans to part {first.part_no} of {first.n_parts} while the question's "
            "words point to another part, and it is not sure enough to overrule them"
        )
    return ""
