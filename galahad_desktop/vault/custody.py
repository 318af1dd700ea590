"""Custody of keys and copies: the rollback counter, backups, restore and the recovery kit.

- **Rollback counter.** A generation number is kept twice: sealed in the catalog (under the
  catalog key) and beside the master key in the keystore. Each open and each close advances
  both, catalog first. A directory whose catalog is behind the keystore is an older copy put
  back (catalog and blocks together, which every per-block check accepts): refused, unless
  restored on purpose (`galahad restore`).
- **Backups** (`galahad backup DEST`) are consistent, still-encrypted snapshots taken under the
  data directory's lock, and recorded (destination encrypted) so a key rotation can say
  which backups need the key it retires. Retired keys are kept until the user drops them.
- **Recovery kit** (`galahad keys export`): the vault's master keys, active and retired,
  wrapped under a recovery passphrase (scrypt, parameters bound in the associated data).
  `galahad keys import` puts them in this machine's keystore so a backup opens anywhere.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from galahad_desktop.errors import (
    DiskFullError,
    GalahadError,
    InputError,
    IntegrityError,
    KeyAccessError,
    StorageError,
    user_path,
)
from galahad_desktop.faults import crashpoint
from galahad_desktop.paths import ensure_private_dir
from galahad_desktop.system.files import (
    atomic_write_bytes,
    check_export_destination,
    fsync_dir,
    open_plain_file,
    open_private,
    read_regular_file,
)
from galahad_desktop.vault import crypto
from galahad_desktop.vault.held import HeldVault
from galahad_desktop.vault.keys import (
    KeyStore,
    PassphraseKeyStore,
    check_scrypt_params,
    entry_name,
)
from galahad_desktop.vault.names import block_file_of, given_back, new_id

KIT_FORMAT = "galahad-recovery-kit/1"
KIT_SCRYPT = (2**16, 8, 1)
MIN_RECOVERY_PASSPHRASE = 12
MIN_RECOVERY_SCORE = 3  # zxcvbn: 0 (too guessable) … 4 (very unguessable)
# A kit's scrypt may cost at most twice what Galahad writes: an edited kit asking for the
# allowed maximum would make every wrong passphrase take many seconds to reject.
KIT_SCRYPT_MAX = (2**17, 8, 1)
COPIED_FILES = ("catalog.sqlite", "settings.json", "passphrase-keys.json")
PENDING = -1  # a backup record's generation while the backup is being made
BACKUP_TMP = ".tmp-galahad-backup-"  # + the record's id: the backup being made


# -- the rollback counter ----------------------------------------------------------------
def _generation_entry(vault_id: str) -> str:
    return f"generation/{vault_id}"


def _catalog_generation(vault: HeldVault) -> int:
    blob = vault.catalog.meta_get("generation")
    if blob is None:
        return 0  # a catalog from before the counter
    try:
        raw = vault.fields.decrypt_bytes(blob, "meta", "generation", vault.vault_id)
    except crypto.DecryptionFailed:
        raise IntegrityError(
            "The catalog's generation counter failed authentication (the catalog was "
            "edited); refused. Nothing was changed."
        ) from None
    return int.from_bytes(raw, "big")


def _keystore_generation(vault: HeldVault) -> int:
    raw = vault.keystore.get(_generation_entry(vault.vault_id))
    if raw is None:
        return 0  # a keystore that never saw this directory (a new machine, a kit import)
    if len(raw) != 8:
        raise KeyAccessError(
            f"The keystore entry '{_generation_entry(vault.vault_id)}' was changed outside "
            "Galahad (wrong length)."
        )
    return int.from_bytes(raw, "big")


def _advance(vault: HeldVault, generation: int) -> None:
    value = generation.to_bytes(8, "big")
    with vault.catalog.transaction():
        vault.catalog.meta_set(
            "generation", vault.fields.encrypt_bytes(value, "meta", "generation", vault.vault_id)
        )
    # Catalog first: a crash in between leaves the catalog ahead, which is accepted.
    vault.keystore.put(_generation_entry(vault.vault_id), value)


def peek_generation(vault: HeldVault) -> int:
    """The catalog's generation, authenticated, without advancing anything."""
    return _catalog_generation(vault)


def open_generation(vault: HeldVault, accept_older: bool) -> int:
    mine, known = _catalog_generation(vault), _keystore_generation(vault)
    if mine < known and not accept_older:
        raise IntegrityError(
            f"{vault.data_dir} is an older copy of this data directory (generation {mine}; "
            f"this computer has since opened generation {known}). Opening it would silently "
            "undo newer changes, so it was refused and nothing was changed. To go back to "
            f"this copy on purpose, run: galahad restore {vault.data_dir}"
        )
    generation = max(mine, known) + 1
    try:
        _advance(vault, generation)
    except (GalahadError, OSError, sqlite3.Error):
        # A full disk or a keyring that will not write must not lock the user out of
        # reading their history: this session simply does not advance the counter (an older
        # copy is still refused; only a copy taken during this session would go unnoticed).
        return max(mine, known)
    return generation


