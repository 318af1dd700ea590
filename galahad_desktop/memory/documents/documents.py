"""Documents: read once, stored as blocks (in parts when longer than the context), stacked on
a conversation as a chain link that reads only the new document."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from galahad_desktop.engine.picture import Media, Picture, Sound, media_from_kept, pictures_in
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import InputError, NotFoundError, check_text
from galahad_desktop.faults import crashpoint
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.chat.turning import ConversationTurns
from galahad_desktop.memory.documents.audio import is_audio, memo_parts, read_audio_bounded
from galahad_desktop.memory.documents.extraction import (
    NoTextLayer,
    extract_text_bounded,
    overlap_tail,
    split_for_parts,
)
from galahad_desktop.memory.documents.media import (
    MEMO_ACK,
    MEMO_CAPTION,
    PICTURE_ACK,
    MediaTurns,
)
from galahad_desktop.memory.documents.pictures import (
    is_picture,
    picture_from_png,
    read_picture_bytes_bounded,
    read_pictures_bounded,
)
from galahad_desktop.memory.documents.stacking import DOCUMENT_ACK, DocumentStacks
from galahad_desktop.memory.results import (
    DepositResult,
    DocumentKind,
    DocumentSummary,
    PartSummary,
    TurnResult,
)
from galahad_desktop.vault.names import BlockRow, DocumentRow, NewPart, PartRow, given_back
from galahad_desktop.vault.vault import new_id

log = logging.getLogger(__name__)
ANSWER_RESERVE = 512  # room kept free after a document for a question and its answer
MAX_DOCUMENT_CHARS = 40_000_000
AddedPart = tuple[str, str, int, int, str]  # part id, document id, number, of, its text


@dataclass(frozen=True)
class PlannedPart:
    text: str  # the part's own text
    overlap: str  # the end of the previous part, repeated at its start
    tokens: int  # its document turn's length


class Documents(MediaTurns, DocumentStacks):
    """Documents: deposited, read once into blocks, asked, added to conversations."""

    def __init__(
        self,
        live: LiveContext,
        conversations: Conversations,
        turns: ConversationTurns,
        on_parts_added: Callable[[list[NewPart]], None],
    ) -> None:
        super().__init__(live, conversations, turns)
        self.on_parts_added = on_parts_added  # the router's index follows deposits

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
            stored = 0  # every part's block: what the document takes on disk
            returned = block is not None and given_back(block)
            for part in self.records.parts(document_id=r["id"]):
                part_block = self.records.block(part["block_id"])
                if part_block and given_back(part_block):
                    returned = True
                elif part_block:
                    stored += part_block["file_bytes"]
            out.append(
                DocumentSummary(
                    r["id"],
                    self.name(r),
                    r["n_tokens"],
                    stored or (block["file_bytes"] if block and not returned else 0),
                    r["source_bytes"],
                    r["created_at"],
                    "missing block" if not block else "needs re-reading" if returned else "stored",
                    r.get("n_parts") or 1,
                    self.kind(r["id"]),
                )
            )
        return out

    def kind(self, document_id: str) -> DocumentKind:
        """text, picture (one picture), scan (pages read as pictures) or memo (sound)."""
        parts = self.records.parts("part_no", document_id=document_id)
        if not parts or not parts[0].get("image_enc"):
            return "text"
        if self.part_text(parts[0]).startswith(MEMO_CAPTION):
            return "memo"
        return "picture" if len(parts) == 1 else "scan"

    def part_picture(self, part: PartRow) -> Media | None:
        """A picture (or sound) part's picture or sound (decrypted and decoded in memory),
        else None. The part's seal covers it: one taken out of the catalog is noticed here."""
        self.live.records.check("parts", part)
        if not part.get("image_enc"):
            return None
        encoded = self.live.records.decrypt("parts", "image_enc", part)
        return media_from_kept(base64.b64decode(encoded))

    def picture(self, document_id: str, part_no: int = 1) -> bytes | None:
        """A picture document's (or scanned page's) PNG, for a thumbnail; a memo's part's
        WAV, to play it."""
        self.row(document_id)
        parts = self.records.parts(document_id=document_id, part_no=part_no)
        found = self.part_picture(parts[0]) if parts else None
        return found.kept if found is not None else None

    def memo(self, document_id: str) -> bytes | None:
        """A voice memo document's whole sound (its parts joined, in order) as a WAV, to
        play it; None for any other document."""
        if self.kind(document_id) != "memo":
            return None
        parts = [
            self.part_picture(p) for p in self.records.parts("part_no", document_id=document_id)
        ]
        pcm = b"".join(p.pcm for p in parts if isinstance(p, Sound))
        return Sound.from_pcm(pcm).wav

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
        configured = self.live.settings.values.part_tokens
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
        overlap_tokens = self.live.settings.values.part_overlap
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

    def recount_part(self, block_id: str, n_tokens: int) -> None:
        """A re-read part now takes `n_tokens` (inside the caller's transaction, which
        reseals the part and its document)."""
        for part in self.records.parts(block_id=block_id):
            self.records.update("parts", part["id"], {"n_tokens": n_tokens})

    def part_pictures(self, block_id: str) -> list[Media]:
        """The pictures a part's ledger holds (one for a picture part, none for text)."""
        parts = self.records.parts(block_id=block_id)
        found = self.part_picture(parts[0]) if parts else None
        return [found] if found is not None else []

    def rendered_part(self, block_id: str) -> tuple[list[int], list[Media]] | None:
        """A stored part's tokens (and pictures) rebuilt for the current model (None: not a
        part)."""
        parts = self.records.parts(block_id=block_id)
        if not parts:
            return None
        part = parts[0]
        document = self.row(part["document_id"])
        name = self.name(document)
        picture = self.part_picture(part)
        if picture is not None:
            ledger = self.picture_ledger(name, part["part_no"], part["n_parts"], picture)
            return ledger, [picture]
        overlap = ""
        if part["part_no"] > 1:
            previous = self.records.parts(
                document_id=part["document_id"], part_no=part["part_no"] - 1
            )
            if previous:
                overlap = overlap_tail(
                    self.part_text(previous[0]),
                    self.live.settings.values.part_overlap,
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
        return tokens, []

    # -- depositing ----------------------------------------------------------------------
    def deposit(
        self, path: Path, job: Job = NO_JOB, name: str | None = None, anyway: bool = False
    ) -> DepositResult:
        """Read a document once, store its KV block, and return what it cost. A picture,
        or a PDF without a text layer (a scan), is read through the vision projector."""
        path = Path(path)
        if is_audio(path):
            self.live.hearing()  # a model that cannot hear: say so before reading the file
            parts = memo_parts(read_audio_bounded(path, job=job))
            return self.deposit_pictures(name or path.name, parts, path.stat().st_size, job)
        if is_picture(path):
            self.live.vision()  # no projector: say so before reading the file
            pictures = read_pictures_bounded(path, "picture", job=job)
            return self.deposit_pictures(name or path.name, pictures, path.stat().st_size, job)
        try:
            text = extract_text_bounded(path, job=job)
        except NoTextLayer:
            self.live.vision()
            pages = read_pictures_bounded(path, "scan", job=job)
            return self.deposit_pictures(name or path.name, pages, path.stat().st_size, job)
        return self.deposit_text(name or path.name, text, path.stat().st_size, job, anyway)

    def deposit_pictures(
        self,
        name: str,
        pictures: Sequence[Media],
        source_bytes: int,
        job: Job = NO_JOB,
    ) -> DepositResult:
        """Store pictures (one, or a scan's pages) or a voice memo's parts as a document:
        each read once through the projector at its own positions and stored as its own
        block; the PNG (or WAV) is kept encrypted with its part (to read it again under
        another projector, or to play a memo)."""
        check_text(name, "The document's name")
        if not pictures:
            raise InputError(f"'{name}' holds no pictures.")
        sound = isinstance(pictures[0], Sound)
        n = len(pictures)
        ledgers = [self.picture_ledger(name, i + 1, n, p) for i, p in enumerate(pictures)]
        for number, ledger in enumerate(ledgers, start=1):
            if len(ledger) > self.limit():
                raise InputError(
                    f"'{name}'{f' page {number}' if n > 1 else ''} takes {len(ledger):,} tokens; "
                    f"the {self.engine.n_ctx:,}-token context leaves room for {self.limit():,}. "
                    "Nothing was stored."
                )

        def commit(document_id: str, rows: list[BlockRow]) -> list[AddedPart]:
            records = self.live.records
            now = time.time()
            added = []
            for index, (row, ledger, picture) in enumerate(
                zip(rows, ledgers, pictures, strict=True)
            ):
                caption = self.picture_caption(name, index + 1, n, sound)
                part_row: PartRow = {
                    "id": new_id("p"),
                    "document_id": document_id,
                    "part_no": index + 1,
                    "n_parts": n,
                    "block_id": row["id"],
                    "n_tokens": len(ledger),
                    "created_at": now,
                }
                part_row["text_enc"] = records.encrypt("parts", "text_enc", part_row, caption)
                kept = base64.b64encode(picture.kept).decode("ascii")
                part_row["image_enc"] = records.encrypt("parts", "image_enc", part_row, kept)
                self.records.insert("parts", part_row)
                added.append((part_row["id"], document_id, index + 1, n, caption))
            caption = self.picture_caption(name, 1, 1, sound)
            self._insert_document(document_id, name, caption, rows, total, source_bytes)
            return added

        total = sum(len(ledger) for ledger in ledgers)
        return self._deposit_parts(
            name,
            n,
            total,
            lambda number: (ledgers[number - 1], [pictures[number - 1]]),
            commit,
            job,
        )

    def deposit_text(
        self,
        name: str,
        text: str,
        source_bytes: int | None = None,
        job: Job = NO_JOB,
        anyway: bool = False,
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
        plan = self.plan_parts(name, text)
        if self.live.fits is not None and not anyway:  # before anything is read
            self.live.fits(name, [part.tokens for part in plan])

        def ledger(number: int) -> tuple[list[int], list[Media]]:
            part = plan[number - 1]
            return self.part_tokens(name, number, len(plan), part.overlap, part.text), []

        def commit(document_id: str, rows: list[BlockRow]) -> list[AddedPart]:
            records = self.live.records
            now = time.time()
            added = []
            for index, (row, part) in enumerate(zip(rows, plan, strict=True)):
                part_row: PartRow = {
                    "id": new_id("p"),
                    "document_id": document_id,
                    "part_no": index + 1,
                    "n_parts": len(plan),
                    "block_id": row["id"],
                    "n_tokens": part.tokens,
                    "created_at": now,
                }
                part_row["text_enc"] = records.encrypt("parts", "text_enc", part_row, part.text)
                self.records.insert("parts", part_row)
                added.append((part_row["id"], document_id, index + 1, len(plan), part.text))
            self._insert_document(document_id, name, text, rows, plan_tokens, size)
            return added

        plan_tokens = sum(part.tokens for part in plan)
        size = len(text.encode("utf-8")) if source_bytes is None else source_bytes
        return self._deposit_parts(name, len(plan), plan_tokens, ledger, commit, job)

    def _deposit_parts(
        self,
        name: str,
        n_parts: int,
        total: int,
        ledger: Callable[[int], tuple[list[int], list[Media]]],
        commit: Callable[[str, list[BlockRow]], list[AddedPart]],
        job: Job,
    ) -> DepositResult:
        """Read each part from an empty context (its ledger made only when it is read: a
        long document never holds more than one part's tokens), store it as its own block
        (durable when written), then `commit` the document's records in one transaction."""
        engine = self.engine
        document_id = new_id("d")
        self.live.drop()
        prefill_ms = capture_ms = persist_ms = encode_ms = 0.0
        pictures = image_tokens = sounds = audio_tokens = 0
        seconds = 0.0
        start = time.perf_counter()
        rows: list[BlockRow] = []
        done = 0
        try:
            for number in range(1, n_parts + 1):
                tokens, part_pictures = ledger(number)
                engine.reset()
                read = self.live.evaluate_ledger(
                    tokens, part_pictures, job.step(done, total, start)
                )
                prefill_ms += read.elapsed_ms
                encode_ms += read.encode_ms
                image_tokens += read.image_tokens
                pictures += read.pictures
                sounds += read.sounds
                audio_tokens += read.audio_tokens
                seconds += sum(p.seconds for p in part_pictures if isinstance(p, Sound))
                step = time.perf_counter()
                row, _record = self.live.persist("document", document_id, None, 1)
                persist_ms += (time.perf_counter() - step) * 1e3
                capture_ms += row["capture_ms"]
                rows.append(row)
                done += len(tokens)
            crashpoint("deposit-before-commit")
            with self.vault.transaction():
                for row in rows:
                    self.records.insert("blocks", row)
                added = commit(document_id, rows)
        except BaseException:
            self.vault.unlink_block_files([row["id"] for row in rows])
            raise
        self.on_parts_added(added)
        if n_parts == 1:
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
            n_parts,
            pictures,
            image_tokens,
            encode_ms,
            sounds,
            audio_tokens,
            round(seconds, 3),
        )

    def _insert_document(
        self,
        document_id: str,
        name: str,
        text: str,
        rows: list[BlockRow],
        n_tokens: int,
        source_bytes: int,
    ) -> None:
        records = self.live.records
        document: DocumentRow = {
            "id": document_id,
            "block_id": rows[0]["id"],
            "n_tokens": n_tokens,
            "n_parts": len(rows),
            "source_bytes": source_bytes,
            "created_at": time.time(),
        }
        document["name_enc"] = records.encrypt("documents", "name_enc", document, name)
        document["text_enc"] = records.encrypt("documents", "text_enc", document, text)
        self.records.insert("documents", document)

    # -- stacked documents ---------------------------------------------------------------
    def add_to_conversation_file(
        self,
        conversation_id: str,
        path: Path,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """add_to_conversation for a file: its text is extracted in a limited child (a
        picture is read through the projector)."""
        path = Path(path)
        if is_audio(path):
            self.live.hearing()
            memo = read_audio_bounded(path, job=job)
            return self.add_memo(conversation_id, path.name, Sound.from_pcm(memo.pcm), job)
        if is_picture(path):
            return self.add_picture_to_conversation(conversation_id, path, job)
        text = extract_text_bounded(path, job=job)
        stored = self.stored_as(path.name, text)
        if stored is not None:  # already in the library: stacked, not read again
            return self.add_stored_to_conversation(conversation_id, [stored], job)
        return self.add_to_conversation(conversation_id, path.name, text, job)

    def add_picture_to_conversation(
        self,
        conversation_id: str,
        path: Path,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """Put a picture into an ongoing conversation: checked in the limited child, read
        once through the projector on top of what the conversation holds, stored as the
        chain's next link with the picture kept encrypted on its message."""
        path = Path(path)
        self.live.vision()
        pictures = read_pictures_bounded(path, "picture", job=job)
        return self.add_picture(conversation_id, path.name, pictures[0], job)

    def add_pasted_picture(
        self, conversation_id: str, png: bytes, name: str, job: Job = NO_JOB
    ) -> TurnResult:
        self.live.vision()
        return self.add_picture(conversation_id, name, picture_from_png(png, name), job)

    def add_sent_picture(
        self, conversation_id: str, name: str, data: bytes, job: Job = NO_JOB
    ) -> TurnResult:
        """A picture an API client sent (bytes, never written to a file): checked in the
        limited child like a dropped file, then read on top of the conversation."""
        self.live.vision()
        picture = read_picture_bytes_bounded(data, name, job=job)
        return self.add_picture(conversation_id, name, picture, job)

    def add_picture(
        self, conversation_id: str, name: str, picture: Picture, job: Job = NO_JOB
    ) -> TurnResult:
        check_text(name, "The picture's name")

        def ledger() -> tuple[list[int], dict[int, Media]]:
            index = len(pictures_in(self.engine.tokens))  # the ledger's pictures before it
            tokens = self.picture_ledger(name, 1, 1, picture, index, opening=False)
            return tokens, {index: picture}

        return self._stack(
            conversation_id, name, PICTURE_ACK.format(name=name), ledger, job, picture=picture
        )

    def add_memo(
        self, conversation_id: str, name: str, sound: Sound, job: Job = NO_JOB
    ) -> TurnResult:
        """Put a voice memo into an ongoing conversation: heard once through the projector
        (in its parts) on top of what the conversation holds, stored as the chain's next
        link with the memo kept encrypted on its message."""
        check_text(name, "The memo's name")
        parts = sound.parts()

        def ledger() -> tuple[list[int], dict[int, Media]]:
            index = len(pictures_in(self.engine.tokens))  # the ledger's pictures before it
            tokens = self.memo_ledger(name, parts, index, opening=False)
            return tokens, {index + i: part for i, part in enumerate(parts)}

        return self._stack(
            conversation_id, name, MEMO_ACK.format(name=name), ledger, job, picture=sound
        )

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
        ack = DOCUMENT_ACK.format(name=name)

        def ledger() -> tuple[list[int], dict[int, Media]]:
            content = f'Document "{name}":\n\n{text}'
            return self.engine.turns.document_turn(content, ack, opening=False), {}

        return self._stack(conversation_id, name, ack, ledger, job, content=text)

    def _stack(
        self,
        conversation_id: str,
        name: str,
        ack: str,
        ledger: Callable[[], tuple[list[int], dict[int, Media]]],
        job: Job,
        content: str = "",
        picture: Media | None = None,
    ) -> TurnResult:
        """Graft what the conversation holds, evaluate only the new document (or picture)
        turn `ledger` makes on top, and store that as the chain's next link (earlier
        documents and turns are never re-read)."""
        conversations = self.conversations
        conv = conversations.row(conversation_id)
        counters = Counters()
        graft = self.turns.ensure_live(conv, counters, job)
        engine = self.engine
        tokens, pictures = ledger()
        if len(tokens) + 64 > engine.room():
            raise InputError(
                f"'{name}' is {len(tokens):,} tokens; this conversation has room for "
                f"{max(0, engine.room() - 64):,} more. Ask the library instead, or start a new "
                "conversation. Nothing was stored."
            )
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        read = self.live.evaluate_ledger(tokens, pictures, job)
        counters.prefill_ms += read.elapsed_ms
        counters.new_tokens += len(tokens)
        self.store_document_turn(conv["id"], name, ack, user_start, counters, content, picture)
        return self.stored_turn(
            conv["id"],
            ack,
            "document",
            counters,
            graft,
            image_tokens=read.image_tokens,
            audio_tokens=read.audio_tokens,
        )
