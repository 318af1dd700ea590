"""Hybrid routing: words (BM25) and meaning (an embedding model), fused by score.

Parts are long (thousands of tokens), so both halves look at passages of about 120 words cut
from each part, overlapping by 20. The lexical half is the router's FTS5/BM25 index over
those passages; the semantic half is the cosine similarity between the question's vector and
each passage's. A passage scores LEXICAL_WEIGHT x its BM25 / the best passage's BM25, plus
the rest x its similarity; a part is as good as its best passage.

Why scores and not ranks: reciprocal-rank fusion was measured first and lost. A question
that names something ("What is Morgana's access code?") matches one passage by its rare
words and every passage alike by meaning; rank fusion lets the meaning ranking's noise
outvote the one clear word match (generated ledgers: 27 of 50 routed right, against 50 of
50 for words alone), while score fusion keeps the gap the words open (50 of 50) and still
routes more paraphrased questions right than words alone (`eval routing`).

The gate answers from the best part when its lead over the best part of any *other*
document is clear (margin; parts of the same document are neighbours, cited together when
they score close) and either of two things holds: its best passage is close in meaning to
the question (similarity) and holds some of its words (coverage, which keeps a question on
a similar subject about something absent from being answered); or the passage holds nearly
all of the question's words (an exact lookup of a name or code, where meaning says little).

Vectors, like the FTS index, exist only in memory after unlock: built from the decrypted
parts, dropped on lock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from galahad_desktop.memory.retrieval.router import Candidate, PartIndex, RouteDecision

PASSAGE_WORDS = 120
PASSAGE_STRIDE = 100
LEXICAL_WEIGHT = 0.7
LEXICAL_DEPTH = 100  # passages taken from the lexical ranking (the rest score 0 on words)
CJK_PIECE = 3  # characters of a space-less script counted as one word
_PIECE = re.compile(r"\S+")
_CJK_CHAR = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def passages(text: str) -> list[str]:
    """Overlapping windows of about PASSAGE_WORDS words. A run of Chinese or Japanese
    (no spaces) is counted CJK_PIECE characters to a word, so its passages are as long in
    tokens as English ones."""
    pieces: list[str] = []
    for piece in _PIECE.findall(text):
        if len(piece) > CJK_PIECE and _CJK_CHAR.search(piece):
            pieces.extend(piece[i : i + CJK_PIECE] for i in range(0, len(piece), CJK_PIECE))
        else:
            pieces.append(piece)
    if len(pieces) <= PASSAGE_WORDS:
        return [" ".join(pieces)] if pieces else []
    out = []
    for start in range(0, len(pieces), PASSAGE_STRIDE):
        out.append(" ".join(pieces[start : start + PASSAGE_WORDS]))
        if start + PASSAGE_WORDS >= len(pieces):
            break
    return out


class VectorStore(Protocol):
    """Where a part's passage vectors are kept between sessions (encrypted by the caller)."""

    def load(self, part_id: str, title: str, n_passages: int) -> np.ndarray | None: ...

    def store(self, part_id: str, title: str, vectors: np.ndarray) -> None: ...


@dataclass(frozen=True)
class _Part:
    document_id: str
    part_no: int
    n_parts: int
    passage_ids: tuple[str, ...]
    vectors: np.ndarray  # (passages, dimensions), unit length


