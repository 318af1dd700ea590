"""What the memory saved: restored versus recomputed tokens per request (numbers only, but
still what the user did: encrypted in the catalog, deleted with what they name)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict

from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import GraftReport, MemoryStats, TurnResult, UsageEntry
from galahad_desktop.vault.names import given_back
from galahad_desktop.vault.vault import new_id

USAGE_KEEP = 500


class Usage:
    def __init__(self, live: LiveContext) -> None:
        self.live = live
        self.vault = live.vault

    def record_turn(self, result: TurnResult) -> None:
        c = result.counters
        saved = 0
        if result.library is not None and result.library.mode == "recurrence":
            saved = len(self.live.engine.encode_text(result.reply))  # what decoding would cost
        self.record(
            result.conversation_id,
            UsageEntry(
                time.time(),
                c.restored_tokens,
                c.recomputed_tokens,
                c.restore_ms,
                c.prefill_ms,
                saved,
            ),
        )

    def record_graft(self, report: GraftReport) -> None:
        self.record(
            report.owner_id,
            UsageEntry(
                time.time(),
                report.restored_tokens,
                report.recomputed_tokens,
                report.restore_ms,
                0.0,
            ),
        )

    def record(self, owner: str, entry: UsageEntry) -> None:
        if not (entry.restored or entry.recomputed or entry.library_saved_tokens):
            return
        with self.vault.transaction():
            self.vault.records.log(
                "usage", new_id("u"), entry.at, asdict(entry), USAGE_KEEP, owner_id=owner
            )

    def entries(self) -> list[UsageEntry]:
        out = []
        for _id, _at, raw in reversed(self.vault.records.log_entries("usage")):
            with contextlib.suppress(TypeError, ValueError):  # the audit reports damaged lines
                out.append(UsageEntry(**raw))
        return out

    def stats(self) -> MemoryStats:
        rows = [r for r in self.vault.records.blocks() if not given_back(r)]
        history = self.entries()
        session = self.live.stats
        return MemoryStats(
            len(rows),
            sum(_count(r["file_bytes"]) for r in rows),
            sum(_count(r["n_tokens"]) for r in rows),
            session.restored_tokens,
            session.recomputed_tokens,
            history,
            sum(h.restored for h in history),
            sum(h.recomputed for h in history),
            sum(h.library_saved_tokens for h in history),
        )


def _count(value: object) -> int:
    """A catalog count as a number (an edited cell of another type counts as 0 here; the
    audit names the record)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
