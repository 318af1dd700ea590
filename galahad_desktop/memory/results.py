"""What the core returns: typed, immutable-enough values that cross threads and print as JSON.

The window and the command receive the same objects; `as_dict()` is the `--json` form.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from galahad_desktop.engine.chat_format import TurnFormat
from galahad_desktop.engine.decoding import StopReason
from galahad_desktop.engine.modelinfo import ModelInfo
from galahad_desktop.engine.proof import NO_PROOF, ProofResult
from galahad_desktop.engine.values import (
    Counters,
    Placement,
    RuntimeDetails,
    SamplingDefaults,
    VisionStatus,
)
from galahad_desktop.jobs import Progress
from galahad_desktop.memory.retrieval.router import RouteDecision
from galahad_desktop.memory.tool_values import (
    ChatMessage,
    ChatRole,
    ConversationTool,
    ReplyShape,
    Tool,
    ToolCall,
    ToolRun,
    ToolServerInfo,
)

LibraryMode = Literal["none", "recurrence", "transfer"]
# How a turn ended: as its reply did, or answered from the library, or a document added.
TurnStop = StopReason | Literal["verified", "document"]
MessageRole = Literal["user", "model", "document", "tool"]  # tool: results given back
VerifyVerdict = Literal["exact", "close", "diverged", "skipped"]
FullChoice = Literal["stop", "summary", "recent"]


def to_jsonable(value: Any) -> Any:
    """Dataclasses, lists and dicts as JSON values (inf and nan become null)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "as_dict"):
            return to_jsonable(value.as_dict())
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# Where a conversation's memory stands ("": not looked at); the window says "writing the
# first reply" while its first turn is under way.
ConversationMemory = Literal[
    "", "stored", "needs re-reading", "not stored", "damaged", "writing the first reply"
]
DocumentKind = Literal["text", "picture", "scan", "memo"]


@dataclass
class GraftReport:
    owner_id: str
    block_id: str
    tokens: int
    restored_tokens: int
    recomputed_tokens: int
    restore_ms: float
    proof: ProofResult
    fallback_reason: str | None = None

    def describe(self) -> str:
        if self.fallback_reason:
            return f"re-read {self.tokens:,} tokens: {self.fallback_reason}"
        if not self.block_id:
            return "Ready"
        return (
            f"Resumed {self.restored_tokens:,} tokens in {self.restore_ms:.0f} ms · "
            f"{self.proof.describe()}"
        )

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["proof"] = self.proof.verdict
        out["proof_detail"] = self.proof.as_dict()
        out["proof_ms"] = self.proof.proof_ms
        return out


@dataclass(frozen=True)
class StackQuality:
    """A stacked context against a full read of the same tokens, on a greedy probe: the
    per-token KL divergence (nats) of the next-token distributions and the argmax match."""

    probe_tokens: int
    kl_mean: float
    kl_p99: float
    kl_max: float
    argmax_agree: int  # of probe_tokens
    full_read_ms: float  # what the comparison's full read took


@dataclass(frozen=True)
class StackReport:
    """Stored documents placed after what a conversation holds without reading them again:
    their keys moved to the new positions, the first tokens of each read on top. Never
    byte-exact (verdict `stacked`); `quality` only when asked for (`verify`)."""

    documents: tuple[str, ...]  # their names, in the order stacked
    stacked_tokens: int  # moved into place from the stored blocks
    recomputed_tokens: int  # read on top: each block's first ones and its last
    reread_tokens: int  # blocks given back (or of another model): read once and stored again
    stack_ms: float  # the moves and the recompute, not the storing
    quality: StackQuality | None = None
    verdict: Literal["stacked"] = "stacked"

    def describe(self) -> str:
        n = len(self.documents)
        what = f"{n} documents" if n > 1 else f"'{self.documents[0]}'"
        parts = [
            f"Stacked {what} ({self.stacked_tokens + self.recomputed_tokens:,} tokens) in "
            f"{self.stack_ms:.0f} ms · recomputed {self.recomputed_tokens:,}"
        ]
        if self.reread_tokens:
            parts.append(f"read again {self.reread_tokens:,} (their memory was given back)")
        if self.quality is not None:
            q = self.quality
            parts.append(
                f"against a full read: KL {q.kl_mean:.3f} · argmax {q.argmax_agree}/"
                f"{q.probe_tokens}"
            )
        parts.append("close, not byte-exact")
        return " · ".join(parts)


