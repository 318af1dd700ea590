"""The facade's documents half: deposits, the library's listing, documents read or stacked
into conversations. Mixed into `Galahad` (memory/galahad.py), which front ends call; it holds
no state of its own."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from galahad_desktop.engine.values import VisionStatus
from galahad_desktop.errors import InputError, ModelError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.documents.documents import Documents
from galahad_desktop.memory.results import (
    DepositResult,
    DocumentSummary,
    PartSummary,
    TurnResult,
)
from galahad_desktop.memory.usage import Usage


class DocumentFacade:
    live: LiveContext
    documents: Documents
    usage: Usage

    # -- documents -----------------------------------------------------------------------
    def deposit(
        self, path: Path, job: Job = NO_JOB, name: str | None = None, anyway: bool = False
    ) -> DepositResult:
        """Read a document file once and store it as encrypted blocks (long ones in parts,
        pictures through the projector). One whose memory would not fit the disk budget or
        the disk is refused before it is read (WontFitError), unless `anyway`."""
        return self.documents.deposit(path, job, name, anyway)

    def deposit_text(
        self,
        name: str,
        text: str,
        source_bytes: int | None = None,
        job: Job = NO_JOB,
        anyway: bool = False,
    ) -> DepositResult:
        """Read text once and store it as a document, as `deposit` does for a file."""
        return self.documents.deposit_text(name, text, source_bytes, job, anyway)

    def list_documents(self) -> list[DocumentSummary]:
        """Every stored document's summary."""
        return self.documents.summaries()

    def document_limit(self) -> int:
        """The most tokens one document part may hold with this context."""
        return self.documents.limit()

    def parts(self, document_id: str) -> list[PartSummary]:
        """A stored document's parts (numbers, tokens, blocks)."""
        return self.documents.parts(document_id)

    def document_picture(self, document_id: str, part_no: int = 1) -> bytes | None:
        """A picture document's PNG (or a scanned page's), decrypted in memory."""
        return self.documents.picture(document_id, part_no)

    def document_memo(self, document_id: str) -> bytes | None:
        """A voice memo's whole sound as a WAV, decrypted in memory (None: not a memo)."""
        return self.documents.memo(document_id)

    def vision_status(self) -> VisionStatus:
        """Whether this model reads pictures, and with which projector (a projector that
        does not load is reported, not raised)."""
        path = self.live.projector_path()
        if path is None:
            return VisionStatus()
        try:
            vision = self.live.vision()
        except (InputError, ModelError) as exc:
            return VisionStatus(projector=str(path), problem=str(exc))
        v = vision
        return VisionStatus(pictures=v.sees, audio=v.hears, projector=str(path), **v.details)

    def document_parts_count(self, document_id: str) -> int:
        """How many parts a stored document has."""
        return int(self.documents.row(document_id).get("n_parts") or 1)

    def add_document_file(
        self,
        conversation_id: str,
        path: Path,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Put a document file into an ongoing conversation (read in the limited child);
        only it is read."""
        result = self.documents.add_to_conversation_file(conversation_id, path, job)
        self.usage.record_turn(result)
        return result

    def add_stored_documents(
        self,
        conversation_id: str,
        document_ids: Sequence[str],
        job: Job = NO_JOB,
        verify: bool = False,
    ) -> TurnResult:
        """Stack stored documents into a conversation without reading them again (their
        first tokens recomputed): close to a full read, never byte-exact; `verify` measures
        how close against one (its figures on `result.stack.quality`)."""
        result = self.documents.add_stored_to_conversation(
            conversation_id, list(document_ids), job, verify=verify
        )
        self.usage.record_turn(result)
        return result

    def add_pasted_picture(
        self, conversation_id: str, png: bytes, name: str, job: Job = NO_JOB
    ) -> TurnResult:
        """A picture pasted into the message box (PNG bytes from the window's encoder):
        read on top of the conversation like a dropped one, never written to a file."""
        result = self.documents.add_pasted_picture(conversation_id, png, name, job)
        self.usage.record_turn(result)
        return result

    def add_document(
        self,
        conversation_id: str,
        name: str,
        text: str,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Put a document's text into an ongoing conversation: only it is read, on top of
        what the conversation holds."""
        result = self.documents.add_to_conversation(conversation_id, name, text, job)
        self.usage.record_turn(result)
        return result
