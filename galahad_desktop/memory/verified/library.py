"""Verified answers: the solve-verify-store-graft flywheel as a feature.

Only answers that pass a mechanical check (or that the user marks as verified) are stored,
each as a block at its own positions: the question's user turn and the verified answer's
model turn. Asked again:

- **Recurrence** (same problem: the same canonical key, so paraphrases of a checkable problem
  meet and the same template with other numbers never does): the block is grafted and the
  stored answer returned with zero decode tokens; the conversation continues from that state.
- **Transfer** (a similar question above the confidence gate, clear of the runner-up): a new
  conversation starts from the verified block's state and the model answers the variant.
- Otherwise the question is answered normally. A stored answer is only ever returned on an
  exact key match, so a near miss can never receive someone else's answer.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Literal

from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import InputError, NotFoundError, check_text
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.live import MODEL_CHANGED, Rendered
from galahad_desktop.memory.chat.turning import TurnRoom
from galahad_desktop.memory.results import LibraryUse, TurnResult
from galahad_desktop.memory.verified.verifiers import Verdict, normalize, verifier_for
from galahad_desktop.vault.names import BlockRow, ConversationRow
from galahad_desktop.vault.vault import new_id, tokens_digest

GATE = 0.6  # similarity needed for transfer
MARGIN = 0.05  # and its lead over the runner-up


@dataclass(frozen=True)
class Entry:
    id: str
    question: str
    answer: str
    key: str
    verifier: str
    verdict: dict[str, Any]
    block_id: str
    created_at: float
    uses: int


@dataclass(frozen=True)
class Hit:
    entry: Entry
    mode: Literal["recurrence", "transfer"]
    score: float
    runner_up: float


def template(text: str) -> str:
    """The question with its numbers masked: same template, other numbers."""
    return re.sub(r"\d+(?:\.\d+)?", "#", normalize(text))


def _grams(text: str) -> set[str]:
    padded = f"  {template(text)}  "
    return {padded[i : i + 3] for i in range(len(padded) - 2)}


def similarity(a: str, b: str) -> float:
    ga, gb = _grams(a), _grams(b)
    return len(ga & gb) / len(ga | gb) if ga and gb else 0.0


def problem_key(question: str) -> tuple[str, str]:
    """(canonical key, verifier name); text questions get their normal form."""
    found = verifier_for(question)
    if found is not None:
        return found[1], found[0].name
    return f"text:{normalize(question)}", "user"


class VerifiedLibrary(TurnRoom):
    """Answers kept and reused, each checked before it is stored."""

    # -- entries -------------------------------------------------------------------------
    def check(self, question: str, answer: str) -> Verdict | None:
        found = verifier_for(question)
        return None if found is None else found[0].check(question, answer)

    def add(self, question: str, answer: str, user_verified: bool = False) -> Entry:
        """Store a verified answer. A mechanically checkable answer must pass its check;
        any other answer is stored only when the user vouches for it."""
        check_text(question, "The question")
        check_text(answer, "The answer")
        if not question.strip() or not answer.strip():
            raise InputError("A verified entry needs a question and an answer.")
        key, verifier = problem_key(question)
        verdict = self.check(question, answer)
        if verdict is not None and not verdict.ok:
            raise InputError(
                f"The answer fails its {verdict.verifier} check (expected {verdict.expected}, "
                f"found {verdict.found or 'no number'}); it was not stored."
            )
        if verdict is None and not user_verified:
            raise InputError(
                "No verifier can check this question; mark it as verified yourself to store it."
            )
        engine, vault = self.live.engine, self.vault
        records = self.live.records
        lookup = records.lookup_tag(key)
        for old in records.verified_matching(key):
            self.remove(old["id"])  # one entry per problem: the newest verified answer
        entry_id = new_id("v")
        tokens, user_start, user_end = self.tokens_for(question, answer)
        if len(tokens) + 64 > engine.n_ctx:
            raise InputError("The question and answer do not fit the context.")
        engine.reset()
        self.live.drop()
        engine.evaluate(tokens)
        row, _record = self.live.persist("verified", entry_id, None, 1)
        verdict_info = {
            "ok": True,
            "verifier": verifier,
            "user_verified": verdict is None,
            "expected": verdict.expected if verdict else None,
            "detail": verdict.detail if verdict else "marked verified by the user",
            "boundaries": [user_start, user_end, len(tokens)],
        }
        now = time.time()
        with vault.transaction():
            vault.records.insert("blocks", row)
            entry_row: dict[str, Any] = {
                "id": entry_id,
                "lookup": lookup,
                "verifier": verifier,
                "block_id": row["id"],
                "uses": 0,
                "created_at": now,
            }
            for column, value in (
                ("question_enc", question),
                ("answer_enc", answer),
                ("key_enc", key),
                ("verdict_enc", json.dumps(verdict_info)),
            ):
                entry_row[column] = records.encrypt("verified", column, entry_row, value)
            vault.records.insert("verified", entry_row)
        self.live.drop()  # the context holds the entry, not a conversation
        return self.entry(entry_id)

    def tokens_for(self, question: str, answer: str) -> tuple[list[int], int, int]:
        """An entry's tokens (a fresh conversation's first turn: the question, the verified
        answer) and where the user turn starts and ends."""
        turns = self.live.engine.turns
        start = turns.start()
        user = start + turns.user_turn(question)
        tokens = user + self.live.engine.encode_text(answer) + turns.model_close
        return tokens, len(start) - len(turns.probe), len(user)

    def rendered(self, row: BlockRow) -> Rendered | None:
        """An entry's ledger rebuilt for the current model."""
        entries = self.vault.records.select("verified", block_id=row["id"])
        if not entries:
            return None
        entry = self._entry(entries[0])
        tokens, user_start, user_end = self.tokens_for(entry.question, entry.answer)

        def apply(new_row: BlockRow) -> list[str]:
            verdict = {**entry.verdict, "boundaries": [user_start, user_end, len(tokens)]}
            self.vault.records.update(
                "verified",
                entry.id,
                {
                    "verdict_enc": self.live.records.encrypt(
                        "verified", "verdict_enc", {"id": entry.id}, json.dumps(verdict)
                    )
                },
            )
            return []

        return Rendered(tokens, apply)

    def _entry(self, row: dict[str, Any]) -> Entry:
        records = self.live.records
        records.check("verified", row)
        return Entry(
            row["id"],
            records.decrypt("verified", "question_enc", row),
            records.decrypt("verified", "answer_enc", row),
            records.decrypt("verified", "key_enc", row),
            row["verifier"],
            json.loads(records.decrypt("verified", "verdict_enc", row)),
            row["block_id"],
            row["created_at"],
            row["uses"] or 0,
        )

    def entry(self, entry_id: str) -> Entry:
        row = self.vault.records.get("verified", entry_id)
        if row is None:
            raise NotFoundError(f"No verified answer has the id '{entry_id}'.")
        return self._entry(row)

    def entries(self) -> list[Entry]:
        rows = self.vault.records.select("verified", "created_at desc")
        return [self._entry(r) for r in rows]

    def remove(self, entry_id: str) -> None:
        vault = self.vault
        row = vault.records.get("verified", entry_id)
        if row is None:
            raise NotFoundError(f"No verified answer has the id '{entry_id}'.")
        blocks = [r["id"] for r in vault.records.blocks(owner_id=entry_id)]
        with vault.transaction():
            vault.records.delete("verified", id=entry_id)
            vault.delete_block_rows(blocks)
        vault.unlink_block_files(blocks)

    # -- routing -------------------------------------------------------------------------
    def lookup(self, question: str) -> Hit | None:
        key, _verifier = problem_key(question)
        vault = self.vault
        exact = vault.records.verified_matching(key)
        if exact:
            return Hit(self._entry(exact[0]), "recurrence", 1.0, 0.0)
        scored = sorted(
            ((similarity(question, e.question), e) for e in self.entries()),
            key=lambda pair: -pair[0],
        )
        if not scored:
            return None
        best, entry = scored[0]
        # The runner-up that matters is the best candidate of another template: entries of
        # one template are interchangeable starting points (transfer never returns their
        # stored answer), entries of different templates are a real ambiguity.
        runner_up = next(
            (
                score
                for score, other in scored[1:]
                if template(other.question) != template(entry.question)
            ),
            0.0,
        )
        if best >= GATE and best - runner_up >= MARGIN:
            return Hit(entry, "transfer", best, runner_up)
        return None

    def set_enabled(self, conversation_id: str, enabled: bool) -> None:
        self.conversations.row(conversation_id)
        with self.vault.transaction():
            self.vault.records.update(
                "conversations", conversation_id, {"library": 1 if enabled else 0}
            )
            self.live.records.reseal("conversations", conversation_id)
            self.live.records.reseal("conversations", conversation_id)

    def enabled(self, conversation_id: str) -> bool:
        row = self.conversations.row(conversation_id)
        return row.get("library") is None or bool(row["library"])

    # -- asking --------------------------------------------------------------------------
    def ask(
        self,
        conversation_id: str,
        question: str,
        params: SamplingParams,
        job: Job = NO_JOB,
    ) -> TurnResult:
        """A turn through the library: a stored verified answer (zero decode tokens), a
        start from a similar verified problem, or an ordinary turn."""
        conversations = self.conversations
        conv = conversations.row(conversation_id)
        hit = self.lookup(question) if self.enabled(conversation_id) else None
        # A stored entry is a plain conversation's first turn; one with a system prompt or
        # thinking starts differently, so the answer is appended there instead.
        fresh = (
            not conv["head_block_id"]
            and not conv["document_id"]
            and not conv.get("thinking")
            and not conversations.system_text(conv)
        )
        if hit is None or (hit.mode == "transfer" and not fresh):
            result = self.turns.send(conversation_id, question, params, job)
            result.library = LibraryUse("none", hit.score if hit else None)
            return result
        counters = Counters()
        self.live.records.check("conversations", conv)
        if hit.mode == "transfer":
            graft = self.live.graft(hit.entry.block_id, hit.entry.id, counters, job)
            result = self.turns.turn(
                conv,
                question,
                counters,
                graft,
                None,
                0,
                [],
                job,
                params,
            )
        elif fresh:
            result = self._recur_fresh(conv, question, hit.entry, counters)
        else:
            result = self._recur_append(conv, question, hit.entry, counters, job)
        if hit.mode == "recurrence":
            job.text(result.reply)
        with self.vault.transaction():
            self.vault.records.update("verified", hit.entry.id, {"uses": hit.entry.uses + 1})
        result.library = LibraryUse(
            hit.mode,
            hit.score,
            hit.entry.id,
            hit.runner_up,
            hit.entry.created_at,
            hit.entry.verifier,
            (
                f"verified answer from memory "
                f"({time.strftime('%Y-%m-%d', time.localtime(hit.entry.created_at))})"
                if hit.mode == "recurrence"
                else f"answered from a similar verified problem (similarity {hit.score:.2f})"
            ),
        )
        return result

    def _recur_fresh(
        self, conv: ConversationRow, question: str, entry: Entry, counters: Counters
    ) -> TurnResult:
        """Graft the verified block as the conversation's first turn: zero decode tokens,
        zero recomputed; the conversation's checkpoint is the same state, re-keyed."""
        live, vault = self.live, self.vault
        engine = live.engine
        block = vault.block_row(entry.block_id)
        if block["fingerprint"] != engine.fingerprint:
            graft = live.reread(block, MODEL_CHANGED, counters)
            block = vault.block_row(graft.block_id)
        stored = vault.read_block(block["id"], expected_owner=entry.id)
        restore_ms = stored.read_ms + engine.restore(stored.payload, stored.tokens, stored.size)
        persist_start = time.perf_counter()
        row = vault.write_block(
            kind="conversation",
            owner_id=conv["id"],
            parent_id=None,
            tokens=stored.tokens,
            generation=live.next_generation(conv["id"]),
            fingerprint=engine.fingerprint,
            model_sha256=engine.model_sha256,
            payload=stored.state,
            sealed_meta={
                "tokens_sha256": tokens_digest(stored.tokens),
                "proof": stored.meta["proof"],
                "state_format": stored.meta.get("state_format", ""),
                "from_verified": entry.id,
            },
            capture_ms=0.0,
        )
        persist_ms = (time.perf_counter() - persist_start) * 1e3
        record = proofs.ProofRecord.from_dict(stored.meta["proof"])
        n_tokens = len(stored.tokens)
        del stored
        result = live.prove(record)
        counters.restored_tokens += n_tokens
        counters.restore_ms += restore_ms
        counters.proof_ms += result.proof_ms
        counters.new_tokens += len(record.probe_tokens)
        start = time.perf_counter()
        boundaries = entry.verdict.get("boundaries", [1, n_tokens, n_tokens])
        self.turns.commit_turn(
            conv,
            row,
            0,
            question,
            entry.answer,
            (int(boundaries[0]), int(boundaries[1]), int(boundaries[2])),
            [],
        )
        counters.persist_ms += persist_ms + (time.perf_counter() - start) * 1e3
        live.stats.restored_tokens += n_tokens
        return TurnResult(
            conv["id"],
            entry.answer,
            "verified",
            counters,
            result,
            None,
            len(engine.tokens),
            engine.n_ctx,
            0.0,
        )

    def _recur_append(
        self,
        conv: ConversationRow,
        question: str,
        entry: Entry,
        counters: Counters,
        job: Job,
    ) -> TurnResult:
        """Mid-conversation: the stored answer is appended as tokens (prefill, no decoding)."""
        live = self.live
        engine = live.engine
        graft = self.turns.ensure_live(conv, counters, job, seal_checked=True)
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        user_tokens = engine.turns.user_turn(question, bool(conv.get("thinking")))
        answer_tokens = engine.encode_text(entry.answer) + engine.model_close()
        if len(user_tokens) + len(answer_tokens) + 64 > engine.room():
            raise InputError("This conversation's context is full. Start a new conversation.")
        counters.prefill_ms += engine.evaluate(user_tokens)
        reply_start = len(engine.tokens)
        counters.prefill_ms += engine.evaluate(answer_tokens)
        counters.new_tokens += len(user_tokens) + len(answer_tokens)
        reply_end = len(engine.tokens)
        start = time.perf_counter()
        row, _record = live.persist(
            "conversation",
            conv["id"],
            self.turns.live_parent(conv, conv["head_block_id"]),
            live.next_generation(conv["id"]),
            counters,
        )
        self.turns.commit_turn(
            conv,
            row,
            conv["n_messages"] or 0,
            question,
            entry.answer,
            (user_start, reply_start, reply_end),
            [],
        )
        counters.persist_ms += (time.perf_counter() - start) * 1e3
        return self.stored_turn(conv["id"], entry.answer, "verified", counters, graft)