@dataclass(frozen=True)
class LibraryUse:
    """How the verified-answer library took part in a turn."""

    mode: LibraryMode
    score: float | None = None
    entry_id: str = ""
    runner_up: float = 0.0
    verified_at: float = 0.0
    verifier: str = ""
    label: str = ""


@dataclass
class TurnResult:
    conversation_id: str
    reply: str
    stop_reason: TurnStop
    counters: Counters
    proof: ProofResult
    graft: GraftReport | None
    context_tokens: int
    n_ctx: int
    tokens_per_s: float
    library: LibraryUse | None = None
    thoughts: str = ""  # the thought channel (thinking mode), never part of the reply
    thought_tokens: int = 0
    reread_tokens: int = 0  # answer tokens re-read so the history holds no thoughts
    compaction: CompactResult | None = None
    image_tokens: int = 0  # a picture read into the conversation: its image positions
    audio_tokens: int = 0  # a voice memo heard into the conversation: its audio positions
    seed: int | None = None  # the sampler's seed (with it, the reply can be reproduced)
    versions: int = 1  # the reply's versions, this one included (Regenerate keeps them)
    notice: str = ""  # what went wrong on the way, said to the user (a device server lost)
    calls: tuple[ToolCall, ...] = ()  # the tools the reply called (its turn waits for them)
    stack: StackReport | None = None  # stored documents stacked by this turn

    def describe(self) -> str:
        """The status line after a turn: what the graft did, what the turn cost."""
        parts = []
        if self.library is not None and self.library.mode in ("recurrence", "transfer"):
            parts.append(self.library.label)
        elif self.graft is not None:
            parts.append(self.graft.describe())
        if self.stack is not None:
            parts.append(self.stack.describe())
        c = self.counters
        parts.append(
            f"{c.generated_tokens} tokens at {self.tokens_per_s:.1f} tok/s · "
            f"context {self.context_tokens:,} of {self.n_ctx:,} tokens"
        )
        if self.thought_tokens:
            parts.append(
                f"thought for {self.thought_tokens} tokens (not kept); re-read the "
                f"{self.reread_tokens}-token answer"
            )
        if self.notice:
            parts.append(self.notice)
        return " · ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "library": to_jsonable(self.library),
            "conversation_id": self.conversation_id,
            "reply": self.reply,
            "thoughts": self.thoughts,
            "thought_tokens": self.thought_tokens,
            "reread_tokens": self.reread_tokens,
            "stop_reason": self.stop_reason,
            "notice": self.notice,
            **self.counters.as_dict(),
            "proof": self.proof.verdict,
            "proof_detail": self.proof.as_dict(),
            "fallback_reason": self.graft.fallback_reason if self.graft else None,
            "graft": self.graft.as_dict() if self.graft else None,
            "stack": to_jsonable(self.stack),
            "context_tokens": self.context_tokens,
            "n_ctx": self.n_ctx,
            "tokens_per_s": self.tokens_per_s,
            "compaction": to_jsonable(self.compaction),
            "seed": self.seed,
            "versions": self.versions,
        }


@dataclass(frozen=True)
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
    pictures: int = 0  # pictures (or scanned pages) read through the vision projector
    image_tokens: int = 0  # their embedding positions
    encode_ms: float = 0.0  # in the projector's encoders
    sounds: int = 0  # a voice memo's parts, heard through the audio encoder
    audio_tokens: int = 0  # their embedding positions
    audio_seconds: float = 0.0  # how long the memo lasts

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["bytes_per_token"] = self.block_bytes / max(1, self.tokens)
        out["tokens_per_s"] = self.tokens / (self.prefill_ms / 1e3) if self.prefill_ms else 0.0
        return out


