"""Catalog records, authenticated: every private field is bound to where it belongs, and every
record's structure is sealed.

- A private field (message text, a title, a document's text…) is AES-GCM encrypted with its
  table, column and *context* as additional data: for most tables the row id; for a message,
  also its conversation, position, role and token range — so a message moved to another
  conversation, renumbered, or given another role no longer decrypts.
- A record's plain structural columns (a conversation's head block, message count, token
  count and document; a document's block and parts; a part's place) are sealed: their values,
  and for a conversation a digest of its whole transcript, encrypted and bound to the row. An
  edited, deleted, added or reordered message, or a head pointed at an older checkpoint, no
  longer matches its seal: refused, and the audit names the record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, cast

from galahad_desktop.errors import AUDIT, IntegrityError
from galahad_desktop.vault import crypto
from galahad_desktop.vault.catalog import ENCRYPTED, Catalog
from galahad_desktop.vault.names import (
    BlockRow,
    ConversationRow,
    DocumentRow,
    MessageRow,
    PartRow,
    Table,
    VersionRow,
)

SEALED: dict[str, tuple[str, ...]] = {
    "conversations": (
        "head_block_id",
        "n_messages",
        "n_tokens",
        "document_id",
        "system_prompt",
        "thinking",
        "library",
        "model_sha256",
    ),
    "documents": ("block_id", "n_tokens", "n_parts", "source_bytes"),
    "parts": ("block_id", "document_id", "part_no", "n_parts", "n_tokens"),
    "verified": ("block_id", "lookup", "verifier"),
    "reply_versions": ("conversation_id", "seq", "tok_start", "tok_end", "block_id", "seed"),
    "prompts": ("lookup", "block_id", "n_tokens", "fingerprint"),
    "api_prefixes": ("lookup", "conversation_id", "seq"),
}
SEAL_SCHEME = 2
MESSAGE_FIELDS = ("text_enc", "thought_enc", "content_enc", "image_enc")
OPTIONAL = (
    "thought_enc",
    "content_enc",
    "image_enc",
    "system_enc",
)  # private fields a record may lack
_WHAT = {
    "conversations": "conversation",
    "documents": "document",
    "parts": "document part",
    "verified": "verified answer",
    "reply_versions": "reply version",
    "prompts": "shared system prompt",
    "api_prefixes": "API history index entry",
}


def _plain(value: Any) -> Any:
    """A column's value as JSON can hold it (an edited cell may hold any SQLite type)."""
    return {"blob": value.hex()} if isinstance(value, bytes) else value


def field_context(table: Table, row: Mapping[str, Any]) -> str:
    """What a private field of `row` is bound to (beyond its table and column)."""
    if table == "messages":
        return "|".join(
            str(row.get(k))
            for k in ("id", "conversation_id", "seq", "role", "tok_start", "tok_end")
        )
    return str(row["id"])


Row = dict[str, Any]
LOGS = {"usage": "entry_enc", "routing_log": "entry_enc"}