def close_generation(vault: HeldVault) -> None:
    """Advance again on close, so a copy taken while the directory was open is older too."""
    with contextlib.suppress(GalahadError, OSError, sqlite3.Error):
        _advance(vault, max(vault.generation, _keystore_generation(vault)) + 1)


# -- backups -----------------------------------------------------------------------------
@dataclass
class BackupResult:
    path: str
    files: int
    bytes: int
    key_id: str
    generation: int


def _empty_target(dest: Path, what: str) -> Path:
    dest = user_path(dest)
    if dest.is_symlink():
        raise InputError(
            f"{dest} is a symbolic link; choose a new {what} (links are not followed)."
        )
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError(f"{dest} already exists and is not an empty folder; choose a new {what}.")
    if not dest.parent.is_dir():
        raise InputError(f"The folder {dest.parent} does not exist.")
    return dest


def copy_file(source: Path, target: Path) -> int:
    """Copy a regular file, never through a link: anything else is an IntegrityError naming
    it (a backup holding a link could copy /etc/shadow into the data directory)."""
    src = open_plain_file(source)
    if src is None:
        raise IntegrityError(
            f"{source} is not a regular file (a link, a device or unreadable); refused. "
            "Nothing was changed."
        )
    with src:
        fd = open_private(target)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out, 4 * 1024 * 1024)
            out.flush()
            os.fsync(out.fileno())
    return target.stat().st_size


def backup(vault: HeldVault, dest: Path) -> BackupResult:
    """A consistent, still-encrypted copy of the catalog and every block file, made while
    this process holds the data directory's lock (nothing else can write meanwhile)."""

    dest = _empty_target(Path(dest), "folder for the backup")
    if dest.resolve().is_relative_to(vault.data_dir.resolve()):
        raise InputError("A backup cannot be stored inside the data directory it copies.")
    files, size = 0, 0
    # Recorded first, so the backup lists itself too: a directory restored from it still
    # knows which key that backup needs when a later rotation retires it. The record is
    # pending (generation -1) until the backup is in place: a backup killed halfway leaves
    # a record the next start removes, with the temporary folder its id names.
    row: dict[str, Any] = {
        "id": new_id("k"),
        "at": time.time(),
        "key_id": vault.key_id,
        "generation": PENDING,
    }
    tmp = dest.parent / f"{BACKUP_TMP}{row['id']}"
    row["dest_enc"] = vault.records.encrypt("backups", "dest_enc", row, str(dest.resolve()))
    with vault.catalog.transaction():
        vault.catalog.insert("backups", row)
    try:
        ensure_private_dir(tmp / "blocks")
        target = sqlite3.connect(tmp / "catalog.sqlite")
        try:
            vault.catalog.db.conn.backup(target)  # SQLite's online backup: one snapshot
            # In the copy, its own record is complete (the copy exists only once it is).
            target.execute(
                "UPDATE backups SET generation = ? WHERE id = ?", (vault.generation, row["id"])
            )
            target.commit()
        finally:
            target.close()
        os.chmod(tmp / "catalog.sqlite", 0o600)
        files, size = 1, (tmp / "catalog.sqlite").stat().st_size
        for name in COPIED_FILES[1:]:
            if (vault.data_dir / name).is_file():
                size += copy_file(vault.data_dir / name, tmp / name)
                files += 1
        for block in vault.catalog.select("blocks"):
            if given_back(block):
                continue  # its file is gone; its row and ledger are copied with the catalog
            name = block_file_of(block)
            size += copy_file(vault.blocks_dir / name, tmp / "blocks" / name)
            files += 1
        fsync_dir(tmp / "blocks")
        fsync_dir(tmp)
        crashpoint("backup-copied")
        if dest.exists():
            dest.rmdir()  # the empty folder the user named
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
        with vault.catalog.transaction():
            vault.catalog.update("backups", row["id"], {"generation": vault.generation})
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        with vault.catalog.transaction():
            vault.catalog.delete("backups", id=row["id"])
        if isinstance(exc, sqlite3.Error):  # SQLite's copy hit a full or read-only disk
            kind = DiskFullError if "full" in str(exc).lower() else StorageError
            raise kind(
                f"The backup could not be written to {dest.parent} ({exc}); nothing was kept "
                "there and the data directory is unchanged."
            ) from None
        raise
    return BackupResult(str(dest), files, size, vault.key_id, vault.generation)


