"""The headless core: conversations and documents over one engine and one vault.

What the context holds is always a prefix of some stored ledger plus the opening tokens of
the next user turn (the proof probe). Each finished turn is persisted as a block captured at
the turn boundary; grafting a block restores exactly that boundary, evaluates the probe (the
next turn needs those tokens anyway) and compares the logits with those recorded at capture.

A block is used only when its runtime fingerprint matches and its proof is not `diverged`;
otherwise the ledger is re-read (re-prefilled) with progress, the block is stored again, and
the report says why. A block that fails authentication is refused with an IntegrityError and
never reaches llama.cpp.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.engine import Counters, Engine, EngineConfig, ProgressFn
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.errors import InputError, IntegrityError, NotFoundError
from galahad_desktop.faults import crashpoint
from galahad_desktop.memory.documents import extract_text_bounded
from galahad_desktop.paths import default_model_path
from galahad_desktop.settings import SYSTEM_PROMPTS, Settings, coerce
from galahad_desktop.vault import crypto
from galahad_desktop.vault.keys import KeyStore, open_keystore
from galahad_desktop.vault.vault import Vault, new_id, tokens_digest

# Room kept free after a document for a question and its answer.
ANSWER_RESERVE = 512
TITLE_CHARS = 60


@dataclass
class GraftReport:
    owner_id: str
    block_id: str
    tokens: int
    restored_tokens: int
    recomputed_tokens: int
    restore_ms: float
    proof: proofs.ProofResult
    fallback_reason: str | None = None

    def describe(self) -> str:
        if self.fallback_reason:
            return f"re-read {self.tokens:,} tokens: {self.fallback_reason}"
        return (
            f"Resumed {self.restored_tokens:,} tokens in {self.restore_ms:.0f} ms · "
            f"{self.proof.describe()}"
        )

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["proof"] = self.proof.verdict
        out["proof_detail"] = self.proof.as_dict()
        out["proof_ms"] = self.proof.proof_ms
        return out


@dataclass
class TurnResult:
    conversation_id: str
    reply: str
    stop_reason: str
    counters: Counters
    proof: proofs.ProofResult
    graft: GraftReport | None
    context_tokens: int
    tokens_per_s: float
    library: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "library": self.library,
            "conversation_id": self.conversation_id,
            "reply": self.reply,
            "stop_reason": self.stop_reason,
            **self.counters.as_dict(),
            "proof": self.proof.verdict,
            "proof_detail": self.proof.as_dict(),
            "fallback_reason": self.graft.fallback_reason if self.graft else None,
            "context_tokens": self.context_tokens,
            "tokens_per_s": self.tokens_per_s,
        }


@dataclass
class DepositResult:
    document_id: str
    name: str
    tokens: int
    prefill_ms: float
    capture_ms: float
    persist_ms: float
    block_bytes: int
    block_id: str

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["bytes_per_token"] = self.block_bytes / max(1, self.tokens)
        out["tokens_per_s"] = self.tokens / (self.prefill_ms / 1e3) if self.prefill_ms else 0.0
        return out


@dataclass
class Message:
    id: str
    role: str
    text: str
    created_at: float
    tok_start: int
    tok_end: int
    block_id: str | None


@dataclass
class ConversationSummary:
    id: str
    title: str
    document_id: str | None
    n_tokens: int
    n_messages: int
    updated_at: float


@dataclass
class DocumentSummary:
    id: str
    name: str
    n_tokens: int
    block_bytes: int
    source_bytes: int
    created_at: float
    status: str


@dataclass
class _Live:
    """What the context holds: an owner's ledger up to `block_id`, plus the probe."""

    owner_id: str
    block_id: str | None


@dataclass
class Stats:
    """This session's totals, for the Memory view."""

    restored_tokens: int = 0
    recomputed_tokens: int = 0
    grafts: int = 0


def engine_config(settings: Settings, model_path: Path | None) -> EngineConfig:
    chosen = model_path or (
        Path(settings.get("model_path")) if settings.get("model_path") else None
    )
    return EngineConfig(
        model_path=chosen or default_model_path(),
        n_ctx=settings.get("n_ctx"),
        n_gpu_layers=settings.get("n_gpu_layers"),
        n_threads=settings.get("n_threads"),
        n_batch=settings.get("n_batch"),
        n_ubatch=settings.get("n_ubatch"),
        flash_attn=settings.get("flash_attn"),
        kv_type=settings.get("kv_type"),
        swa_full=settings.get("swa_full"),
    )


