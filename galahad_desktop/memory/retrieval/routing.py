"""Asking the library: which stored part answers a question (the router and its confidence
gate), and the answer from that part's graft. The index exists only in memory after unlock."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from galahad_desktop.engine.embedder import Embedder
from galahad_desktop.engine.engine import Counters
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.errors import InputError, NotFoundError, StorageError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.documents.documents import Documents
from galahad_desktop.memory.results import AskResult
from galahad_desktop.memory.retrieval.hybrid import HybridIndex, decide_hybrid
from galahad_desktop.memory.retrieval.router import PartIndex, RouteDecision, decide
from galahad_desktop.vault.names import PartRow
from galahad_desktop.vault.vault import Vault, new_id

ROUTING_LOG_KEEP = 1000
log = logging.getLogger(__name__)


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


class Routing:
    def __init__(self, live: LiveContext, documents: Documents) -> None:
        self.live = live
        self.vault = live.vault
        self.documents = documents
        self._index: PartIndex | HybridIndex | None = None
        self._index_model = ""  # the embedding model the index's vectors came from
        self._embedder: Embedder | None = None
        documents.on_parts_added = self._parts_added

    # -- the index -----------------------------------------------------------------------
    def embedder(self) -> Embedder | None:
        """The embedding model in settings, loaded on first use (None: words alone)."""
        setting = str(self.live.settings.get("embedding_model") or "").strip()
        wanted = Path(setting).expanduser() if setting else None
        if self._embedder is not None and self._embedder.path != wanted:
            self._embedder.close()
            self._embedder = None
        if wanted is not None and self._embedder is None:
            self._embedder = Embedder(wanted, self.live.settings.get("n_threads"))
        return self._embedder

    def describe(self) -> str:
        setting = str(self.live.settings.get("embedding_model") or "").strip()
        if not setting:
            return (
                "words alone (BM25); set an embedding model for meaning too: "
                "galahad models get embeddinggemma --use"
            )
        return f"words and meaning: BM25 fused with {Path(setting).name} (hybrid)"

    @property
    def method(self) -> str:
        return "hybrid" if isinstance(self._index, HybridIndex) else "lexical"

    def index(self) -> PartIndex | HybridIndex:
        """The router's index, built in memory from the decrypted parts (never on disk):
        words alone, or words and an embedding model's vectors when one is set."""
        model = str(self.live.settings.get("embedding_model") or "").strip()
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

    def _parts_added(self, parts: list[tuple[str, str, int, int, str]]) -> None:
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
    def route(self, question: str, document_id: str | None = None) -> RouteDecision:
        """Score every part (of one document, or of the whole library) and apply the gate.
        The decision (scores and margin, not the question) goes to the routing log."""
        if document_id is not None:
            self.documents.row(document_id)
        index = self.index()
        terms, candidates = index.search(question, document_id)
        settings = self.live.settings
        if isinstance(index, HybridIndex):
            decision = decide_hybrid(
                terms,
                candidates,
                settings.get("route_min_similarity"),
                settings.get("route_min_coverage"),
                settings.get("route_hybrid_margin"),
                settings.get("route_strong_coverage"),
                document_id or "library",
            )
        else:
            decision = decide(
                terms,
                candidates,
                settings.get("route_min_strength"),
                settings.get("route_min_margin"),
                document_id or "library",
            )
        self.log(decision, "answered" if decision.confident else "gated", None)
        return decision

    def log(self, decision: RouteDecision, outcome: str, part_id: str | None) -> None:
        entry = {
            "scope": decision.scope,
            "candidates": [[c.part_id, round(c.score, 4)] for c in decision.candidates],
            "documents": sorted({c.document_id for c in decision.candidates}),
            "best_score": decision.best_score,
            "margin": decision.margin if decision.margin != float("inf") else -1.0,
            "decision": outcome,
            "part_id": part_id or (decision.best.part_id if decision.best else None),
        }
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
        decision = self.route(question, document_id)
        cited = [self.citation(c.part_id) for c in decision.candidates]
        if part_id is None:
            if not decision.confident or decision.best is None:
                return AskResult(question, decision, False, candidates_cited=cited)
            part_id = decision.best.part_id
        else:
            self.log(decision, "chosen", part_id)
        part = self.vault.records.part(part_id)
        if part is None:
            raise NotFoundError(f"No document part has the id '{part_id}'.")
        if document_id is not None and part["document_id"] != document_id:
            raise InputError(f"Part {part_id} is not a part of document {document_id}.")
        self.live.records.check("parts", part)
        counters = Counters()
        graft = None
        if not self.live.holds(part["document_id"], part["block_id"]):
            graft = self.live.graft(part["block_id"], part["document_id"], counters, job)
        engine = self.live.engine
        question_tokens = engine.turns.question(question)
        if len(question_tokens) + 64 > engine.room():
            raise InputError("The question is too long for the room left after the document.")
        self.live.drop()  # the context now holds this one-off question
        counters.prefill_ms += engine.evaluate(question_tokens)
        counters.new_tokens += len(question_tokens)
        generation = engine.generate(params, job)
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