@dataclass
class BackupRecord:
    id: str
    at: float
    path: str
    key_id: str


def backups(vault: HeldVault) -> list[BackupRecord]:
    """The backups that were completed (a pending record is a backup still being made, or
    one that was interrupted)."""
    return [
        BackupRecord(r["id"], r["at"], vault.records.decrypt("backups", "dest_enc", r), r["key_id"])
        for r in vault.catalog.select("backups", "at")
        if (r["generation"] or 0) >= 0
    ]


def recover_backups(vault: HeldVault) -> list[str]:
    """At start: a backup interrupted halfway (kill -9, power loss) left a pending record
    and a temporary folder beside its destination; the folder is removed and the record
    dropped, or, when the backup had been put in place, the record completed."""
    notes: list[str] = []
    for r in vault.catalog.select("backups", generation=PENDING):
        try:
            dest = Path(vault.records.decrypt("backups", "dest_enc", r))
        except IntegrityError:
            continue  # the audit names a damaged record; nothing is removed on its account
        tmp = dest.parent / f"{BACKUP_TMP}{r['id']}"
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        finished = _backup_generation(dest / "catalog.sqlite", str(r["id"]))
        with vault.catalog.transaction():
            if finished is not None:
                vault.catalog.update("backups", r["id"], {"generation": finished})
            else:
                vault.catalog.delete("backups", id=r["id"])
        notes.append(
            f"The backup to {dest} had been completed; its record is kept."
            if finished is not None
            else f"The backup to {dest} was interrupted; its temporary copy was removed "
            "(make it again)."
        )
    return notes


def _backup_generation(catalog: Path, record_id: str) -> int | None:
    """The generation a finished backup's own record holds (None: no such backup)."""
    if not catalog.is_file() or catalog.is_symlink():
        return None
    try:
        conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT generation FROM backups WHERE id = ?", (record_id,)
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return int(found[0]) if found and isinstance(found[0], int) and found[0] >= 0 else None


def stranded_by(vault: HeldVault, key_ids: list[str]) -> list[BackupRecord]:
    """Backups that need one of `key_ids` from this machine's keystore (a passphrase
    directory's backup carries its own key file, wrapped under the same passphrase)."""
    if isinstance(vault.keystore, PassphraseKeyStore):
        return []
    return [b for b in backups(vault) if b.key_id in key_ids]


def drop_retired(vault: HeldVault, confirmed: bool) -> tuple[list[str], list[BackupRecord]]:
    retired = vault.retired_key_ids()
    stranded = stranded_by(vault, retired)
    if stranded and not confirmed:
        raise InputError(
            f"Dropping the retired keys makes {len(stranded)} backup(s) unreadable without a "
            "recovery kit that holds them: "
            + "; ".join(b.path for b in stranded)
            + ". Export a kit first (galahad keys export), or confirm with --yes."
        )
    for key_id in retired:
        vault.keystore.delete(entry_name(vault.vault_id, key_id))
    with vault.catalog.transaction():
        vault.catalog.meta_delete("retired_key_ids")
    return retired, stranded


# -- the recovery kit --------------------------------------------------------------------
def _kit_aad(vault_id: str, key_id: str, params: dict[str, Any]) -> bytes:
    bound = json.dumps(params, sort_keys=True)
    return f"galahad-kit/v1/{vault_id}/{key_id}/{bound}".encode()


def _kit_kek(passphrase: str, params: dict[str, Any]) -> bytes:
    salt = base64.b64decode(params["salt"])
    return Scrypt(salt=salt, length=32, n=params["n"], r=params["r"], p=params["p"]).derive(
        passphrase.encode("utf-8")
    )


def check_recovery_passphrase(passphrase: str) -> None:
    """At least 12 characters, 6 different ones, and not guessable: zxcvbn's estimate (words,
    names, keyboard runs, repeats, dates) must reach 3 of 4 ("safely unguessable")."""
    if len(passphrase) < MIN_RECOVERY_PASSPHRASE or len(set(passphrase)) < 6:
        raise InputError(
            f"A recovery passphrase needs at least {MIN_RECOVERY_PASSPHRASE} characters and "
            "6 different ones: it alone protects every key in the kit."
        )
    from zxcvbn import zxcvbn

    estimate = zxcvbn(passphrase[:100])  # its time grows with length; 100 is plenty
    if estimate["score"] < MIN_RECOVERY_SCORE:
        hint = (estimate.get("feedback") or {}).get("warning") or "it is too easy to guess"
        raise InputError(
            f"That recovery passphrase is too easy to guess ({hint.rstrip('.')}); use a few "
            "unrelated words or a longer phrase: it alone protects every key in the kit."
        )


