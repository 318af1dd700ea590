"""Documents: read once, stored as blocks (in parts when longer than the context), stacked on
a conversation as a chain link that reads only the new document."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.engine import Counters
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.errors import InputError, NotFoundError, check_text
from galahad_desktop.faults import crashpoint
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.documents.extraction import (
    extract_text_bounded,
    overlap_tail,
    split_for_parts,
)
from galahad_desktop.memory.results import DepositResult, DocumentSummary, PartSummary, TurnResult
from galahad_desktop.vault.names import BlockRow, DocumentRow, PartRow
from galahad_desktop.vault.vault import new_id

log = logging.getLogger(__name__)
ANSWER_RESERVE = 512  # room kept free after a document for a question and its answer
MAX_DOCUMENT_CHARS = 40_000_000
DOCUMENT_ACK = 'I have read "{name}". Ask me about it.'


@dataclass(frozen=True)
class PlannedPart:
    text: str  # the part's own text
    overlap: str  # the end of the previous part, repeated at its start
    tokens: int  # its document turn's length


class Documents:
    def __init__(self, live: LiveContext, conversations: Conversations) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records
        self.conversations = conversations
        self.on_parts_added: Any = lambda parts: None  # the router's index follows deposits

    @property
    def engine(self) -> ChatEngine:
        return self.live.engine

    # -- records -------------------------------------------------------------------------
    def row(self, document_id: str) -> DocumentRow:
        return self.conversations.document_row(document_id)

    def name(self, row: DocumentRow) -> str:
        return self.live.records.decrypt("documents", "name_enc", row)

    def text(self, document_id: str) -> str:
        row = self.row(document_id)
        return self.live.records.decrypt("documents", "text_enc", row)

    def part_rows(self, document_id: str | None = None) -> list[PartRow]:
        if document_id is None:
            return self.records.parts("document_id, part_no")
        return self.records.parts("part_no", document_id=document_id)

    def part_text(self, part: PartRow) -> str:
        return self.live.records.decrypt("parts", "text_enc", part)

    def part_row(self, part_id: str) -> PartRow:
        part = self.records.part(part_id)
        if part is None:
            raise NotFoundError(f"No document part has the id '{part_id}'.")
        return part

    def parts(self, document_id: str) -> list[PartSummary]:
        self.row(document_id)
        return [
            PartSummary(r["id"], r["part_no"], r["n_parts"], r["block_id"], r["n_tokens"])
            for r in self.part_rows(document_id)
        ]

    def summaries(self) -> list[DocumentSummary]:
        out = []
        for r in self.records.documents("created_at desc"):
            block = self.records.block(r["block_id"])
            out.append(
                DocumentSummary(
                    r["id"],
                    self.name(r),
                    r["n_tokens"],
                    block["file_bytes"] if block else 0,
                    r["source_bytes"],
                    r["created_at"],
                    "stored" if block else "missing block",
                    r.get("n_parts") or 1,
                )
            )
        return out

    # -- tokens --------------------------------------------------------------------------
    def limit(self) -> int:
        return self.engine.n_ctx - ANSWER_RESERVE

    def document_tokens(self, name: str, text: str) -> list[int]:
        return self.engine.turns.document_turn(
            f'Document "{name}":\n\n{text}', DOCUMENT_ACK.format(name=name)
        )

    def part_tokens(
        self, name: str, part_no: int, n_parts: int, overlap: str, text: str
    ) -> list[int]:
        """One part of a long document as its own document turn, under a short header (title,
        part i of n, and the end of the previous part) so the model knows where it is."""
        if n_parts == 1:
            return self.document_tokens(name, text)
        lead = f"(continued from part {part_no - 1}) …{overlap}\n\n" if overlap else ""
        return self.engine.turns.document_turn(
            f'Document "{name}", part {part_no} of {n_parts}:\n\n{lead}{text}',
            f'I have read part {part_no} of {n_parts} of "{name}".',
        )

    def _count(self, text: str) -> int:
        return len(self.engine.encode_text(text))

    def part_budget(self) -> int:
        """Tokens per part: the setting, or what fits with room for a question and answer."""
        limit = self.limit()
        configured = self.live.settings.get("part_tokens")
        return int(min(configured, limit) if configured else limit)

    def plan_parts(self, name: str, text: str) -> list[PlannedPart]:
        """Every part's own text, overlap and token count; one part when the document fits.
        Tokens are not kept: a long document never holds more than one part's tokens (the
        deposit makes each part's tokens again when it reads that part)."""
        budget = self.part_budget()
        if len(text) <= budget * 8:  # a token is rarely over 8 characters: it may fit whole
            whole = len(self.document_tokens(name, text))
            if whole <= budget:
                return [PlannedPart(text, "", whole)]
        overlap_tokens = self.live.settings.get("part_overlap")
        overhead = len(self.part_tokens(name, 999, 999, "x", "")) + overlap_tokens + 16
        room = budget - overhead
        if room < 64:
            raise InputError(
                f"The {self.engine.n_ctx:,}-token context leaves too little room to store "
                f"'{name}' in parts; raise n_ctx (or lower part_overlap)."
            )
        for attempt in range(4):
            pieces = split_for_parts(text, room, self._count)
            planned = []
            for index, piece in enumerate(pieces):
                overlap = (
                    overlap_tail(pieces[index - 1], overlap_tokens, self._count) if index else ""
                )
                size = len(self.part_tokens(name, index + 1, len(pieces), overlap, piece))
                planned.append(PlannedPart(piece, overlap, size))
            if all(p.tokens <= budget for p in planned):
                return planned
            room = int(room * 0.9)  # token counts of pieces do not add up exactly: retry
            log.info("document parts ran over the budget; retrying (attempt %d)", attempt + 1)
        raise InputError(f"'{name}' could not be cut into parts of {budget:,} tokens.")

    def rendered_part(self, block_id: str) -> list[int] | None:
        """A stored part's tokens rebuilt for the current model (None: not a part)."""
        parts = self.records.parts(block_id=block_id)
        if not parts:
            return None
        part = parts[0]
        document = self.row(part["document_id"])
        name = self.name(document)
        overlap = ""
        if part["part_no"] > 1:
            previous = self.records.parts(
                document_id=part["document_id"], part_no=part["part_no"] - 1
            )
            if previous:
                overlap = overlap_tail(
                    self.part_text(previous[0]),
                    self.live.settings.get("part_overlap"),
                    self._count,
                )
        tokens = self.part_tokens(
            name, part["part_no"], part["n_parts"], overlap, self.part_text(part)
        )
        if len(tokens) > self.limit():
            raise InputError(
                f"Part {part['part_no']} of '{name}' does not fit this model's context; "
                "store the document again (forget it, then add it) to cut it anew."
            )
        return tokens

    # -- depositing ----------------------------------------------------------------------
    def deposit(
        self,
        path: Path,
        job: Job = NO_JOB,
        name: str | None = None,
    ) -> DepositResult:
        """Read a document once, store its KV block, and return what it cost."""
        path = Path(path)
        text = extract_text_bounded(path, job=job)
        return self.deposit_text(name or path.name, text, path.stat().st_size, job)

    def deposit_text(
        self,
        name: str,
        text: str,
        source_bytes: int | None = None,
        job: Job = NO_JOB,
    ) -> DepositResult:
        """Store a document given as text (the file was read already, or it was generated).

        A document longer than the context is cut into parts, each prefilled at its own
        positions under a short header and stored as its own block. Every part is durable
        when written; the document exists (in one transaction) once all parts are.
        """
        check_text(text, f"The document '{name}'")
        check_text(name, "The document's name")
        if not text.strip():
            raise InputError(f"'{name}' contains no text.")
        if len(text) > MAX_DOCUMENT_CHARS:
            raise InputError(
                f"'{name}' has {len(text):,} characters; at most {MAX_DOCUMENT_CHARS:,} are "
                "accepted in one document. Nothing was stored."
            )
        engine = self.engine
        plan = self.plan_parts(name, text)
        total = sum(part.tokens for part in plan)
        document_id = new_id("d")
        self.live.drop()
        prefill_ms = capture_ms = 0.0
        persist_start = time.perf_counter()
        persist_ms = 0.0
        rows: list[BlockRow] = []
        done = 0
        try:
            for number, part in enumerate(plan, start=1):
                tokens = self.part_tokens(name, number, len(plan), part.overlap, part.text)
                engine.reset()
                prefill_ms += engine.evaluate(tokens, job.step(done, total, persist_start))
                step = time.perf_counter()
                row, _record = self.live.persist("document", document_id, None, 1)
                persist_ms += (time.perf_counter() - step) * 1e3
                capture_ms += row["capture_ms"]
                rows.append(row)
                done += len(tokens)
            crashpoint("deposit-before-commit")
            records = self.live.records
            now = time.time()
            added = []
            with self.vault.transaction():
                for row in rows:
                    self.records.insert("blocks", row)
                for index, (row, part) in enumerate(zip(rows, plan, strict=True)):
                    piece = part.text
                    part_row: PartRow = {
                        "id": new_id("p"),
                        "document_id": document_id,
                        "part_no": index + 1,
                        "n_parts": len(plan),
                        "block_id": row["id"],
                        "n_tokens": part.tokens,
                        "created_at": now,
                    }
                    part_row["text_enc"] = records.encrypt("parts", "text_enc", part_row, piece)
                    self.records.insert("parts", part_row)
                    added.append((part_row["id"], document_id, index + 1, len(plan), piece))
                document: DocumentRow = {
                    "id": document_id,
                    "block_id": rows[0]["id"],
                    "n_tokens": total,
                    "n_parts": len(plan),
                    "source_bytes": source_bytes
                    if source_bytes is not None
                    else len(text.encode("utf-8")),
                    "created_at": now,
                }
                document["name_enc"] = records.encrypt("documents", "name_enc", document, name)
                document["text_enc"] = records.encrypt("documents", "text_enc", document, text)
                self.records.insert("documents", document)
        except BaseException:
            self.vault.unlink_block_files([row["id"] for row in rows])
            raise
        self.on_parts_added(added)
        if len(plan) == 1:
            self.live.mark(document_id, rows[0]["id"])
        return DepositResult(
            document_id,
            name,
            total,
            prefill_ms,
            capture_ms,
            persist_ms,
            sum(row["file_bytes"] for row in rows),
            rows[0]["id"],
            len(plan),
        )

    # -- stacked documents ---------------------------------------------------------------
    def add_to_conversation_file(
        self,
        conversation_id: str,
        path: Path,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """add_to_conversation for a file: its text is extracted in a limited child."""
        path = Path(path)
        text = extract_text_bounded(path, job=job)
        return self.add_to_conversation(conversation_id, path.name, text, job)

    def add_to_conversation(
        self,
        conversation_id: str,
        name: str,
        text: str,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Put a document into an ongoing conversation: graft what it holds, prefill only the
        new document on top, and store that as the chain's next link (earlier documents
        and turns are never re-read)."""
        if not text.strip():
            raise InputError(f"'{name}' contains no text.")
        conversations = self.conversations
        conv = conversations.row(conversation_id)
        counters = Counters()
        graft = conversations.ensure_live(conv, counters, job)
        engine = self.engine
        ack = DOCUMENT_ACK.format(name=name)
        tokens = engine.turns.document_turn(f'Document "{name}":\n\n{text}', ack, opening=False)
        if len(tokens) + 64 > engine.room():
            raise InputError(
                f"'{name}' is {len(tokens):,} tokens; this conversation has room for "
                f"{max(0, engine.room() - 64):,} more. Ask the library instead, or start a new "
                "conversation. Nothing was stored."
            )
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        counters.prefill_ms += engine.evaluate(tokens, job)
        counters.new_tokens += len(tokens)
        reply_end = len(engine.tokens)
        persist_start = time.perf_counter()
        seq = conv["n_messages"] or 0
        row, _record = self.live.persist(
            "conversation",
            conv["id"],
            conversations.live_parent(conv, conv["head_block_id"] or None),
            self.live.next_generation(conv["id"]),
            counters,
        )
        conversations.commit_turn(
            conv,
            row,
            seq,
            name,
            ack,
            (user_start, reply_end, reply_end),
            [],
            roles=("document", "model"),
            content=text,
        )
        counters.persist_ms += (time.perf_counter() - persist_start) * 1e3
        return TurnResult(
            conv["id"],
            ack,
            "document",
            counters,
            graft.proof if graft else proofs.NO_PROOF,
            graft,
            len(engine.tokens),
            engine.n_ctx,
            0.0,
        )