@dataclass(frozen=True)
class Message:
    id: str
    role: MessageRole
    text: str
    created_at: float
    tok_start: int
    tok_end: int
    block_id: str | None
    thoughts: str = ""
    picture: bytes | None = None  # a picture put into the conversation: its PNG
    sound: bytes | None = None  # a voice memo put into the conversation: its WAV
    seed: int | None = None  # a model reply's sampler seed (None: not recorded)
    version: int = 1  # which of the reply's versions this is (Regenerate keeps them)
    versions: int = 1
    stop: str = ""  # how a reply ended when not at its own end ("cancelled", "length", …)
    calls: tuple[ToolCall, ...] = ()  # the tools a model reply called (an API client's)


@dataclass(frozen=True)
class ReplyVersion:
    """One version of a model reply: the one the conversation continues from, or an
    earlier one that Regenerate kept."""

    number: int  # 1 = the oldest
    text: str
    thoughts: str
    seed: int | None
    created_at: float
    current: bool  # the conversation continues from this one
    restorable: bool  # its own block is kept: choosing it grafts, 0 tokens re-read
    stop: str = ""  # how it ended when not at its own end ("cancelled", "length", …)


@dataclass(frozen=True)
class ConversationSummary:
    id: str
    title: str
    document_id: str | None
    n_tokens: int
    n_messages: int
    updated_at: float
    created_at: float = 0.0
    thinking: bool = False
    model_sha256: str = ""
    damaged: str = ""  # why its record does not open (it is listed, marked, never hidden)
    preview: str = ""  # the start of its last message (decrypted in memory, for the sidebar)
    memory: ConversationMemory = ""
    block_bytes: int = 0  # its stored blocks' bytes on disk
    origin: str = ""  # "api": made through the local API server ("": in the app)
    given_back: bool = False  # its memory was given back to the disk budget (re-read once)
    kept: bool = False  # pinned: never given back to the disk budget


@dataclass(frozen=True)
class DocumentSummary:
    id: str
    name: str
    n_tokens: int
    block_bytes: int  # every part's block together
    source_bytes: int
    created_at: float
    status: str
    n_parts: int = 1
    kind: DocumentKind = "text"


@dataclass(frozen=True)
class PartSummary:
    id: str
    part_no: int
    n_parts: int
    block_id: str
    n_tokens: int


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
    candidates_cited: list[str] = field(default_factory=list)
    citations: list[str] = field(default_factory=list)  # each part read, when several were
    across: bool = False  # answered from several parts read together (the later stacked)

    @property
    def why(self) -> str:
        """Why the question was answered or refused (or that the person chose the part)."""
        if self.answered and not self.decision.confident:
            return f"Answered from the part you chose ({self.citation})"
        if self.across:
            return self.decision.explain_across(self.citations)
        return self.decision.explain()

    def as_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answered": self.answered,
            "answer": self.text,
            "citation": self.citation,
            "why": self.why,
            "part_id": self.part_id,
            "document_id": self.document_id,
            "routing": self.decision.as_dict(),
            "candidates_cited": self.candidates_cited,
            "citations": self.citations or ([self.citation] if self.citation else []),
            "across": self.across,
            "graft": self.graft.as_dict() if self.graft else None,
            "counters": self.counters.as_dict() if self.counters else None,
            "stop_reason": self.stop_reason,
        }


@dataclass(frozen=True)
class VerifyResult:
    block_id: str
    owner_id: str
    kind: str
    tokens: int
    links: int
    fingerprint: str
    fingerprint_matches: bool
    proof: VerifyVerdict
    reason: str = ""
    restore_ms: float = 0.0
    proof_ms: float = 0.0
    max_abs_delta: float = 0.0
    kl: float = 0.0
    argmax_agree: bool = True

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = to_jsonable(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        )
        return out


@dataclass(frozen=True)
class ForgetResult:
    forgotten: str
    kind: str
    conversations: list[str]
    blocks: int


