"""The live context: what the engine holds, and the three things done to it — graft a stored
block, persist a checkpoint, prove a restore.

What the context holds is always a prefix of some stored ledger plus the opening tokens of
the next user turn (the proof probe). Each checkpoint is captured at a turn boundary;
grafting a block restores exactly that boundary, evaluates the probe (the next turn needs
those tokens anyway) and compares the logits with those recorded at capture.

A block is used only when its runtime fingerprint matches and its proof is not `diverged`;
otherwise its ledger is re-read (re-prefilled) with progress, stored again, and the report
says why. A block that fails authentication is refused with an IntegrityError and never
reaches llama.cpp.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from galahad_desktop.engine import kvstate
from galahad_desktop.engine import proof as proofs
from galahad_desktop.engine.device_guard import lost_servers
from galahad_desktop.engine.picture import LedgerRead, Media, cannot_hear, holds_pictures
from galahad_desktop.engine.protocol import ChatEngine, StateBuffer
from galahad_desktop.engine.values import Counters
from galahad_desktop.errors import DeviceLostError, InputError, IntegrityError, ModelError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.results import GraftReport
from galahad_desktop.settings import Settings

if TYPE_CHECKING:  # llama.cpp is imported when a model opens, not with this module
    from galahad_desktop.engine.vision import Vision
from galahad_desktop.vault.names import BlockKind, BlockRow, Table, given_back
from galahad_desktop.vault.vault import StoredBlock, Vault, tokens_digest

log = logging.getLogger(__name__)

STATE_FORMAT = "llama_state_seq/llama-cpp-python-0.3.36"
MODEL_CHANGED = "the model or its runtime settings changed"
OTHER_MODEL = "it was made with another model (re-read once from its text under this one)"
GIVEN_BACK = (
    "its memory was given back to stay within the disk budget (re-read once, then stored again)"
)


@dataclass
class Rendered:
    """A ledger rebuilt for the current model (its tokenizer and turn format), and what to
    change in the catalog once its block is stored (inside the same transaction): returns
    the ids of the owner's blocks made useless by the change, to delete."""

    tokens: list[int]
    apply: Callable[[BlockRow], list[str]] | None = None
    pictures: list[Media] = field(default_factory=list)  # the ledger's, in order


class LiveSources(Protocol):
    """What the live context asks of the rooms built on it (they know conversations and
    documents; it does not), supplied to its constructor by the façade."""

    def chain_owners(self, owner_id: str) -> set[str]:
        """Who may own the links of an owner's chains."""

    def ledger_for_model(self, row: BlockRow) -> Rendered | None:
        """A block's ledger rebuilt for the current model (None: its own still serves)."""

    def pictures_for(self, row: BlockRow) -> list[Media]:
        """The pictures and sounds a block's ledger holds, in ledger order (to re-read it)."""


def no_projector() -> InputError:
    return InputError(
        "This model reads no pictures: no vision projector (its mmproj GGUF) is set up for it.",
        command="galahad models get NAME --vision, or galahad settings projector=FILE",
        window="Choose its projector file under File → Settings… → Vision projector.",
    )


@dataclass(frozen=True)
class Holding:
    """The context holds `owner_id`'s ledger up to `block_id` (None: not stored yet)."""

    owner_id: str
    block_id: str | None


@dataclass
class Stats:
    """This session's totals, for the Memory view."""

    restored_tokens: int = 0
    recomputed_tokens: int = 0
    grafts: int = 0


