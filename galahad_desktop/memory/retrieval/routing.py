"""Asking the library: which stored part answers a question (the router and its confidence
gate), and the answer from that part's graft. The index exists only in memory after unlock."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sqlite3
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import (
    InputError,
    NotFoundError,
    StorageError,
    user_path,
)
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.documents.documents import Documents
from galahad_desktop.memory.documents.stacked import reread_given_back, stack_stored_block
from galahad_desktop.memory.results import AskResult
from galahad_desktop.memory.retrieval.across import across
from galahad_desktop.memory.retrieval.hybrid import HybridIndex, decide_hybrid
from galahad_desktop.memory.retrieval.rerank import (
    Reranker,
    Scored,
    candidates_to_check,
    decide_reranked,
)
from galahad_desktop.memory.retrieval.router import (
    RERANKED,
    Candidate,
    PartIndex,
    RouteDecision,
    RoutingMethod,
    decide,
)
from galahad_desktop.vault.names import NewPart, PartRow
from galahad_desktop.vault.vault import Vault, new_id

if TYPE_CHECKING:
    from galahad_desktop.engine.embedder import Embedder

ROUTING_LOG_KEEP = 1000
log = logging.getLogger(__name__)

# Plain words (the window shows them); the command adds how to get one in the terminal.
WORDS_ALONE = "words alone (BM25); an embedding model adds meaning (Meaning model, in Settings)"


class StoredVectors:
    """Passage vectors kept encrypted in the catalog (table part_vectors), so an unlock does
    not read every document through the embedding model again. The row id is derived from
    the part, the document's name (embedded with each passage) and the model, and the
    ciphertext is bound to it; the passage count and dimensions travel inside it. Anything
    that does not open or does not fit is computed again, never used."""

    def __init__(self, vault: Vault, model: str) -> None:
        self.vault = vault
        self.model = model

    def _row_id(self, part_id: str, title: str) -> str:
        key = f"{part_id}\0{title}\0{self.model}".encode()
        return "v" + hashlib.sha256(key).hexdigest()[:31]

    def load(self, part_id: str, title: str, n_passages: int) -> np.ndarray | None:
        row_id = self._row_id(part_id, title)
        raw = self.vault.records.vectors(row_id)
        if raw is None:
            return None
        n, dims = struct.unpack_from("<II", raw)
        if n != n_passages or len(raw) != 8 + n * dims * 2:
            log.warning("stored vectors %s do not fit the part; computed again", row_id)
            return None
        vectors: np.ndarray = np.frombuffer(raw, dtype="<f2", offset=8).reshape(n, dims)
        return vectors.astype(np.float32)

    def store(self, part_id: str, title: str, vectors: np.ndarray) -> None:
        row_id = self._row_id(part_id, title)
        n, dims = vectors.shape
        payload = struct.pack("<II", n, dims) + vectors.astype("<f2").tobytes()
        try:
            with self.vault.transaction():
                self.vault.records.put_vectors(
                    row_id,
                    payload,
                    part_id=part_id,
                    model=self.model,
                    n_passages=n,
                    dims=dims,
                    created_at=time.time(),
                )
        except (StorageError, sqlite3.Error) as exc:  # a full disk: routing goes on
            log.warning("vectors of a part not kept (%s); computed again next time", exc)


@dataclass(frozen=True)
class RoutingLogEntry:
    at: float
    scope: str
    candidates: list[list[Any]]
    best_score: float
    margin: float
    decision: str
    part_id: str | None
    method: RoutingMethod | Literal[""] = ""  # "": logged before methods were recorded
    rerank: list[list[Any]] | None = None  # [part id, PMI in nats], best first
    rerank_ms: float | None = None


def _logged_method(value: object) -> RoutingMethod | Literal[""]:
    """A routing log entry's method, as logged ("": an entry from before methods were)."""
    unknown: Literal[""] = ""
    return next((m for m in RERANKED if m == value), unknown)  # its keys: every method