@dataclass(frozen=True)
class CompactResult:
    conversation: str
    links_before: int
    merged: int
    links_after: int
    merged_block: str = ""
    merged_bytes: int = 0
    freed_bytes: int = 0
    ms: float = 0.0
    skipped: str = ""


@dataclass(frozen=True)
class RotateResult:
    key_id: str
    blocks_rewrapped: int
    retired_key_id: str = ""
    backups_needing_retired: list[str] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class KeyStatus:
    backend: str
    key_id: str
    locked: bool
    data_dir: str
    retired_key_ids: list[str] = dataclasses.field(default_factory=list)
    generation: int = 0


@dataclass(frozen=True)
class UsageEntry:
    at: float
    restored: int
    recomputed: int
    restore_ms: float
    prefill_ms: float
    library_saved_tokens: int = 0


@dataclass(frozen=True)
class MemoryStats:
    blocks: int  # with a file on disk (not given back)
    bytes: int
    tokens_stored: int
    restored_tokens_session: int
    recomputed_tokens_session: int
    history: list[UsageEntry]
    restored_tokens_total: int
    recomputed_tokens_total: int
    library_saved_tokens_total: int
    on_disk_bytes: int = 0  # the whole data directory
    budget_bytes: int = 0  # the disk budget (0: no limit)


StoredKind = Literal["conversation", "document"]
StoredState = Literal["stored", "needs re-reading", "not stored"]


@dataclass(frozen=True)
class StoredItem:
    """A conversation or a document as the disk budget sees it."""

    id: str
    kind: StoredKind
    title: str
    bytes: int  # its blocks' files on disk
    blocks: int  # blocks with a file
    given_back: int  # blocks given back to the disk budget (re-read when next opened)
    last_used: float
    state: StoredState
    kept: bool  # pinned by the person: never given back
    open: bool  # what the model holds now: never given back


@dataclass(frozen=True)
class StorageReport:
    """What memory takes on disk against the budget (`galahad storage`, Settings)."""

    data_dir: str
    total_bytes: int  # every file in the data directory, as the disk counts them
    blocks_bytes: int  # the block files the catalog lists
    budget_bytes: int  # 0: no limit
    budget_rule: str  # where the budget comes from, in words
    disk_bytes: int  # the size of the disk the data directory is on
    disk_free_bytes: int
    items: list[StoredItem]

    @property
    def over_budget(self) -> bool:
        return 0 < self.budget_bytes < self.total_bytes


@dataclass(frozen=True)
class GiveBackResult:
    """An item's blocks given back to the disk budget (its text, title and ledger stay)."""

    item_id: str
    kind: StoredKind
    blocks: int
    bytes_freed: int
    title: str = ""


@dataclass(frozen=True)
class OpenedConversation:
    """What the window shows when a conversation is opened."""

    summary: ConversationSummary
    messages: list[Message]
    graft: GraftReport
    context_tokens: int
    n_ctx: int
    library_enabled: bool
    other_model: bool  # made with another model: it was re-read once under this one
    documents: tuple[str, ...] = ()  # the names of what it holds: its own, then those added


@dataclass(frozen=True)
class SearchHit:
    conversation_id: str
    title: str
    snippet: str  # where the words were found (title or message)


@dataclass(frozen=True)
class ModelFile:
    path: str
    name: str
    size_bytes: int
    embedded: bool
    in_use: bool