class LiveContext:
    """One engine and what it holds. Not thread-safe: one worker thread owns it."""

    def __init__(
        self,
        vault: Vault,
        settings: Settings,
        engine_factory: Callable[[], ChatEngine],
        sources: LiveSources,
        vision_hash_cache: Path | None,
    ) -> None:
        self.vault = vault
        self.settings = settings
        self._engine_factory = engine_factory
        self._engine: ChatEngine | None = None
        self.holding: Holding | None = None
        self.stats = Stats()
        self.records = vault.records
        self.sources = sources
        self._vision: Vision | None = None
        self._vision_key: tuple[Any, ...] | None = None
        self.vision_hash_cache = vision_hash_cache  # where projector files' hashes are kept
        # Called before a block of N bytes is written for an owner (the disk budget makes
        # room: memory/storage.py); set by the façade.
        self.room_for: Callable[[int, str], object] | None = None
        # Called before a document's parts (their tokens) are read: refuses what won't fit.
        self.fits: Callable[[str, list[int]], None] | None = None

    # -- the engine ----------------------------------------------------------------------
    @property
    def engine(self) -> ChatEngine:
        if self._engine is not None and lost_servers() & set(self._engine.config.rpc_servers):
            # Its calls can never finish. Never swapped silently in the middle of a step
            # (that would go on with an empty context): the step fails, and the next use
            # loads the engine again without the server (memory/model_files.py).
            servers = ", ".join(self._engine.config.rpc_servers)
            self.close()
            raise DeviceLostError(
                f"The device server at {servers} went away: the model runs without it for "
                "the rest of this session (restart Galahad to use it again)."
            )
        if self._engine is None:
            self._engine = self._engine_factory()
        return self._engine

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    def reload(self) -> None:
        """Drop the engine so the next use loads it with the current settings."""
        self.close()

    def close(self) -> None:
        self._close_vision()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self.holding = None

    # -- pictures --------------------------------------------------------------------------
    def projector_path(self) -> Path | None:
        """The projector set up for the model: the setting, else the one mmproj GGUF next
        to the model file (the model catalog downloads it there)."""
        configured = self.settings.values.projector
        if configured:
            return Path(configured)
        from galahad_desktop.engine.engine import Engine  # loaded with the engine itself

        engine = self.engine
        if not isinstance(engine, Engine) or engine.config.embedded:
            return None
        found = sorted(engine.config.model_path.parent.glob("mmproj*.gguf"))
        return found[0] if len(found) == 1 else None

    def vision(self) -> Vision:
        """The projector loaded for this engine (InputError when there is none)."""
        from galahad_desktop.engine.engine import Engine
        from galahad_desktop.engine.vision import Vision

        engine = self.engine
        path = self.projector_path()
        if path is None or not isinstance(engine, Engine):
            raise no_projector()
        key = (
            id(engine),
            str(path),
            self.settings.values.image_min_tokens,
            self.settings.values.image_max_tokens,
        )
        if self._vision is None or self._vision_key != key:
            self._close_vision()
            self._vision = Vision(engine, path, key[2], key[3], self.vision_hash_cache)
            self._vision_key = key
        return self._vision

    def hearing(self) -> Vision:
        """The projector loaded for this engine, if it hears (InputError when it cannot)."""
        try:
            vision = self.vision()
        except InputError:
            raise cannot_hear() from None
        if not vision.hears:
            raise cannot_hear()
        return vision

    def vision_fingerprint(self) -> str | None:
        """The fingerprint blocks holding pictures are stored under now (None: no projector
        can be loaded, so such a block cannot be used as it is)."""
        try:
            return self.vision().fingerprint
        except (InputError, ModelError):
            return None

    def current(self, link: BlockRow) -> bool:
        """Whether a link was captured under this runtime (its pictures' too) and is still
        on disk (not given back to the disk budget)."""
        if given_back(link):
            return False
        fingerprint = link["fingerprint"]
        if fingerprint == self.engine.fingerprint:
            return True
        return fingerprint == self.vision_fingerprint()

    def _close_vision(self) -> None:
        if self._vision is not None:
            self._vision.close()
        self._vision = None
        self._vision_key = None

    def evaluate_ledger(
        self,
        tokens: list[int],
        pictures: list[Media] | dict[int, Media],
        job: Job = NO_JOB,
    ) -> LedgerRead:
        """Evaluate a ledger after what the context holds; its pictures read from
        `pictures` (a list in ledger order, or by their index in the ledger)."""
        if not holds_pictures(tokens):
            return LedgerRead(self.engine.evaluate(tokens, job))
        by_index = pictures if isinstance(pictures, dict) else dict(enumerate(pictures))
        return self.vision().evaluate(tokens, by_index, job)

    def clear(self, wipe: bool = True) -> None:
        """Forget what the context holds (lock wipes the KV buffers too, and frees the
        projector, whose buffers hold the last picture's embeddings)."""
        self.holding = None
        if wipe:
            self._close_vision()
        if self._engine is not None:
            self._engine.reset(wipe)

    # -- what the context holds -----------------------------------------------------------
    def holds(self, owner_id: str, block_id: str | None) -> bool:
        h = self.holding
        return h is not None and h.owner_id == owner_id and h.block_id == block_id

    def mark(self, owner_id: str, block_id: str | None) -> None:
        self.holding = Holding(owner_id, block_id)
        # The disk budget gives back what was used longest ago: this is a use (one write, to
        # the table the id names: c-… conversations, d-… documents).
        tables: dict[str, Table] = {"c-": "conversations", "d-": "documents"}
        table = tables.get(owner_id[:2])
        if table is not None:
            self.vault.records.update_where(table, {"used_at": time.time()}, id=owner_id)

    def drop(self, owners: set[str] | None = None) -> None:
        """Stop relying on what the context holds (for `owners`, or whatever it is)."""
        if owners is None or (self.holding is not None and self.holding.owner_id in owners):
            self.holding = None

    def start(self, owner_id: str, tokens: list[int], counters: Counters) -> None:
        """A fresh context holding `tokens` (a new conversation's opening), not stored."""
        engine = self.engine
        engine.reset()
        counters.prefill_ms += engine.evaluate(tokens)
        counters.new_tokens += len(tokens)
        self.mark(owner_id, None)

    # -- reading stored state ------------------------------------------------------------
    def read_state(self, block_id: str, owners: set[str]) -> StoredBlock:
        """A block's state: its chain's links read, authenticated, and spliced (root
        first) into the state it was captured from."""
        start = time.perf_counter()
        links = self.vault.read_links(block_id, owners)
        if len(links) == 1:
            return links[0]
        head = links[-1]
        payload, size = kvstate.splice(
            [(link.payload, link.size) for link in links],
            head.meta.get("layout"),
            self.vault.splice_buffer,
        )
        self.vault.wipe(links[1:])
        tokens = [t for link in links for t in link.tokens]
        return StoredBlock(
            head.row, head.meta, payload, size, tokens, (time.perf_counter() - start) * 1e3
        )

    def prove(self, record: proofs.ProofRecord, mid_turn: bool = False) -> proofs.ProofResult:
        """Evaluate the probe on what was just restored and compare the logits. A block
        that ends inside a turn is proved without keeping the probe (the turn goes on
        with other words)."""
        engine = self.engine
        start = time.perf_counter()
        if mid_turn:
            engine.hold()
        engine.evaluate(record.probe_tokens)
        logits = engine.last_logits()
        if mid_turn:
            engine.return_to_hold()
        return proofs.compare(record, logits, (time.perf_counter() - start) * 1e3)

    def restore_and_prove(self, block_id: str, owners: set[str]) -> tuple[float, int, Any]:
        """Restore a block into a cleared context and prove it: (restore ms, tokens,
        proof result). Changes nothing stored."""
        stored = self.read_state(block_id, owners)
        restore_ms = stored.read_ms + self.engine.restore(
            stored.payload, stored.tokens, stored.size
        )
        n_tokens = len(stored.tokens)
        record = proofs.ProofRecord.from_dict(stored.meta["proof"])
        mid_turn = bool(stored.meta.get("mid_turn"))
        del stored
        return restore_ms, n_tokens, self.prove(record, mid_turn)

    # -- grafting ------------------------------------------------------------------------
    def graftable(self, block_id: str) -> bool:
        """Whether the block's whole chain was captured under this runtime (a graft, not a
        re-read)."""
        return all(self.current(link) for link in self.vault.chain_rows(block_id))

    def graft(
        self,
        block_id: str,
        owner_id: str,
        counters: Counters,
        job: Job = NO_JOB,
        mid_turn: bool = False,
    ) -> GraftReport:
        """Make the context hold `block_id` (plus the probe, unless the block ends inside
        a turn): grafted from disk and proved, or re-read (and stored again) when it cannot
        be used as it is."""
        engine = self.engine
        row = self.vault.block_row(block_id)
        if row["owner_id"] != owner_id:
            raise IntegrityError(
                f"Block {block_id} belongs to {row['owner_id']}, not {owner_id}; refused."
            )
        chain = self.vault.chain_rows(block_id)
        if not all(self.current(link) for link in chain):
            other = row.get("model_sha256") and row["model_sha256"] != engine.model_sha256
            reason = OTHER_MODEL if other else MODEL_CHANGED
            if not other and any(given_back(link) for link in chain):
                reason = GIVEN_BACK
            return self.reread(row, reason, counters, job, mid_turn)
        restore_ms, n_tokens, result = self.restore_and_prove(
            block_id, self.sources.chain_owners(owner_id)
        )
        if result.verdict == "diverged":
            reason = f"the graft proof diverged (KL {result.kl:.2e})"
            return self.reread(row, reason, counters, job, mid_turn)
        counters.restored_tokens += n_tokens
        counters.restore_ms += restore_ms
        counters.proof_ms += result.proof_ms
        counters.new_tokens += 0 if mid_turn else len(engine.probe_tokens)
        self.stats.restored_tokens += n_tokens
        self.stats.grafts += 1
        self.mark(owner_id, block_id)
        return GraftReport(owner_id, block_id, n_tokens, n_tokens, 0, restore_ms, result)

    def reread(
        self,
        row: BlockRow,
        reason: str,
        counters: Counters,
        job: Job = NO_JOB,
        mid_turn: bool = False,
    ) -> GraftReport:
        """Re-read a block's ledger from scratch (rebuilt for the current model when the
        owner says so), store it again, and say why."""
        engine = self.engine
        rendered = self.sources.ledger_for_model(row)
        tokens = rendered.tokens if rendered is not None else self.vault.chain_tokens(row["id"])
        pictures = rendered.pictures if rendered is not None else []
        if holds_pictures(tokens) and not pictures:
            pictures = self.sources.pictures_for(row)
        engine.reset()
        self.holding = None
        prefill_ms = self.evaluate_ledger(tokens, pictures, job).elapsed_ms
        new_row, record = self.persist(
            row["kind"], row["owner_id"], None, row["generation"] + 1, mid_turn=mid_turn
        )
        # A block other links continue from stays: their token ledgers run through it.
        keep_old = bool(self.vault.children(row["id"]))
        records = self.vault.records
        with self.vault.transaction():
            records.insert("blocks", new_row)
            resealed: set[tuple[Table, str]] = set()
            holders: tuple[tuple[Table, str], ...] = (
                ("conversations", "head_block_id"),
                ("documents", "block_id"),
                ("parts", "block_id"),
                ("verified", "block_id"),
            )
            for table, column in holders:
                for owner in records.select(table, **{column: row["id"]}):
                    records.update(table, owner["id"], {column: new_row["id"]})
                    resealed.add((table, owner["id"]))
                    if table == "parts":  # a document's seal covers its parts' blocks
                        resealed.add(("documents", owner["document_id"]))
            for message in records.select("messages", block_id=row["id"]):
                resealed.add(("conversations", message["conversation_id"]))
            records.update_where("messages", {"block_id": new_row["id"]}, block_id=row["id"])
            retired = [] if keep_old else [row["id"]]
            if rendered is not None and rendered.apply is not None:
                retired += [b for b in rendered.apply(new_row) if b not in retired]
            self.vault.delete_block_rows(retired)
            for table, owner_id in sorted(resealed):
                self.records.reseal(table, owner_id)
        self.vault.unlink_block_files(retired)
        counters.recomputed_tokens += len(tokens)
        counters.prefill_ms += prefill_ms
        counters.new_tokens += 0 if mid_turn else len(record.probe_tokens)
        self.stats.recomputed_tokens += len(tokens)
        self.mark(row["owner_id"], new_row["id"])
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

    # -- persisting ----------------------------------------------------------------------
    def _capture_whole(
        self, ledger: list[int]
    ) -> tuple[tuple[StateBuffer, int], list[kvstate.Ranges] | None, float]:
        """The whole sequence's state, its layout (None: one this version cannot splice)
        and the ms it took. The live context continues from exactly what a resume will
        rebuild: it can hold more than the per-sequence state carries (with swa_full every
        sliding-window cell stays live, the state keeps only the window), so the captured
        state is grafted back in place and every future resume computes from the same cells."""
        engine = self.engine
        payload, used, capture_ms = engine.capture()
        layout = None
        if kvstate.chains_supported():
            try:
                state = kvstate.parse(payload, used)
                ordered = kvstate.in_position_order(state)
                if any(a is not b for a, b in zip(ordered.sections, state.sections, strict=True)):
                    # a long read wrapped the sliding window's ring: store its cells in order
                    payload, used = kvstate.write(ordered, self.vault.splice_buffer)
                layout = ordered.layout()
                del state, ordered
            except kvstate.KVLayoutError as exc:
                log.warning("a state this version cannot splice: %s", exc)
        capture_ms += engine.restore(payload, ledger, used)
        return (payload, used), layout, capture_ms

    def persist(
        self,
        kind: BlockKind,
        owner_id: str,
        parent_id: str | None,
        generation: int,
        counters: Counters | None = None,
        parent_end: int | None = None,
        mid_turn: bool = False,
    ) -> tuple[BlockRow, proofs.ProofRecord]:
        """Capture the context at a turn boundary, evaluate the probe, write the block file.
        `mid_turn`: the block ends inside a turn (a shared prefix of a first message); its
        probe is evaluated for the proof and taken back, so the context holds the block.

        With a parent (the block the context was grafted from), the block holds only the
        cells at positions after the parent's end: a link of a chain, O(new tokens) on disk.
        Returns the catalog row (the caller inserts it in its transaction) and the proof.
        `parent_end`: where a parent not yet in the catalog ends (an import in progress).
        """
        engine = self.engine
        ledger = list(engine.tokens)
        if parent_id is None:
            parent_end = 0
        elif parent_end is None:
            parent_end = self.vault.block_row(parent_id)["pos_end"]
        link = None
        if (
            parent_id
            and 0 < parent_end < len(ledger)
            and self.settings.values.chain_blocks
            and kvstate.chains_supported()
        ):
            link = self._capture_link(parent_end, len(ledger))
        layout: list[kvstate.Ranges] | None
        if link is not None:
            block, layout, capture_ms = (link[0], link[1]), link[2], link[3]
            start = parent_end
        else:
            block, layout, capture_ms = self._capture_whole(ledger)
            start = 0
        if mid_turn:
            engine.hold()
        engine.evaluate(engine.probe_tokens)  # the next turn's opening: needed anyway
        if counters is not None and not mid_turn:
            counters.new_tokens += len(engine.probe_tokens)
        record = proofs.make_record(engine.probe_tokens, engine.last_logits())
        if mid_turn:
            engine.return_to_hold()
        own_tokens = ledger[start:]
        if self.room_for is not None:
            self.room_for(block[1], owner_id)
        row = self.vault.write_block(
            kind=kind,
            owner_id=owner_id,
            parent_id=parent_id if start else None,
            tokens=own_tokens,
            generation=generation,
            fingerprint=self.vision().fingerprint
            if holds_pictures(own_tokens)
            else engine.fingerprint,
            model_sha256=engine.model_sha256,
            payload=memoryview(block[0]).cast("B")[: block[1]],
            sealed_meta={
                "tokens_sha256": tokens_digest(own_tokens),
                "ledger_sha256": tokens_digest(ledger),
                "layout": layout,
                "proof": record.as_dict(),
                "state_format": STATE_FORMAT,
                **({"mid_turn": True} if mid_turn else {}),
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

    def next_generation(self, owner_id: str) -> int:
        rows = self.vault.records.blocks(owner_id=owner_id)
        return 1 + max([int(r["generation"]) for r in rows] or [0])


def strip_whitespace_tokens(engine: ChatEngine, tokens: list[int]) -> list[int]:
    """The answer without leading and trailing whitespace tokens (the template trims a model
    turn's content in the history)."""
    start, end = 0, len(tokens)
    while start < end and not engine.detokenize(tokens[start : start + 1]).strip():
        start += 1
    while end > start and not engine.detokenize(tokens[end - 1 : end]).strip():
        end -= 1
    return tokens[start:end]


def engine_answer(engine: ChatEngine, text: str) -> list[int]:
    return engine.encode_text(text.strip())
