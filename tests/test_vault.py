"""Vault without the model: keys, catalog encryption, rotation, audit, permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from galahad_desktop.errors import BusyError, IntegrityError, KeyAccessError
from galahad_desktop.vault import crypto, custody
from galahad_desktop.vault.keys import MemoryKeyStore, entry_name
from galahad_desktop.vault.vault import Vault, tokens_digest


def _store(vault: Vault, owner: str = "c-1", tokens: list[int] | None = None) -> dict:
    tokens = tokens or list(range(100))
    payload = np.arange(20000, dtype=np.uint8).tobytes()
    row = vault.write_block(
        kind="conversation",
        owner_id=owner,
        parent_id=None,
        tokens=tokens,
        generation=1,
        fingerprint="f" * 64,
        payload=memoryview(payload),
        sealed_meta={"tokens_sha256": tokens_digest(tokens)},
        capture_ms=1.0,
    )
    with vault.transaction():
        vault.catalog.insert("blocks", row)
    return row


def test_store_read_and_modes(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "d", MemoryKeyStore())
    row = _store(vault)
    block = vault.read_block(row["id"], expected_owner="c-1")
    assert bytes(block.state) == np.arange(20000, dtype=np.uint8).tobytes()
    assert block.tokens == list(range(100))
    for path in [tmp_path / "d", *(tmp_path / "d").rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    with pytest.raises(IntegrityError, match="belongs to"):
        vault.read_block(row["id"], expected_owner="c-2")
    vault.close()


def test_wrong_master_key_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    vault = Vault(tmp_path / "d", keys)
    _store(vault)
    name = entry_name(vault.vault_id, vault.key_id)
    vault.close()
    before = {p: p.read_bytes() for p in (tmp_path / "d").rglob("*.gkv")}
    keys.entries[name] = crypto.new_key()
    with pytest.raises(KeyAccessError, match="wrong key"):
        Vault(tmp_path / "d", keys)
    del keys.entries[name]
    with pytest.raises(KeyAccessError, match="not in the keyring"):
        Vault(tmp_path / "d", keys)
    assert before == {p: p.read_bytes() for p in (tmp_path / "d").rglob("*.gkv")}


def test_rotation_rewraps_without_touching_block_files(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    vault = Vault(tmp_path / "d", keys)
    rows = [_store(vault, owner=f"c-{i}") for i in range(3)]
    files = {p: p.read_bytes() for p in (tmp_path / "d" / "blocks").iterdir()}
    old = entry_name(vault.vault_id, vault.key_id)
    new_key_id = vault.rotate_master_key()
    # The retired key is kept (copies made before need it) until it is dropped on purpose.
    assert old in keys.entries and entry_name(vault.vault_id, new_key_id) in keys.entries
    assert vault.retired_key_ids() == [old.rsplit("/", 1)[1]]
    assert files == {p: p.read_bytes() for p in (tmp_path / "d" / "blocks").iterdir()}
    dropped, stranded = custody.drop_retired(vault, confirmed=False)  # no backups: no question
    assert dropped == [old.rsplit("/", 1)[1]] and stranded == [] and old not in keys.entries
    vault.close()
    reopened = Vault(tmp_path / "d", keys)
    for row in rows:
        assert reopened.read_block(row["id"]).tokens == list(range(100))
    reopened.close()


def test_catalog_fields_are_bound_to_their_row(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "d", MemoryKeyStore())
    blob = vault.fields.encrypt_text("secret title", "conversations", "title", "c-1")
    assert vault.fields.decrypt_text(blob, "conversations", "title", "c-1") == "secret title"
    with pytest.raises(crypto.DecryptionFailed):
        vault.fields.decrypt_text(blob, "conversations", "title", "c-2")
    vault.close()


def test_swapped_wrapped_key_is_refused(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "d", MemoryKeyStore())
    a, b = _store(vault, "c-a"), _store(vault, "c-b")
    with vault.transaction():
        vault.catalog.update("blocks", a["id"], {"wrapped_key": b["wrapped_key"]})
    with pytest.raises(IntegrityError, match="key of block"):
        vault.read_block(a["id"])
    vault.read_block(b["id"])
    vault.close()


def test_audit_finds_orphans_and_damage_and_repairs_orphans(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "d", MemoryKeyStore())
    good, bad = _store(vault), _store(vault, "c-2")
    (vault.blocks_dir / "b-orphan.gkv").write_bytes(b"x")
    (vault.blocks_dir / ".tmp-b-x.gkv.1234").write_bytes(b"x")
    path = vault.blocks_dir / bad["file_name"]
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    report = vault.audit()
    assert report.blocks == 2 and report.ok == 1
    assert any(bad["id"] in p for p in report.problems)
    assert any("orphan file b-orphan.gkv" in p for p in report.problems)
    assert any("unfinished write" in p for p in report.problems)
    repaired = vault.audit(repair=True)
    assert len(repaired.repaired) == 2 and not (vault.blocks_dir / "b-orphan.gkv").exists()
    assert vault.read_block(good["id"])
    vault.close()


def test_the_next_start_removes_what_a_killed_write_left_and_nothing_else(
    tmp_path: Path,
) -> None:
    from galahad_desktop.vault.blockfile import MAGIC

    keys = MemoryKeyStore()
    vault = Vault(tmp_path / "d", keys)
    good = _store(vault)
    vault.close()
    blocks = tmp_path / "d" / "blocks"
    (blocks / "b-0123456789abcdef.gkv").write_bytes(MAGIC + b"its row never committed")
    (blocks / ".tmp-b-x.gkv.1234").write_bytes(b"half written")
    (blocks / "kit.txt").write_bytes(b"someone else's file")
    again = Vault(tmp_path / "d", keys)
    assert again.recovered == ["Removed 2 files an interrupted write left behind."]
    assert sorted(p.name for p in blocks.iterdir()) == sorted([good["file_name"], "kit.txt"])
    assert again.read_block(good["id"])
    report = again.audit()  # the file Galahad did not write is the audit's to report
    assert [p for p in report.problems if "kit.txt" in p] and report.ok == 1
    again.close()
    assert Vault(tmp_path / "d", keys).recovered == []  # nothing left: nothing said


def test_second_process_is_told_the_directory_is_busy(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    vault = Vault(tmp_path / "d", keys)
    with pytest.raises(BusyError, match="Another Galahad process"):
        Vault(tmp_path / "d", keys, lock_timeout_s=0.2)
    vault.close()
    Vault(tmp_path / "d", keys).close()


def test_locking_drops_keys(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "d", MemoryKeyStore())
    row = _store(vault)
    vault.lock()
    assert vault.locked
    with pytest.raises(KeyAccessError, match="locked"):
        vault.read_block(row["id"])
    vault.unlock()
    assert vault.read_block(row["id"]).tokens == list(range(100))
    vault.close()


def test_failed_keyring_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class RefusingKeyStore(MemoryKeyStore):
        def put(self, name: str, key: bytes) -> None:
            raise KeyAccessError("The keyring is locked.")

    with pytest.raises(KeyAccessError, match="locked"):
        Vault(tmp_path / "d", RefusingKeyStore())
    assert not (tmp_path / "d").exists()  # no catalog, no blocks/, no .lock left behind
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "notes.txt").write_text("the user's")
    with pytest.raises(KeyAccessError, match="locked"):
        Vault(tmp_path / "e", RefusingKeyStore())
    assert os.listdir(tmp_path / "e") == ["notes.txt"]  # a folder that existed is kept as it was