@dataclass(frozen=True)
class EngineInfo:
    """What `galahad info` and the window's first screen say about the running model."""

    model: ModelInfo
    fingerprint: str
    fingerprint_details: RuntimeDetails
    backend: str
    gpu_layers: int
    n_ctx: int
    turn_format: TurnFormat
    turn_format_note: str
    sampling_defaults: SamplingDefaults
    keyring: str
    supports_thinking: bool
    settings_problems: list[str]
    routing: str = ""  # how the library's router matches questions to parts, in words
    # Where the model runs: device, offloaded layers, KV cache's device, CPU kernels.
    placement: Placement | None = None
    # Pictures: whether the model reads them, its projector and image-token budget.
    vision: VisionStatus = dataclasses.field(default_factory=VisionStatus)

    def vision_note(self) -> str:
        v = self.vision
        hears = "voice memos: yes" if v.audio else "voice memos: no (its projector cannot hear)"
        if not v.pictures:
            if v.audio:
                return f"pictures: no ({Path(str(v.projector)).name} has no vision) · {hears}"
            why = v.problem or "no projector for this model"
            return f"pictures: not available ({why}) · voice memos: not available"
        return (
            f"pictures: yes ({Path(str(v.projector)).name}, "
            f"{v.image_min_tokens}-{v.image_max_tokens} tokens each, "
            f"attention within a picture {v.attention_within_image}) · {hears}"
        )

    def device_note(self) -> str:
        """'RPC0: 127.0.0.1:50052 (19/19 layers, KV cache there)' or 'CPU (zen4 kernels)'."""
        p = self.placement
        if p is None or not p.gpu_layers:
            variant = p.cpu_variant if p is not None else ""
            return f"CPU ({variant} kernels)" if variant else self.backend
        kv = "KV cache there" if set(p.kv_devices) - {"CPU"} else "KV cache in memory"
        return f"{p.device} ({p.gpu_layers}/{p.total_layers} layers, {kv})"


@dataclass(frozen=True)
class ContextOption:
    kind: FullChoice
    label: str
    reread_tokens: int
    detail: str


@dataclass(frozen=True)
class ContextFull:
    conversation_id: str
    context_tokens: int
    needed_tokens: int
    n_ctx: int
    options: list[ContextOption]
    message_fits: bool = True  # False: the message alone is longer than any context holds

    def describe(self) -> str:
        if not self.message_fits:
            return self.options[0].detail
        choices = "; ".join(
            f"{o.label} (re-reads {o.reread_tokens:,} tokens)" for o in self.options
        )
        return (
            f"The context is full: {self.context_tokens:,} of {self.n_ctx:,} tokens are used "
            f"and the next turn needs {self.needed_tokens:,} more. Choose: {choices}."
        )


@dataclass(frozen=True)
class Continued:
    conversation_id: str  # the new conversation, ready for the next message
    kind: str
    reread_tokens: int
    kept_messages: int
    summary: str = ""
    context_tokens: int = 0  # what the new conversation's context holds, ready for the message


@dataclass(frozen=True)
class ImportedSummary:
    conversation_id: str
    title: str
    messages: int
    tokens: int
    source: str
    left_out: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SkippedImport:
    title: str
    reason: str


@dataclass(frozen=True)
class ImportResult:
    conversations: list[ImportedSummary]
    skipped: list[SkippedImport]
    tokens: int
    prefill_ms: float
    cancelled: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.prefill_ms / 1e3) if self.prefill_ms else 0.0


@dataclass(frozen=True)
class ExportResult:
    path: str | None
    format: str
    messages: int
    bytes: int
    text: str = ""  # when no path was given (the command prints it)


NO_GRAFT_PROOF = NO_PROOF
# Values the core hands out that are defined below it (the window imports them from here).
__all__ = [
    "ChatMessage",
    "ChatRole",
    "ConversationTool",
    "Counters",
    "ModelInfo",
    "Progress",
    "ReplyShape",
    "Tool",
    "ToolCall",
    "ToolRun",
    "ToolServerInfo",
]


@dataclass(frozen=True)
class ChatCompletion:
    """What one API chat request did: the reply, and what its prompt cost.

    `cached_tokens` are exactly the tokens restored from stored blocks (the history, or a
    shared system prompt); `read_tokens` the ones evaluated for this request."""

    conversation_id: str
    text: str
    finish_reason: Literal["stop", "length", "cancelled", "tool_calls"]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    read_tokens: int
    matched_turns: int  # the request's earlier turns found stored (0: a new history)
    seed: int | None
    turn: TurnResult
    calls: tuple[ToolCall, ...] = ()  # the tools the reply called (finish_reason tool_calls)
