"""The disk budget: what kept memory costs on disk, item by item, and what gives its memory
back when a save would go past the budget.

At real Gemma 4 sizes a short turn writes 15-55 MB and a document a gigabyte, so memory is
a cache the person bounds (setting `disk_budget`). Before a block is written, the
conversations and documents used longest ago give their blocks back (vault/giveback.py)
until the new one fits: their messages, titles, text and token ledgers stay, and the next
graft re-reads them once and stores them again. Never given back: what the model holds now
(and the chain it grows from), the item being saved, and what the person kept ("Keep").

One thread owns the core, so nothing reads a block while another is given back.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from galahad_desktop.engine import kvstate
from galahad_desktop.errors import InputError, IntegrityError, NotFoundError, WontFitError
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.documents.documents import Documents
from galahad_desktop.memory.results import (
    GiveBackResult,
    StorageReport,
    StoredItem,
    StoredKind,
    StoredState,
)
from galahad_desktop.sizes import human_size
from galahad_desktop.vault import giveback
from galahad_desktop.vault.names import BlockRow, Table, file_bytes, given_back

log = logging.getLogger(__name__)

# The automatic budget: a cache never takes more than a quarter of the disk, nor more than
# half of what is free besides itself, so the person's own files never run out because of
# it; at least 1 GB, enough for a day's chats on the largest Gemma 4.
AUTO_DISK_SHARE = 0.25
AUTO_FREE_SHARE = 0.5
AUTO_MINIMUM = 1_000_000_000
# What a save adds to the catalog beside its block (rows, seals, the usage log: a few
# SQLite pages in its write-ahead log), measured at ~25 KB a turn: room is made for it too.
CATALOG_HEADROOM = 64 * 1024
# Room left free on the disk for everything else when a document is checked before reading
# (a tenth of a disk smaller than 2.56 GB: on a 52 MB disk 256 MB refused every deposit).
DISK_RESERVE = 256_000_000
RESERVE_SHARE = 0.1


def disk_reserve(total: int) -> int:
    return min(DISK_RESERVE, int(total * RESERVE_SHARE))


class Storage:
    def __init__(
        self,
        live: LiveContext,
        conversations: Conversations,
        documents: Documents,
    ) -> None:
        self.live = live
        self.vault = live.vault
        self.conversations = conversations
        self.documents = documents
        self.given_back: list[GiveBackResult] = []  # since the front end last asked
        self._cell_bytes: dict[str, tuple[int, int]] = {}  # by runtime fingerprint

    # -- the budget ----------------------------------------------------------------------
    def budget(self) -> tuple[int, str]:
        """(bytes, where the number comes from); 0 bytes: no limit."""
        return budget_for(self.vault.data_dir, self.live.settings.values.disk_budget)[1:]

    def make_room(self, incoming: int, owner_id: str) -> list[GiveBackResult]:
        """Before `owner_id` writes a block of `incoming` bytes: give back the blocks of
        what was used longest ago until it fits the budget. Inside a catalog transaction
        nothing is given back (the next save makes room)."""
        if self.vault.records.in_transaction():
            return []
        chosen = self.live.settings.values.disk_budget
        if chosen == 0:
            return []
        used, budget, _rule = budget_for(self.vault.data_dir, chosen)
        incoming += CATALOG_HEADROOM
        if used + incoming <= budget:
            return []
        keep = self._protected(owner_id)
        done: list[GiveBackResult] = []
        for item in sorted(self._items(keep), key=lambda i: i.last_used):
            if used + incoming <= budget:
                break
            if item.kept or item.open or item.blocks == 0:
                continue
            result = self._give_back(item)
            used -= result.bytes_freed
            done.append(result)
        if used + incoming > budget:
            log.info("the disk budget is smaller than what must stay stored")
        self.given_back += done
        return done

    # -- before a document is read --------------------------------------------------------
    def check_fits(self, name: str, parts: list[int]) -> None:
        """Refuse a document of `parts` (each part's tokens: each is its own block) before
        it is read when its memory would not fit: not in the disk budget once everything
        that may give its memory back has, or not on the disk. Nothing is read or stored;
        the person may read it anyway."""
        estimates = [self.estimate(tokens) for tokens in parts]
        if not estimates or estimates[0] is None:
            return  # nothing of this model is stored yet to measure it by
        estimate, tokens = sum(e or 0 for e in estimates), sum(parts)
        chosen = self.live.settings.values.disk_budget
        used, budget, _rule = budget_for(self.vault.data_dir, chosen)
        items = self._items(self._protected(None))
        givable = sum(i.bytes for i in items if not (i.kept or i.open))
        disk = shutil.disk_usage(self.vault.data_dir)
        reserve = disk_reserve(disk.total)
        over_budget = bool(budget) and estimate > budget - (used - givable)
        over_disk = estimate > disk.free - reserve
        over = []
        if over_budget:
            room = max(0, budget - (used - givable))
            over.append(
                f"the disk space for memory ({human_size(budget)}, of which "
                f"{human_size(room)} can be made free)"
            )
        if over_disk:
            over.append(
                f"the disk's free space ({human_size(disk.free)}, {human_size(reserve)} kept free)"
            )
        if over:
            # The advice fits what is short: a larger budget cannot make room on the disk.
            advice = (
                "Free space on this disk (or keep the data directory on a larger one), or "
                "forget what you no longer need"
                if over_disk
                else "Raise 'Disk space for memory' in Settings, forget what you no longer "
                "need, or read it anyway (its memory then goes past the budget)"
            )
            raise WontFitError(
                f"Reading '{name}' ({tokens:,} tokens) would keep about {human_size(estimate)} "
                f"of memory on disk, more than {' and '.join(over)}. Nothing was read. "
                f"{advice}.",
                command="galahad deposit --anyway FILE",  # the window asks instead
            )

    def estimate(self, tokens: int) -> int | None:
        """What a block of `tokens` tokens will take on disk with the loaded model: every
        position's cells in the global layers and at most a window's in the sliding ones,
        as a stored block of this model measures them (None before any is stored)."""
        engine = self.live.engine
        rates = self._cell_bytes.get(engine.fingerprint)
        if rates is None:
            rows = [
                r
                for r in self.vault.records.blocks()
                if r["fingerprint"] == engine.fingerprint and not given_back(r)
            ]
            for row in sorted(rows, key=file_bytes)[:3]:  # the smallest that holds every layer
                stored = self.vault.read_block(row["id"])
                sections = kvstate.parse(stored.payload, stored.size).sections
                del stored
                if sections and all(s.layers for s in sections):
                    per_cell = [s.cell_bytes + s.meta.itemsize for s in sections]  # K, V, pos
                    rates = self._cell_bytes[engine.fingerprint] = (per_cell[0], sum(per_cell[1:]))
                    break
            if rates is None:
                return None
        window = engine.model_info().window or tokens
        ledger = 4  # the block also holds its tokens (int32 each)
        return tokens * (rates[0] + ledger) + min(tokens, window) * rates[1]

    def _protected(self, owner_id: str | None) -> set[str]:
        owners: set[str] = set()
        holding = self.live.holding
        for owner in ([owner_id] if owner_id else []) + ([holding.owner_id] if holding else []):
            owners |= self.conversations.chain_owners(owner)
        return owners

    # -- what is stored ------------------------------------------------------------------
    def report(self) -> StorageReport:
        budget, rule = self.budget()
        items = self._items(self._protected(None))
        disk = shutil.disk_usage(self.vault.data_dir)
        on_disk = [r for r in self.vault.records.blocks() if not given_back(r)]
        return StorageReport(
            str(self.vault.data_dir),
            giveback.bytes_on_disk(self.vault.data_dir),
            sum(file_bytes(r) for r in on_disk),
            budget,
            rule,
            disk.total,
            disk.free,
            sorted(items, key=lambda i: -i.last_used),
        )

    def _items(self, protected: set[str]) -> list[StoredItem]:
        blocks: dict[str, list[BlockRow]] = {}
        for row in self.vault.records.blocks():
            blocks.setdefault(row["owner_id"], []).append(row)
        last_use: dict[str, float] = {}
        items: list[StoredItem] = []
        for conv in self.vault.records.conversations():
            used = _time(conv.get("used_at"), conv.get("updated_at"), conv.get("created_at"))
            title = self._title(self.conversations.title, conv)
            kept = bool(conv.get("kept"))
            item = self._item(conv["id"], "conversation", title, used, kept, blocks, protected)
            doc_id = conv["document_id"]
            if doc_id:
                last_use[doc_id] = max(last_use.get(doc_id, 0.0), used)
                if item.state == "stored" and any(map(given_back, blocks.get(doc_id, []))):
                    item = dataclasses.replace(item, state="needs re-reading")  # its root went
            items.append(item)
        for doc in self.vault.records.documents():
            used = _time(doc.get("used_at"), doc.get("created_at"), last_use.get(doc["id"]))
            title = self._title(self.documents.name, doc)
            kept = bool(doc.get("kept"))
            items.append(self._item(doc["id"], "document", title, used, kept, blocks, protected))
        return items

    @staticmethod
    def _title(read: Callable[..., str], row: object) -> str:
        try:
            return read(row)
        except IntegrityError:
            return "(damaged record)"

    @staticmethod
    def _item(
        item_id: str,
        kind: StoredKind,
        title: str,
        used: float,
        kept: bool,
        blocks: dict[str, list[BlockRow]],
        protected: set[str],
    ) -> StoredItem:
        own = blocks.get(item_id, [])
        kept_rows = [r for r in own if not given_back(r)]
        returned = len(own) - len(kept_rows)
        state: StoredState = (
            "not stored" if not own else "needs re-reading" if returned else "stored"
        )
        return StoredItem(
            item_id,
            kind,
            title,
            sum(file_bytes(r) for r in kept_rows),
            len(kept_rows),
            returned,
            used,
            state,
            kept,
            item_id in protected,
        )

    # -- what the person asks ------------------------------------------------------------
    def give_back(self, item_id: str) -> GiveBackResult:
        """Give back one conversation's or document's blocks now (its messages stay)."""
        items = {i.id: i for i in self._items(self._protected(None))}
        item = items.get(item_id)
        if item is None:
            raise NotFoundError(f"No conversation or document has the id '{item_id}'.")
        if item.kept:
            raise InputError(
                f"'{item.title}' is kept: its memory is never given back. Unkeep it first "
                "(storage --unkeep ID, or Memory ▸ Keep). Nothing was given back."
            )
        if item.open:
            self.live.drop(self.conversations.chain_owners(item_id))
        return self._give_back(item)

    def keep(self, item_id: str, kept: bool) -> StoredItem:
        """Pin an item (its blocks are never given back) or let it go again."""
        table: Table = "conversations" if self.vault.records.conversation(item_id) else "documents"
        if table == "documents" and self.vault.records.document(item_id) is None:
            raise NotFoundError(f"No conversation or document has the id '{item_id}'.")
        self.vault.records.update(table, item_id, {"kept": 1 if kept else 0})
        return next(i for i in self._items(self._protected(None)) if i.id == item_id)

    def _give_back(self, item: StoredItem) -> GiveBackResult:
        ids = [r["id"] for r in self.vault.records.blocks(owner_id=item.id) if not given_back(r)]
        freed = giveback.give_back(self.vault, ids)
        log.info("gave back %d blocks (%d bytes) of a %s", len(ids), freed, item.kind)
        return GiveBackResult(item.id, item.kind, len(ids), freed, item.title)


def budget_for(data_dir: Path, chosen: int | None) -> tuple[int, int, str]:
    """(bytes the data directory holds, the budget, where it comes from) for the setting's
    value `chosen` (None: automatic; 0: no limit). Needs no key and no model."""
    used = giveback.bytes_on_disk(data_dir)
    if chosen == 0:
        return used, 0, "no limit (disk_budget = 0)"
    if chosen is not None:
        return used, chosen, f"set to {human_size(chosen)}"
    disk = shutil.disk_usage(data_dir)
    quarter = int(disk.total * AUTO_DISK_SHARE)
    half_free = int((disk.free + used) * AUTO_FREE_SHARE)
    # Half the free space moves with every file written anywhere on the disk (40.5, 38.4,
    # 41.2 GB within an hour): taken in steps of a twentieth of the quarter (at least 1 GB),
    # rounded down, it stays put until the disk really fills or empties.
    step = max(AUTO_MINIMUM, quarter // 20)
    if half_free < quarter and half_free >= step:
        half_free -= half_free % step
    share = min(quarter, half_free)
    # The minimum holds where the disk can give it: never more than half its free space.
    floor = min(AUTO_MINIMUM, half_free)
    if share >= floor:
        rule = (
            f"automatic: a quarter of the {human_size(disk.total)} disk, at most half of its "
            f"free space in steps of {human_size(step)} ({human_size(share)})"
        )
        return used, share, rule
    what = "the minimum" if floor == AUTO_MINIMUM else "half of its free space"
    rule = (
        f"automatic: {what} ({human_size(floor)}), more than a quarter of this "
        f"{human_size(disk.total)} disk"
    )
    return used, floor, rule


def _time(*values: object) -> float:
    return max([float(v) for v in values if isinstance(v, int | float)] or [0.0])
