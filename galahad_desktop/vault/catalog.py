"""The catalog: one SQLite file (through sqlite-utils) listing conversations, messages,
documents and blocks. Private fields are stored encrypted (see FieldCipher); what stays plain
is structure (ids, sizes, counts, times, fingerprints) that the audit needs without a key.

Writes that belong together go through `Catalog.transaction()` (BEGIN IMMEDIATE ... COMMIT),
so a process killed mid-write leaves the previous consistent state.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlite_utils

from galahad_desktop.vault.atomic import create_private_file

SCHEMA_VERSION = 1

_TABLES: dict[str, tuple[dict[str, Any], str]] = {
    "meta": ({"key": str, "value": bytes}, "key"),
    "blocks": (
        {
            "id": str,
            "kind": str,
            "owner_id": str,
            "parent_id": str,
            "pos_start": int,
            "pos_end": int,
            "n_tokens": int,
            "generation": int,
            "fingerprint": str,
            "file_name": str,
            "file_bytes": int,
            "header_sha256": str,
            "wrapped_key": bytes,
            "tokens_enc": bytes,
            "payload_bytes": int,
            "capture_ms": float,
            "created_at": float,
        },
        "id",
    ),
    "conversations": (
        {
            "id": str,
            "title_enc": bytes,
            "document_id": str,
            "head_block_id": str,
            "n_tokens": int,
            "n_messages": int,
            "library": int,
            "system_prompt": str,
            "seal": bytes,
            "created_at": float,
            "updated_at": float,
        },
        "id",
    ),
    "messages": (
        {
            "id": str,
            "conversation_id": str,
            "seq": int,
            "role": str,
            "text_enc": bytes,
            "tok_start": int,
            "tok_end": int,
            "block_id": str,
            "created_at": float,
        },
        "id",
    ),
    "verified": (
        {
            "id": str,
            "lookup": str,
            "question_enc": bytes,
            "answer_enc": bytes,
            "key_enc": bytes,
            "verdict_enc": bytes,
            "verifier": str,
            "block_id": str,
            "uses": int,
            "created_at": float,
        },
        "id",
    ),
    "documents": (
        {
            "id": str,
            "name_enc": bytes,
            "text_enc": bytes,
            "block_id": str,
            "seal": bytes,
            "n_tokens": int,
            "n_parts": int,
            "source_bytes": int,
            "created_at": float,
        },
        "id",
    ),
    # One row per stored part of a document (a short document is part 1 of 1). The text is
    # the part's own text (without the overlap), encrypted: the router's index is built from
    # it in memory after unlock and never written out.
    "parts": (
        {
            "id": str,
            "document_id": str,
            "part_no": int,
            "n_parts": int,
            "block_id": str,
            "text_enc": bytes,
            "seal": bytes,
            "n_tokens": int,
            "created_at": float,
        },
        "id",
    ),
    # Routing decisions, to measure the router: scores and margin, never the question's text.
    "routing_log": (
        {
            "id": str,
            "at": float,
            "scope": str,
            "candidates": str,
            "best_score": float,
            "margin": float,
            "decision": str,
            "part_id": str,
        },
        "id",
    ),
}


class Catalog:
    FILE_NAME = "catalog.sqlite"

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / self.FILE_NAME
        # Created 0600 before SQLite opens it: its -wal/-shm files copy these permissions.
        create_private_file(self.path)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db = sqlite_utils.Database(conn)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA secure_delete=ON")
        self.db.execute("PRAGMA foreign_keys=ON")
        for name, (columns, pk) in _TABLES.items():
            self.db[name].create(columns, pk=pk, if_not_exists=True)  # type: ignore[union-attr]
            table = self.db[name]
            for column, kind in columns.items():  # a catalog from before the column existed
                if column not in table.columns_dict:
                    table.add_column(column, kind)  # type: ignore[union-attr]
        self.db["messages"].create_index(  # type: ignore[union-attr]
            ["conversation_id", "seq"], unique=True, if_not_exists=True
        )
        self.db["blocks"].create_index(["owner_id"], if_not_exists=True)  # type: ignore[union-attr]
        self.db["blocks"].create_index(["parent_id"], if_not_exists=True)  # type: ignore[union-attr]
        self.db["parts"].create_index(["document_id"], if_not_exists=True)  # type: ignore[union-attr]

    def close(self) -> None:
        self.db.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        conn = self.db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # Plain SQL for writes: sqlite-utils' write helpers commit on their own, which would
    # split a transaction that must be all-or-nothing.
    def insert(self, table: str, row: dict[str, Any]) -> None:
        columns = ", ".join(f"[{c}]" for c in row)
        marks = ", ".join("?" for _ in row)
        self.db.execute(f"INSERT INTO [{table}] ({columns}) VALUES ({marks})", list(row.values()))

    def update(self, table: str, row_id: str, changes: dict[str, Any]) -> None:
        sets = ", ".join(f"[{c}] = ?" for c in changes)
        self.db.execute(f"UPDATE [{table}] SET {sets} WHERE id = ?", [*changes.values(), row_id])

    def delete(self, table: str, where: str, args: list[Any]) -> None:
        self.db.execute(f"DELETE FROM [{table}] WHERE {where}", args)

    def get(self, table: str, row_id: str) -> dict[str, Any] | None:
        rows = list(self.db[table].rows_where("id = ?", [row_id]))
        return rows[0] if rows else None

    def rows(
        self,
        table: str,
        where: str | None = None,
        args: list[Any] | None = None,
        order_by: str | None = None,
    ) -> list[dict[str, Any]]:
        return list(self.db[table].rows_where(where, args or [], order_by=order_by))

    def meta_get(self, key: str) -> bytes | None:
        row = list(self.db["meta"].rows_where("key = ?", [key]))
        return row[0]["value"] if row else None

    def meta_delete(self, key: str) -> None:
        self.db.execute("DELETE FROM meta WHERE key = ?", [key])

    def meta_set(self, key: str, value: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])
