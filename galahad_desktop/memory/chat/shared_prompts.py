"""Shared system prompts: read once, grafted into every conversation that starts with one.

A new conversation's first tokens (BOS and its system turn) are the same for every
conversation with the same system prompt under the same runtime. When they are long enough
to be worth it, they are read once and kept as a block of their own (kind "prompt"); a new
conversation with that prompt grafts the block (proved, 0 tokens re-read) instead of reading
its system turn again. The conversation's first turn is then stored whole (its chain starts
there), so forgetting a prompt block never breaks a conversation. The catalog row names the
prompt by a keyed tag of its words, never the words; forgetting the last conversation that
uses a prompt forgets its block too.
"""

from __future__ import annotations

import hashlib
import time

from galahad_desktop.engine.engine import Counters
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import GraftReport

MIN_TOKENS = 32  # shorter openings cost less to read than a graft's proof
TAG = "system-prompt"


class SharedPrompts:
    def __init__(self, live: LiveContext) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records

    def tag(self, words: str, thinking: bool) -> str:
        return self.records.lookup_tag(f"{int(thinking)}\0{words}", TAG)

    def prompt_id(self, tag: str, fingerprint: str) -> str:
        return "p-" + hashlib.sha256(f"{tag}\0{fingerprint}".encode()).hexdigest()[:20]

    def open(
        self,
        words: str,
        thinking: bool,
        opening: list[int],
        counters: Counters,
        job: Job = NO_JOB,
    ) -> tuple[bool, GraftReport | None]:
        """Make the context hold `opening` (a conversation's first tokens, the next user
        turn's opening included): grafted from the prompt's block (its report), or read
        once and kept (no report). (False, None) when the opening is too short to share:
        the caller reads it."""
        engine = self.live.engine
        probe = engine.probe_tokens
        prefix = opening[: len(opening) - len(probe)]
        if not words.strip() or len(prefix) < MIN_TOKENS or opening[len(prefix) :] != probe:
            return False, None
        tag = self.tag(words, thinking)
        prompt_id = self.prompt_id(tag, engine.fingerprint)
        row = self.records.get("prompts", prompt_id)
        if row is not None:
            self.records.check("prompts", row)
            block = self.records.block(str(row["block_id"]))
            if block is not None and self.live.graftable(block["id"]):
                report = self.live.graft(block["id"], prompt_id, counters, job)
                if not report.fallback_reason:
                    return True, report
        self.live.drop()
        engine.reset()
        counters.prefill_ms += engine.evaluate(prefix, job)
        counters.new_tokens += len(prefix)
        block_row, _record = self.live.persist("prompt", prompt_id, None, 0, counters)
        stale = [r for r in self.records.select("prompts", lookup=tag) if r["id"] != prompt_id]
        old_blocks = [str(r["block_id"]) for r in [*stale, *([row] if row else [])]]
        with self.vault.transaction():
            self.records.insert("blocks", block_row)
            self.records.delete_in("prompts", "id", [r["id"] for r in stale])
            if row is not None:
                self.records.delete("prompts", id=prompt_id)
            self.records.insert(
                "prompts",
                {
                    "id": prompt_id,
                    "lookup": tag,
                    "block_id": block_row["id"],
                    "n_tokens": len(prefix),
                    "fingerprint": engine.fingerprint,
                    "created_at": time.time(),
                },
            )
            self.vault.delete_block_rows(old_blocks)
        self.vault.unlink_block_files(old_blocks)
        self.live.mark(prompt_id, block_row["id"])
        return True, None

    def forget_unused(self, tags_in_use: set[str]) -> list[str]:
        """Forget the prompts no remaining conversation starts with (inside the caller's
        transaction); returns their block ids, whose files the caller unlinks."""
        gone = [r for r in self.records.select("prompts") if r["lookup"] not in tags_in_use]
        blocks = [str(r["block_id"]) for r in gone]
        self.records.delete_in("prompts", "id", [r["id"] for r in gone])
        self.vault.delete_block_rows(blocks)
        return blocks
