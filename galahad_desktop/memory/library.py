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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.engine import Counters, ProgressFn
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.errors import InputError, NotFoundError
from galahad_desktop.memory.service import Galahad, TurnResult
from galahad_desktop.memory.verifiers import Verdict, normalize, verifier_for
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
    mode: str  # recurrence | transfer
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


class VerifiedLibrary:
    def __init__(self, core: Galahad) -> None:
        self.core = core

    # -- entries -------------------------------------------------------------------------
    def check(self, question: str, answer: str) -> Verdict | None:
        found = verifier_for(question)
        return None if found is None else found[0].check(question, answer)

    def add(self, question: str, answer: str, user_verified: bool = False) -> Entry:
        """Store a verified answer. A mechanically checkable answer must pass its check;
        any other answer is stored only when the user vouches for it."""
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
        core, engine, vault = self.core, self.core.engine, self.core.vault
        fields = vault.fields
        lookup = fields.lookup_tag(key, "verified")
        for row in vault.catalog.rows("verified", "lookup = ?", [lookup]):
            self.remove(row["id"])  # one entry per problem: the newest verified answer
        entry_id = new_id("v")
        turns = engine.turns
        user = (
            engine.bos()
            + engine.encode_template(turns.user_open)
            + engine.encode_text(question)
            + engine.encode_template(turns.user_close_model_open)
        )
        tokens = user + engine.encode_text(answer) + engine.model_close()
        if len(tokens) + 64 > engine.n_ctx:
            raise InputError("The question and answer do not fit the context.")
        engine.reset()
        core._live = None
        engine.evaluate(tokens)
        row, _record = core._persist_state("verified", entry_id, None, 1)
        verdict_info = {
            "ok": True,
            "verifier": verifier,
            "user_verified": verdict is None,
            "expected": verdict.expected if verdict else None,
            "detail": verdict.detail if verdict else "marked verified by the user",
            "boundaries": [1, len(user), len(tokens)],
        }
        now = time.time()
        with vault.transaction():
            vault.catalog.insert("blocks", row)
            vault.catalog.insert(
                "verified",
                {
                    "id": entry_id,
                    "lookup": lookup,
                    "question_enc": fields.encrypt_text(question, "verified", "question", entry_id),
                    "answer_enc": fields.encrypt_text(answer, "verified", "answer", entry_id),
                    "key_enc": fields.encrypt_text(key, "verified", "key", entry_id),
                    "verdict_enc": fields.encrypt_text(
                        json.dumps(verdict_info), "verified", "verdict", entry_id
                    ),
                    "verifier": verifier,
                    "block_id": row["id"],
                    "uses": 0,
                    "created_at": now,
                },
            )
        core._live = None  # the context holds the entry, not a conversation
        return self.entry(entry_id)

    def _entry(self, row: dict[str, Any]) -> Entry:
        f = self.core.vault.fields
        return Entry(
            row["id"],
            f.decrypt_text(row["question_enc"], "verified", "question", row["id"]),
            f.decrypt_text(row["answer_enc"], "verified", "answer", row["id"]),
            f.decrypt_text(row["key_enc"], "verified", "key", row["id"]),
            row["verifier"],
            json.loads(f.decrypt_text(row["verdict_enc"], "verified", "verdict", row["id"])),
            row["block_id"],
            row["created_at"],
            row["uses"] or 0,
        )

    def entry(self, entry_id: str) -> Entry:
        row = self.core.vault.catalog.get("verified", entry_id)
        if row is None:
            raise NotFoundError(f"No verified answer has the id '{entry_id}'.")
        return self._entry(row)

    def entries(self) -> list[Entry]:
        rows = self.core.vault.catalog.rows("verified", order_by="created_at desc")
        return [self._entry(r) for r in rows]

    def remove(self, entry_id: str) -> None:
        vault = self.core.vault
        row = vault.catalog.get("verified", entry_id)
        if row is None:
            raise NotFoundError(f"No verified answer has the id '{entry_id}'.")
        blocks = [r["id"] for r in vault.catalog.rows("blocks", "owner_id = ?", [entry_id])]
        with vault.transaction():
            vault.catalog.delete("verified", "id = ?", [entry_id])
            vault.delete_block_rows(blocks)
        vault.unlink_block_files(blocks)

    # -- routing -------------------------------------------------------------------------
    def lookup(self, question: str) -> Hit | None:
        key, _verifier = problem_key(question)
        vault = self.core.vault
        exact = vault.catalog.rows(
            "verified", "lookup = ?", [vault.fields.lookup_tag(key, "verified")]
        )
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
        self.core._conversation_row(conversation_id)
        with self.core.vault.transaction():
            self.core.vault.catalog.update(
                "conversations", conversation_id, {"library": 1 if enabled else 0}
            )

    def enabled(self, conversation_id: str) -> bool:
        row = self.core._conversation_row(conversation_id)
        return row.get("library") is None or bool(row["library"])

    # -- asking --------------------------------------------------------------------------
    def ask(
        self,
        conversation_id: str,
        question: str,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        params: SamplingParams | None = None,
        progress: ProgressFn | None = None,
    ) -> TurnResult:
        core = self.core
        conv = core._conversation_row(conversation_id)
        hit = self.lookup(question) if self.enabled(conversation_id) else None
        fresh = not conv["head_block_id"] and not conv["document_id"]
        if hit is None or (hit.mode == "transfer" and not fresh):
            result = core.send(conversation_id, question, on_text, cancel, params, progress)
            result.library = {"mode": "none", "score": hit.score if hit else None}
            return result
        counters = Counters()
        core._check_seal("conversations", conv, "head_block_id")
        if hit.mode == "transfer":
            graft = core._graft(hit.entry.block_id, hit.entry.id, counters, progress)
            result = core._turn(
                conv, question, counters, graft, None, 0, [], on_text, cancel, params
            )
        elif fresh:
            result = self._recur_fresh(conv, question, hit.entry, counters)
        else:
            result = self._recur_append(conv, question, hit.entry, counters, progress)
        if hit.mode == "recurrence" and on_text is not None:
            on_text(result.reply)
        with core.vault.transaction():
            core.vault.catalog.update("verified", hit.entry.id, {"uses": hit.entry.uses + 1})
        result.library = {
            "mode": hit.mode,
            "entry_id": hit.entry.id,
            "score": hit.score,
            "runner_up": hit.runner_up,
            "verified_at": hit.entry.created_at,
            "verifier": hit.entry.verifier,
            "label": (
                f"verified answer from memory "
                f"({time.strftime('%Y-%m-%d', time.localtime(hit.entry.created_at))})"
                if hit.mode == "recurrence"
                else f"answered from a similar verified problem (similarity {hit.score:.2f})"
            ),
        }
        return result

    def _recur_fresh(
        self, conv: dict[str, Any], question: str, entry: Entry, counters: Counters
    ) -> TurnResult:
        """Graft the verified block as the conversation's first turn: zero decode tokens,
        zero recomputed; the conversation's checkpoint is the same state, re-keyed."""
        core, engine, vault = self.core, self.core.engine, self.core.vault
        block = vault.block_row(entry.block_id)
        if block["fingerprint"] != engine.fingerprint:
            graft = core._reprefill(
                block, "the model or its runtime settings changed", counters, None
            )
            block = vault.block_row(graft.block_id)
        stored = vault.read_block(block["id"], expected_owner=entry.id)
        restore_ms = stored.read_ms + engine.restore(stored.payload, stored.tokens, stored.size)
        persist_start = time.perf_counter()
        row = vault.write_block(
            kind="conversation",
            owner_id=conv["id"],
            parent_id=None,
            tokens=stored.tokens,
            generation=core._next_generation(conv["id"]),
            fingerprint=engine.fingerprint,
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
        del stored.payload
        record = proofs.ProofRecord.from_dict(stored.meta["proof"])
        start = time.perf_counter()
        engine.evaluate(record.probe_tokens)
        result = proofs.compare(record, engine.last_logits(), (time.perf_counter() - start) * 1e3)
        counters.restored_tokens += len(stored.tokens)
        counters.restore_ms += restore_ms
        counters.proof_ms += result.proof_ms
        counters.new_tokens += len(record.probe_tokens)
        start = time.perf_counter()
        boundaries = entry.verdict.get("boundaries", [1, len(stored.tokens), len(stored.tokens)])
        core._commit_turn(
            conv,
            row,
            0,
            question,
            entry.answer,
            (int(boundaries[0]), int(boundaries[1]), int(boundaries[2])),
            [],
        )
        counters.persist_ms += persist_ms + (time.perf_counter() - start) * 1e3
        core.stats.restored_tokens += len(stored.tokens)
        graft_report = None
        return TurnResult(
            conv["id"],
            entry.answer,
            "verified",
            counters,
            result,
            graft_report,
            len(engine.tokens),
            0.0,
        )

    def _recur_append(
        self,
        conv: dict[str, Any],
        question: str,
        entry: Entry,
        counters: Counters,
        progress: ProgressFn | None,
    ) -> TurnResult:
        """Mid-conversation: the stored answer is appended as tokens (prefill, no decoding)."""
        core, engine = self.core, self.core.engine
        graft = core._ensure_live(conv, counters, progress, seal_checked=True)
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        user_tokens = engine.encode_text(question) + engine.encode_template(
            engine.turns.user_close_model_open
        )
        answer_tokens = engine.encode_text(entry.answer) + engine.model_close()
        if len(user_tokens) + len(answer_tokens) + 64 > engine.room():
            raise InputError("This conversation's context is full. Start a new conversation.")
        counters.prefill_ms += engine.evaluate(user_tokens)
        reply_start = len(engine.tokens)
        counters.prefill_ms += engine.evaluate(answer_tokens)
        counters.new_tokens += len(user_tokens) + len(answer_tokens)
        reply_end = len(engine.tokens)
        start = time.perf_counter()
        row, _record = core._persist_state(
            "conversation",
            conv["id"],
            conv["head_block_id"],
            core._next_generation(conv["id"]),
            counters,
        )
        core._commit_turn(
            conv,
            row,
            conv["n_messages"] or 0,
            question,
            entry.answer,
            (user_start, reply_start, reply_end),
            [],
        )
        counters.persist_ms += (time.perf_counter() - start) * 1e3
        return TurnResult(
            conv["id"],
            entry.answer,
            "verified",
            counters,
            graft.proof if graft else proofs.NO_PROOF,
            graft,
            len(engine.tokens),
            0.0,
        )
