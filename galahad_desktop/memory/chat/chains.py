"""Chains and compaction: a conversation's turns are links of one chain; long chains are
merged without changing a byte of the spliced state."""

from __future__ import annotations

import time

from galahad_desktop.engine import kvstate
from galahad_desktop.errors import InputError
from galahad_desktop.faults import crashpoint
from galahad_desktop.memory.chat.conversations import Conversations
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import CompactResult
from galahad_desktop.vault.names import BlockRow, file_bytes, given_back
from galahad_desktop.vault.vault import tokens_digest

# On large models a turn's link is big (a 31B-shape short turn 54 MB, a 900-token reply
# 0.8 GB), so the turns kept apart when a chain is merged are chosen by bytes as well as by
# count: together at most 1 GB, or a sixteenth of a disk budget the person set. A chain is
# merged once its separate links take twice that. What is given up: regenerating or editing
# an older reply re-reads from the merged block instead of restoring its own link.
CHECKPOINT_BYTES = 1_000_000_000
CHECKPOINT_BUDGET_SHARE = 16


def checkpoint_bytes(disk_budget: int | None) -> int:
    """The most kept checkpoints may take together (the links kept apart at a compaction;
    the blocks a reply's earlier versions keep): 1 GB, or a sixteenth of the budget set."""
    if not disk_budget:  # automatic (None) or no limit (0)
        return CHECKPOINT_BYTES
    return min(CHECKPOINT_BYTES, disk_budget // CHECKPOINT_BUDGET_SHARE)


class Chains:
    def __init__(self, live: LiveContext, conversations: Conversations) -> None:
        self.live = live
        self.vault = live.vault
        self.conversations = conversations

    def links(self, conversation_id: str) -> int:
        """How many of the conversation's own blocks its head's chain runs through."""
        head = self.conversations.row(conversation_id)["head_block_id"]
        if not head:
            return 0
        return sum(r["owner_id"] == conversation_id for r in self.vault.chain_rows(head))

    def needs_compaction(self, conversation_id: str) -> bool:
        if self.links(conversation_id) > self.live.settings.values.compact_after:
            return True
        head = self.conversations.row(conversation_id)["head_block_id"]
        if not head:
            return False
        own = [r for r in self.vault.chain_rows(head) if r["owner_id"] == conversation_id]
        apart = sum(file_bytes(r) for r in own[1:])  # the root (or merged block) always stays
        return len(own) > 2 and apart > 2 * self.checkpoint_bytes()

    def checkpoint_bytes(self) -> int:
        """The most the links kept apart at a compaction may take together."""
        return checkpoint_bytes(self.live.settings.values.disk_budget)

    def _kept_by_bytes(self, own: list[BlockRow], keep: int) -> int:
        """How many of the newest links (at most `keep`, at least one) fit the bytes."""
        limit, total, kept = self.checkpoint_bytes(), 0, 0
        for row in reversed(own[1:]):
            total += file_bytes(row)
            if kept == keep or (kept and total > limit):
                break
            kept += 1
        return max(kept, 1)

    def compact(self, conversation_id: str, keep: int | None = None) -> CompactResult:
        """Merge the older links of a conversation's chain into one block.

        The spliced state of every kept checkpoint is unchanged, byte for byte: the merged
        block holds exactly the cells its links held at its end, and the first kept link is
        rewritten (same id, new file) to continue from it. The newest `keep` turn boundaries
        stay separate checkpoints; the merged-away ones are re-read if ever rewound to.
        """
        conv = self.conversations.row(conversation_id)
        self.live.records.check("conversations", conv)
        chosen = keep
        keep = self.live.settings.values.checkpoints if keep is None else keep
        if keep < 1:
            raise InputError("Compaction must keep at least one link.")
        head = conv["head_block_id"]
        chain = self.vault.chain_rows(head) if head else []
        own = [r for r in chain if r["owner_id"] == conversation_id]
        if chosen is None:  # automatic: by bytes too (a count the person asks for is kept)
            keep = self._kept_by_bytes(own, keep)
        if any(given_back(r) for r in chain):
            return CompactResult(
                conversation_id,
                len(own),
                0,
                len(own),
                skipped="its memory was given back to the disk budget (re-read on next open)",
            )
        if len(own) <= keep + 1:
            return CompactResult(conversation_id, len(own), 0, len(own))
        merge, successor = own[: len(own) - keep], own[len(own) - keep]
        for row in merge:
            if len(self.vault.children(row["id"])) != 1:
                return CompactResult(
                    conversation_id,
                    len(own),
                    0,
                    len(own),
                    skipped=f"block {row['id']} has other continuations",
                )
        start = time.perf_counter()
        merged, rewritten = self._write_merged(conversation_id, merge, successor)
        crashpoint("compact-before-commit")
        gone = [r["id"] for r in merge]
        self._commit(conversation_id, merged, rewritten, successor, merge[-1]["id"], gone)
        self.vault.unlink_block_files([*gone, successor["id"]], keep={rewritten["file_name"]})
        holding = self.live.holding
        if holding and holding.owner_id == conversation_id and holding.block_id in gone:
            self.live.drop()
        return CompactResult(
            conversation_id,
            len(own),
            len(merge),
            len(own) - len(merge) + 1,
            merged["id"],
            merged["file_bytes"],
            sum(r["file_bytes"] for r in merge) - merged["file_bytes"],
            (time.perf_counter() - start) * 1e3,
        )

    def _write_merged(
        self, conversation_id: str, merge: list[BlockRow], successor: BlockRow
    ) -> tuple[BlockRow, BlockRow]:
        """Write the merged block (the cells the links to merge held at their end) and the
        first kept link rewritten to continue from it; neither is in the catalog yet."""
        last, base = merge[-1], merge[0]["parent_id"]
        owners = self.conversations.chain_owners(conversation_id)
        stored = self.live.read_state(last["id"], owners)
        state = kvstate.parse(stored.payload, stored.size)
        payload, size = (
            kvstate.cut(state, merge[0]["pos_start"]) if base else (stored.payload, stored.size)
        )
        del state
        tokens = stored.tokens[merge[0]["pos_start"] :]
        merged = self.vault.write_block(
            kind="conversation",
            owner_id=conversation_id,
            parent_id=base,
            tokens=tokens,
            generation=last["generation"],
            fingerprint=last["fingerprint"],
            model_sha256=last.get("model_sha256") or "",
            payload=memoryview(payload).cast("B")[:size],
            sealed_meta={**stored.meta, "tokens_sha256": tokens_digest(tokens)},
            capture_ms=0.0,
            pos_start=merge[0]["pos_start"],
        )
        del payload, stored
        link = self.vault.read_block(successor["id"], expected_owner=conversation_id)
        rewritten = self.vault.write_block(
            kind=successor["kind"],
            owner_id=conversation_id,
            parent_id=merged["id"],
            tokens=link.tokens,
            generation=successor["generation"],
            fingerprint=successor["fingerprint"],
            model_sha256=successor.get("model_sha256") or "",
            payload=link.state,
            sealed_meta=link.meta,
            capture_ms=successor["capture_ms"],
            pos_start=successor["pos_start"],
            rewrite_of=successor["id"],
        )
        return merged, rewritten

    def _commit(
        self,
        conversation_id: str,
        merged: BlockRow,
        rewritten: BlockRow,
        successor: BlockRow,
        last_id: str,
        gone: list[str],
    ) -> None:
        """One transaction: the merged block in, the kept link pointed at its new file, the
        messages moved to the merged block, the merged-away links out, the head resealed."""
        records = self.vault.records
        moved = {
            "parent_id": rewritten["parent_id"],
            "file_name": rewritten["file_name"],
            "file_bytes": rewritten["file_bytes"],
            "header_sha256": rewritten["header_sha256"],
            "wrapped_key": rewritten["wrapped_key"],
        }
        with self.vault.transaction():
            records.insert("blocks", merged)
            records.update("blocks", successor["id"], moved)
            records.update_where("messages", {"block_id": merged["id"]}, block_id=last_id)
            records.update_in("messages", {"block_id": None}, "block_id", gone)
            self.vault.delete_block_rows(gone)
            records.reseal("conversations", conversation_id)