class Routing:
    def __init__(self, live: LiveContext, documents: Documents) -> None:
        self.live = live
        self.vault = live.vault
        self.documents = documents
        self._index: PartIndex | HybridIndex | None = None
        self._index_model = ""  # the embedding model the index's vectors came from
        self._embedder: Embedder | None = None
        self.reranker = Reranker(live)

    # -- the index -----------------------------------------------------------------------
    def embedder(self) -> Embedder | None:
        """The embedding model in settings, loaded on first use (None: words alone)."""
        setting = str(self.live.settings.values.embedding_model or "").strip()
        wanted = user_path(setting) if setting else None
        if self._embedder is not None and self._embedder.path != wanted:
            self._embedder.close()
            self._embedder = None
        if wanted is not None and self._embedder is None:
            from galahad_desktop.engine.embedder import Embedder  # llama.cpp: on first use

            self._embedder = Embedder(wanted, self.live.settings.values.n_threads)
        return self._embedder

    def describe(self) -> str:
        setting = str(self.live.settings.values.embedding_model or "").strip()
        if not setting:
            return WORDS_ALONE
        return f"words and meaning: BM25 fused with {Path(setting).name} (hybrid)"

    @property
    def method(self) -> str:
        return "hybrid" if isinstance(self._index, HybridIndex) else "lexical"

    def index(self) -> PartIndex | HybridIndex:
        """The router's index, built in memory from the decrypted parts (never on disk):
        words alone, or words and an embedding model's vectors when one is set."""
        model = str(self.live.settings.values.embedding_model or "").strip()
        if self._index is not None and self._index_model != model:
            self.drop_index()  # the embedding model changed: vectors from another model
        if self._index is None:
            embedder = self.embedder()
            index: PartIndex | HybridIndex = (
                HybridIndex(
                    embedder.passages,
                    embedder.query,
                    StoredVectors(self.vault, embedder.identity),
                )
                if embedder is not None
                else PartIndex()
            )
            self._index_model = model
            docs = self.documents
            by_document: dict[str, list[PartRow]] = {}
            for row in docs.part_rows():
                by_document.setdefault(row["document_id"], []).append(row)
            for document_id, rows in by_document.items():
                index.add(
                    (
                        (r["id"], r["document_id"], r["part_no"], r["n_parts"], docs.part_text(r))
                        for r in rows
                    ),
                    title=docs.name(docs.row(document_id)),
                )
            self._index = index
        return self._index

    def parts_added(self, parts: list[NewPart]) -> None:
        if self._index is not None and parts:
            self._index.add(parts, title=self.documents.name(self.documents.row(parts[0][1])))

    def drop_index(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
        if self._embedder is not None:  # native memory, freed now rather than at exit
            self._embedder.close()
            self._embedder = None

    def forget_document(self, document_id: str) -> None:
        if self._index is not None:
            self._index.remove_document(document_id)

    # -- routing -------------------------------------------------------------------------
    def retrieve(self, question: str, document_id: str | None = None) -> RouteDecision:
        """Score every part (of one document, or of the whole library) by words (and meaning,
        with an embedding model) and apply that gate; nothing is logged."""
        if document_id is not None:
            self.documents.row(document_id)
        index = self.index()
        limit = max(8, int(self.live.settings.values.rerank_candidates))
        terms, candidates = index.search(question, document_id, limit=limit)
        settings = self.live.settings
        if isinstance(index, HybridIndex):
            return decide_hybrid(
                terms,
                candidates,
                settings.values.route_min_similarity,
                settings.values.route_min_coverage,
                settings.values.route_hybrid_margin,
                settings.values.route_strong_coverage,
                document_id or "library",
            )
        return decide(
            terms,
            candidates,
            settings.values.route_min_strength,
            settings.values.route_min_margin,
            document_id or "library",
        )

    def route(self, question: str, document_id: str | None = None) -> RouteDecision:
        """Retrieval's decision, logged (scores and margin, not the question)."""
        decision = self.retrieve(question, document_id)
        self.log(decision, "answered" if decision.confident else "gated", None)
        return decision

    def _scope_parts(self, document_id: str | None, limit: int) -> list[Candidate]:
        """Every part in scope as a candidate, when there are no more than `limit`."""
        if self.index().count(document_id) > limit:
            return []
        rows = self.documents.part_rows()
        return [
            Candidate(r["id"], r["document_id"], r["part_no"], r["n_parts"], 0.0, 0.0)
            for r in rows
            if document_id is None or r["document_id"] == document_id
        ]

    def rerank(
        self, question: str, decision: RouteDecision, counters: Counters, job: Job = NO_JOB
    ) -> tuple[RouteDecision, Scored | None]:
        """The chat model checks retrieval's best candidates on their grafted blocks; the
        gate decides on its evidence. The best candidate's context is kept."""
        settings = self.live.settings
        limit = int(settings.values.rerank_candidates)
        scope = None if decision.scope == "library" else decision.scope
        candidates = candidates_to_check(
            decision.candidates, self._scope_parts(scope, limit), limit
        )
        if not candidates:
            return decision, None
        known = {c.part_id for c in decision.candidates}
        decision.candidates += [c for c in candidates if c.part_id not in known]
        scored = self.reranker.rerank(question, candidates, counters, job)
        reranked = decide_reranked(
            decision,
            scored.reranking,
            settings.values.route_min_pmi,
            settings.values.route_pmi_margin,
            settings.values.route_pmi_alone,
            one_document=scope is not None or self.vault.records.count("documents") == 1,
        )
        return reranked, scored

    def log(self, decision: RouteDecision, outcome: str, part_id: str | None) -> None:
        entry = {
            "scope": decision.scope,
            "candidates": [[c.part_id, round(c.score, 4)] for c in decision.candidates],
            "documents": sorted({c.document_id for c in decision.candidates}),
            "best_score": decision.best_score,
            "margin": decision.margin if decision.margin != float("inf") else -1.0,
            "decision": outcome,
            "part_id": part_id or (decision.best.part_id if decision.best else None),
            "method": decision.method,
        }
        rerank = decision.extra.get("rerank")
        if rerank is not None:  # the model's scores, never the question
            entry["rerank"] = [[s["part_id"], s["pmi"]] for s in rerank["scores"]]
            entry["rerank_ms"] = rerank["ms"]
        with self.vault.transaction():
            self.vault.records.log("routing_log", new_id("r"), time.time(), entry, ROUTING_LOG_KEEP)

    def _entries(self) -> list[tuple[str, float, dict[str, Any]]]:
        return self.vault.records.log_entries("routing_log")

    def routing_log(self, limit: int = 100) -> list[RoutingLogEntry]:
        return [
            RoutingLogEntry(
                at,
                str(e.get("scope", "")),
                list(e.get("candidates", [])),
                float(e.get("best_score", 0.0)),
                float(e.get("margin", 0.0)),
                str(e.get("decision", "")),
                e.get("part_id"),
                _logged_method(e.get("method")),
                e.get("rerank"),
                e.get("rerank_ms"),
            )
            for _id, at, e in self._entries()[: max(0, limit)]
        ]

    def forget_log_of(self, document_id: str) -> list[str]:
        """Ids of the log entries that name a document (deleted when it is forgotten)."""
        return [i for i, _at, e in self._entries() if document_id in e.get("documents", [])]

    def citation(self, part_id: str) -> str:
        part = self.documents.part_row(part_id)
        name = self.documents.name(self.documents.row(part["document_id"]))
        return f"{name}, part {part['part_no']} of {part['n_parts']}"

    def across(
        self, question: str, decision: RouteDecision, document_id: str | None
    ) -> RouteDecision | None:
        """The decision to answer from several parts read together (across.py), when the
        question needs them and they fit the context together."""
        values = self.live.settings.values
        if not values.route_across:
            return None
        index = self.index()
        joined = across(
            decision,
            lambda ids: index.coverage(question, ids, document_id),
            values.route_min_strength,
            values.route_min_margin,
        )
        if joined is None:
            return None
        engine = self.live.engine
        room = engine.n_ctx - len(engine.turns.question(question)) - 64
        fitting: list[Candidate] = []
        used = 0
        for candidate in joined.cited:  # best first; those that do not fit are left out
            part = self.vault.records.part(candidate.part_id)
            if part is not None and used + int(part["n_tokens"]) <= room:
                fitting.append(candidate)
                used += int(part["n_tokens"])
        if len(fitting) < 2:
            return None
        if len(fitting) < len(joined.cited):
            each = [index.coverage(question, [c.part_id], document_id) for c in fitting]
            together = index.coverage(question, [c.part_id for c in fitting], document_id)
            extra = {**joined.extra, "across": {"together": together, "each": each}}
            joined = dataclasses.replace(joined, cited=fitting, strength=together, extra=extra)
        return joined

    def ask_across(
        self, question: str, decision: RouteDecision, params: SamplingParams, job: Job = NO_JOB
    ) -> AskResult:
        """Answer from several parts read together: the first grafted (proved, as a single
        part is), the others stacked after it (each moved into place, its first tokens read
        on top: close to a full read, not byte-exact), then the question."""
        self.log(decision, "answered", None)
        parts = []
        for candidate in decision.cited:
            part = self.vault.records.part(candidate.part_id)
            if part is None:
                raise NotFoundError(f"No document part has the id '{candidate.part_id}'.")
            self.live.records.check("parts", part)
            parts.append(part)
        counters = Counters()
        given_back = [(p["block_id"], f"Part {p['id']}") for p in parts[1:]]
        reread_given_back(self.live, given_back, counters, job)  # read once, stored again
        parts = [self.vault.records.part(p["id"]) or p for p in parts]  # re-read: new blocks
        engine = self.live.engine
        first = parts[0]
        graft = None
        if not self.live.holds(first["document_id"], first["block_id"]):
            graft = self.live.graft(first["block_id"], first["document_id"], counters, job)
        self.live.drop()  # the context now holds a one-off stack
        opening = list(engine.probe_tokens)
        lead: list[int] = []  # the graft left the next turn's opening in the context
        for part in parts[1:]:
            # Each part's opening is read with its first tokens, its last token with what
            # follows it: one step per part.
            placed = stack_stored_block(
                self.live,
                part["block_id"],
                part["document_id"],
                lead,
                job,
                f"Part {part['id']} was stored in another turn format; forget its document "
                "and add it again.",
            )
            counters.restore_ms += placed.elapsed_ms
            counters.recomputed_tokens += placed.recomputed
            counters.stacked_tokens += placed.n_tokens - placed.recomputed
            counters.new_tokens += len(lead)
            lead = opening
        question_tokens = [*lead, *engine.turns.question(question)]
        counters.prefill_ms += engine.evaluate(question_tokens, job)
        counters.new_tokens += len(question_tokens)
        generation = engine.generate(params, job).check_device()
        counters.generated_tokens += len(generation.tokens)
        counters.generate_ms += generation.elapsed_ms
        citations = [self.citation(p["id"]) for p in parts]
        return AskResult(
            question,
            decision,
            True,
            generation.text,
            " and ".join(citations),
            first["id"],
            first["document_id"],
            graft,
            counters,
            generation.stop_reason,
            [self.citation(c.part_id) for c in decision.candidates],
            citations,
            across=True,
        )

    # -- asking --------------------------------------------------------------------------
    def ask(
        self,
        question: str,
        document_id: str | None,
        part_id: str | None,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> AskResult:
        """Answer a question from the stored part the router picks (or `part_id`, the user's
        choice among the candidates). A weak or ambiguous match is not answered: the result
        carries the candidates instead. Nothing is stored but the routing log."""
        if not question.strip():
            raise InputError("The question is empty.")
        decision = self.retrieve(question, document_id)
        if part_id is None:
            joined = self.across(question, decision, document_id)
            if joined is not None:
                return self.ask_across(question, joined, params, job)
        counters = Counters()
        scored: Scored | None = None
        try:
            # Retrieval answers what it is sure of; the model checks what it is not.
            if part_id is None and not decision.confident and self.live.settings.values.rerank:
                decision, scored = self.rerank(question, decision, counters, job)
            self.log(
                decision,
                "chosen" if part_id else "answered" if decision.confident else "gated",
                part_id,
            )
            cited = [self.citation(c.part_id) for c in decision.candidates]
            if part_id is None:
                if not decision.confident or decision.best is None:
                    self.live.drop()
                    return AskResult(question, decision, False, candidates_cited=cited)
                part_id = decision.best.part_id
            part = self.vault.records.part(part_id)
            if part is None:
                raise NotFoundError(f"No document part has the id '{part_id}'.")
            if document_id is not None and part["document_id"] != document_id:
                raise InputError(f"Part {part_id} is not a part of document {document_id}.")
            self.live.records.check("parts", part)
            engine = self.live.engine
            if scored is not None:
                # The question was evaluated on this part while checking it: answer from
                # there (nothing re-read).
                counters.restore_ms += self.reranker.continue_from_best(scored)
                graft = scored.graft
            else:
                graft = None
                if not self.live.holds(part["document_id"], part["block_id"]):
                    graft = self.live.graft(part["block_id"], part["document_id"], counters, job)
                question_tokens = engine.turns.question(question)
                if len(question_tokens) + 64 > engine.room():
                    raise InputError(
                        "The question is too long for the room left after the document."
                    )
                self.live.drop()  # the context now holds this one-off question
                counters.prefill_ms += engine.evaluate(question_tokens)
                counters.new_tokens += len(question_tokens)
        finally:
            if scored is not None:
                scored.release()
        generation = engine.generate(params, job).check_device()
        counters.generated_tokens += len(generation.tokens)
        counters.generate_ms += generation.elapsed_ms
        return AskResult(
            question,
            decision,
            True,
            generation.text,
            self.citation(part_id),
            part_id,
            part["document_id"],
            graft,
            counters,
            generation.stop_reason,
            cited,
        )
