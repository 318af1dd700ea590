"""Bring history in, take it out: import conversations from other apps, export them.

An imported conversation is read into the model once — turn by turn, each turn stored as a
chain link (a checkpoint, like any conversation made here) — and opens later with zero
recomputed tokens. A conversation is stored whole or not at all (its blocks are written
first, its rows in one transaction). The plaintext of an import is read into memory only;
nothing of it is written anywhere but the encrypted catalog and blocks.
"""

from __future__ import annotations

import time
from pathlib import Path

from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import CancelledError, InputError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.conversations import TITLE_CHARS, Conversations
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import (
    ExportResult,
    ImportedSummary,
    ImportResult,
    SkippedImport,
)
from galahad_desktop.memory.transfer import exporters, formats
from galahad_desktop.system.files import atomic_write_bytes, check_export_destination
from galahad_desktop.vault.names import BlockRow, ConversationRow
from galahad_desktop.vault.vault import new_id


class Transfer:
    def __init__(self, live: LiveContext, conversations: Conversations) -> None:
        self.live = live
        self.vault = live.vault
        self.conversations = conversations

    # -- import --------------------------------------------------------------------------
    def import_file(
        self,
        path: Path,
        job: Job = NO_JOB,
    ) -> ImportResult:
        parsed = formats.read_file(Path(path))
        engine = self.live.engine
        turns = engine.turns
        plans: list[tuple[formats.ImportedConversation, list[list[int]]]] = []
        skipped: list[SkippedImport] = []
        for conversation in parsed:
            title = conversation.title or _title_of(conversation)
            if not conversation.messages:
                skipped.append(SkippedImport(title, "it has no messages"))
                continue
            pieces = [turns.start()]
            for index in range(0, len(conversation.messages), 2):
                user, reply = conversation.messages[index], conversation.messages[index + 1]
                pieces.append(
                    turns.user_turn(user.text) + engine.encode_text(reply.text) + turns.model_close
                )
            total = sum(len(p) for p in pieces) + len(turns.probe) * (len(pieces) - 1)
            if total + 64 > engine.n_ctx:
                skipped.append(
                    SkippedImport(
                        title,
                        f"it is {total:,} tokens, longer than the {engine.n_ctx:,}-token "
                        "context (raise n_ctx, or use a model with a longer context)",
                    )
                )
                continue
            plans.append((conversation, pieces))
        grand_total = sum(sum(len(p) for p in pieces) for _c, pieces in plans)
        done = 0
        start = time.perf_counter()
        imported: list[ImportedSummary] = []
        prefill_ms = 0.0
        cancelled = False
        for conversation, pieces in plans:
            if job.cancelled:
                cancelled = True
                break
            try:
                summary, ms = self._import_one(
                    conversation, pieces, job.step(done, grand_total, start)
                )
            except CancelledError:
                cancelled = True
                break
            imported.append(summary)
            prefill_ms += ms
            done += sum(len(p) for p in pieces)
        return ImportResult(imported, skipped, done, prefill_ms, cancelled)

    def _import_one(
        self,
        conversation: formats.ImportedConversation,
        pieces: list[list[int]],
        job: Job,
    ) -> tuple[ImportedSummary, float]:
        live, engine, vault = self.live, self.live.engine, self.vault
        conversation_id = new_id("c")
        total = sum(len(p) for p in pieces)
        counters = Counters()
        live.drop()
        engine.reset()
        rows: list[BlockRow] = []
        boundaries: list[tuple[int, int, int]] = []
        read = 0
        try:
            for index, piece in enumerate(pieces):
                if index == 0:
                    counters.prefill_ms += engine.evaluate(piece)
                    read += len(piece)
                    continue
                user_start = len(engine.tokens) - len(engine.probe_tokens)
                message = conversation.messages[2 * (index - 1)]
                reply_start = (
                    user_start
                    + len(engine.probe_tokens)
                    + len(engine.turns.user_turn(message.text))
                )
                counters.prefill_ms += engine.evaluate(piece, job.step(read, total))
                read += len(piece)
                parent = rows[-1] if rows else None
                row, _record = live.persist(
                    "conversation",
                    conversation_id,
                    parent["id"] if parent else None,
                    index,
                    parent_end=parent["pos_end"] if parent else None,
                )
                rows.append(row)
                boundaries.append(
                    (user_start, reply_start, len(engine.tokens) - len(engine.probe_tokens))
                )
            self._commit(conversation_id, conversation, rows, boundaries)
        except BaseException:
            live.drop()
            vault.unlink_block_files([row["id"] for row in rows])
            raise
        live.mark(conversation_id, rows[-1]["id"])
        title = conversation.title or _title_of(conversation)
        return (
            ImportedSummary(
                conversation_id,
                title,
                len(conversation.messages),
                rows[-1]["pos_end"],
                conversation.source,
                list(conversation.dropped),
            ),
            counters.prefill_ms,
        )

    def _commit(
        self,
        conversation_id: str,
        conversation: formats.ImportedConversation,
        rows: list[BlockRow],
        boundaries: list[tuple[int, int, int]],
    ) -> None:
        records = self.live.records
        now = time.time()
        created = conversation.created_at or conversation.messages[0].created_at or now
        updated = conversation.updated_at or conversation.messages[-1].created_at or created
        title = conversation.title or _title_of(conversation)
        with self.vault.transaction():
            for row in rows:
                records.insert("blocks", row)
            conv: ConversationRow = {
                "id": conversation_id,
                "document_id": None,
                "head_block_id": rows[-1]["id"],
                "n_tokens": rows[-1]["pos_end"],
                "n_messages": len(conversation.messages),
                "system_prompt": "none",
                "thinking": 0,
                "model_sha256": self.live.engine.model_sha256,
                "created_at": created,
                "updated_at": updated,
            }
            conv["title_enc"] = records.encrypt("conversations", "title_enc", conv, title)
            records.insert("conversations", conv)
            for index, message in enumerate(conversation.messages):
                pair = index // 2
                user_start, reply_start, reply_end = boundaries[pair]
                is_user = message.role == "user"
                records.add_message(
                    {
                        "id": new_id("m"),
                        "conversation_id": conversation_id,
                        "seq": index,
                        "role": message.role,
                        "tok_start": user_start if is_user else reply_start,
                        "tok_end": reply_start if is_user else reply_end,
                        "block_id": None if is_user else rows[pair]["id"],
                        "created_at": message.created_at or created,
                    },
                    message.text,
                )
            records.reseal("conversations", conversation_id)

    # -- export --------------------------------------------------------------------------
    def export(
        self, conversation_id: str, fmt: str, out: Path | None = None, force: bool = False
    ) -> ExportResult:
        writer = exporters.EXPORTERS.get(fmt)
        if writer is None:
            raise InputError(f"Unknown export format '{fmt}'; use md, json or html.")
        conv = self.conversations.row(conversation_id)
        messages = [
            exporters.ExportedMessage(
                m.role, exporters.shown_text(m.role, m.text, m.calls), m.created_at
            )
            for m in self.conversations.messages(conversation_id)
        ]
        text = writer(
            self.conversations.title(conv), conv["created_at"], conv["updated_at"], messages
        )
        data = text.encode("utf-8")
        if out is None:
            return ExportResult(None, fmt, len(messages), len(data), text)
        out = check_export_destination(Path(out), self.vault.data_dir, force)
        atomic_write_bytes(out, data)
        return ExportResult(str(out), fmt, len(messages), len(data))


def _title_of(conversation: formats.ImportedConversation) -> str:
    first = next((m.text for m in conversation.messages if m.role == "user"), "")
    return " ".join(first.split())[:TITLE_CHARS] or "Imported conversation"