class Records:
    """The catalog as the rest of the core sees it: rows in and out, with every private
    field encrypted and every structural record sealed here. Callers never see a cipher, a
    seal or the SQLite connection; a locked vault raises LockedError from every method
    that needs a key."""

    def __init__(self, catalog: Catalog, fields: Callable[[], crypto.FieldCipher]) -> None:
        self.catalog = catalog
        self._fields = fields  # the vault's FieldCipher (it changes on lock and unlock)

    # -- rows ----------------------------------------------------------------------------
    def get(self, table: Table, row_id: str) -> Row | None:
        return self.catalog.get(table, row_id)

    def conversation(self, conversation_id: str) -> ConversationRow | None:
        return cast("ConversationRow | None", self.catalog.get("conversations", conversation_id))

    def conversations(self, order_by: str | None = None, **equals: Any) -> list[ConversationRow]:
        rows = self.catalog.select("conversations", order_by, **equals)
        return cast("list[ConversationRow]", rows)

    def document(self, document_id: str) -> DocumentRow | None:
        return cast("DocumentRow | None", self.catalog.get("documents", document_id))

    def documents(self, order_by: str | None = None, **equals: Any) -> list[DocumentRow]:
        return cast("list[DocumentRow]", self.catalog.select("documents", order_by, **equals))

    def block(self, block_id: str) -> BlockRow | None:
        return cast("BlockRow | None", self.catalog.get("blocks", block_id))

    def blocks(self, order_by: str | None = None, **equals: Any) -> list[BlockRow]:
        return cast("list[BlockRow]", self.catalog.select("blocks", order_by, **equals))

    def messages(self, conversation_id: str) -> list[MessageRow]:
        """A conversation's messages in order."""
        rows = self.catalog.select("messages", "seq", conversation_id=conversation_id)
        return cast("list[MessageRow]", rows)

    def part(self, part_id: str) -> PartRow | None:
        return cast("PartRow | None", self.catalog.get("parts", part_id))

    def parts(self, order_by: str | None = None, **equals: Any) -> list[PartRow]:
        return cast("list[PartRow]", self.catalog.select("parts", order_by, **equals))

    def select(self, table: Table, order_by: str | None = None, **equals: Any) -> list[Row]:
        return self.catalog.select(table, order_by, **equals)

    def select_in(
        self, table: Table, column: str, values: list[Any], order_by: str | None = None
    ) -> list[Row]:
        return self.catalog.select_in(table, column, values, order_by)

    def count(self, table: Table, **equals: Any) -> int:
        return self.catalog.count(table, **equals)

    def insert(self, table: Table, row: Mapping[str, Any]) -> None:
        """Insert a row; a structural record (conversation, document, part, verified
        answer) is sealed as it stands, with what it depends on already in the catalog."""
        values = dict(row)
        if table in SEALED:
            values["seal"] = self.seal_value(table, values)
        self.catalog.insert(table, values)

    def update(self, table: Table, row_id: str, changes: Row) -> None:
        """Change plain columns; call reseal() once a sealed record's changes are done."""
        self.catalog.update(table, row_id, changes)

    def update_where(self, table: Table, changes: Row, **equals: Any) -> None:
        self.catalog.update_where(table, changes, **equals)

    def update_in(self, table: Table, changes: Row, column: str, values: list[Any]) -> None:
        self.catalog.update_in(table, changes, column, values)

    def delete(self, table: Table, **equals: Any) -> None:
        self.catalog.delete(table, **equals)

    def delete_in(self, table: Table, column: str, values: list[Any]) -> None:
        self.catalog.delete_in(table, column, values)

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the catalog file (after forgetting: no old pages)."""
        self.catalog.checkpoint()

    # -- encrypted logs and vectors -------------------------------------------------------
    def log(self, kind: str, row_id: str, at: float, entry: Row, keep: int, **plain: Any) -> None:
        """Append an entry to an encrypted log ("usage", "routing_log"), keeping the newest
        `keep` (inside the caller's transaction)."""
        value = self._fields().encrypt_text(json.dumps(entry), kind, "entry", row_id)
        self.catalog.insert(kind, {"id": row_id, "at": at, **plain, LOGS[kind]: value})
        old = self.catalog.select(kind, "at desc")[keep:]
        self.catalog.delete_in(kind, "id", [r["id"] for r in old])

    def log_entries(self, kind: str) -> list[tuple[str, float, Row]]:
        """A log's readable entries, newest first, as (id, time, entry); a damaged line is
        skipped (the audit reports it)."""
        fields = self._fields()
        out = []
        for row in self.catalog.select(kind, "at desc"):
            try:
                entry = json.loads(fields.decrypt_text(row[LOGS[kind]], kind, "entry", row["id"]))
            except (crypto.DecryptionFailed, TypeError, ValueError):
                continue
            at = float(row["at"]) if isinstance(row["at"], int | float) else 0.0
            if isinstance(entry, dict):
                out.append((str(row["id"]), at, entry))
        return out

    def vectors(self, row_id: str) -> bytes | None:
        """Stored vectors (encrypted, bound to their row), or None when absent or damaged."""
        row = self.catalog.get("part_vectors", row_id)
        if row is None:
            return None
        try:
            return bytes(
                self._fields().decrypt_bytes(row["vectors_enc"], "part_vectors", "vectors", row_id)
            )
        except crypto.DecryptionFailed:
            return None

    def put_vectors(self, row_id: str, data: bytes, **plain: Any) -> None:
        """Store (replace) a part's vectors, encrypted and bound to `row_id`."""
        self.catalog.delete("part_vectors", id=row_id)
        value = self._fields().encrypt_bytes(data, "part_vectors", "vectors", row_id)
        self.catalog.insert("part_vectors", {"id": row_id, **plain, "vectors_enc": value})

    def secret_setting(self, key: str, vault_id: str) -> bytes | None:
        """A setting kept encrypted in the catalog's meta table (bound to its key and this
        vault); None when absent. Raises DecryptionFailed when it fails authentication."""
        blob = self.catalog.meta_get(key)
        if blob is None:
            return None
        return bytes(self._fields().decrypt_bytes(blob, "meta", key, vault_id))

    def put_secret_setting(self, key: str, value: bytes, vault_id: str) -> None:
        self.catalog.meta_set(key, self._fields().encrypt_bytes(value, "meta", key, vault_id))

    def in_transaction(self) -> bool:
        return bool(self.catalog.db.conn.in_transaction)

    def verified_matching(self, key: str) -> list[Row]:
        """Verified answers whose lookup tag is the keyed hash of `key` (a question)."""
        return self.catalog.select("verified", lookup=self.lookup_tag(key))

    def lookup_tag(self, key: str, purpose: str = "verified") -> str:
        return str(self._fields().lookup_tag(key, purpose))

    # -- private fields ------------------------------------------------------------------
    def encrypt(self, table: Table, column: str, row: Mapping[str, Any], text: str) -> bytes:
        return bytes(
            self._fields().encrypt_text(
                text, table, column.removesuffix("_enc"), field_context(table, row)
            )
        )

    def decrypt(self, table: Table, column: str, row: Mapping[str, Any]) -> str:
        return str(
            self._fields().decrypt_text(
                row.get(column), table, column.removesuffix("_enc"), field_context(table, row)
            )
        )

    def add_message(
        self,
        row: Mapping[str, Any],
        text: str,
        thought: str = "",
        content: str = "",
        image: str = "",
    ) -> None:
        """Insert a message row (its place in `row`), its private fields bound to that place."""
        row = dict(row)
        row["text_enc"] = self.encrypt("messages", "text_enc", row, text)
        row["thought_enc"] = (
            self.encrypt("messages", "thought_enc", row, thought) if thought else None
        )
        row["content_enc"] = (
            self.encrypt("messages", "content_enc", row, content) if content else None
        )
        row["image_enc"] = self.encrypt("messages", "image_enc", row, image) if image else None
        self.catalog.insert("messages", row)

    def versions(self, conversation_id: str) -> list[VersionRow]:
        """A conversation's earlier reply versions, oldest first."""
        rows = self.catalog.select("reply_versions", "created_at", conversation_id=conversation_id)
        return cast("list[VersionRow]", rows)

    def add_version(self, row: Mapping[str, Any], text: str, thought: str = "") -> None:
        """Keep a reply as an earlier version (its fields encrypted, the row sealed)."""
        row = dict(row)
        row["text_enc"] = self.encrypt("reply_versions", "text_enc", row, text)
        row["thought_enc"] = (
            self.encrypt("reply_versions", "thought_enc", row, thought) if thought else None
        )
        self.insert("reply_versions", row)

    def move_message(self, row: Mapping[str, Any], changes: dict[str, Any]) -> None:
        """Change a message's place (token range, position…): its private fields are
        decrypted under the old place and bound to the new one."""
        moved = {**row, **changes}
        for column in MESSAGE_FIELDS:
            if row.get(column):
                moved[column] = self.encrypt(
                    "messages", column, moved, self.decrypt("messages", column, row)
                )
        self.catalog.update(
            "messages", row["id"], {k: moved[k] for k in (*changes, *MESSAGE_FIELDS)}
        )

    # -- seals ---------------------------------------------------------------------------
    def transcript(self, conversation_id: str) -> str:
        """A digest of a conversation's messages: ids, order, roles, token ranges,
        checkpoints and ciphertexts."""
        digest = hashlib.sha256()
        for m in self.catalog.select("messages", "seq", conversation_id=conversation_id):
            text = m.get("text_enc")
            place = [
                _plain(m[k]) for k in ("id", "seq", "role", "tok_start", "tok_end", "block_id")
            ]
            cipher = hashlib.sha256(text).hexdigest() if isinstance(text, bytes) else None
            picture = m.get("image_enc")
            # A picture is part of the transcript (added only where there is one, so the
            # digests of conversations without pictures are what they always were).
            extra = [hashlib.sha256(picture).hexdigest()] if isinstance(picture, bytes) else []
            if m.get("stop") is not None:  # how a reply ended, likewise only where recorded
                extra.append(f"stop:{_plain(m['stop'])}")
            digest.update(json.dumps([*place, cipher, *extra]).encode())
        return digest.hexdigest()

    def part_list(self, document_id: str) -> str:
        """A digest of a document's parts: which exist, their order and their blocks."""
        parts = self.catalog.select("parts", "part_no", document_id=document_id)
        return hashlib.sha256(
            json.dumps(
                [[_plain(p[k]) for k in ("id", "part_no", "block_id")] for p in parts]
            ).encode()
        ).hexdigest()

    def _payload(self, table: Table, row: Mapping[str, Any]) -> str:
        values: dict[str, Any] = {"scheme": SEAL_SCHEME}
        values.update({k: _plain(row.get(k)) for k in SEALED[table]})
        if table == "conversations":
            values["transcript"] = self.transcript(str(row["id"]))
            for own in ("temperature", "max_tokens", "origin"):  # sealed where set
                if row.get(own) is not None:
                    values[own] = _plain(row.get(own))
            if isinstance(row.get("system_enc"), bytes):
                # Its own system prompt cannot be removed or swapped without breaking the
                # seal (the seals of conversations on a preset are what they always were).
                values["system"] = hashlib.sha256(row["system_enc"]).hexdigest()
        elif table == "parts" and isinstance(row.get("image_enc"), bytes):
            # A picture part's picture cannot be removed or swapped without breaking the
            # seal (a text part's seal is what it always was).
            values["picture"] = hashlib.sha256(row["image_enc"]).hexdigest()
        elif table == "documents":
            values["parts"] = self.part_list(str(row["id"]))
        elif table == "reply_versions" and row.get("stop") is not None:
            values["stop"] = _plain(row.get("stop"))  # sealed where recorded (schema 8)
        return json.dumps(values, sort_keys=True)

    def seal_value(self, table: Table, row: Mapping[str, Any]) -> bytes:
        """The seal for `row` as it stands (for an insert: the row about to be written)."""
        return bytes(
            self._fields().encrypt_text(self._payload(table, row), table, "seal", str(row["id"]))
        )

    def reseal(self, table: Table, row_id: str) -> None:
        """Seal a record again from the catalog (inside the caller's transaction)."""
        row = self.catalog.get(table, row_id)
        if row is not None:
            self.catalog.update(table, row_id, {"seal": self.seal_value(table, row)})

    def check(self, table: Table, row: Mapping[str, Any]) -> None:
        """Raise IntegrityError naming the record when it does not match its seal."""
        sealed = row.get("seal")
        try:
            found = self._fields().decrypt_text(sealed, table, "seal", str(row["id"]))
        except crypto.DecryptionFailed:
            found = None
        if found != self._payload(table, row):
            what = "its messages" if table == "conversations" else "its structure"
            raise IntegrityError(
                f"The catalog record of {_WHAT[table]} {row['id']} was edited ({what} or its "
                "latest checkpoint no longer match its seal); refused.",
                **AUDIT,
            )

    # -- auditing ------------------------------------------------------------------------
    def audit(self) -> list[str]:
        """Every private field decrypts where it stands, every record matches its seal, and
        every message belongs to a conversation: the problems found, one line each."""
        problems: list[str] = []
        fields = self._fields()
        for name, columns in ENCRYPTED.items():
            table = cast("Table", name)  # the catalog declares these names (names.Table)
            if table in ("meta", "blocks"):
                continue  # the wrapped catalog key opened; blocks are audited with their files
            for row in self.catalog.select(table):
                for column in columns:
                    if column == "seal" or (column in OPTIONAL and row.get(column) is None):
                        continue
                    try:
                        if table == "part_vectors":
                            fields.decrypt_bytes(row.get(column), table, "vectors", str(row["id"]))
                        elif table in ("routing_log", "usage"):
                            fields.decrypt_text(
                                row.get(column),
                                table,
                                column.removesuffix("_enc"),
                                str(row["id"]),
                            )
                        else:
                            self.decrypt(table, column, row)
                    except crypto.DecryptionFailed as exc:
                        problems.append(str(exc).split(";")[0])
                if table in SEALED:
                    try:
                        self.check(table, row)
                    except IntegrityError as exc:
                        problems.append(str(exc).split(";")[0])
        return problems + self._orphans()

    def _orphans(self) -> list[str]:
        """Rows whose owner's record is gone: a deleted record leaves its messages, parts
        and blocks behind, so a deletion is named rather than silently missing."""
        ids = {
            table: {r["id"] for r in self.catalog.select(table)}
            for table in ("conversations", "documents", "verified", "prompts")
        }
        ids["parts"] = {p["id"] for p in self.catalog.select("parts")}
        problems: list[str] = []
        for what, table, column, parents, parent in (
            ("Message {} belongs", "messages", "conversation_id", "conversations", "conversation"),
            (
                "Reply version {} belongs",
                "reply_versions",
                "conversation_id",
                "conversations",
                "conversation",
            ),
            (
                "API history entry {} belongs",
                "api_prefixes",
                "conversation_id",
                "conversations",
                "conversation",
            ),
            ("Document part {} belongs", "parts", "document_id", "documents", "document"),
            ("Passage vectors {} belong", "part_vectors", "part_id", "parts", "document part"),
        ):
            problems += [
                f"{what.format(r['id'])} to no {parent} ({r[column]})"
                for r in self.catalog.select(table)
                if r[column] not in ids[parents]
            ]
        problems += [
            f"Conversation {c['id']} is on a document that is not in the catalog"
            for c in self.catalog.select("conversations")
            if c["document_id"] and c["document_id"] not in ids["documents"]
        ]
        owner_table = {
            "conversation": "conversations",
            "document": "documents",
            "verified": "verified",
            "prompt": "prompts",
        }
        problems += [
            f"Block {b['id']} belongs to a {b['kind']} that is not in the catalog"
            for b in self.catalog.select("blocks")
            if b["owner_id"] not in ids.get(owner_table.get(b["kind"], ""), set())
        ]
        return problems

    # -- upgrading -----------------------------------------------------------------------
    def upgrade_from_v1(self) -> None:
        """Schema 1 bound a message's fields to its id only and sealed only pointers: bind
        every message to its place and seal every record (inside the caller's transaction)."""
        fields = self._fields()
        for m in self.catalog.select("messages"):
            changes: dict[str, Any] = {}
            for column in MESSAGE_FIELDS:
                if m.get(column):
                    text = fields.decrypt_text(
                        m[column], "messages", column.removesuffix("_enc"), str(m["id"])
                    )
                    changes[column] = self.encrypt("messages", column, m, text)
            if changes:
                self.catalog.update("messages", m["id"], changes)
        for table in ("parts", "documents", "conversations", "verified"):
            for row in self.catalog.select(table):
                self.reseal(table, row["id"])