class Galahad:
    """One data directory and one engine. Not thread-safe: one worker thread owns it."""

    def __init__(
        self,
        data_dir: Path,
        model_path: Path | None = None,
        keystore: KeyStore | None = None,
        overrides: dict[str, Any] | None = None,
        passphrase: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        if keystore is None:
            keystore = open_keystore(self.data_dir, passphrase)
        self.vault = Vault(self.data_dir, keystore)
        try:
            self.settings = Settings(self.data_dir)
            if overrides:
                self.settings.override(overrides)
        except BaseException:
            self.vault.close()
            raise
        self.model_path = model_path
        self._engine: Engine | None = None
        self._live: _Live | None = None
        self.stats = Stats()

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(
                engine_config(self.settings, self.model_path),
                hash_cache=self.data_dir / "model-hashes.json",
            )
        return self._engine

    def reload_engine(self) -> None:
        """Drop the engine so the next use loads it with the current settings."""
        if self._engine is not None:
            self._engine.close()
        self._engine = None
        self._live = None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self.vault.close()

    def lock(self) -> None:
        """Drop keys and decrypted state from memory until unlock()."""
        self._live = None
        if self._engine is not None:
            self._engine.reset()
        self.vault.lock()

    def unlock(self) -> None:
        self.vault.unlock()

    def sampling(self, **changes: Any) -> SamplingParams:
        s = self.settings
        params = {
            "temperature": s.get("temperature"),
            "top_p": s.get("top_p"),
            "top_k": s.get("top_k"),
            "max_tokens": s.get("max_tokens"),
            "seed": s.get("seed"),
        }
        params.update({k: v for k, v in changes.items() if v is not None})
        return SamplingParams(**params)

    # -- catalog reads -------------------------------------------------------------------
    def _conversation_row(self, conversation_id: str) -> dict[str, Any]:
        row = self.vault.catalog.get("conversations", conversation_id)
        if row is None:
            raise NotFoundError(f"No conversation has the id '{conversation_id}'.")
        return row

    def _document_row(self, document_id: str) -> dict[str, Any]:
        row = self.vault.catalog.get("documents", document_id)
        if row is None:
            raise NotFoundError(f"No document has the id '{document_id}'.")
        return row

    # -- sealed pointers ---------------------------------------------------------------
    # A conversation's head (and a document's block) is a plain column the audit can read
    # without a key; its sealed copy, encrypted and bound to the row, catches an edit that
    # points the row at another of its own, older checkpoints.
    def _seal(self, table: str, row_id: str, pointer: str | None, n_messages: int) -> bytes:
        payload = json.dumps({"pointer": pointer, "n_messages": n_messages})
        return self.vault.fields.encrypt_text(payload, table, "seal", row_id)

    def _check_seal(self, table: str, row: dict[str, Any], pointer_column: str) -> None:
        sealed = row.get("seal")
        n_messages = row.get("n_messages") or 0
        try:
            if sealed is None:
                raise crypto.DecryptionFailed("missing")
            found = json.loads(self.vault.fields.decrypt_text(sealed, table, "seal", row["id"]))
        except crypto.DecryptionFailed:
            found = None
        if found != {"pointer": row[pointer_column], "n_messages": n_messages}:
            raise IntegrityError(
                f"The catalog record of {row['id']} was edited (its latest checkpoint does not "
                "match its sealed copy); refused."
            )

    def head_block(self, conversation_id: str) -> str:
        head = self._conversation_row(conversation_id)["head_block_id"]
        if not head:
            raise InputError(f"Conversation {conversation_id} has no stored turn yet.")
        return str(head)

    def conversation_title(self, row: dict[str, Any]) -> str:
        return self.vault.fields.decrypt_text(row["title_enc"], "conversations", "title", row["id"])

    def document_name(self, row: dict[str, Any]) -> str:
        return self.vault.fields.decrypt_text(row["name_enc"], "documents", "name", row["id"])

    def document_text(self, document_id: str) -> str:
        row = self._document_row(document_id)
        return self.vault.fields.decrypt_text(row["text_enc"], "documents", "text", row["id"])

    def list_conversations(self) -> list[ConversationSummary]:
        rows = self.vault.catalog.rows("conversations", order_by="updated_at desc")
        return [
            ConversationSummary(
                r["id"],
                self.conversation_title(r),
                r["document_id"],
                r["n_tokens"] or 0,
                r["n_messages"] or 0,
                r["updated_at"],
            )
            for r in rows
        ]

    def list_documents(self) -> list[DocumentSummary]:
        out = []
        for r in self.vault.catalog.rows("documents", order_by="created_at desc"):
            block = self.vault.catalog.get("blocks", r["block_id"])
            out.append(
                DocumentSummary(
                    r["id"],
                    self.document_name(r),
                    r["n_tokens"],
                    block["file_bytes"] if block else 0,
                    r["source_bytes"],
                    r["created_at"],
                    "stored" if block else "missing block",
                )
            )
        return out

    def messages(self, conversation_id: str) -> list[Message]:
        self._conversation_row(conversation_id)
        rows = self.vault.catalog.rows(
            "messages", "conversation_id = ?", [conversation_id], order_by="seq"
        )
        return [
            Message(
                r["id"],
                r["role"],
                self.vault.fields.decrypt_text(r["text_enc"], "messages", "text", r["id"]),
                r["created_at"],
                r["tok_start"],
                r["tok_end"],
                r["block_id"],
            )
            for r in rows
        ]

    def kind_of(self, item_id: str) -> str:
        for table, kind in (
            ("conversations", "conversation"),
            ("documents", "document"),
            ("blocks", "block"),
        ):
            if self.vault.catalog.get(table, item_id) is not None:
                return kind
        raise NotFoundError(f"Nothing stored has the id '{item_id}'.")

    # -- grafting ------------------------------------------------------------------------
    def _persist_state(
        self,
        kind: str,
        owner_id: str,
        parent_id: str | None,
        generation: int,
        counters: Counters | None = None,
    ) -> tuple[dict[str, Any], proofs.ProofRecord]:
        """Capture the context at a turn boundary, evaluate the probe, write the block file.

        Returns the catalog row (the caller inserts it in its transaction) and the proof.
        """
        engine = self.engine
        ledger = list(engine.tokens)
        payload, used, capture_ms = engine.capture()
        # Continue from exactly what a resume will rebuild: the live context can hold more
        # than the per-sequence state carries (with swa_full every sliding-window cell stays
        # live, the state keeps only the window), which made some later grafts only `close`.
        # Re-grafting the captured state in place makes this conversation's own continuation
        # and every future resume compute from the same cells.
        capture_ms += engine.restore(payload, ledger, used)
        engine.evaluate(engine.probe_tokens)  # the next turn's opening: needed anyway
        if counters is not None:
            counters.new_tokens += len(engine.probe_tokens)
        record = proofs.make_record(engine.probe_tokens, engine.last_logits())
        row = self.vault.write_block(
            kind=kind,
            owner_id=owner_id,
            parent_id=parent_id,
            tokens=ledger,
            generation=generation,
            fingerprint=engine.fingerprint,
            payload=memoryview(payload).cast("B")[:used],
            sealed_meta={
                "tokens_sha256": tokens_digest(ledger),
                "proof": record.as_dict(),
                "state_format": "llama_state_seq/llama-cpp-python-0.3.36",
            },
            capture_ms=capture_ms,
        )
        del payload
        return row, record

    def _graft(
        self,
        block_id: str,
        owner_id: str,
        counters: Counters,
        progress: ProgressFn | None = None,
    ) -> GraftReport:
        engine = self.engine
        row = self.vault.block_row(block_id)
        if row["owner_id"] != owner_id:
            raise IntegrityError(
                f"Block {block_id} belongs to {row['owner_id']}, not {owner_id}; refused."
            )
        if row["fingerprint"] != engine.fingerprint:
            return self._reprefill(
                row, "the model or its runtime settings changed", counters, progress
            )
        stored = self.vault.read_block(block_id, expected_owner=owner_id)
        restore_ms = stored.read_ms + engine.restore(stored.payload, stored.tokens, stored.size)
        del stored.payload
        record = proofs.ProofRecord.from_dict(stored.meta["proof"])
        start = time.perf_counter()
        engine.evaluate(record.probe_tokens)
        result = proofs.compare(record, engine.last_logits(), (time.perf_counter() - start) * 1e3)
        if result.verdict == "diverged":
            return self._reprefill(
                row, f"the graft proof diverged (KL {result.kl:.2e})", counters, progress
            )
        counters.restored_tokens += len(stored.tokens)
        counters.restore_ms += restore_ms
        counters.proof_ms += result.proof_ms
        counters.new_tokens += len(record.probe_tokens)
        self.stats.restored_tokens += len(stored.tokens)
        self.stats.grafts += 1
        self._live = _Live(owner_id, block_id)
        return GraftReport(
            owner_id, block_id, len(stored.tokens), len(stored.tokens), 0, restore_ms, result
        )

    def _reprefill(
        self,
        row: dict[str, Any],
        reason: str,
        counters: Counters,
        progress: ProgressFn | None,
    ) -> GraftReport:
        """Re-read a block's ledger from scratch, store it again, and say why."""
        engine = self.engine
        tokens = self.vault.block_tokens(row)
        engine.reset()
        self._live = None
        prefill_ms = engine.evaluate(tokens, progress=progress)
        new_row, record = self._persist_state(
            row["kind"], row["owner_id"], row["parent_id"], row["generation"] + 1
        )
        with self.vault.transaction():
            self.vault.catalog.insert("blocks", new_row)
            for table, column in (
                ("conversations", "head_block_id"),
                ("documents", "block_id"),
                ("verified", "block_id"),
            ):
                for owner in self.vault.catalog.rows(table, f"{column} = ?", [row["id"]]):
                    changes: dict[str, Any] = {column: new_row["id"]}
                    if table != "verified":  # verified entries have no sealed pointer
                        changes["seal"] = self._seal(
                            table, owner["id"], new_row["id"], owner.get("n_messages") or 0
                        )
                    self.vault.catalog.update(table, owner["id"], changes)
            self.vault.catalog.db.execute(
                "UPDATE messages SET block_id = ? WHERE block_id = ?", [new_row["id"], row["id"]]
            )
            self.vault.delete_block_rows([row["id"]])
        self.vault.unlink_block_files([row["id"]])
        counters.recomputed_tokens += len(tokens)
        counters.prefill_ms += prefill_ms
        counters.new_tokens += len(record.probe_tokens)
        self.stats.recomputed_tokens += len(tokens)
        self._live = _Live(row["owner_id"], new_row["id"])
        return GraftReport(
            row["owner_id"],
            new_row["id"],
            len(tokens),
            0,
            len(tokens),
            0.0,
            proofs.NO_PROOF,
            fallback_reason=reason,
        )

    def _ensure_live(
        self,
        conv: dict[str, Any],
        counters: Counters,
        progress: ProgressFn | None = None,
        seal_checked: bool = False,
    ) -> GraftReport | None:
        """Make the context hold this conversation's head plus the probe."""
        engine = self.engine
        live = self._live
        if not seal_checked:
            self._check_seal("conversations", conv, "head_block_id")
        if conv["head_block_id"]:
            if live and live.owner_id == conv["id"] and live.block_id == conv["head_block_id"]:
                return None
            return self._graft(conv["head_block_id"], conv["id"], counters, progress)
        if conv["document_id"]:
            doc = self._document_row(conv["document_id"])
            self._check_seal("documents", doc, "block_id")
            if live and live.owner_id == doc["id"] and live.block_id == doc["block_id"]:
                return None
            return self._graft(doc["block_id"], doc["id"], counters, progress)
        engine.reset()
        start = engine.bos() + engine.probe_tokens
        counters.prefill_ms += engine.evaluate(start)
        counters.new_tokens += len(start)
        self._live = _Live(conv["id"], None)
        return None

    # -- conversations -------------------------------------------------------------------
    def new_conversation(
        self, document_id: str | None = None, title: str = "", system_prompt: str | None = None
    ) -> str:
        if document_id is not None:
            self._document_row(document_id)
        conversation_id = new_id("c")
        now = time.time()
        with self.vault.transaction():
            self.vault.catalog.insert(
                "conversations",
                {
                    "id": conversation_id,
                    "title_enc": self.vault.fields.encrypt_text(
                        title, "conversations", "title", conversation_id
                    ),
                    "document_id": document_id,
                    "head_block_id": None,
                    "n_tokens": 0,
                    "n_messages": 0,
                    "seal": self._seal("conversations", conversation_id, None, 0),
                    "system_prompt": coerce("system_prompt", system_prompt)
                    if system_prompt is not None
                    else self.settings.get("system_prompt"),
                    "created_at": now,
                    "updated_at": now,
                },
            )
        return conversation_id

    def resume(self, conversation_id: str, progress: ProgressFn | None = None) -> GraftReport:
        """Graft a conversation's latest checkpoint into the context (always from disk)."""
        conv = self._conversation_row(conversation_id)
        self._live = None
        counters = Counters()
        report = self._ensure_live(conv, counters, progress)
        if report is None:
            return GraftReport(conversation_id, "", 0, 0, 0, 0.0, proofs.NO_PROOF)
        return report

    def send(
        self,
        conversation_id: str,
        text: str,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        params: SamplingParams | None = None,
        progress: ProgressFn | None = None,
    ) -> TurnResult:
        """Run one turn: user text in, streamed reply out, checkpoint persisted.

        Cancelling stops generation between tokens; what was generated is kept and stored.
        """
        conv = self._conversation_row(conversation_id)
        counters = Counters()
        graft = self._ensure_live(conv, counters, progress)
        return self._turn(
            conv,
            text,
            counters,
            graft,
            conv["head_block_id"],
            conv["n_messages"] or 0,
            [],
            on_text,
            cancel,
            params,
        )

    def regenerate(
        self,
        conversation_id: str,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        params: SamplingParams | None = None,
        progress: ProgressFn | None = None,
    ) -> TurnResult:
        """Replace the last reply: restore the checkpoint before the last user message (never
        trim the cache: sliding-window layers cannot roll back) and answer again."""
        conv = self._conversation_row(conversation_id)
        rows = self._message_rows(conversation_id)
        if len(rows) < 2 or rows[-1]["role"] != "model":
            raise InputError("There is no reply to regenerate yet.")
        seq = len(rows) - 2
        user_text = self.vault.fields.decrypt_text(
            rows[seq]["text_enc"], "messages", "text", rows[seq]["id"]
        )
        counters = Counters()
        graft, parent = self._rewind(conv, rows, seq, counters, progress)
        replaced = [r["id"] for r in rows[seq:]]
        return self._turn(
            conv,
            user_text,
            counters,
            graft,
            parent,
            seq,
            replaced,
            on_text,
            cancel,
            params,
            retire_head=True,
        )

    def branch(
        self,
        conversation_id: str,
        seq: int,
        new_text: str,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        params: SamplingParams | None = None,
        progress: ProgressFn | None = None,
    ) -> TurnResult:
        """Edit user message `seq` and continue from there in a new conversation (a branch);
        the original stays as it was. The history before the edit is grafted, not re-read."""
        conv = self._conversation_row(conversation_id)
        rows = self._message_rows(conversation_id)
        if not 0 <= seq < len(rows) or rows[seq]["role"] != "user":
            raise InputError(f"Message {seq} is not a user message of this conversation.")
        counters = Counters()
        graft, _parent = self._rewind(conv, rows, seq, counters, progress)
        branch_id = new_id("c")
        title = self.conversation_title(conv) or " ".join(new_text.split())[:TITLE_CHARS]
        fields = self.vault.fields
        now = time.time()
        with self.vault.transaction():
            self.vault.catalog.insert(
                "conversations",
                {
                    "id": branch_id,
                    "title_enc": fields.encrypt_text(
                        f"{title} (edited)", "conversations", "title", branch_id
                    ),
                    "document_id": conv["document_id"],
                    "head_block_id": None,
                    "n_tokens": 0,
                    "n_messages": seq,
                    "seal": self._seal("conversations", branch_id, None, seq),
                    "created_at": now,
                    "updated_at": now,
                },
            )
            for row in rows[:seq]:
                message_id = new_id("m")
                text = fields.decrypt_text(row["text_enc"], "messages", "text", row["id"])
                self.vault.catalog.insert(
                    "messages",
                    {
                        **row,
                        "id": message_id,
                        "conversation_id": branch_id,
                        "block_id": None,
                        "text_enc": fields.encrypt_text(text, "messages", "text", message_id),
                    },
                )
        branch_row = self._conversation_row(branch_id)
        return self._turn(
            branch_row, new_text, counters, graft, None, seq, [], on_text, cancel, params
        )

    def _message_rows(self, conversation_id: str) -> list[dict[str, Any]]:
        return self.vault.catalog.rows(
            "messages", "conversation_id = ?", [conversation_id], order_by="seq"
        )

    def _rewind(
        self,
        conv: dict[str, Any],
        rows: list[dict[str, Any]],
        seq: int,
        counters: Counters,
        progress: ProgressFn | None,
    ) -> tuple[GraftReport | None, str | None]:
        """Make the context hold the conversation just before message `seq` (plus the probe),
        from the checkpoint stored at that turn boundary. Returns (graft, checkpoint id)."""
        engine = self.engine
        self._check_seal("conversations", conv, "head_block_id")
        self._live = None
        if seq == 0:
            start_conv = {**conv, "head_block_id": None}
            return self._ensure_live(start_conv, counters, progress, seal_checked=True), None
        checkpoint = rows[seq - 1]["block_id"]
        if checkpoint and self.vault.catalog.get("blocks", checkpoint) is not None:
            return self._graft(checkpoint, conv["id"], counters, progress), checkpoint
        # The checkpoint was retired (only the latest ones are kept): re-read the prefix.
        head = self.vault.block_row(conv["head_block_id"])
        prefix = self.vault.block_tokens(head)[: rows[seq]["tok_start"]]
        engine.reset()
        counters.prefill_ms += engine.evaluate(prefix, progress=progress)
        counters.recomputed_tokens += len(prefix)
        engine.evaluate(engine.probe_tokens)
        counters.new_tokens += len(engine.probe_tokens)
        self.stats.recomputed_tokens += len(prefix)
        report = GraftReport(
            conv["id"],
            "",
            len(prefix),
            0,
            len(prefix),
            0.0,
            proofs.NO_PROOF,
            fallback_reason="that turn's checkpoint is no longer kept",
        )
        return report, None

    def _turn(
        self,
        conv: dict[str, Any],
        text: str,
        counters: Counters,
        graft: GraftReport | None,
        parent_block: str | None,
        seq: int,
        replaced_messages: list[str],
        on_text: Callable[[str], None] | None,
        cancel: threading.Event | None,
        params: SamplingParams | None,
        retire_head: bool = False,
    ) -> TurnResult:
        """Evaluate a user message on the live context, stream the reply, persist the turn."""
        if not text.strip():
            raise InputError("The message is empty.")
        engine = self.engine
        preset = SYSTEM_PROMPTS.get(conv.get("system_prompt") or "none", "")
        first_turn = seq == 0 and not conv["document_id"]
        # Gemma has no system role: a preset is folded into the first user turn's tokens.
        prompt = f"{preset}\n\n{text}" if preset and first_turn else text
        user_tokens = engine.encode_text(prompt) + engine.encode_template(
            engine.turns.user_close_model_open
        )
        if len(user_tokens) + 64 > engine.room():
            raise InputError(
                f"This conversation has {len(engine.tokens):,} of {engine.n_ctx:,} context "
                f"tokens; the message needs {len(user_tokens):,} more. Start a new conversation."
            )
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        counters.prefill_ms += engine.evaluate(user_tokens)
        counters.new_tokens += len(user_tokens)
        reply_start = len(engine.tokens)
        generation = engine.generate(params or self.sampling(), on_text, cancel)
        counters.generated_tokens += len(generation.tokens)
        counters.generate_ms += generation.elapsed_ms
        close = engine.model_close()
        engine.evaluate(close)
        counters.new_tokens += len(close)
        reply_end = len(engine.tokens)
        persist_start = time.perf_counter()
        generation_no = self._next_generation(conv["id"])
        row, _record = self._persist_state(
            "conversation", conv["id"], parent_block, generation_no, counters
        )
        self._commit_turn(
            conv,
            row,
            seq,
            text,
            generation.text,
            (user_start, reply_start, reply_end),
            replaced_messages,
            retire_head,
        )
        counters.persist_ms += (time.perf_counter() - persist_start) * 1e3
        return TurnResult(
            conv["id"],
            generation.text,
            generation.stop_reason,
            counters,
            graft.proof if graft else proofs.NO_PROOF,
            graft,
            len(engine.tokens),
            generation.tokens_per_s,
        )

    def _next_generation(self, owner_id: str) -> int:
        rows = self.vault.catalog.rows("blocks", "owner_id = ?", [owner_id])
        return 1 + max([int(r["generation"]) for r in rows] or [0])

    def _commit_turn(
        self,
        conv: dict[str, Any],
        row: dict[str, Any],
        seq: int,
        text: str,
        reply: str,
        boundaries: tuple[int, int, int],
        replaced_messages: list[str],
        retire_head: bool = False,
    ) -> None:
        """One transaction: the turn's block row, its two messages, the sealed new head, and
        the checkpoints retired beyond the `checkpoints` setting."""
        user_start, reply_start, reply_end = boundaries
        crashpoint("persist-before-commit")
        fields = self.vault.fields
        now = time.time()
        owned = self.vault.catalog.rows(
            "blocks", "owner_id = ?", [conv["id"]], order_by="generation desc"
        )
        retired = [r["id"] for r in owned if retire_head and r["id"] == conv["head_block_id"]]
        kept = [r["id"] for r in owned if r["id"] not in retired]
        retired += kept[self.settings.get("checkpoints") - 1 :]
        with self.vault.transaction():
            self.vault.catalog.insert("blocks", row)
            if replaced_messages:
                self.vault.catalog.delete(
                    "messages",
                    f"id IN ({','.join('?' * len(replaced_messages))})",
                    replaced_messages,
                )
            for offset, (role, message, tok_start, tok_end, block_id) in enumerate(
                (
                    ("user", text, user_start, reply_start, None),
                    ("model", reply, reply_start, reply_end, row["id"]),
                )
            ):
                message_id = new_id("m")
                self.vault.catalog.insert(
                    "messages",
                    {
                        "id": message_id,
                        "conversation_id": conv["id"],
                        "seq": seq + offset,
                        "role": role,
                        "text_enc": fields.encrypt_text(message, "messages", "text", message_id),
                        "tok_start": tok_start,
                        "tok_end": tok_end,
                        "block_id": block_id,
                        "created_at": now,
                    },
                )
            changes: dict[str, Any] = {
                "head_block_id": row["id"],
                "n_tokens": row["n_tokens"],
                "n_messages": seq + 2,
                "seal": self._seal("conversations", conv["id"], row["id"], seq + 2),
                "updated_at": now,
            }
            if seq == 0 and not self.conversation_title(conv):
                changes["title_enc"] = fields.encrypt_text(
                    " ".join(text.split())[:TITLE_CHARS], "conversations", "title", conv["id"]
                )
            self.vault.catalog.update("conversations", conv["id"], changes)
            if retired:
                self.vault.catalog.db.execute(
                    "UPDATE messages SET block_id = NULL WHERE block_id IN "
                    f"({','.join('?' * len(retired))})",
                    retired,
                )
            self.vault.delete_block_rows(retired)
        crashpoint("persist-after-commit")
        self.vault.unlink_block_files(retired)
        self._live = _Live(conv["id"], row["id"])

    # -- documents -----------------------------------------------------------------------
    def document_limit(self) -> int:
        return self.engine.n_ctx - ANSWER_RESERVE

    def deposit(
        self,
        path: Path,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
        name: str | None = None,
    ) -> DepositResult:
        """Read a document once, store its KV block, and return what it cost."""
        path = Path(path)
        text = extract_text_bounded(path, cancel=cancel)
        return self.deposit_text(name or path.name, text, path.stat().st_size, progress, cancel)

    def document_tokens(self, name: str, text: str) -> list[int]:
        """The document turn: the user hands over the document, the model acknowledges it, so
        the block ends at a turn boundary like every conversation checkpoint."""
        engine = self.engine
        turns = engine.turns
        return (
            engine.bos()
            + engine.encode_template(turns.user_open)
            + engine.encode_text(f'Document "{name}":\n\n{text}')
            + engine.encode_template(turns.user_close_model_open)
            + engine.encode_text(f'I have read "{name}". Ask me about it.')
            + engine.model_close()
        )

    def deposit_text(
        self,
        name: str,
        text: str,
        source_bytes: int | None = None,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> DepositResult:
        """Store a document given as text (the file was read already, or it was generated)."""
        if not text.strip():
            raise InputError(f"'{name}' contains no text.")
        limit = self.document_limit()
        if len(text) > limit * 40:  # no tokenizer packs 40 characters into one token
            raise InputError(
                f"'{name}' has {len(text):,} characters, far more than the {limit:,} tokens "
                "one document may hold; nothing was stored."
            )
        engine = self.engine
        tokens = self.document_tokens(name, text)
        limit = self.document_limit()
        if len(tokens) > limit:
            raise InputError(
                f"'{name}' is {len(tokens):,} tokens; one document may hold at most "
                f"{limit:,} tokens with the {engine.n_ctx:,}-token context (documents longer "
                "than the context are not supported yet). Nothing was stored."
            )
        document_id = new_id("d")
        engine.reset()
        self._live = None
        prefill_ms = engine.evaluate(tokens, progress=progress, cancel=cancel)
        persist_start = time.perf_counter()
        row, _record = self._persist_state("document", document_id, None, 1)
        crashpoint("deposit-before-commit")
        fields = self.vault.fields
        with self.vault.transaction():
            self.vault.catalog.insert("blocks", row)
            self.vault.catalog.insert(
                "documents",
                {
                    "id": document_id,
                    "name_enc": fields.encrypt_text(name, "documents", "name", document_id),
                    "text_enc": fields.encrypt_text(text, "documents", "text", document_id),
                    "block_id": row["id"],
                    "seal": self._seal("documents", document_id, row["id"], 0),
                    "n_tokens": len(tokens),
                    "source_bytes": source_bytes
                    if source_bytes is not None
                    else len(text.encode("utf-8")),
                    "created_at": time.time(),
                },
            )
        self._live = _Live(document_id, row["id"])
        return DepositResult(
            document_id,
            name,
            len(tokens),
            prefill_ms,
            row["capture_ms"],
            (time.perf_counter() - persist_start) * 1e3,
            row["file_bytes"],
            row["id"],
        )

    # -- verification, audit, forgetting -------------------------------------------------
    def verify_block(self, block_id: str) -> dict[str, Any]:
        """Re-run the graft proof of one block in this engine; report, change nothing."""
        engine = self.engine
        row = self.vault.block_row(block_id)
        out: dict[str, Any] = {
            "block_id": block_id,
            "owner_id": row["owner_id"],
            "kind": row["kind"],
            "tokens": row["n_tokens"],
            "fingerprint": row["fingerprint"],
            "fingerprint_matches": row["fingerprint"] == engine.fingerprint,
        }
        if not out["fingerprint_matches"]:
            out.update(proof="skipped", reason="captured under another model or runtime")
            return out
        stored = self.vault.read_block(block_id)
        self._live = None
        restore_ms = stored.read_ms + engine.restore(stored.payload, stored.tokens, stored.size)
        del stored.payload
        record = proofs.ProofRecord.from_dict(stored.meta["proof"])
        start = time.perf_counter()
        engine.evaluate(record.probe_tokens)
        result = proofs.compare(record, engine.last_logits(), (time.perf_counter() - start) * 1e3)
        self._live = _Live(row["owner_id"], block_id)
        out.update(
            proof=result.verdict,
            restore_ms=restore_ms,
            proof_ms=result.proof_ms,
            max_abs_delta=result.max_abs_delta,
            kl=result.kl,
            argmax_agree=result.argmax_agree,
        )
        return out

    def verify(self, item_id: str | None = None) -> list[dict[str, Any]]:
        if item_id is None:
            block_ids = [r["id"] for r in self.vault.catalog.rows("blocks", order_by="created_at")]
        else:
            kind = self.kind_of(item_id)
            if kind == "conversation":
                head = self._conversation_row(item_id)["head_block_id"]
                if not head:
                    raise InputError(f"Conversation {item_id} has no stored turn yet.")
                block_ids = [head]
            elif kind == "document":
                block_ids = [self._document_row(item_id)["block_id"]]
            else:
                block_ids = [item_id]
        return [self.verify_block(b) for b in block_ids]

    def forget(self, item_id: str) -> dict[str, Any]:
        """Delete a conversation or a document with its blocks and their keys.

        Forgetting a document also forgets the conversations built on it: their blocks hold
        the document's content too.
        """
        kind = self.kind_of(item_id)
        if kind == "block":
            raise InputError("Forget a conversation or a document, not a single block.")
        conversations = (
            [item_id]
            if kind == "conversation"
            else [
                r["id"]
                for r in self.vault.catalog.rows("conversations", "document_id = ?", [item_id])
            ]
        )
        owners = [*conversations, *([item_id] if kind == "document" else [])]
        marks = ",".join("?" * len(owners))
        block_ids = [
            r["id"] for r in self.vault.catalog.rows("blocks", f"owner_id IN ({marks})", owners)
        ]
        with self.vault.transaction():
            if conversations:
                cmarks = ",".join("?" * len(conversations))
                self.vault.catalog.delete(
                    "messages", f"conversation_id IN ({cmarks})", conversations
                )
                self.vault.catalog.delete("conversations", f"id IN ({cmarks})", conversations)
            if kind == "document":
                self.vault.catalog.delete("documents", "id = ?", [item_id])
            self.vault.delete_block_rows(block_ids)
        self.vault.unlink_block_files(block_ids)
        self.vault.catalog.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if self._live and self._live.owner_id in owners:
            self._live = None
            self.engine.reset()
        return {
            "forgotten": item_id,
            "kind": kind,
            "conversations": conversations,
            "blocks": len(block_ids),
        }

    def memory_stats(self) -> dict[str, Any]:
        rows = self.vault.catalog.rows("blocks")
        return {
            "blocks": len(rows),
            "bytes": sum(r["file_bytes"] for r in rows),
            "tokens_stored": sum(r["n_tokens"] for r in rows),
            "restored_tokens_session": self.stats.restored_tokens,
            "recomputed_tokens_session": self.stats.recomputed_tokens,
        }
