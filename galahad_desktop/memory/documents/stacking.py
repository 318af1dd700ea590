"""Stored documents stacked on a conversation without reading them again: each block placed
after what the conversation holds (engine `stack`), its first tokens read on top, stored as
the chain's next link so that a resume restores it exactly and never stacks again."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from galahad_desktop.engine.picture import Media
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import InputError, IntegrityError
from galahad_desktop.faults import crashpoint
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.turning import TurnRoom
from galahad_desktop.memory.documents.stacked import (
    QUALITY_PROBE,
    STACK_RECOMPUTE,
    against_full_read,
    reread_given_back,
    stack_stored_block,
)
from galahad_desktop.memory.results import DocumentKind, StackReport, TurnResult
from galahad_desktop.vault.names import ConversationRow, DocumentRow, PartRow

DOCUMENT_ACK = 'I have read "{name}". Ask me about it.'


class DocumentStacks(TurnRoom):
    """Stacking, for the documents' room (which provides the catalog reads below)."""

    def row(self, document_id: str) -> DocumentRow:
        raise NotImplementedError

    def name(self, row: DocumentRow) -> str:
        raise NotImplementedError

    def kind(self, document_id: str) -> DocumentKind:
        raise NotImplementedError

    def part_rows(self, document_id: str | None = None) -> list[PartRow]:
        raise NotImplementedError

    def store_document_turn(
        self,
        conversation_id: str,
        name: str,
        ack: str,
        user_start: int,
        counters: Counters,
        content: str,
        picture: Media | None = None,
    ) -> None:
        """What the context now holds, from `user_start` (the document turn's opening) to
        its end, stored as the conversation's next link with the document's messages."""
        reply_end = len(self.live.engine.tokens)
        persist_start = time.perf_counter()
        conv = self.conversations.row(conversation_id)
        link, _record = self.live.persist(
            "conversation",
            conv["id"],
            self.turns.live_parent(conv, conv["head_block_id"] or None),
            self.live.next_generation(conv["id"]),
            counters,
        )
        self.turns.commit_turn(
            conv,
            link,
            conv["n_messages"] or 0,
            name,
            ack,
            (user_start, reply_end, reply_end),
            [],
            roles=("document", "model"),
            content=content,
            picture=picture,
        )
        counters.persist_ms += (time.perf_counter() - persist_start) * 1e3

    def stored_as(self, name: str, text: str) -> str | None:
        """The stored text document with this name and this very text, if there is one
        (names are compared first: only those are decrypted in full)."""
        for row in self.records.documents("created_at desc"):
            if (
                self.name(row) == name
                and self.kind(row["id"]) == "text"
                and self.live.records.decrypt("documents", "text_enc", row) == text
            ):
                return str(row["id"])
        return None

    def _stack_parts(self, row: DocumentRow) -> list[PartRow]:
        """A document's parts in order, each with its own block."""
        parts = self.part_rows(row["id"])
        if not parts:
            raise IntegrityError(f"Document {row['id']} has no parts in the catalog.")
        return parts

    def add_stored_to_conversation(
        self,
        conversation_id: str,
        document_ids: Sequence[str],
        job: Job = NO_JOB,
        verify: bool = False,
        recompute: int = STACK_RECOMPUTE,
        as_stored: bool = False,
    ) -> TurnResult:
        """Put stored documents into a conversation without reading them again: each part's
        stored block is placed after what the conversation holds, its keys moved to the new
        positions and its first `recompute` tokens read on top (engine `stack`); each
        document is stored as the chain's next link, so a resume restores it exactly and
        never stacks again. Close to a full read, never byte-exact (`verify`: measured
        against one). A part whose memory was given back is read once and stored again.
        `as_stored`: the naive stitch `bench stack` measures against (stack_stored_block)."""
        documents = self._documents_to_stack(document_ids)
        conv = self.conversations.row(conversation_id)
        self.records.check("conversations", conv)
        engine = self.live.engine
        need = self._check_room(conv, documents)
        counters = Counters()
        given_back = [
            (part["block_id"], f"Document {row['id']}")
            for row, _ in documents
            for part in self._stack_parts(row)
        ]
        reread = reread_given_back(self.live, given_back, counters, job)  # read once, alone
        conv = self.conversations.row(conversation_id)
        graft = self.turns.ensure_live(conv, counters, job)
        if len(engine.tokens) + need + 64 > engine.n_ctx:
            raise InputError(
                f"These documents take {need:,} tokens; this conversation has room for "
                f"{max(0, engine.room() - 64):,} more. Nothing was stored."
            )
        recomputed = 0
        stack_ms = 0.0
        opening = list(engine.probe_tokens)
        for row, name in documents:
            # Each part's turn opening is read in one step with its recomputed tokens; the
            # first part's may be held already (a chat's last turn ends with it).
            held = engine.tokens[-len(opening) :] == opening
            user_start = len(engine.tokens) - (len(opening) if held else 0)
            for part in self._stack_parts(row):
                lead = [] if held and part["part_no"] == 1 else opening
                # The last token is not read: what follows (the probe, when the turn is
                # stored) gives the next logits, one step sooner.
                placed = stack_stored_block(
                    self.live,
                    part["block_id"],
                    row["id"],
                    lead,
                    job,
                    f"'{name}' was stored in another turn format; forget it and add it again.",
                    recompute,
                    as_stored,
                )
                counters.new_tokens += len(lead)
                stack_ms += placed.elapsed_ms
                recomputed += placed.recomputed
                counters.recomputed_tokens += placed.recomputed
                counters.stacked_tokens += placed.n_tokens - placed.recomputed
            crashpoint("stack-before-persist")
            content = self.live.records.decrypt("documents", "text_enc", row)
            self.store_document_turn(
                conversation_id, name, DOCUMENT_ACK.format(name=name), user_start, counters, content
            )
        quality = None
        if verify:
            quality = against_full_read(engine, engine.turns.question(QUALITY_PROBE), job=job)
        names = tuple(name for _, name in documents)
        stack = StackReport(names, counters.stacked_tokens, recomputed, reread, stack_ms, quality)
        result = self.stored_turn(
            conversation_id, DOCUMENT_ACK.format(name=names[-1]), "document", counters, graft
        )
        return dataclasses.replace(result, stack=stack)

    def _documents_to_stack(self, document_ids: Sequence[str]) -> list[tuple[DocumentRow, str]]:
        """The named documents, authenticated, each with its name; only text stacks."""
        if not document_ids:
            raise InputError("Name at least one stored document to add.")
        if len(set(document_ids)) != len(document_ids):
            raise InputError("A document is named twice; each is added once.")
        documents = []
        for document_id in document_ids:
            row = self.row(document_id)
            self.records.check("documents", row)
            name = self.name(row)
            if self.kind(document_id) != "text":
                raise InputError(
                    f"'{name}' is a {self.kind(document_id)}: only text documents are stacked "
                    "so far. Attach its file to the chat to read it into the chat."
                )
            documents.append((row, name))
        return documents

    def _check_room(self, conv: ConversationRow, documents: list[tuple[DocumentRow, str]]) -> int:
        """The tokens the documents add, refused before anything is read when the
        conversation has no room for them."""
        engine = self.live.engine
        bos = engine.bos()
        held = conv["n_tokens"] or 0
        if not held and conv["document_id"]:
            held = self.row(conv["document_id"])["n_tokens"]
        need = sum(
            part["n_tokens"] - len(bos) for row, _ in documents for part in self._stack_parts(row)
        )
        if held + need + 64 > engine.n_ctx:
            listed = ", ".join(f"'{name}'" for _, name in documents)
            raise InputError(
                f"{listed} take {need:,} tokens; this conversation holds {held:,} of "
                f"{engine.n_ctx:,}. Start a new conversation, or ask the library instead. "
                "Nothing was stored."
            )
        return need
