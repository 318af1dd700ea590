"""Names and shapes the vault, its audit and custody share (so none imports another's
module for them): ids, block file names, the token digest, the audit report."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np

from galahad_desktop.errors import IntegrityError

BlockKind = Literal["conversation", "document", "verified", "prompt"]
MessageRole = Literal["user", "model", "document", "tool"]  # tool: results given back


# The catalog's tables (vault/catalog.py declares their columns; a test keeps the two equal).
Table = Literal[
    "meta",
    "blocks",
    "conversations",
    "api_prefixes",
    "messages",
    "reply_versions",
    "verified",
    "documents",
    "parts",
    "part_vectors",
    "prompts",
    "routing_log",
    "backups",
    "usage",
]


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


BLOCK_ID = re.compile(r"b-[0-9a-f]{16}")
BLOCK_SUFFIX = ".gkv"
BLOCK_FILE = re.compile(r"(b-[0-9a-f]{16})(-[0-9a-f]{8})?" + re.escape(BLOCK_SUFFIX))


def block_file_of(row: Mapping[str, Any]) -> str:
    """A block row's file name, checked: only a name this vault writes for this block (an
    edited catalog must not point a read, or a delete, outside the blocks folder)."""
    name = row.get("file_name")
    match = BLOCK_FILE.fullmatch(name) if isinstance(name, str) else None
    if match is None or match.group(1) != row.get("id"):
        raise IntegrityError(
            f"The catalog record of block {row.get('id')} names an invalid file; refused."
        )
    return str(name)


@dataclass
class AuditReport:
    blocks: int = 0
    ok: int = 0
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    given_back: int = 0  # blocks whose files were given back to the disk budget (no file)

    def as_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "ok": self.ok,
            "given_back": self.given_back,
            "problems": self.problems,
            "repaired": self.repaired,
        }


def tokens_digest(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


class ConversationRow(TypedDict):
    """A conversation's catalog record (its title encrypted; the rest sealed or bookkeeping)."""

    id: str
    document_id: str | None  # a conversation on a document starts from its block
    head_block_id: str | None  # the latest checkpoint (None: nothing stored yet)
    n_tokens: int
    n_messages: int
    system_prompt: str | None  # a preset's name, or "custom" (the words in system_enc)
    thinking: int
    created_at: float
    updated_at: float
    title_enc: NotRequired[bytes]
    system_enc: NotRequired[bytes | None]  # the user's own system prompt (schema 5)
    temperature: NotRequired[float | None]  # its own sampling, over the settings (schema 5)
    max_tokens: NotRequired[int | None]
    library: NotRequired[int | None]  # the verified-answer library: on (1), off (0), default
    model_sha256: NotRequired[str | None]  # the model it was last stored under
    origin: NotRequired[str | None]  # "api": made through the local API server (schema 6)
    used_at: NotRequired[float | None]  # last opened or continued (schema 7)
    kept: NotRequired[int | None]  # 1: pinned, never given back to the disk budget
    seal: NotRequired[bytes]


class DocumentRow(TypedDict):
    id: str
    block_id: str  # the first part's block
    n_tokens: int
    n_parts: int
    source_bytes: int
    created_at: float
    used_at: NotRequired[float | None]  # last read from (schema 7)
    kept: NotRequired[int | None]  # 1: pinned, never given back to the disk budget
    name_enc: NotRequired[bytes]
    text_enc: NotRequired[bytes]
    seal: NotRequired[bytes]


# A part just stored, for the router's index: (part id, document id, part number, how many
# parts, its text).
NewPart = tuple[str, str, int, int, str]


class PartRow(TypedDict):
    id: str
    document_id: str
    part_no: int
    n_parts: int
    block_id: str
    n_tokens: int
    created_at: float
    text_enc: NotRequired[bytes]
    image_enc: NotRequired[bytes | None]  # a picture or a scanned page
    seal: NotRequired[bytes]


class BlockRow(TypedDict):
    """A block's catalog record: where its file is, what it holds, its wrapped key."""

    id: str
    kind: BlockKind
    owner_id: str
    parent_id: str | None  # the link it continues (None: a root)
    pos_start: int
    pos_end: int
    n_tokens: int
    generation: int
    fingerprint: str
    model_sha256: str | None
    file_name: str
    file_bytes: int
    header_sha256: str
    wrapped_key: bytes
    tokens_enc: bytes
    payload_bytes: int
    capture_ms: float
    created_at: float
    evicted_at: NotRequired[float | None]  # given back to the disk budget (schema 7)


def given_back(row: Mapping[str, Any]) -> bool:
    """Whether a block's file was given back to the disk budget (its row and ledger stay)."""
    return row.get("evicted_at") is not None


def file_bytes(row: Mapping[str, Any]) -> int:
    """A block file's size as the catalog recorded it (bookkeeping, not sealed: 0 when
    missing, never a crash)."""
    size = row.get("file_bytes")
    return size if isinstance(size, int) else 0


class MessageRow(TypedDict):
    """A message's place (its private fields are bound to it) and its checkpoint."""

    id: str
    conversation_id: str
    seq: int
    role: MessageRole
    tok_start: int
    tok_end: int
    block_id: str | None  # the checkpoint stored after it, while kept
    created_at: float
    seed: NotRequired[int | None]  # a model reply's sampler seed (schema 5)
    stop: NotRequired[str | None]  # how a reply ended, when not at its end (schema 8)
    text_enc: NotRequired[bytes]
    thought_enc: NotRequired[bytes | None]
    content_enc: NotRequired[bytes | None]
    image_enc: NotRequired[bytes | None]


class VersionRow(TypedDict):
    """An earlier version of a model reply (Regenerate keeps them)."""

    id: str
    conversation_id: str
    seq: int  # the reply's place in the conversation
    tok_start: int
    tok_end: int
    block_id: str | None  # the block it ended in, while it is the last reply
    seed: int | None
    stop: NotRequired[str | None]
    created_at: float
    text_enc: NotRequired[bytes]
    thought_enc: NotRequired[bytes | None]
    seal: NotRequired[bytes]
