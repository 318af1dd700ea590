"""The vault of one data directory: master key (keyring), catalog, encrypted block files.

Envelope encryption: the master key (in the OS keyring only) wraps a catalog key and one
random data key per block. Rotation re-wraps those keys in one catalog transaction and never
re-encrypts payloads. Forgetting deletes the wrapped key with the block, so even a recovered
copy of the file is unreadable.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from galahad_desktop.errors import IntegrityError, KeyAccessError, NotFoundError, StorageError
from galahad_desktop.faults import crashpoint
from galahad_desktop.paths import ensure_private_dir
from galahad_desktop.system.files import create_private_file, fsync_dir
from galahad_desktop.system.lock import LOCK_NAME, DataDirLock
from galahad_desktop.vault import blockfile, crypto, custody, restoring
from galahad_desktop.vault.audit import audit as audit_vault
from galahad_desktop.vault.audit import remove_crash_leftovers
from galahad_desktop.vault.catalog import SCHEMA_VERSION, Catalog
from galahad_desktop.vault.held import HeldVault
from galahad_desktop.vault.keys import KeyringKeyStore, KeyStore, api_key_entry, entry_name
from galahad_desktop.vault.names import (
    BLOCK_ID,
    BLOCK_SUFFIX,
    AuditReport,
    BlockKind,
    BlockRow,
    block_file_of,
    given_back,
    new_id,
    tokens_digest,
)
from galahad_desktop.vault.records import Records

MAX_CHAIN = 100_000


def _catalog_key_aad(vault_id: str, key_id: str) -> bytes:
    return f"galahad-catalog-key/v1/{vault_id}/{key_id}".encode()


@dataclass
class StoredBlock:
    row: BlockRow
    meta: dict[str, Any]
    payload: ctypes.Array[ctypes.c_uint8]  # the vault's reusable buffer: first `size` bytes
    size: int
    tokens: list[int]
    read_ms: float

    @property
    def state(self) -> memoryview:
        return memoryview(self.payload).cast("B")[: self.size]


class Vault:
    def __init__(
        self,
        data_dir: Path,
        keystore: KeyStore | None = None,
        lock_timeout_s: float = 10.0,
        accept_older: bool = False,
        inspect_only: bool = False,
        recovered: tuple[str, ...] = (),
    ) -> None:
        """`accept_older`: open a copy older than the keystore's counter on purpose (a
        restore). `inspect_only`: open to audit, leaving the rollback counter alone (in the
        catalog and the keystore), and refusing nothing for its age: a check that is refused
        afterwards must not make the live directory look older than the keystore."""
        self.inspect_only = inspect_only
        # What the start repaired, in words (an interrupted restore or backup), for the
        # front ends to say once.
        self.recovered: list[str] = list(recovered)
        if not inspect_only:
            note, finished = restoring.recover_restore(Path(data_dir))
            if note and note not in self.recovered:  # the app's start may have said it
                self.recovered.append(note)
            accept_older = accept_older or finished
            crashpoint("restore-accepting")  # a restored copy's first open, before it counts
        made = _missing_paths(Path(data_dir))
        self.data_dir = ensure_private_dir(Path(data_dir))
        self.blocks_dir = ensure_private_dir(self.data_dir / "blocks")
        self._lock: DataDirLock | None = self._acquire_lock(lock_timeout_s)
        first_use = not (self.data_dir / Catalog.FILE_NAME).exists()
        try:
            self.keystore: KeyStore = keystore if keystore is not None else KeyringKeyStore()
            if first_use:
                # Key first: if the keyring refuses, no catalog is left behind.
                vault_id, key_id, master = (
                    secrets.token_hex(8),
                    secrets.token_hex(4),
                    crypto.new_key(),
                )
                self.keystore.put(entry_name(vault_id, key_id), master)
            self.catalog = Catalog(self.data_dir)
            self.records = Records(self.catalog, self._field_cipher)
            if first_use:
                catalog_key = crypto.new_key()
                with self.catalog.transaction():
                    self.catalog.meta_set("schema_version", str(SCHEMA_VERSION).encode())
                    self.catalog.meta_set("vault_id", vault_id.encode())
                    self.catalog.meta_set("active_key_id", key_id.encode())
                    self.catalog.meta_set(
                        "catalog_key_wrapped",
                        crypto.seal(master, catalog_key, _catalog_key_aad(vault_id, key_id)),
                    )
            self._unlock()
            self._upgrade_schema()
            self.generation = (
                custody.peek_generation(self)
                if inspect_only
                else custody.open_generation(self, accept_older)
            )
            if not inspect_only:
                restoring.accepted(self.data_dir)  # a restored copy now counts as current
                self.recovered += custody.recover_backups(self)
                self.recovered += remove_crash_leftovers(self)
        except BaseException:
            if hasattr(self, "catalog"):
                self.catalog.close()
            self._release_lock()
            if first_use and not hasattr(self, "catalog"):
                # Refused before anything was stored: leave no trace of the attempt.
                with contextlib.suppress(OSError):
                    (self.data_dir / LOCK_NAME).unlink()
                _remove_if_empty([self.blocks_dir, *made])
            raise

    def _upgrade_schema(self) -> None:
        """Refuse a catalog from a newer Galahad; bring an older one up to date in one
        transaction (a crash leaves it as it was)."""
        raw = self.catalog.meta_get("schema_version")
        try:
            version = int((raw or b"").decode())
        except (UnicodeDecodeError, ValueError):
            raise IntegrityError(
                "The catalog's schema version is missing or damaged; refused. Nothing was changed."
            ) from None
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"This data directory was written by a newer Galahad (catalog schema "
                f"{version}; this one reads up to {SCHEMA_VERSION}). Update Galahad to open "
                "it; nothing was changed."
            )
        if version < 1:
            raise IntegrityError(f"The catalog's schema version ({version}) is not valid.")

        if version < SCHEMA_VERSION:
            # 2 -> 3 only adds the part_vectors table (created empty when the catalog opened).
            with self.catalog.transaction():
                if version == 1:
                    self.records.upgrade_from_v1()
                self.catalog.meta_set("schema_version", str(SCHEMA_VERSION).encode())

    # -- locking -------------------------------------------------------------------------
    def _acquire_lock(self, timeout_s: float) -> DataDirLock:
        lock = DataDirLock(self.data_dir, timeout_s)
        lock.acquire()
        return lock

    def _release_lock(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()
            self._lock = None

    def close(self) -> None:
        if hasattr(self, "catalog") and not self.locked and not self.inspect_only:
            custody.close_generation(self)
        self.lock()
        if hasattr(self, "catalog"):
            self.catalog.close()
        self._release_lock()

    # -- keys ----------------------------------------------------------------------------
    @property
    def vault_id(self) -> str:
        return self._meta_text("vault_id")

    @property
    def key_id(self) -> str:
        return self._meta_text("active_key_id")

    def _meta_text(self, key: str) -> str:
        value = self.catalog.meta_get(key)
        if value is None:
            raise IntegrityError(f"The catalog is missing its '{key}' entry.")
        try:
            text = bytes(value).decode("ascii")
        except (UnicodeDecodeError, TypeError):
            raise IntegrityError(f"The catalog's '{key}' entry is damaged.") from None
        if not text.isalnum():
            raise IntegrityError(f"The catalog's '{key}' entry is damaged.")
        return text

    def _master_key(self) -> bytes:
        master = self.keystore.get(entry_name(self.vault_id, self.key_id))
        if master is None:
            raise KeyAccessError(
                f"The master key for {self.data_dir} is not in the keyring "
                f"({self.keystore.backend_name}). Without it the stored data cannot be opened."
            )
        if len(master) != crypto.KEY_BYTES:
            raise KeyAccessError(
                f"The keyring entry for {self.data_dir} holds {len(master)} bytes, not a "
                f"{crypto.KEY_BYTES}-byte master key: it was changed outside Galahad. Nothing "
                "was read or changed."
            )
        return master

    def _unlock(self) -> None:
        master = self._master_key()
        wrapped = self.catalog.meta_get("catalog_key_wrapped")
        if wrapped is None:
            raise IntegrityError("The catalog is missing its wrapped key.")
        try:
            catalog_key = crypto.open_sealed(
                master, wrapped, _catalog_key_aad(self.vault_id, self.key_id)
            )
        except crypto.DecryptionFailed:
            raise KeyAccessError(
                "The master key in the keyring does not open this data directory (wrong key). "
                "Nothing was changed."
            ) from None
        self._master: bytes | None = master
        self._cipher: crypto.FieldCipher | None = crypto.FieldCipher(catalog_key)
        self._finish_rotation()

    @property
    def locked(self) -> bool:
        return getattr(self, "_master", None) is None

    def lock(self) -> None:
        """Drop key material and decrypted state from memory; `unlock()` fetches the key
        from the keyring again."""
        self._wipe_buffer()
        self._master = None
        self._cipher = None

    def unlock(self) -> None:
        if self.locked:
            self._unlock()

    def _field_cipher(self) -> crypto.FieldCipher:
        cipher: crypto.FieldCipher | None = getattr(self, "_cipher", None)
        if self.locked or cipher is None:
            raise KeyAccessError("The vault is locked. Unlock it to continue.")
        return cipher

    @property
    def fields(self) -> crypto.FieldCipher:
        """The catalog's field cipher; after lock() every use raises the locked error."""
        return self._field_cipher()

    def _require_master(self) -> bytes:
        if self._master is None:
            raise KeyAccessError("The vault is locked. Unlock it to continue.")
        return self._master

    def api_key(self, rotate: bool = False) -> bytes:
        """The local API server's bearer key (32 random bytes), made on first use and kept
        in the keystore beside the master key, never in a file; `rotate` replaces it."""
        self._require_master()
        name = api_key_entry(self.vault_id)
        key = None if rotate else self.keystore.get(name)
        if key is None or len(key) != crypto.KEY_BYTES:
            key = secrets.token_bytes(crypto.KEY_BYTES)
            self.keystore.put(name, key)
        return key

    def rotate_master_key(self) -> str:
        """Re-wrap the catalog key and every block key under a fresh master key.

        Crash-safe: the new key id is recorded as pending before the key is stored, and the
        old one as retired in the same transaction that switches over; whatever a crash
        leaves behind is finished or undone the next time the vault opens.
        """
        old_master = self._require_master()
        old_key_id, vault_id = self.key_id, self.vault_id
        new_key_id, new_master = secrets.token_hex(4), crypto.new_key()
        with self.catalog.transaction():
            self.catalog.meta_set("pending_key_id", new_key_id.encode())
        self.keystore.put(entry_name(vault_id, new_key_id), new_master)
        crashpoint("rotate-after-put")
        wrapped_catalog = self.catalog.meta_get("catalog_key_wrapped")
        assert wrapped_catalog is not None
        catalog_key = crypto.open_sealed(
            old_master, wrapped_catalog, _catalog_key_aad(vault_id, old_key_id)
        )
        with self.catalog.transaction():
            for row in self.catalog.select("blocks"):
                aad = crypto.key_wrap_aad(row["id"], row["owner_id"])
                data_key = crypto.open_sealed(old_master, row["wrapped_key"], aad)
                self.catalog.update(
                    "blocks", row["id"], {"wrapped_key": crypto.seal(new_master, data_key, aad)}
                )
            crashpoint("rotate-before-commit")
            self.catalog.meta_set(
                "catalog_key_wrapped",
                crypto.seal(new_master, catalog_key, _catalog_key_aad(vault_id, new_key_id)),
            )
            self.catalog.meta_set("active_key_id", new_key_id.encode())
            # The old key is kept (backups and copies made before need it) until the user
            # drops it: `galahad keys drop-retired`.
            self.catalog.meta_set(
                "retired_key_ids", json.dumps([*self.retired_key_ids(), old_key_id]).encode()
            )
            self.catalog.meta_delete("pending_key_id")
        crashpoint("rotate-after-commit")
        self._master = new_master
        self._finish_rotation()
        return new_key_id

    def _finish_rotation(self) -> None:
        """Finish or undo what a rotation left behind: a key stored but never committed
        (pending) is removed; a catalog from before retired keys were kept lists its one."""
        active = self.key_id
        pending = self.catalog.meta_get("pending_key_id")
        if pending is not None:
            if pending.decode("ascii", "replace") != active:
                self.keystore.delete(entry_name(self.vault_id, pending.decode("ascii", "replace")))
            with self.catalog.transaction():
                self.catalog.meta_delete("pending_key_id")
        legacy = self.catalog.meta_get("retired_key_id")
        if legacy is not None:
            old = legacy.decode("ascii", "replace")
            with self.catalog.transaction():
                if old != active:
                    self.catalog.meta_set(
                        "retired_key_ids", json.dumps([*self.retired_key_ids(), old]).encode()
                    )
                self.catalog.meta_delete("retired_key_id")

    def retired_key_ids(self) -> list[str]:
        raw = self.catalog.meta_get("retired_key_ids")
        try:
            ids = json.loads(raw) if raw else []
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise IntegrityError("The catalog's list of retired keys is damaged.")
        return [str(i) for i in ids]

    # -- blocks --------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with self.catalog.transaction():
            yield

    def block_path(self, block_id: str) -> Path:
        return self.blocks_dir / f"{block_id}{BLOCK_SUFFIX}"

    def write_block(
        self,
        *,
        kind: BlockKind,
        owner_id: str,
        parent_id: str | None,
        tokens: list[int],
        generation: int,
        fingerprint: str,
        payload: memoryview,
        sealed_meta: dict[str, Any],
        capture_ms: float,
        chunk_bytes: int = blockfile.CHUNK_BYTES,
        pos_start: int = 0,
        rewrite_of: str | None = None,
        model_sha256: str = "",
    ) -> BlockRow:
        """Encrypt and write a block file; return its catalog row, to insert in a transaction.

        The file is complete and durable before the row exists; a crash in between leaves an
        orphan file that the audit reports and removes, never a row without its file.
        """
        master = self._require_master()
        # A rewrite keeps the block's id (links continue from it) in a new file, so the old
        # file stays valid until the catalog transaction that switches to the new one.
        block_id = rewrite_of or new_id("b")
        data_key = crypto.new_key()
        header = blockfile.BlockHeader(
            block_id=block_id,
            kind=kind,
            owner_id=owner_id,
            parent_id=parent_id,
            pos_start=pos_start,
            pos_end=pos_start + len(tokens),
            n_tokens=len(tokens),
            generation=generation,
            fingerprint=fingerprint,
            created_at=time.time(),
            payload_bytes=len(payload),
            chunk_bytes=chunk_bytes,
            nonce_prefix=blockfile.new_nonce_prefix(),
        )
        path = self.block_path(block_id)
        if rewrite_of:
            path = path.with_name(f"{block_id}-{secrets.token_hex(4)}{BLOCK_SUFFIX}")
        digest, size = blockfile.write_block(path, header, sealed_meta, data_key, payload)
        token_bytes = np.asarray(tokens, dtype="<i4").tobytes()
        return {
            "id": block_id,
            "kind": kind,
            "owner_id": owner_id,
            "parent_id": parent_id,
            "pos_start": pos_start,
            "pos_end": pos_start + len(tokens),
            "n_tokens": len(tokens),
            "generation": generation,
            "fingerprint": fingerprint,
            "model_sha256": model_sha256 or None,
            "file_name": path.name,
            "file_bytes": size,
            "header_sha256": digest,
            "wrapped_key": crypto.seal(master, data_key, crypto.key_wrap_aad(block_id, owner_id)),
            "tokens_enc": self.fields.encrypt_bytes(token_bytes, "blocks", "tokens", block_id),
            "payload_bytes": len(payload),
            "capture_ms": capture_ms,
            "created_at": header.created_at,
        }

    def block_row(self, block_id: str) -> BlockRow:
        row = self.records.block(block_id)
        if row is None:
            raise NotFoundError(f"No stored block has the id '{block_id}'.")
        return row

    def block_tokens(self, row: BlockRow) -> list[int]:
        try:
            raw = self.fields.decrypt_bytes(row["tokens_enc"], "blocks", "tokens", row["id"])
        except crypto.DecryptionFailed:
            raise IntegrityError(
                f"The token record of block {row['id']} failed authentication."
            ) from None
        return list(np.frombuffer(raw, dtype="<i4").tolist())

    def _check_header(self, row: BlockRow, header: blockfile.BlockHeader) -> None:
        expected = {
            "block_id": row["id"],
            "kind": row["kind"],
            "owner_id": row["owner_id"],
            "parent_id": row["parent_id"],
            "pos_start": row["pos_start"],
            "pos_end": row["pos_end"],
            "n_tokens": row["n_tokens"],
            "generation": row["generation"],
            "fingerprint": row["fingerprint"],
            "payload_bytes": row["payload_bytes"],
        }
        for name, want in expected.items():
            if getattr(header, name) != want:
                raise IntegrityError(
                    f"Block {row['id']} was refused: its file's {name} does not match the "
                    "catalog (the file was swapped, replaced by an older copy, or edited)."
                )

    def _data_key(self, row: BlockRow) -> bytes:
        master = self._require_master()
        try:
            return crypto.open_sealed(
                master, row["wrapped_key"], crypto.key_wrap_aad(row["id"], row["owner_id"])
            )
        except crypto.DecryptionFailed:
            raise IntegrityError(
                f"The key of block {row['id']} failed authentication (wrong master key or "
                "an edited catalog)."
            ) from None

    def authenticate_file(
        self, row: BlockRow, path: Path, header: blockfile.BlockHeader
    ) -> dict[str, Any]:
        """Check a block file against its catalog row and authenticate it with its own key,
        without keeping the decrypted payload (what audit does to every block); returns its
        sealed meta. Raises IntegrityError or BlockFormatError on any mismatch."""
        self._check_header(row, header)
        _header, meta, _payload = blockfile.read_block(
            path, self._data_key(row), row["header_sha256"], keep_payload=False
        )
        return meta

    def read_block(
        self,
        block_id: str,
        expected_owner: str | None = None,
        buffer_for: Callable[[int], ctypes.Array[ctypes.c_uint8]] | None = None,
    ) -> StoredBlock:
        """Read, authenticate and decrypt a block. Raises IntegrityError on any mismatch."""
        start = time.perf_counter()
        row = self.block_row(block_id)
        if expected_owner is not None and row["owner_id"] != expected_owner:
            raise IntegrityError(
                f"Block {block_id} belongs to {row['owner_id']}, not {expected_owner}; refused."
            )
        if given_back(row):
            raise NotFoundError(
                f"Block {block_id} was given back to the disk budget; it is re-read when needed."
            )
        path = self.blocks_dir / block_file_of(row)
        if path.is_symlink():
            raise IntegrityError(f"Block {block_id} was refused: its file is a link; refused.")
        try:
            size = path.lstat().st_size
        except FileNotFoundError:
            raise IntegrityError(f"The file of block {block_id} is missing.") from None
        if size != row["file_bytes"]:
            raise IntegrityError(
                f"Block {block_id} was refused: the file is {size} bytes, the catalog "
                f"recorded {row['file_bytes']} (truncated or extended)."
            )
        data_key = self._data_key(row)
        try:
            header, meta, payload = blockfile.read_block(
                path, data_key, row["header_sha256"], buffer_for=buffer_for or self._state_buffer
            )
        except blockfile.BlockFormatError as exc:
            raise IntegrityError(f"Block {block_id} was refused: {exc}.") from None
        self._check_header(row, header)
        tokens = self.block_tokens(row)
        if meta.get("tokens_sha256") != tokens_digest(tokens):
            raise IntegrityError(
                f"Block {block_id} was refused: its token record does not match the block."
            )
        assert payload is not None
        return StoredBlock(
            row, meta, payload, header.payload_bytes, tokens, (time.perf_counter() - start) * 1e3
        )

    def chain_rows(self, block_id: str) -> list[BlockRow]:
        """The block and its ancestors, root first. Each link must start where its parent
        ends; a missing parent or a loop is an IntegrityError."""
        chain = [self.block_row(block_id)]
        seen = {block_id}
        while chain[-1]["parent_id"]:
            parent_id = chain[-1]["parent_id"]
            if parent_id in seen or len(chain) > MAX_CHAIN:
                raise IntegrityError(f"The chain of block {block_id} loops; refused.")
            parent = self.records.block(parent_id)
            if parent is None:
                raise IntegrityError(
                    f"Block {chain[-1]['id']} continues block {parent_id}, which is missing."
                )
            if parent["pos_end"] != chain[-1]["pos_start"]:
                raise IntegrityError(
                    f"Block {chain[-1]['id']} starts at position {chain[-1]['pos_start']} but "
                    f"its parent {parent_id} ends at {parent['pos_end']}; refused."
                )
            seen.add(parent_id)
            chain.append(parent)
        chain.reverse()
        if chain[0]["pos_start"] != 0:
            raise IntegrityError(f"The chain of block {block_id} does not start at position 0.")
        return chain

    def chain_tokens(self, block_id: str) -> list[int]:
        """The whole token ledger up to the end of a block (every link's tokens, in order)."""
        tokens: list[int] = []
        for row in self.chain_rows(block_id):
            tokens += self.block_tokens(row)
        return tokens

    def read_links(self, block_id: str, owners: set[str]) -> list[StoredBlock]:
        """Read and authenticate every link of a block's chain, root first. Every link must
        belong to one of `owners`, and their tokens must make up the head's sealed ledger.
        The root is decrypted into the vault's reusable buffer; the caller splices the
        links (engine.kvstate) and then wipes them (`wipe`)."""
        rows = self.chain_rows(block_id)
        for row in rows:
            if row["owner_id"] not in owners:
                raise IntegrityError(
                    f"Block {row['id']} in the chain of {block_id} belongs to "
                    f"{row['owner_id']}; refused."
                )
        if len(rows) == 1:
            return [self.read_block(block_id)]
        links = [self.read_block(rows[0]["id"])]
        links_buffer = self._links_buffer(rows[1:])
        links += [self.read_block(row["id"], buffer_for=links_buffer) for row in rows[1:]]
        tokens = [t for link in links for t in link.tokens]
        if links[-1].meta.get("ledger_sha256") != tokens_digest(tokens):
            raise IntegrityError(
                f"Block {block_id} was refused: its chain's token ledger does not match."
            )
        return links

    def splice_buffer(self, size: int) -> ctypes.Array[ctypes.c_uint8]:
        """A reusable buffer for the spliced state of a chain (wiped on lock)."""
        return self._reusable("_spliced", size)

    @staticmethod
    def wipe(blocks: list[StoredBlock]) -> None:
        """Zero decrypted state that is no longer needed (never just drop it)."""
        for block in blocks:
            ctypes.memset(block.payload, 0, ctypes.sizeof(block.payload))

    def children(self, block_id: str) -> list[str]:
        return [r["id"] for r in self.catalog.select("blocks", parent_id=block_id)]

    def _state_buffer(self, size: int) -> ctypes.Array[ctypes.c_uint8]:
        """One decryption buffer, reused: llama.cpp copies the state out of it, and fresh
        pages for every restore cost more than the decryption (first-touch page faults)."""
        return self._reusable("_buffer", size)

    def _links_buffer(self, rows: list[BlockRow]) -> Callable[[int], ctypes.Array[ctypes.c_uint8]]:
        """Consecutive pieces of one reusable buffer for a chain's links after the root: at
        real Gemma 4 sizes each link holds its turn's window-layer cells (15-80 MB), and
        fresh pages for them cost a sixth of a resume."""
        whole = self._reusable("_links", sum(int(row["payload_bytes"]) for row in rows))
        taken = 0

        def piece(size: int) -> ctypes.Array[ctypes.c_uint8]:
            nonlocal taken
            if taken + size > ctypes.sizeof(whole):
                raise IntegrityError("A link of the chain is larger than the catalog says.")
            out = (ctypes.c_uint8 * size).from_buffer(whole, taken)
            taken += size
            return out

        return piece

    def _reusable(self, name: str, size: int) -> ctypes.Array[ctypes.c_uint8]:
        buffer: ctypes.Array[ctypes.c_uint8] | None = getattr(self, name, None)
        if buffer is None or ctypes.sizeof(buffer) < size:
            if buffer is not None:  # decrypted state: wipe before letting it go
                ctypes.memset(buffer, 0, ctypes.sizeof(buffer))
            buffer = (ctypes.c_uint8 * size)()
            setattr(self, name, buffer)
        return buffer

    def _wipe_buffer(self) -> None:
        for name in ("_buffer", "_spliced", "_links"):
            buffer = getattr(self, name, None)
            if buffer is not None:
                ctypes.memset(buffer, 0, ctypes.sizeof(buffer))
                setattr(self, name, None)

    def delete_block_rows(self, block_ids: list[str]) -> None:
        """Delete catalog rows (and so the wrapped keys) inside the caller's transaction."""
        self.catalog.delete_in("blocks", "id", block_ids)

    def unlink_block_files(self, block_ids: list[str], keep: set[str] | None = None) -> None:
        """After the transaction committed: remove the files of deleted blocks (a rewritten
        block's earlier files too); `keep` names files still in use."""
        for block_id in block_ids:
            if not BLOCK_ID.fullmatch(block_id):
                continue  # never a pattern from an edited catalog
            for path in self.blocks_dir.glob(f"{block_id}*{BLOCK_SUFFIX}"):
                if keep is None or path.name not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
        fsync_dir(self.blocks_dir)

    # -- audit ---------------------------------------------------------------------------
    def audit(self, repair: bool = False) -> AuditReport:
        """Every block file, every catalog record and the blocks folder, checked."""

        return audit_vault(self, repair)


def _missing_paths(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


def _remove_if_empty(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()


__all__ = ["AuditReport", "StoredBlock", "Vault", "create_private_file", "new_id", "tokens_digest"]


def _the_vault_is_what_custody_holds(vault: Vault) -> HeldVault:
    return vault  # mypy checks the structural match here
