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
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from galahad_desktop.engine import kvstate
from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.engine import Counters, Engine, EngineConfig, Progress, ProgressFn
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.errors import InputError, IntegrityError, NotFoundError
from galahad_desktop.faults import crashpoint
from galahad_desktop.memory.documents import extract_text_bounded, overlap_tail, split_for_parts
from galahad_desktop.memory.router import PartIndex, RouteDecision, decide
from galahad_desktop.paths import default_model_path
from galahad_desktop.settings import SYSTEM_PROMPTS, Settings, coerce
from galahad_desktop.vault import crypto
from galahad_desktop.vault.keys import KeyStore, open_keystore
from galahad_desktop.vault.vault import Vault, new_id, tokens_digest

# Room kept free after a document for a question and its answer.
log = logging.getLogger(__name__)
ANSWER_RESERVE = 512
MAX_DOCUMENT_CHARS = 40_000_000
DOCUMENT_ACK = 'I have read "{name}". Ask me about it.'
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
    n_parts: int = 1

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
    n_parts: int = 1


@dataclass
class AskResult:
    """A routed question: the decision, and the answer when the gate let it through."""

    question: str
    decision: RouteDecision
    answered: bool
    text: str = ""
    citation: str = ""
    part_id: str = ""
    document_id: str = ""
    graft: GraftReport | None = None
    counters: Counters | None = None
    stop_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answered": self.answered,
            "answer": self.text,
            "citation": self.citation,
            "part_id": self.part_id,
            "document_id": self.document_id,
            "routing": self.decision.as_dict(),
            "graft": self.graft.as_dict() if self.graft else None,
            "counters": self.counters.as_dict() if self.counters else None,
            "stop_reason": self.stop_reason,
        }


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
        self._index: PartIndex | None = None
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
        self._drop_index()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self.vault.close()

    def lock(self) -> None:
        """Drop keys and decrypted state from memory until unlock()."""
        self._live = None
        self._drop_index()
        if self._engine is not None:
            self._engine.reset()
        self.vault.lock()

    def unlock(self) -> None:
        self.vault.unlock()

    def _drop_index(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

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
                    r.get("n_parts") or 1,
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

        With a parent (the block the context was grafted from), the block holds only the
        cells at positions after the parent's end: a link of a chain, O(new tokens) on disk.
        Returns the catalog row (the caller inserts it in its transaction) and the proof.
        """
        engine = self.engine
        ledger = list(engine.tokens)
        parent_end = self.vault.block_row(parent_id)["pos_end"] if parent_id else 0
        link = None
        if (
            parent_id
            and 0 < parent_end < len(ledger)
            and self.settings.get("chain_blocks")
            and kvstate.chains_supported()
        ):
            link = self._capture_link(parent_end, len(ledger))
        if link is not None:
            block, layout, capture_ms = (link[0], link[1]), link[2], link[3]
            start = parent_end
        else:
            payload, used, capture_ms = engine.capture()
            # Continue from exactly what a resume will rebuild: the live context can hold
            # more than the per-sequence state carries (with swa_full every sliding-window
            # cell stays live, the state keeps only the window), which made some later
            # grafts only `close`. Re-grafting the captured state in place makes this
            # conversation's own continuation and every future resume compute from the
            # same cells.
            capture_ms += engine.restore(payload, ledger, used)
            block, layout, start = (payload, used), None, 0
            if kvstate.chains_supported():
                try:
                    layout = kvstate.parse(payload, used).layout()
                except kvstate.KVLayoutError as exc:
                    log.warning("a state this version cannot splice: %s", exc)
        engine.evaluate(engine.probe_tokens)  # the next turn's opening: needed anyway
        if counters is not None:
            counters.new_tokens += len(engine.probe_tokens)
        record = proofs.make_record(engine.probe_tokens, engine.last_logits())
        own_tokens = ledger[start:]
        row = self.vault.write_block(
            kind=kind,
            owner_id=owner_id,
            parent_id=parent_id if start else None,
            tokens=own_tokens,
            generation=generation,
            fingerprint=engine.fingerprint,
            payload=memoryview(block[0]).cast("B")[: block[1]],
            sealed_meta={
                "tokens_sha256": tokens_digest(own_tokens),
                "ledger_sha256": tokens_digest(ledger),
                "layout": layout,
                "proof": record.as_dict(),
                "state_format": "llama_state_seq/llama-cpp-python-0.3.36",
            },
            capture_ms=capture_ms,
            pos_start=start,
        )
        del block
        return row, record

    def _capture_link(
        self, start: int, end: int
    ) -> tuple[Any, int, list[kvstate.Ranges], float] | None:
        """The cells after `start` and the whole state's layout, without serializing the
        whole state: O(new tokens + the sliding window). None when the layout is not one
        this version knows how to splice (the caller then stores a whole state)."""
        engine = self.engine
        try:
            buffer, used, capture_ms = engine.capture_from(start)
            link = kvstate.parse(buffer, used)
            window_buffer, window_used, window_ms = engine.regraft_window()
            window = kvstate.parse(window_buffer, window_used)
            if len(window.sections) == len(link.sections):
                layout = window.layout()  # no separate window cache: that was the whole state
            elif (
                len(link.sections) == 2
                and len(window.sections) == 1
                and link.layout()[0] == [(start, end)]
            ):
                layout = [[(0, end)], window.layout()[0]]  # full attention, sliding window
            else:
                raise kvstate.KVLayoutError("the cache sections are not the expected ones")
            del link, window, window_buffer
            return buffer, used, layout, capture_ms + window_ms
        except kvstate.KVLayoutError as exc:
            log.warning("storing a whole state, not a chain link: %s", exc)
            return None

    def _chain_owners(self, owner_id: str) -> set[str]:
        """Who may own the links of an owner's chains: itself and, for a conversation on a
        document, that document (its block is the chain's root)."""
        owners = {owner_id}
        conv = self.vault.catalog.get("conversations", owner_id)
        if conv is not None and conv["document_id"]:
            owners.add(conv["document_id"])
        return owners

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
        chain = self.vault.chain_rows(block_id)
        if any(link["fingerprint"] != engine.fingerprint for link in chain):
            return self._reprefill(
                row, "the model or its runtime settings changed", counters, progress
            )
        stored = self.vault.read_chain(block_id, self._chain_owners(owner_id))
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
        tokens = self.vault.chain_tokens(row["id"])
        engine.reset()
        self._live = None
        prefill_ms = engine.evaluate(tokens, progress=progress)
        new_row, record = self._persist_state(
            row["kind"], row["owner_id"], None, row["generation"] + 1
        )
        # A block other links continue from stays: their token ledgers run through it.
        keep_old = bool(self.vault.children(row["id"]))
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
            if not keep_old:
                self.vault.delete_block_rows([row["id"]])
        if not keep_old:
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
        if rows[-2]["role"] != "user":
            raise InputError("The last turn added a document; there is no reply to regenerate.")
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
        prefix = self.vault.chain_tokens(conv["head_block_id"])[: rows[seq]["tok_start"]]
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
            "conversation",
            conv["id"],
            self._live_parent(conv, parent_block),
            generation_no,
            counters,
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

    def _live_parent(self, conv: dict[str, Any], grafted: str | None) -> str | None:
        """The block this turn continues (its chain parent): what the context was grafted
        from, when it belongs to this conversation or its document. A branch starts a new
        chain, so forgetting the original never breaks it."""
        live = self._live
        if live is None or live.block_id is None:
            return None
        if grafted is not None and live.block_id != grafted:
            return None
        if live.owner_id not in (conv["id"], conv["document_id"]):
            return None
        return live.block_id

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
        roles: tuple[str, str] = ("user", "model"),
    ) -> None:
        """One transaction: the turn's block row, its two messages, the sealed new head (and,
        for a regenerated reply, the replaced head when nothing continues from it)."""
        user_start, reply_start, reply_end = boundaries
        crashpoint("persist-before-commit")
        fields = self.vault.fields
        now = time.time()
        old_head = conv["head_block_id"]
        retired = (
            [old_head]
            if retire_head
            and old_head
            and old_head != row["parent_id"]
            and not self.vault.children(old_head)
            else []
        )
        if not self.settings.get("chain_blocks"):
            # Whole-state turns: keep the newest `checkpoints` of them.
            owned = self.vault.catalog.rows(
                "blocks", "owner_id = ?", [conv["id"]], order_by="generation desc"
            )
            kept = [r["id"] for r in owned if r["id"] not in retired]
            retired += [
                b
                for b in kept[self.settings.get("checkpoints") - 1 :]
                if not self.vault.children(b)
            ]
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
                    (roles[0], text, user_start, reply_start, None),
                    (roles[1], reply, reply_start, reply_end, row["id"]),
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
                "n_tokens": row["pos_end"],
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

    # -- chains ----------------------------------------------------------------------------
    def chain_links(self, conversation_id: str) -> int:
        """How many of the conversation's own blocks its head's chain runs through."""
        head = self._conversation_row(conversation_id)["head_block_id"]
        if not head:
            return 0
        return sum(r["owner_id"] == conversation_id for r in self.vault.chain_rows(head))

    def needs_compaction(self, conversation_id: str) -> bool:
        return bool(self.chain_links(conversation_id) > self.settings.get("compact_after"))

    def compact(self, conversation_id: str, keep: int | None = None) -> dict[str, Any]:
        """Merge the older links of a conversation's chain into one block.

        The spliced state of every kept checkpoint is unchanged, byte for byte: the merged
        block holds exactly the cells its links held at its end, and the first kept link is
        rewritten (same id, new file) to continue from it. The newest `keep` turn boundaries
        stay separate checkpoints; the merged-away ones are re-read if ever rewound to.
        """
        conv = self._conversation_row(conversation_id)
        self._check_seal("conversations", conv, "head_block_id")
        keep = self.settings.get("checkpoints") if keep is None else keep
        if keep < 1:
            raise InputError("Compaction must keep at least one link.")
        head = conv["head_block_id"]
        chain = self.vault.chain_rows(head) if head else []
        own = [r for r in chain if r["owner_id"] == conversation_id]
        result: dict[str, Any] = {"conversation": conversation_id, "links_before": len(own)}
        if len(own) <= keep + 1:
            return {**result, "merged": 0, "links_after": len(own)}
        merge, successor = own[: len(own) - keep], own[len(own) - keep]
        for row in merge:
            if len(self.vault.children(row["id"])) != 1:
                return {
                    **result,
                    "merged": 0,
                    "links_after": len(own),
                    "skipped": f"block {row['id']} has other continuations",
                }
        last, base = merge[-1], merge[0]["parent_id"]
        start = time.perf_counter()
        owners = self._chain_owners(conversation_id)
        stored = self.vault.read_chain(last["id"], owners)
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
            payload=link.state,
            sealed_meta=link.meta,
            capture_ms=successor["capture_ms"],
            pos_start=successor["pos_start"],
            rewrite_of=successor["id"],
        )
        del link
        crashpoint("compact-before-commit")
        gone = [r["id"] for r in merge]
        marks = ",".join("?" * len(gone))
        with self.vault.transaction():
            self.vault.catalog.insert("blocks", merged)
            self.vault.catalog.update(
                "blocks",
                successor["id"],
                {
                    k: rewritten[k]
                    for k in (
                        "parent_id",
                        "file_name",
                        "file_bytes",
                        "header_sha256",
                        "wrapped_key",
                    )
                },
            )
            db = self.vault.catalog.db
            db.execute(
                "UPDATE messages SET block_id = ? WHERE block_id = ?", [merged["id"], last["id"]]
            )
            db.execute(f"UPDATE messages SET block_id = NULL WHERE block_id IN ({marks})", gone)
            self.vault.delete_block_rows(gone)
        self.vault.unlink_block_files([*gone, successor["id"]], keep={rewritten["file_name"]})
        if self._live and self._live.owner_id == conversation_id and self._live.block_id in gone:
            self._live = None
        return {
            **result,
            "merged": len(merge),
            "links_after": len(own) - len(merge) + 1,
            "merged_block": merged["id"],
            "merged_bytes": merged["file_bytes"],
            "freed_bytes": sum(r["file_bytes"] for r in merge) - merged["file_bytes"],
            "ms": (time.perf_counter() - start) * 1e3,
        }

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

    def _document_turn(self, content: str, ack: str, opening: bool = True) -> list[int]:
        """The user hands over a document, the model acknowledges it: the block ends at a turn
        boundary like every conversation checkpoint. Without `opening`, the turn continues a
        context that already holds the user-turn opening (a document added mid-chat)."""
        engine = self.engine
        turns = engine.turns
        start = engine.bos() + engine.encode_template(turns.user_open) if opening else []
        return (
            start
            + engine.encode_text(content)
            + engine.encode_template(turns.user_close_model_open)
            + engine.encode_text(ack)
            + engine.model_close()
        )

    def document_tokens(self, name: str, text: str) -> list[int]:
        return self._document_turn(f'Document "{name}":\n\n{text}', DOCUMENT_ACK.format(name=name))

    def part_tokens(
        self, name: str, part_no: int, n_parts: int, overlap: str, text: str
    ) -> list[int]:
        """One part of a long document as its own document turn, under a short header (title,
        part i of n, and the end of the previous part) so the model knows where it is."""
        if n_parts == 1:
            return self.document_tokens(name, text)
        lead = f"(continued from part {part_no - 1}) …{overlap}\n\n" if overlap else ""
        return self._document_turn(
            f'Document "{name}", part {part_no} of {n_parts}:\n\n{lead}{text}',
            f'I have read part {part_no} of {n_parts} of "{name}".',
        )

    def part_budget(self) -> int:
        """Tokens per part: the setting, or what fits with room for a question and answer."""
        limit = self.document_limit()
        configured = self.settings.get("part_tokens")
        return min(configured, limit) if configured else limit

    def plan_parts(self, name: str, text: str) -> list[tuple[str, list[int], str]]:
        """(own text, tokens, overlap) for every part; one part when the document fits."""
        tokens = self.document_tokens(name, text)
        budget = self.part_budget()
        if len(tokens) <= budget:
            return [(text, tokens, "")]
        engine = self.engine
        overlap_tokens = self.settings.get("part_overlap")
        overhead = len(self.part_tokens(name, 999, 999, "x", "")) + overlap_tokens + 16
        room = budget - overhead
        for attempt in range(4):
            pieces = split_for_parts(text, room, lambda piece: len(engine.encode_text(piece)))
            planned = []
            for index, piece in enumerate(pieces):
                overlap = overlap_tail(pieces[index - 1], overlap_tokens) if index else ""
                planned.append(
                    (piece, self.part_tokens(name, index + 1, len(pieces), overlap, piece), overlap)
                )
            if all(len(p[1]) <= budget for p in planned):
                return planned
            room = int(room * 0.9)  # token counts of pieces do not add up exactly: retry
            log.info("document parts ran over the budget; retrying (attempt %d)", attempt + 1)
        raise InputError(f"'{name}' could not be cut into parts of {budget:,} tokens.")

    def deposit_text(
        self,
        name: str,
        text: str,
        source_bytes: int | None = None,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> DepositResult:
        """Store a document given as text (the file was read already, or it was generated).

        A document longer than the context is cut into parts, each prefilled at its own
        positions under a short header and stored as its own block. Every part is durable
        when written; the document exists (in one transaction) once all parts are.
        """
        if not text.strip():
            raise InputError(f"'{name}' contains no text.")
        if len(text) > MAX_DOCUMENT_CHARS:
            raise InputError(
                f"'{name}' has {len(text):,} characters; at most {MAX_DOCUMENT_CHARS:,} are "
                "accepted in one document. Nothing was stored."
            )
        engine = self.engine
        plan = self.plan_parts(name, text)
        total = sum(len(tokens) for _piece, tokens, _overlap in plan)
        document_id = new_id("d")
        self._live = None
        prefill_ms = capture_ms = 0.0
        persist_start = time.perf_counter()
        persist_ms = 0.0
        rows: list[dict[str, Any]] = []
        done = 0
        try:
            for _index, (_piece, tokens, _overlap) in enumerate(plan):
                engine.reset()
                offset = done

                def report(p: Progress, offset: int = offset) -> None:
                    if progress is not None:
                        progress(
                            Progress(offset + p.done, total, time.perf_counter() - persist_start)
                        )

                prefill_ms += engine.evaluate(tokens, progress=report, cancel=cancel)
                step = time.perf_counter()
                row, _record = self._persist_state("document", document_id, None, 1)
                persist_ms += (time.perf_counter() - step) * 1e3
                capture_ms += row["capture_ms"]
                rows.append(row)
                done += len(tokens)
            crashpoint("deposit-before-commit")
            fields = self.vault.fields
            now = time.time()
            with self.vault.transaction():
                for row in rows:
                    self.vault.catalog.insert("blocks", row)
                for index, (row, (piece, tokens, _overlap)) in enumerate(
                    zip(rows, plan, strict=True)
                ):
                    part_id = new_id("p")
                    self.vault.catalog.insert(
                        "parts",
                        {
                            "id": part_id,
                            "document_id": document_id,
                            "part_no": index + 1,
                            "n_parts": len(plan),
                            "block_id": row["id"],
                            "text_enc": fields.encrypt_text(piece, "parts", "text", part_id),
                            "seal": self._seal("parts", part_id, row["id"], 0),
                            "n_tokens": len(tokens),
                            "created_at": now,
                        },
                    )
                    if self._index is not None:
                        self._index.add([(part_id, document_id, index + 1, len(plan), piece)])
                self.vault.catalog.insert(
                    "documents",
                    {
                        "id": document_id,
                        "name_enc": fields.encrypt_text(name, "documents", "name", document_id),
                        "text_enc": fields.encrypt_text(text, "documents", "text", document_id),
                        "block_id": rows[0]["id"],
                        "seal": self._seal("documents", document_id, rows[0]["id"], 0),
                        "n_tokens": total,
                        "n_parts": len(plan),
                        "source_bytes": source_bytes
                        if source_bytes is not None
                        else len(text.encode("utf-8")),
                        "created_at": now,
                    },
                )
        except BaseException:
            self._index = None  # rebuilt from the catalog on the next question
            self.vault.unlink_block_files([row["id"] for row in rows])
            raise
        if len(plan) == 1:
            self._live = _Live(document_id, rows[0]["id"])
        return DepositResult(
            document_id,
            name,
            total,
            prefill_ms,
            capture_ms,
            persist_ms,
            sum(row["file_bytes"] for row in rows),
            rows[0]["id"],
            len(plan),
        )

    # -- routing -------------------------------------------------------------------------
    def _part_rows(self, document_id: str | None = None) -> list[dict[str, Any]]:
        where, args = ("document_id = ?", [document_id]) if document_id else (None, [])
        return self.vault.catalog.rows("parts", where, args, order_by="document_id, part_no")

    def parts(self, document_id: str) -> list[dict[str, Any]]:
        self._document_row(document_id)
        return [
            {k: r[k] for k in ("id", "part_no", "n_parts", "block_id", "n_tokens")}
            for r in self._part_rows(document_id)
        ]

    def part_text(self, part_id: str) -> str:
        part = self.vault.catalog.get("parts", part_id)
        if part is None:
            raise NotFoundError(f"No document part has the id '{part_id}'.")
        return self.vault.fields.decrypt_text(part["text_enc"], "parts", "text", part_id)

    def part_index(self) -> PartIndex:
        """The router's index, built in memory from the decrypted parts (never on disk)."""
        if self._index is None:
            index = PartIndex()
            fields = self.vault.fields
            index.add(
                (
                    r["id"],
                    r["document_id"],
                    r["part_no"],
                    r["n_parts"],
                    fields.decrypt_text(r["text_enc"], "parts", "text", r["id"]),
                )
                for r in self._part_rows()
            )
            self._index = index
        return self._index

    def route(self, question: str, document_id: str | None = None) -> RouteDecision:
        """Score every part (of one document, or of the whole library) and apply the gate.
        The decision (scores and margin, not the question) goes to the routing log."""
        if document_id is not None:
            self._document_row(document_id)
        index = self.part_index()
        terms, candidates = index.search(question, document_id)
        decision = decide(
            terms,
            candidates,
            self.settings.get("route_min_strength"),
            self.settings.get("route_min_margin"),
            document_id or "library",
        )
        self._log_route(decision, "answered" if decision.confident else "gated", None)
        return decision

    def _log_route(self, decision: RouteDecision, outcome: str, part_id: str | None) -> None:
        with self.vault.transaction():
            self.vault.catalog.insert(
                "routing_log",
                {
                    "id": new_id("r"),
                    "at": time.time(),
                    "scope": decision.scope,
                    "candidates": json.dumps(
                        [[c.part_id, round(c.score, 4)] for c in decision.candidates]
                    ),
                    "best_score": decision.best_score,
                    "margin": decision.margin if decision.margin != float("inf") else -1.0,
                    "decision": outcome,
                    "part_id": part_id or (decision.best.part_id if decision.best else None),
                },
            )

    def routing_log(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self.vault.catalog.rows("routing_log", order_by="at desc")[:limit]
        return [{**r, "candidates": json.loads(r["candidates"])} for r in rows]

    def citation(self, part_id: str) -> str:
        part = self.vault.catalog.get("parts", part_id)
        if part is None:
            raise NotFoundError(f"No document part has the id '{part_id}'.")
        name = self.document_name(self._document_row(part["document_id"]))
        return f"{name}, part {part['part_no']} of {part['n_parts']}"

    def ask(
        self,
        question: str,
        document_id: str | None = None,
        part_id: str | None = None,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        params: SamplingParams | None = None,
        progress: ProgressFn | None = None,
    ) -> AskResult:
        """Answer a question from the stored part the router picks (or `part_id`, the user's
        choice among the candidates). A weak or ambiguous match is not answered: the result
        carries the candidates instead. Nothing is stored but the routing log."""
        if not question.strip():
            raise InputError("The question is empty.")
        decision = self.route(question, document_id)
        if part_id is None:
            if not decision.confident or decision.best is None:
                return AskResult(question, decision, False)
            part_id = decision.best.part_id
        else:
            self._log_route(decision, "chosen", part_id)
        part = self.vault.catalog.get("parts", part_id)
        if part is None:
            raise NotFoundError(f"No document part has the id '{part_id}'.")
        if document_id is not None and part["document_id"] != document_id:
            raise InputError(f"Part {part_id} is not a part of document {document_id}.")
        self._check_seal("parts", part, "block_id")
        counters = Counters()
        live = self._live
        graft = None
        if not (
            live and live.owner_id == part["document_id"] and live.block_id == part["block_id"]
        ):
            graft = self._graft(part["block_id"], part["document_id"], counters, progress)
        engine = self.engine
        question_tokens = engine.encode_text(question) + engine.encode_template(
            engine.turns.user_close_model_open
        )
        if len(question_tokens) + 64 > engine.room():
            raise InputError("The question is too long for the room left after the document.")
        self._live = None  # the context now holds this one-off question
        counters.prefill_ms += engine.evaluate(question_tokens)
        counters.new_tokens += len(question_tokens)
        generation = engine.generate(params or self.sampling(), on_text, cancel)
        counters.generated_tokens += len(generation.tokens)
        counters.generate_ms += generation.elapsed_ms
        return AskResult(
            question,
            decision,
            True,
            generation.text,
            self.citation(part_id),
            part_id,
            part["document_id"],
            graft,
            counters,
            generation.stop_reason,
        )

    # -- stacked documents ---------------------------------------------------------------
    def add_document_file(
        self,
        conversation_id: str,
        path: Path,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> TurnResult:
        """add_document for a file: its text is extracted in a limited child process."""
        path = Path(path)
        text = extract_text_bounded(path, cancel=cancel)
        return self.add_document(conversation_id, path.name, text, progress, cancel)

    def add_document(
        self,
        conversation_id: str,
        name: str,
        text: str,
        progress: ProgressFn | None = None,
        cancel: threading.Event | None = None,
    ) -> TurnResult:
        """Put a document into an ongoing conversation: graft what it holds, prefill only the
        new document on top, and store that as the chain's next link (earlier documents
        and turns are never re-read)."""
        if not text.strip():
            raise InputError(f"'{name}' contains no text.")
        conv = self._conversation_row(conversation_id)
        counters = Counters()
        graft = self._ensure_live(conv, counters, progress)
        engine = self.engine
        ack = DOCUMENT_ACK.format(name=name)
        tokens = self._document_turn(f'Document "{name}":\n\n{text}', ack, opening=False)
        if len(tokens) + 64 > engine.room():
            raise InputError(
                f"'{name}' is {len(tokens):,} tokens; this conversation has room for "
                f"{max(0, engine.room() - 64):,} more. Ask the library instead, or start a new "
                "conversation. Nothing was stored."
            )
        user_start = len(engine.tokens) - len(engine.probe_tokens)
        counters.prefill_ms += engine.evaluate(tokens, progress=progress, cancel=cancel)
        counters.new_tokens += len(tokens)
        reply_end = len(engine.tokens)
        persist_start = time.perf_counter()
        seq = conv["n_messages"] or 0
        row, _record = self._persist_state(
            "conversation",
            conv["id"],
            self._live_parent(conv, conv["head_block_id"] or None),
            self._next_generation(conv["id"]),
            counters,
        )
        self._commit_turn(
            conv,
            row,
            seq,
            name,
            ack,
            (user_start, reply_end, reply_end),
            [],
            roles=("document", "model"),
        )
        counters.persist_ms += (time.perf_counter() - persist_start) * 1e3
        return TurnResult(
            conv["id"],
            ack,
            "document",
            counters,
            graft.proof if graft else proofs.NO_PROOF,
            graft,
            len(engine.tokens),
            0.0,
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
            "tokens": row["pos_end"],
            "links": len(self.vault.chain_rows(block_id)),
            "fingerprint": row["fingerprint"],
            "fingerprint_matches": row["fingerprint"] == engine.fingerprint,
        }
        if not out["fingerprint_matches"]:
            out.update(proof="skipped", reason="captured under another model or runtime")
            return out
        stored = self.vault.read_chain(block_id, self._chain_owners(row["owner_id"]))
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
                self.vault.catalog.delete("parts", "document_id = ?", [item_id])
            self.vault.delete_block_rows(block_ids)
        self.vault.unlink_block_files(block_ids)
        self.vault.catalog.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if kind == "document" and self._index is not None:
            self._index.remove_document(item_id)
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
