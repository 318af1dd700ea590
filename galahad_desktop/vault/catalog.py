"""The catalog: one SQLite file (through sqlite-utils) listing conversations, messages,
documents and blocks. Private fields are stored encrypted (see FieldCipher); what stays plain
is structure (ids, sizes, counts, times, fingerprints) that the audit needs without a key.

All SQL lives here: the rest of the program asks for rows by column values and never writes a
query. Writes that belong together go through `Catalog.transaction()` (BEGIN IMMEDIATE ...
COMMIT), so a process killed mid-write leaves the previous consistent state.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import sqlite_utils

from galahad_desktop.errors import IntegrityError
from galahad_desktop.system.files import create_private_file

SCHEMA_VERSION = 8  # 2: messages bound to their place, every record sealed; 3: part vectors;
# 4: pictures (a part's or a message's picture, encrypted); 5: reply versions, seeds,
# a conversation's own system prompt and sampling, shared system prompts; 6: conversations
# made through the local API server and its prefix index; 7: the disk budget (blocks given
# back, last use, kept items); 8: how a reply ended (stopped, cut at the length limit)

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
            "model_sha256": str,
            "file_name": str,
            "file_bytes": int,
            "header_sha256": str,
            "wrapped_key": bytes,
            "tokens_enc": bytes,
            "payload_bytes": int,
            "capture_ms": float,
            "created_at": float,
            # Given back to stay within the disk budget: the file is gone, the row (its
            # ledger, its place in a chain) stays, and the next graft re-reads it.
            "evicted_at": float,
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
            "system_enc": bytes,  # the user's own system prompt, when not a preset
            "temperature": float,  # this conversation's own, over the settings (None: theirs)
            "max_tokens": int,  # this conversation's longest reply (None: the setting)
            "thinking": int,
            "model_sha256": str,
            "origin": str,  # "api": made through the local API server (None: the app)
            "seal": bytes,
            "created_at": float,
            "updated_at": float,
            "used_at": float,  # last opened or continued (the disk budget gives back the oldest)
            "kept": int,  # 1: the person pinned it, its blocks are never given back
        },
        "id",
    ),
    # The API server's memory for stateless clients: a keyed tag of a request's history (its
    # system prompt and turns, never their words) and where that history ends in a stored
    # conversation, so the next request grafts it instead of re-reading; sealed.
    "api_prefixes": (
        {
            "id": str,
            "lookup": str,
            "conversation_id": str,
            "seq": int,
            "seal": bytes,
            "created_at": float,
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
            "thought_enc": bytes,
            "content_enc": bytes,  # a document put into the conversation: its text
            "image_enc": bytes,  # a picture put into the conversation: its PNG
            "tok_start": int,
            "tok_end": int,
            "block_id": str,
            "seed": int,  # the sampler's seed for a model reply (None before schema 5)
            "stop": str,  # how a reply ended when not at its own end (None: at its end)
            "created_at": float,
        },
        "id",
    ),
    # Earlier versions of a reply (Regenerate keeps them): the reply's text and thoughts,
    # encrypted and bound to the row; the block it ended in while it is the last reply, so
    # choosing it again grafts that block (0 tokens re-read); sealed like a conversation.
    "reply_versions": (
        {
            "id": str,
            "conversation_id": str,
            "seq": int,
            "tok_start": int,
            "tok_end": int,
            "block_id": str,
            "seed": int,
            "stop": str,
            "text_enc": bytes,
            "thought_enc": bytes,
            "seal": bytes,
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
            "seal": bytes,
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
            "used_at": float,  # last read from (the disk budget gives back the oldest)
            "kept": int,  # 1: the person pinned it, its blocks are never given back
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
            "image_enc": bytes,  # a picture or a scanned page: its PNG (None for text)
            "seal": bytes,
            "n_tokens": int,
            "created_at": float,
        },
        "id",
    ),
    # The embedding model's vectors of a part's passages (the router's meaning half), kept so
    # an unlock does not re-read every document through the model: encrypted (vectors can be
    # inverted back towards text), bound to their row id, which is derived from the part and
    # the model. A cache: a missing or damaged row is computed again from the part's text.
    "part_vectors": (
        {
            "id": str,
            "part_id": str,
            "model": str,
            "n_passages": int,
            "dims": int,
            "vectors_enc": bytes,
            "created_at": float,
        },
        "id",
    ),
    # Routing decisions, to measure the router: scores and margin, never the question's text.
    # Encrypted like everything else that says what the user did; deleted with what it names.
    # A system prompt's opening read once and kept as a block, grafted into every new
    # conversation that starts with it; `lookup` is a keyed tag of its words (no text).
    "prompts": (
        {
            "id": str,
            "lookup": str,
            "block_id": str,
            "n_tokens": int,
            "fingerprint": str,
            "seal": bytes,
            "created_at": float,
        },
        "id",
    ),
    "routing_log": ({"id": str, "at": float, "entry_enc": bytes}, "id"),
    # Backups taken with `galahad backup`: where (encrypted) and under which key, so a key
    # rotation can say which backups need the key it retires.
    "backups": (
        {"id": str, "at": float, "key_id": str, "generation": int, "dest_enc": bytes},
        "id",
    ),
    # Restored-versus-recomputed counts per request, for the Memory view (numbers only).
    "usage": ({"id": str, "at": float, "owner_id": str, "entry_enc": bytes}, "id"),
}

# Encrypted columns, by table: what the audit decrypts to check every private field.
ENCRYPTED: dict[str, tuple[str, ...]] = {
    table: tuple(c for c in columns if c.endswith("_enc") or c in ("seal", "wrapped_key"))
    for table, (columns, _pk) in _TABLES.items()
}

_ORDER = re.compile(r"^\s*(\w+)(\s+(asc|desc))?\s*$", re.IGNORECASE)


class Catalog:
    FILE_NAME = "catalog.sqlite"

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / self.FILE_NAME
        # Created 0600 before SQLite opens it: its -wal/-shm files copy these permissions.
        create_private_file(self.path)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db = sqlite_utils.Database(conn)
        # One process holds the data directory (its lock), so SQLite may keep the WAL index
        # in heap memory instead of a shared -shm file: nothing shared, and the history can
        # still be read when the disk is full (creating -shm would fail there).
        self.db.execute("PRAGMA locking_mode=EXCLUSIVE")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA secure_delete=ON")
        self.db.execute("PRAGMA foreign_keys=ON")
        existing = set(self.db.table_names())
        # Each table's columns asked once (a PRAGMA per question: every open pays for them).
        have = {name: set(self.db[name].columns_dict) for name in _TABLES if name in existing}
        missing = [n for n in _TABLES if existing and n not in existing] + [
            f"{name}.{column}"
            for name, (columns, _pk) in _TABLES.items()
            if name in have
            for column in columns
            if column not in have[name]
        ]
        if missing and self._schema_version() == SCHEMA_VERSION:
            # A current catalog lacks a table or column: dropped by someone, never ours to
            # re-create empty (that would hide the loss from the next open).
            conn.close()
            raise IntegrityError(
                "The catalog is missing parts of its structure (" + ", ".join(missing) + "): "
                "it was edited or damaged; refused. Restore a backup (galahad restore)."
            )
        for name, (columns, pk) in _TABLES.items():
            self.db[name].create(columns, pk=pk, if_not_exists=True)  # type: ignore[union-attr]
            table = self.db[name]
            present = have.get(name) or set(table.columns_dict)
            for column, kind in columns.items():  # a catalog from before the column existed
                if column not in present:
                    table.add_column(column, kind)  # type: ignore[union-attr]
        self.db["messages"].create_index(  # type: ignore[union-attr]
            ["conversation_id", "seq"], unique=True, if_not_exists=True
        )
        self.db["blocks"].create_index(["owner_id"], if_not_exists=True)  # type: ignore[union-attr]
        self.db["blocks"].create_index(["parent_id"], if_not_exists=True)  # type: ignore[union-attr]
        self.db["parts"].create_index(["document_id"], if_not_exists=True)  # type: ignore[union-attr]
        self.db["api_prefixes"].create_index(["lookup"], if_not_exists=True)  # type: ignore[union-attr]
        self.db["part_vectors"].create_index(["part_id"], if_not_exists=True)  # type: ignore[union-attr]

    def _schema_version(self) -> int | None:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            return int(bytes(row[0]).decode()) if row else None
        except (sqlite3.Error, ValueError, TypeError, UnicodeDecodeError):
            return None

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

    # -- checked names -------------------------------------------------------------------
    @staticmethod
    def _table(table: str) -> str:
        if table not in _TABLES:
            raise KeyError(f"unknown catalog table {table!r}")
        return table

    @classmethod
    def _columns(cls, table: str, names: Iterable[str]) -> list[str]:
        known = _TABLES[cls._table(table)][0]
        names = list(names)
        for name in names:
            if name not in known:
                raise KeyError(f"unknown column {table}.{name}")
        return names

    @classmethod
    def _order(cls, table: str, order_by: str | None) -> str:
        if not order_by:
            return ""
        terms = []
        for term in order_by.split(","):
            match = _ORDER.match(term)
            if match is None:
                raise KeyError(f"bad ordering {order_by!r}")
            cls._columns(table, [match.group(1)])
            terms.append(f"[{match.group(1)}] {(match.group(3) or 'asc').upper()}")
        return " ORDER BY " + ", ".join(terms)

    def _where(self, table: str, equals: dict[str, Any]) -> tuple[str, list[Any]]:
        if not equals:
            return "", []
        parts = []
        args: list[Any] = []
        for column in self._columns(table, equals):
            value = equals[column]
            if value is None:
                parts.append(f"[{column}] IS NULL")
            else:
                parts.append(f"[{column}] = ?")
                args.append(value)
        return " WHERE " + " AND ".join(parts), args

    # -- reads ---------------------------------------------------------------------------
    def get(self, table: str, row_id: str) -> dict[str, Any] | None:
        rows = self.select(table, id=row_id) if table != "meta" else []
        return rows[0] if rows else None

    def select(
        self, table: str, order_by: str | None = None, **equals: Any
    ) -> list[dict[str, Any]]:
        where, args = self._where(table, equals)
        sql = f"SELECT * FROM [{self._table(table)}]{where}{self._order(table, order_by)}"
        cursor = self.db.execute(sql, args)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def select_in(
        self, table: str, column: str, values: Iterable[Any], order_by: str | None = None
    ) -> list[dict[str, Any]]:
        values = list(values)
        if not values:
            return []
        self._columns(table, [column])
        marks = ",".join("?" * len(values))
        sql = (
            f"SELECT * FROM [{self._table(table)}] WHERE [{column}] IN ({marks})"
            f"{self._order(table, order_by)}"
        )
        cursor = self.db.execute(sql, values)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def count(self, table: str, **equals: Any) -> int:
        where, args = self._where(table, equals)
        row = self.db.execute(f"SELECT count(*) FROM [{self._table(table)}]{where}", args)
        return int(row.fetchone()[0])

    # -- writes (inside the caller's transaction) ------------------------------------------
    # Plain SQL for writes: sqlite-utils' write helpers commit on their own, which would
    # split a transaction that must be all-or-nothing.
    def insert(self, table: str, row: dict[str, Any]) -> None:
        columns = ", ".join(f"[{c}]" for c in self._columns(table, row))
        marks = ", ".join("?" for _ in row)
        self.db.execute(f"INSERT INTO [{table}] ({columns}) VALUES ({marks})", list(row.values()))

    def update(self, table: str, row_id: str, changes: dict[str, Any]) -> None:
        sets = ", ".join(f"[{c}] = ?" for c in self._columns(table, changes))
        self.db.execute(f"UPDATE [{table}] SET {sets} WHERE id = ?", [*changes.values(), row_id])

    def update_where(self, table: str, changes: dict[str, Any], **equals: Any) -> None:
        sets = ", ".join(f"[{c}] = ?" for c in self._columns(table, changes))
        where, args = self._where(table, equals)
        self.db.execute(f"UPDATE [{table}] SET {sets}{where}", [*changes.values(), *args])

    def update_in(
        self, table: str, changes: dict[str, Any], column: str, values: Iterable[Any]
    ) -> None:
        values = list(values)
        if not values:
            return
        sets = ", ".join(f"[{c}] = ?" for c in self._columns(table, changes))
        self._columns(table, [column])
        marks = ",".join("?" * len(values))
        self.db.execute(
            f"UPDATE [{table}] SET {sets} WHERE [{column}] IN ({marks})",
            [*changes.values(), *values],
        )

    def delete(self, table: str, **equals: Any) -> None:
        if not equals:
            raise ValueError("delete needs a condition")
        where, args = self._where(table, equals)
        self.db.execute(f"DELETE FROM [{self._table(table)}]{where}", args)

    def delete_in(self, table: str, column: str, values: Iterable[Any]) -> None:
        values = list(values)
        if not values:
            return
        self._columns(table, [column])
        marks = ",".join("?" * len(values))
        self.db.execute(f"DELETE FROM [{self._table(table)}] WHERE [{column}] IN ({marks})", values)

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the main file (after deletes: shrink what a
        recovered copy of the log could still show)."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- meta ----------------------------------------------------------------------------
    def meta_get(self, key: str) -> bytes | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        if row is None:
            return None
        if not isinstance(row[0], bytes):  # every entry is written as bytes
            raise IntegrityError(f"The catalog's '{key}' entry is damaged.")
        return row[0]

    def meta_delete(self, key: str) -> None:
        self.db.execute("DELETE FROM meta WHERE key = ?", [key])

    def meta_set(self, key: str, value: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])
