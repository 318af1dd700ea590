"""Sealed pointers: a record's plain pointer column (a conversation's head, a document's
block) has an encrypted copy bound to the row, so an edit that points the row at another of
its own, older checkpoints is refused."""

from __future__ import annotations

import json
from typing import Any

from galahad_desktop.errors import IntegrityError
from galahad_desktop.vault import crypto


class Seals:
    def __init__(self, fields: Any) -> None:
        self._fields = fields  # a callable returning the vault's FieldCipher (it changes on lock)

    def seal(self, table: str, row_id: str, pointer: str | None, n_messages: int) -> bytes:
        payload = json.dumps({"pointer": pointer, "n_messages": n_messages})
        return bytes(self._fields().encrypt_text(payload, table, "seal", row_id))

    def check(self, table: str, row: dict[str, Any], pointer_column: str) -> None:
        sealed = row.get("seal")
        n_messages = row.get("n_messages") or 0
        found: Any = None
        if isinstance(sealed, bytes):
            try:
                found = json.loads(self._fields().decrypt_text(sealed, table, "seal", row["id"]))
            except (crypto.DecryptionFailed, ValueError):
                found = None
        if found != {"pointer": row[pointer_column], "n_messages": n_messages}:
            raise IntegrityError(
                f"The catalog record of {row['id']} was edited (its latest checkpoint does not "
                "match its sealed copy); refused."
            )