class HybridIndex:
    """Same interface as PartIndex, over passages, with vectors beside the words."""

    def __init__(
        self,
        embed_passages: Callable[[list[str]], np.ndarray],
        embed_query: Callable[[str], np.ndarray],
        store: VectorStore | None = None,
    ) -> None:
        self.lexical = PartIndex()
        self._store = store
        self.embedded_passages = 0  # passages read through the model (not found stored)
        self._embed_passages = embed_passages
        self._embed_query = embed_query
        self._parts: dict[str, _Part] = {}
        self._passage_part: dict[str, str] = {}
        self._matrix: dict[str | None, tuple[list[str], np.ndarray]] = {}

    def add(self, rows: Iterable[tuple[str, str, int, int, str]], title: str = "") -> None:
        for part_id, document_id, part_no, n_parts, text in rows:
            texts = passages(text) or [title or part_id]
            ids = tuple(f"{part_id}@{i}" for i in range(len(texts)))
            vectors = self._store.load(part_id, title, len(texts)) if self._store else None
            if vectors is None:
                vectors = self._embed_passages([f"{title}: {t}" if title else t for t in texts])
                self.embedded_passages += len(texts)
                if self._store is not None:
                    self._store.store(part_id, title, vectors)
            rows_of_passages = [
                (pid, document_id, i, len(texts), t)
                for i, (pid, t) in enumerate(zip(ids, texts, strict=True))
            ]
            self.lexical.add(rows_of_passages, title=title)
            self._parts[part_id] = _Part(document_id, part_no, n_parts, ids, vectors)
            self._passage_part.update({pid: part_id for pid in ids})
        self._matrix.clear()

    def remove_document(self, document_id: str) -> None:
        self.lexical.remove_document(document_id)
        for part_id in [p for p, part in self._parts.items() if part.document_id == document_id]:
            for pid in self._parts.pop(part_id).passage_ids:
                self._passage_part.pop(pid, None)
        self._matrix.clear()

    def __len__(self) -> int:
        return len(self._parts)

    def count(self, document_id: str | None = None) -> int:
        if document_id is None:
            return len(self._parts)
        return sum(1 for p in self._parts.values() if p.document_id == document_id)

    @property
    def passage_count(self) -> int:
        return len(self._passage_part)

    def close(self) -> None:
        self.lexical.close()
        self._parts.clear()
        self._passage_part.clear()
        self._matrix.clear()

    def _vectors(self, document_id: str | None) -> tuple[list[str], np.ndarray]:
        if document_id not in self._matrix:
            parts = [
                p
                for p in self._parts.values()
                if document_id is None or p.document_id == document_id
            ]
            ids = [pid for p in parts for pid in p.passage_ids]
            matrix = (
                np.concatenate([p.vectors for p in parts])
                if parts
                else np.zeros((0, 1), dtype=np.float32)
            )
            self._matrix[document_id] = (ids, matrix)
        return self._matrix[document_id]

    def coverage(self, question: str, part_ids: Iterable[str], document_id: str | None) -> float:
        """The share of the question's words the parts hold between them (in any passage)."""
        held = [pid for p in part_ids if p in self._parts for pid in self._parts[p].passage_ids]
        return self.lexical.coverage(question, held, document_id)

    def search(
        self, question: str, document_id: str | None = None, limit: int = 8
    ) -> tuple[list[str], list[Candidate]]:
        """(terms, parts best first), each part scored by its best passage."""
        terms, lexical = self.lexical.search(
            question, document_id, limit=LEXICAL_DEPTH, by_score=True
        )
        ids, matrix = self._vectors(document_id)
        if not ids:
            return terms, []
        similarity = matrix @ self._embed_query(question)
        top = max((c.score for c in lexical), default=0.0)
        words = {c.part_id: (c.score / top if top > 0 else 0.0, c.coverage) for c in lexical}
        fused = {
            pid: LEXICAL_WEIGHT * words.get(pid, (0.0, 0.0))[0]
            + (1 - LEXICAL_WEIGHT) * float(similarity[i])
            for i, pid in enumerate(ids)
        }
        position = {pid: i for i, pid in enumerate(ids)}
        best: dict[str, str] = {}  # part id -> its best passage
        for pid in sorted(fused, key=lambda p: -fused[p]):
            best.setdefault(self._passage_part[pid], pid)
        candidates = []
        for part_id, pid in list(best.items())[:limit]:
            part = self._parts[part_id]
            candidates.append(
                Candidate(
                    part_id,
                    part.document_id,
                    part.part_no,
                    part.n_parts,
                    fused[pid],
                    words.get(pid, (0.0, 0.0))[1],
                    float(similarity[position[pid]]),
                )
            )
        return terms, candidates


def decide_hybrid(
    terms: list[str],
    candidates: list[Candidate],
    min_similarity: float,
    min_coverage: float,
    min_margin: float,
    strong_coverage: float,
    scope: str,
) -> RouteDecision:
    """The gate on fused candidates (see the module's description)."""

    def refuse(reason: str, margin: float = 0.0) -> RouteDecision:
        best = candidates[0].score if candidates else 0.0
        strength = (candidates[0].similarity or 0.0) if candidates else 0.0
        return RouteDecision(
            terms, candidates, best, margin, False, reason, scope, strength, method="hybrid"
        )

    if not candidates:
        return refuse("no document is stored here")
    first = candidates[0]
    similarity = first.similarity or 0.0
    rival = next((c for c in candidates[1:] if c.document_id != first.document_id), None)
    margin = first.score / rival.score if rival is not None and rival.score > 0 else float("inf")
    where = f"part {first.part_no} of {first.n_parts}"
    by_words = first.coverage >= strong_coverage
    if not by_words and similarity < min_similarity:
        return refuse(
            f"nothing stored is close in meaning: the closest passage ({where}) is "
            f"{similarity:.0%} similar to the question, and at least {min_similarity:.0%} is "
            "needed",
            margin,
        )
    if not by_words and first.coverage < min_coverage:
        return refuse(
            f"the closest passage ({where}) is on a similar subject but holds only "
            f"{first.coverage:.0%} of the question's words (at least {min_coverage:.0%} is "
            "needed), so it may well not hold the answer",
            margin,
        )
    if margin < min_margin:
        return refuse(
            f"two documents match about as well (the best scores {margin:.2f}× the other; "
            f"{min_margin:.2f}× is needed)",
            margin,
        )
    cited = [first] + [
        c
        for c in candidates[1:3]
        if c.document_id == first.document_id and c.score * min_margin >= first.score
    ]
    return RouteDecision(
        terms,
        candidates,
        first.score,
        margin,
        True,
        "",
        scope,
        similarity,
        # Answered on the words route: the meaning gate was not what let it through.
        extra={"by_words": by_words and similarity < min_similarity},
        cited=cited,
        method="hybrid",
    )
