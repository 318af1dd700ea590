"""Names and shapes the vault, its audit and custody share (so none imports another's
module for them): ids, block file names, the token digest, the audit report."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from galahad_desktop.errors import IntegrityError


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


BLOCK_ID = re.compile(r"b-[0-9a-f]{16}")
_BLOCK_FILE = re.compile(r"(b-[0-9a-f]{16})(-[0-9a-f]{8})?" + re.escape(".gkv"))


def block_file_of(row: dict[str, Any]) -> str:
    """A block row's file name, checked: only a name this vault writes for this block (an
    edited catalog must not point a read, or a delete, outside the blocks folder)."""
    name = row.get("file_name")
    match = _BLOCK_FILE.fullmatch(name) if isinstance(name, str) else None
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "ok": self.ok,
            "problems": self.problems,
            "repaired": self.repaired,
        }


def tokens_digest(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()
