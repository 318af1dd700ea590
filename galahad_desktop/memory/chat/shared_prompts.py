"""Shared system prompts: read once, grafted into every conversation that starts with one.

A new conversation's first tokens (BOS and its system turn) are the same for every
conversation with the same system prompt under the same runtime. When they are long enough
to be worth it, they are read once and kept as a block of their own (kind "prompt"); a new
conversation with that prompt grafts the block (proved, 0 tokens re-read) instead of reading
its system turn again. The conversation's first turn is then stored whole (its chain starts
there), so forgetting a prompt block never breaks a conversation. The catalog row names the
prompt by a keyed tag of its words, never the words; forgetting the last conversation that
uses a prompt forgets its block too.

A first message can also begin with words other conversations began with: a system prompt
folded into the first user turn (Gemma 3 has no system turn), or a document pasted before
the question (everything up to the message's last paragraph break). Those prefixes end
inside the user turn; their blocks are marked so, proved with the probe taken back, and
grafted with the rest of the message read after them. A prefix is shared only when the
message's own tokens begin with the prefix's tokens (tokenized alone), so the conversation's
ledger is the one a plain read would make.
"""

from __future__ import annotations

import hashlib
import time

from galahad_desktop.engine.values import Counters
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import LiveContext
from galahad_desktop.memory.results import GraftReport

MIN_TOKENS = 32  # shorter openings cost less to read than a graft's proof
HEAD_MIN_TOKENS = 256  # a pasted document: worth a block of its own
TAG = "system-prompt"
HEAD_TAG = "first-message-head"


