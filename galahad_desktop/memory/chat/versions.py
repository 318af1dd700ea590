"""Reply versions: Regenerate keeps the reply it replaces, so a user can page back to it.

Every version keeps its text and thoughts (encrypted, sealed). The last reply's versions also
keep the block their turn ended in, so choosing one again makes that block the
conversation's head: grafted and proved, 0 tokens re-read. Once the conversation moves on,
older replies' versions let their blocks go (only the last reply can be swapped).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from galahad_desktop.errors import InputError
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import ReplyVersion
from galahad_desktop.vault.names import MessageRow, VersionRow
from galahad_desktop.vault.vault import new_id


class Versions:
    def __init__(self, live: LiveContext, check_conversation: Callable[[str], None]) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records
        self.check_conversation = check_conversation  # the conversation's seal, or refused

    def rows(self, conversation_id: str) -> list[VersionRow]:
        rows = self.records.versions(conversation_id)
        for row in rows:
            self.records.check("reply_versions", row)
        return rows

    def places(self, conversation_id: str, rows: list[MessageRow]) -> dict[int, tuple[int, int]]:
        """For each reply with earlier versions: (its number, how many), oldest first."""
        by_seq: dict[int, list[float]] = {}
        for v in self.rows(conversation_id):
            by_seq.setdefault(v["seq"], []).append(v["created_at"])
        out: dict[int, tuple[int, int]] = {}
        for r in rows:
            earlier = by_seq.get(r["seq"])
            if earlier and r["role"] == "model":
                times = sorted([*earlier, r["created_at"]])
                out[r["seq"]] = (times.index(r["created_at"]) + 1, len(times))
        return out

    def of_reply(self, conversation_id: str, seq: int) -> list[ReplyVersion]:
        """Every version of the reply at `seq`, oldest first (the current one included)."""
        self.check_conversation(conversation_id)
        rows = self.records.messages(conversation_id)
        current = next((r for r in rows if r["seq"] == seq and r["role"] == "model"), None)
        if current is None:
            raise InputError(f"Message {seq} is not a reply of this conversation.")
        records = self.records
        last = rows[-1]["seq"] == seq
        found: list[tuple[float, str, str, int | None, bool, bool, str]] = [
            (
                v["created_at"],
                records.decrypt("reply_versions", "text_enc", v),
                records.decrypt("reply_versions", "thought_enc", v) if v.get("thought_enc") else "",
                v.get("seed"),
                False,
                last and bool(v["block_id"]) and records.block(str(v["block_id"])) is not None,
                str(v.get("stop") or ""),
            )
            for v in self.rows(conversation_id)
            if v["seq"] == seq
        ]
        found.append(
            (
                current["created_at"],
                records.decrypt("messages", "text_enc", current),
                records.decrypt("messages", "thought_enc", current)
                if current.get("thought_enc")
                else "",
                current.get("seed"),
                True,
                True,
                str(current.get("stop") or ""),
            )
        )
        found.sort(key=lambda item: item[0])
        return [
            ReplyVersion(n, text, thoughts, seed, at, is_current, restorable, stop)
            for n, (at, text, thoughts, seed, is_current, restorable, stop) in enumerate(
                found, start=1
            )
        ]

    def keep(self, reply: MessageRow) -> None:
        """Keep a reply that is being replaced as an earlier version (inside the caller's
        transaction), its block with it."""
        records = self.records
        records.add_version(
            {
                "id": new_id("v"),
                "conversation_id": reply["conversation_id"],
                "seq": reply["seq"],
                "tok_start": reply["tok_start"],
                "tok_end": reply["tok_end"],
                "block_id": reply["block_id"],
                "seed": reply.get("seed"),
                "stop": reply.get("stop"),
                "created_at": reply["created_at"],
            },
            records.decrypt("messages", "text_enc", reply),
            records.decrypt("messages", "thought_enc", reply) if reply.get("thought_enc") else "",
        )

    def choose(self, conversation_id: str, number: int) -> bool:
        """Make version `number` of the last reply the one the conversation continues
        from: its stored block becomes the head again (grafted next, 0 tokens re-read).
        Returns whether anything changed."""
        versions = self.of_reply(conversation_id, self.records.messages(conversation_id)[-1]["seq"])
        if not 1 <= number <= len(versions):
            raise InputError(f"This reply has {len(versions)} versions; there is no {number}.")
        chosen = versions[number - 1]
        if chosen.current:
            return False
        rows = self.records.messages(conversation_id)
        reply = rows[-1]
        target = next(
            v
            for v in self.rows(conversation_id)
            if v["seq"] == reply["seq"] and v["created_at"] == chosen.created_at
        )
        block = self.records.block(str(target["block_id"])) if target["block_id"] else None
        if block is None:
            raise InputError("That version's stored state is no longer kept; regenerate instead.")
        records = self.records
        with self.vault.transaction():
            self.keep(reply)
            records.delete("reply_versions", id=target["id"])
            records.delete("messages", id=reply["id"])
            records.add_message(
                {
                    "id": new_id("m"),
                    "conversation_id": conversation_id,
                    "seq": reply["seq"],
                    "role": "model",
                    "tok_start": target["tok_start"],
                    "tok_end": target["tok_end"],
                    "block_id": block["id"],
                    "seed": target.get("seed"),
                    "stop": target.get("stop"),
                    "created_at": target["created_at"],
                },
                chosen.text,
                chosen.thoughts,
            )
            records.update(
                "conversations",
                conversation_id,
                {
                    "head_block_id": block["id"],
                    "n_tokens": block["pos_end"],
                    "updated_at": time.time(),
                },
            )
            records.reseal("conversations", conversation_id)
        self.live.drop({conversation_id})
        return True