def export_kit(vault: HeldVault, passphrase: str, out: Path) -> list[str]:
    check_recovery_passphrase(passphrase)
    out = user_path(out)
    if out.exists() and not out.is_symlink():
        raise InputError(f"{out} already exists; choose a new file for the recovery kit.")
    # Never inside the data directory (the audit would call it a stranger; a kit kept
    # beside what it protects is lost with it), never through a link or onto a device.
    out = check_export_destination(out, vault.data_dir, force=False)
    n, r, p = KIT_SCRYPT
    params = {"n": n, "r": r, "p": p, "salt": base64.b64encode(os.urandom(16)).decode()}
    kek = _kit_kek(passphrase, params)
    keys: dict[str, str] = {}
    for key_id in [vault.key_id, *vault.retired_key_ids()]:
        master = vault.keystore.get(entry_name(vault.vault_id, key_id))
        if master is not None:
            aad = _kit_aad(vault.vault_id, key_id, params)
            keys[key_id] = base64.b64encode(crypto.seal(kek, master, aad)).decode()
    kit = {"format": KIT_FORMAT, "vault_id": vault.vault_id, "scrypt": params, "keys": keys}
    atomic_write_bytes(out, json.dumps(kit, indent=1).encode("utf-8"))
    return list(keys)


def _read_kit(path: Path) -> dict[str, Any]:
    try:
        # A kit is a few KiB: a larger file, a device or a FIFO is not one.
        kit = json.loads(read_regular_file(user_path(path), 1024 * 1024, "a recovery kit"))
    except (ValueError, RecursionError):
        raise InputError(f"{path} is not a Galahad recovery kit (not readable JSON).") from None
    ok = (
        isinstance(kit, dict)
        and kit.get("format") == KIT_FORMAT
        and isinstance(kit.get("vault_id"), str)
        and isinstance(kit.get("scrypt"), dict)
        and isinstance(kit.get("keys"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in kit["keys"].items())
    )
    if not ok:
        raise InputError(f"{path} is not a Galahad recovery kit.")
    if not kit["keys"]:
        raise InputError(f"{path} holds no keys: it cannot open anything. Nothing was changed.")
    check_scrypt_params(kit["scrypt"], str(path))
    if any(kit["scrypt"][k] > most for k, most in zip("nrp", KIT_SCRYPT_MAX, strict=True)):
        raise KeyAccessError(
            f"The key-derivation parameters in {path} ask for more work than a Galahad kit "
            "uses; refused (the file was edited)."
        )
    return dict(kit)


def catalog_identity(data_dir: Path) -> tuple[str, str]:
    """(vault id, active key id) of a data directory, read without opening the vault."""
    path = Path(data_dir) / "catalog.sqlite"
    if not path.is_file():
        raise InputError(f"{data_dir} holds no Galahad catalog.")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        finally:
            conn.close()
        return bytes(meta["vault_id"]).decode(), bytes(meta["active_key_id"]).decode()
    except (sqlite3.Error, KeyError, TypeError, UnicodeDecodeError):
        raise IntegrityError(
            f"The catalog in {data_dir} is damaged; its identity cannot be read."
        ) from None


def import_kit(
    data_dir: Path, keystore: KeyStore, kit_path: Path, passphrase: str | Callable[[], str]
) -> list[str]:
    """Put the kit's keys into this machine's keystore for `data_dir`; return their ids.
    A callable `passphrase` is asked only once the kit was read and checked."""
    vault_id, active = catalog_identity(data_dir)
    kit = _read_kit(kit_path)
    if callable(passphrase):
        passphrase = passphrase()
    if kit["vault_id"] != vault_id:
        raise InputError(
            f"This recovery kit belongs to another data directory (vault {kit['vault_id']}, "
            f"not {vault_id})."
        )
    kek = _kit_kek(passphrase, kit["scrypt"])
    imported = []
    for key_id, blob in kit["keys"].items():
        try:
            master = crypto.open_sealed(
                kek,
                base64.b64decode(blob, validate=True),
                _kit_aad(vault_id, key_id, kit["scrypt"]),
            )
        except (crypto.DecryptionFailed, binascii.Error):
            raise KeyAccessError(
                "The recovery passphrase is wrong, or the kit was edited: it does not open "
                "the kit's keys. Nothing was changed."
            ) from None
        name = entry_name(vault_id, key_id)
        if keystore.get(name) is None:
            keystore.put(name, master)
        imported.append(key_id)
    if active not in imported and keystore.get(entry_name(vault_id, active)) is None:
        raise KeyAccessError(
            f"The kit does not hold key {active}, the one this data directory uses (the kit "
            "was exported before a later rotation)."
        )
    return imported