class SharedPrompts:
    def __init__(self, live: LiveContext) -> None:
        self.live = live
        self.vault = live.vault
        self.records = live.records

    def tag(self, words: str, thinking: bool) -> str:
        return self.records.lookup_tag(f"{int(thinking)}\0{words}", TAG)

    def head_tag(self, words: str, thinking: bool, head: str) -> str:
        return self.records.lookup_tag(f"{int(thinking)}\0{words}\0{head}", HEAD_TAG)

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
        block_id = self._keep(prompt_id, tag, row, counters)
        self.live.mark(prompt_id, block_id)
        return True, None

    def _keep(
        self,
        prompt_id: str,
        tag: str,
        row: dict[str, object] | None,
        counters: Counters,
        mid_turn: bool = False,
    ) -> str:
        """Store what the context holds as the prompt's block (replacing `row`, its block
        under an earlier runtime, and rows of the same words under other runtimes)."""
        engine = self.live.engine
        n_tokens = len(engine.tokens)
        block_row, _record = self.live.persist(
            "prompt", prompt_id, None, 0, counters, mid_turn=mid_turn
        )
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
                    "n_tokens": n_tokens,
                    "fingerprint": engine.fingerprint,
                    "created_at": time.time(),
                },
            )
            self.vault.delete_block_rows(old_blocks)
        self.vault.unlink_block_files(old_blocks)
        return str(block_row["id"])

    # -- prefixes of a first message -----------------------------------------------------
    def tags_of(self, words: str, thinking: bool, first_text: str | None) -> set[str]:
        """The tags of every prompt a conversation with this system prompt and first user
        text can use (for forgetting the unused ones). Without the model loaded, both ways
        a system prompt can begin the first turn are kept."""
        tags = {self.tag(words, thinking)}
        if self.live.loaded:
            folds = [self._folded(words)]
        else:
            folds = ["", words.strip() + "\n\n" if words.strip() else ""]
        for folded in folds:
            head = self._head_text(folded, first_text or "")
            if head:
                tags.add(self.head_tag(words, thinking, head))
        return tags

    def _folded(self, words: str) -> str:
        """The system prompt's words as the first user turn begins with them ('' when the
        format has a system turn of its own)."""
        fmt = self.live.engine.turns.format
        if fmt.system_open is not None or not words.strip():
            return ""
        return words.strip() + fmt.fold_separator

    @staticmethod
    def _head_text(folded: str, text: str) -> str:
        """The first user turn's text up to its last paragraph break (where a pasted
        document ends and the question begins), the folded system prompt included."""
        prompt = folded + text.strip()
        cut = prompt.rfind("\n\n")
        return prompt[: cut + 2] if cut >= len(folded) else ""

    def _covers(self, prefix: str, user_tokens: list[int]) -> int:
        """How many of the turn's tokens `prefix` is, when the turn's tokens begin with the
        prefix's own (0 when the tokenizer joins words across the cut)."""
        if not prefix:
            return 0
        tokens = self.live.engine.encode_text(prefix)
        same = 0 < len(tokens) < len(user_tokens) and user_tokens[: len(tokens)] == tokens
        return len(tokens) if same else 0

    def open_heads(
        self,
        words: str,
        thinking: bool,
        text: str,
        user_tokens: list[int],
        counters: Counters,
        job: Job = NO_JOB,
    ) -> tuple[int, GraftReport | None]:
        """Before a conversation's first user turn is read (the context holds its opening):
        graft the longest stored prefix of the turn, then read and keep the longer ones
        not stored yet. Returns how many of `user_tokens` the context now holds, and the
        graft's report."""
        engine = self.live.engine
        opening = list(engine.tokens)
        candidates: list[tuple[str, int]] = []
        folded_text = self._folded(words)
        folded = self._covers(folded_text, user_tokens)
        if folded and len(opening) + folded >= MIN_TOKENS:
            candidates.append((self.tag(words, thinking), folded))
        head_text = self._head_text(folded_text, text[len(folded_text) :])
        head = self._covers(head_text, user_tokens)
        if head >= HEAD_MIN_TOKENS and head > folded:
            candidates.append((self.head_tag(words, thinking, head_text), head))
        held, first_new, report = 0, 0, None
        for index in range(len(candidates) - 1, -1, -1):
            tag, n = candidates[index]
            report = self._graft_prefix(tag, opening + user_tokens[:n], counters, job)
            if report is not None:
                held, first_new = n, index + 1
                break
        for tag, n in candidates[first_new:]:
            counters.prefill_ms += engine.evaluate(user_tokens[held:n], job)
            counters.new_tokens += n - held
            held = n
            prompt_id = self.prompt_id(tag, engine.fingerprint)
            self._keep(prompt_id, tag, self.records.get("prompts", prompt_id), counters, True)
        return held, report

    def _graft_prefix(
        self, tag: str, ledger: list[int], counters: Counters, job: Job
    ) -> GraftReport | None:
        """Graft the prompt stored under `tag` when it holds exactly `ledger`; the context
        is left as it was when it cannot."""
        engine = self.live.engine
        prompt_id = self.prompt_id(tag, engine.fingerprint)
        row = self.records.get("prompts", prompt_id)
        if row is None:
            return None
        self.records.check("prompts", row)
        if row["n_tokens"] != len(ledger):
            return None
        block = self.records.block(str(row["block_id"]))
        if block is None or not self.live.graftable(block["id"]):
            return None
        before = list(engine.tokens)
        report = self.live.graft(block["id"], prompt_id, counters, job, mid_turn=True)
        if report.fallback_reason:  # re-read and stored again: the prompt names the new block
            with self.vault.transaction():
                self.records.update("prompts", prompt_id, {"block_id": report.block_id})
                self.records.reseal("prompts", prompt_id)
        if engine.tokens != ledger:  # not what this turn begins with: read it instead
            engine.reset()
            counters.prefill_ms += engine.evaluate(before, job)
            counters.new_tokens += len(before)
            return None
        return report

    def forget_unused(self, tags_in_use: set[str]) -> list[str]:
        """Forget the prompts no remaining conversation starts with (inside the caller's
        transaction); returns their block ids, whose files the caller unlinks."""
        gone = [r for r in self.records.select("prompts") if r["lookup"] not in tags_in_use]
        blocks = [str(r["block_id"]) for r in gone]
        self.records.delete_in("prompts", "id", [r["id"] for r in gone])
        self.vault.delete_block_rows(blocks)
        return blocks
