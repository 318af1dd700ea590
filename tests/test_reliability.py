"""Reliability beyond the block files (fast tier): the catalog is sealed and authenticated as
thoroughly as the blocks, copies and rollbacks are caught, backups survive key rotation,
keys and key files are checked, and odd input gets a message, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from galahad_desktop.errors import (
    GalahadError,
    InputError,
    IntegrityError,
    KeyAccessError,
    StorageError,
)
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.verified.verifiers import verifier_for
from galahad_desktop.vault import blockfile, custody
from galahad_desktop.vault.catalog import SCHEMA_VERSION
from galahad_desktop.vault.keys import (
    KeyringKeyStore,
    MemoryKeyStore,
    PassphraseKeyStore,
    entry_name,
    open_keystore,
)
from galahad_desktop.vault.vault import Vault
from galahad_dev import catalog_fuzz

CoreFactory = Callable[..., Galahad]


def _edit(data: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """What an attacker with write access to catalog.sqlite can do: plain SQL."""
    conn = sqlite3.connect(data / "catalog.sqlite")
    with conn:
        for sql, args in statements:
            conn.execute(sql, args)
    conn.close()


def _as_schema(
    version: int, factory: CoreFactory, data: Path, *statements: tuple[str, tuple[Any, ...]]
) -> Galahad:
    """Turn the closed catalog back into what schema `version` wrote (the statements, then
    the version), and open it: the upgrade runs."""
    schema = ("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version).encode(),))
    _edit(data, *statements, schema)
    return factory()


def _transcript(factory: CoreFactory, conversation: str, **kw: Any) -> list[tuple[str, str]]:
    core = factory(**kw)
    try:
        return [(m.role, m.text) for m in core.messages(conversation)]
    finally:
        core.close()


def _chat(core: Galahad, *texts: str) -> str:
    conversation = core.new_conversation()
    for text in texts:
        core.send(conversation, text, params=core.sampling(max_tokens=8))
    return conversation


# -- the catalog ------------------------------------------------------------------------
@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_catalog_fuzzer_refuses_or_proves_harmless_every_edit() -> None:
    result = catalog_fuzz.catalog_fuzz(190, seed=7, log=lambda _m: None)
    assert result["silent"] == 0, result["examples"]
    assert result["crashed"] == 0, result["examples"]
    assert result["refused"] + result["unchanged"] == 190
    assert result["refused"] >= 180  # "unchanged" is only a timestamp, a counter or a log line
    assert min(result["by_kind"].values()) >= 5 and len(result["by_kind"]) == len(
        catalog_fuzz.MUTATIONS
    )
    assert result["pristine_intact"]


@pytest.mark.parametrize(
    "edit",
    [
        "move",  # a message moved to another conversation
        "swap",  # two messages swapped
        "role",  # a user message made the model's
        "drop",  # the last turn deleted, the counts made to match
    ],
)
def test_an_edited_transcript_is_refused_by_name_and_audited(
    make_fake_core: CoreFactory, edit: str
) -> None:
    core = make_fake_core()
    first = _chat(core, "Hello there.", "Tell me more.")
    second = _chat(core, "One.")
    expected = [(m.role, m.text) for m in core.messages(first)]
    core.close()
    data = core.data_dir
    conn = sqlite3.connect(data / "catalog.sqlite")
    rows = conn.execute(
        "SELECT id, seq FROM messages WHERE conversation_id = ? ORDER BY seq", (first,)
    ).fetchall()
    conn.close()
    statements: list[tuple[str, tuple[Any, ...]]] = {
        "move": [
            ("UPDATE messages SET conversation_id = ?, seq = 9 WHERE id = ?", (second, rows[3][0]))
        ],
        "swap": [
            ("UPDATE messages SET seq = -1 WHERE id = ?", (rows[0][0],)),
            ("UPDATE messages SET seq = 0 WHERE id = ?", (rows[2][0],)),
            ("UPDATE messages SET seq = 2 WHERE id = ?", (rows[0][0],)),
        ],
        "role": [("UPDATE messages SET role = 'model' WHERE id = ?", (rows[2][0],))],
        "drop": [
            ("DELETE FROM messages WHERE id IN (?, ?)", (rows[2][0], rows[3][0])),
            ("UPDATE conversations SET n_messages = 2 WHERE id = ?", (first,)),
        ],
    }[edit]
    _edit(data, *statements)
    again = make_fake_core()
    damaged = first if edit != "move" else None
    with pytest.raises(IntegrityError, match="was edited") as refused:
        for conversation in (first, second):
            again.messages(conversation)
    if damaged:
        assert damaged in str(refused.value)
    problems = again.audit().problems
    assert any("was edited" in p for p in problems), problems
    with pytest.raises(IntegrityError):
        again.send(first if edit != "move" else second, "Go on.")
    again.close()
    if edit == "drop":
        return  # deleted rows cannot be put back by SQL
    _edit(data, *[(sql, args) for sql, args in _undo(statements, rows, first)])
    restored = make_fake_core()
    assert [(m.role, m.text) for m in restored.messages(first)] == expected


def _undo(
    statements: list[tuple[str, tuple[Any, ...]]], rows: list[tuple[str, int]], first: str
) -> list[tuple[str, tuple[Any, ...]]]:
    """Put the rows back where they were (a dropped turn cannot be undone by SQL: skip)."""
    if statements[0][0].startswith("DELETE"):
        return []
    undo: list[tuple[str, tuple[Any, ...]]] = [
        ("UPDATE messages SET seq = -100 - seq WHERE conversation_id = ?", (first,))
    ]
    for message_id, seq in rows:
        undo.append(
            (
                "UPDATE messages SET conversation_id = ?, seq = ?, role = ? WHERE id = ?",
                (first, seq, "user" if seq % 2 == 0 else "model", message_id),
            )
        )
    return undo


def test_a_catalog_from_a_newer_galahad_is_refused_untouched(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    _chat(core, "Hello.")
    core.close()
    _edit(core.data_dir, ("UPDATE meta SET value = ? WHERE key = 'schema_version'", (b"99",)))
    before = (core.data_dir / "catalog.sqlite").read_bytes()
    with pytest.raises(StorageError, match="newer Galahad"):
        make_fake_core()
    assert (core.data_dir / "catalog.sqlite").read_bytes() == before


def test_a_schema_1_catalog_is_bound_and_sealed_on_upgrade(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    conversation = _chat(core, "Hello there.", "And then?")
    expected = [(m.role, m.text) for m in core.messages(conversation)]
    fields = core.vault.fields
    # Write the messages back as schema 1 did: bound to their id only, no seals.
    old = []
    for row in core.vault.catalog.select("messages"):
        text = core.vault.records.decrypt("messages", "text_enc", row)
        old.append((fields.encrypt_text(text, "messages", "text", row["id"]), row["id"]))
    core.close()
    upgraded = _as_schema(
        1,
        make_fake_core,
        core.data_dir,
        *[("UPDATE messages SET text_enc = ? WHERE id = ?", args) for args in old],
        ("UPDATE conversations SET seal = NULL", ()),
    )
    assert [(m.role, m.text) for m in upgraded.messages(conversation)] == expected
    assert upgraded.audit().problems == []
    assert upgraded.resume(conversation).proof.verdict == "exact"


def test_a_schema_2_catalog_gains_the_passage_vectors_table(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    conversation = _chat(core, "Hello there.")
    core.close()
    upgraded = _as_schema(2, make_fake_core, core.data_dir, ("DROP TABLE part_vectors", ()))
    assert upgraded.vault.catalog.meta_get("schema_version") == str(SCHEMA_VERSION).encode()
    assert upgraded.vault.catalog.count("part_vectors") == 0
    assert upgraded.audit().problems == []
    assert upgraded.messages(conversation)[0].text == "Hello there."


def test_a_schema_7_catalog_learns_how_replies_end_and_its_seals_still_hold(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    engine: Any = core.engine
    engine.script = [*b"Hi.", engine.ids["<end_of_turn>"]]  # a reply that ends on its own
    conversation = _chat(core, "Hello there.")
    core.close()
    upgraded = _as_schema(
        7,
        make_fake_core,
        core.data_dir,
        ("ALTER TABLE messages DROP COLUMN stop", ()),
        ("ALTER TABLE reply_versions DROP COLUMN stop", ()),
    )
    assert upgraded.vault.catalog.meta_get("schema_version") == str(SCHEMA_VERSION).encode()
    assert upgraded.audit().problems == []  # the seals made before still hold
    assert upgraded.messages(conversation)[-1].stop == ""
    upgraded.close()
    # How a reply ended is sealed with its conversation: an edit of it is caught.
    _edit(core.data_dir, ("UPDATE messages SET stop = 'cancelled' WHERE role = 'model'", ()))
    assert make_fake_core().audit().problems


def test_a_dropped_table_is_refused_and_not_recreated(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    core.verified_add("What is 37 * 12 + 5?", "37 * 12 + 5 = 449.")
    core.close()
    _edit(core.data_dir, ("DROP TABLE verified", ()))
    for _attempt in range(2):  # the refusal must not "repair" it for the next open
        with pytest.raises(IntegrityError, match=r"missing parts of its structure.*verified"):
            make_fake_core()


def test_a_block_row_cannot_point_outside_the_blocks_folder(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    core = make_fake_core()
    conversation = _chat(core, "Hello.")
    head = core.head_block(conversation)
    core.close()
    bait = tmp_path / "precious.txt"
    bait.write_text("not Galahad's")
    _edit(
        core.data_dir,
        ("UPDATE blocks SET file_name = ? WHERE id = ?", ("../../precious.txt", head)),
    )
    again = make_fake_core()
    with pytest.raises(IntegrityError, match="invalid file"):
        again.resume(conversation)
    assert any("invalid file" in p for p in again.audit(repair=True).problems)
    again.forget(conversation)
    assert bait.read_text() == "not Galahad's"


def test_odd_entries_in_the_blocks_folder(make_fake_core: CoreFactory, tmp_path: Path) -> None:
    core = make_fake_core()
    conversation = _chat(core, "Hello.")
    head = core.vault.block_row(core.head_block(conversation))
    blocks = core.vault.blocks_dir
    core.close()
    path = blocks / head["file_name"]
    original = path.read_bytes()
    path.unlink()
    path.symlink_to(path.name)  # a link to itself: ELOOP
    (blocks / "b-0123456789abcdef.gkv").mkdir()  # a folder named like a block
    again = make_fake_core()
    with pytest.raises(IntegrityError, match="link"):
        again.resume(conversation)
    report = again.audit(repair=True)
    assert any("link" in p for p in report.problems)
    assert any("b-0123456789abcdef.gkv" in p for p in report.problems)
    assert path.is_symlink() and (blocks / "b-0123456789abcdef.gkv").is_dir()  # not removed
    again.close()
    path.unlink()
    path.write_bytes(original)
    assert make_fake_core().resume(conversation).proof.verdict == "exact"


@pytest.mark.parametrize(
    "header",
    [
        b'{"chunk_bytes": "4194304"}',
        b"[" * 30000 + b"]" * 30000,
        b'{"a": 1}',
        b"\xff\xfe",
    ],
)
def test_a_malformed_header_is_a_format_error(header: bytes) -> None:
    with pytest.raises(blockfile.BlockFormatError):
        blockfile.BlockHeader.from_bytes(header)


def test_every_header_field_type_is_checked() -> None:
    good = {
        "block_id": "b-0123456789abcdef",
        "kind": "conversation",
        "owner_id": "c-1",
        "parent_id": None,
        "pos_start": 0,
        "pos_end": 4,
        "n_tokens": 4,
        "generation": 1,
        "fingerprint": "f",
        "created_at": 1.0,
        "payload_bytes": 10,
        "chunk_bytes": 4,
        "nonce_prefix": "00" * 8,
    }
    assert blockfile.BlockHeader.from_bytes(json.dumps(good).encode()).pos_end == 4
    for name, value in good.items():
        wrong = {**good, name: 7 if value is None or isinstance(value, str) else "7"}
        with pytest.raises(blockfile.BlockFormatError, match=name):
            blockfile.BlockHeader.from_bytes(json.dumps(wrong).encode())


# -- copies, backups, keys --------------------------------------------------------------
@pytest.fixture()
def memory_keys(keystore: MemoryKeyStore, monkeypatch: pytest.MonkeyPatch) -> MemoryKeyStore:
    """Restores and kit imports open their directory with the test's in-memory keystore."""
    monkeypatch.setattr("galahad_desktop.memory.facade_store.open_keystore", lambda *_a: keystore)
    return keystore


@pytest.mark.usefixtures("memory_keys")
def test_a_whole_directory_put_back_is_refused_until_restored(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    core = make_fake_core()
    conversation = _chat(core, "Hello there.")
    at_copy = [(m.role, m.text) for m in core.messages(conversation)]
    core.close()
    copy = tmp_path / "copy"
    shutil.copytree(core.data_dir, copy)  # `cp -a`: catalog and blocks together
    newer = make_fake_core()
    newer.send(conversation, "And more.", params=newer.sampling(max_tokens=8))
    newer.close()
    with pytest.raises(IntegrityError, match=r"older copy.*galahad restore"):
        make_fake_core(data=copy)
    # Putting the copy back over the data directory is the same rollback: refused too.
    shutil.rmtree(core.data_dir)
    shutil.copytree(copy, core.data_dir)
    with pytest.raises(IntegrityError, match="older copy"):
        make_fake_core()
    _restored, report = Galahad.restore(core.data_dir, core.data_dir)  # on purpose, in place
    assert report.problems == []
    assert _transcript(make_fake_core, conversation) == at_copy


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_backup_rotation_and_restore_end_to_end(
    make_fake_core: CoreFactory, memory_keys: MemoryKeyStore, tmp_path: Path
) -> None:
    keystore = memory_keys
    core = make_fake_core()
    conversation = _chat(core, "Hello there.", "Tell me more.")
    at_backup = [(m.role, m.text) for m in core.messages(conversation)]
    backup = core.backup(tmp_path / "backup")
    assert backup.files >= 3 and (tmp_path / "backup" / "catalog.sqlite").is_file()
    core.export_recovery_kit("a recovery phrase 42", tmp_path / "kit.json")
    kit_text = (tmp_path / "kit.json").read_text()
    master = keystore.entries[entry_name(core.vault.vault_id, core.vault.key_id)]
    assert master.hex() not in kit_text and "Hello" not in kit_text
    rotated = core.rotate_key()
    assert rotated.backups_needing_retired == [str((tmp_path / "backup").resolve())]
    core.send(conversation, "After the backup.", params=core.sampling(max_tokens=8))
    core.close()
    data = core.data_dir
    # Opening the backup in place is a rollback; restoring it is the way back, on purpose.
    with pytest.raises(IntegrityError, match="older copy"):
        make_fake_core(data=tmp_path / "backup")
    restored, report = Galahad.restore(tmp_path / "backup", data)
    assert report.problems == [] and restored.previous_kept_at
    assert _transcript(make_fake_core, conversation) == at_backup
    kept = Path(restored.previous_kept_at)
    assert (kept / "catalog.sqlite").is_file()  # what was there is kept, never deleted
    # Dropping the retired key strands the backup: asked first, then a kit opens it again.
    opened = make_fake_core()
    opened.rotate_key()
    with pytest.raises(InputError, match="unreadable without a recovery kit"):
        opened.drop_retired_keys(confirmed=False)
    dropped, stranded = opened.drop_retired_keys(confirmed=True)
    assert len(dropped) == 1 and stranded  # the key the backup needs is gone now
    opened.close()
    before = sorted(p.name for p in data.iterdir())
    with pytest.raises(KeyAccessError, match="not in the keyring"):
        Galahad.restore(tmp_path / "backup", data)
    assert sorted(p.name for p in data.iterdir()) == before  # a failed restore moves nothing
    with pytest.raises(KeyAccessError, match="wrong"):
        custody.import_kit(tmp_path / "backup", keystore, tmp_path / "kit.json", "wrong phrase 1")
    assert custody.import_kit(
        tmp_path / "backup", keystore, tmp_path / "kit.json", "a recovery phrase 42"
    )
    restored, report = Galahad.restore(tmp_path / "backup", data)
    assert report.problems == []
    assert _transcript(make_fake_core, conversation) == at_backup


def test_the_recovery_kit_refuses_weak_phrases_and_other_directories(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    core = make_fake_core()
    with pytest.raises(InputError, match="at least 12"):
        core.export_recovery_kit("short", tmp_path / "kit.json")
    with pytest.raises(InputError, match="6 different"):
        core.export_recovery_kit("aaaaaaaaaaaaaaaa", tmp_path / "kit.json")
    core.export_recovery_kit("a recovery phrase 42", tmp_path / "kit.json")
    with pytest.raises(InputError, match="already exists"):
        core.export_recovery_kit("a recovery phrase 42", tmp_path / "kit.json")
    other = make_fake_core(data=tmp_path / "other")
    other.close()
    with pytest.raises(InputError, match="another data directory"):
        custody.import_kit(tmp_path / "other", MemoryKeyStore(), tmp_path / "kit.json", "x" * 12)
    (tmp_path / "bad.json").write_text('{"format": "galahad-recovery-kit/1"}')
    with pytest.raises(InputError, match="not a Galahad recovery kit"):
        custody.import_kit(tmp_path / "other", MemoryKeyStore(), tmp_path / "bad.json", "x" * 12)


def test_a_keyring_entry_of_the_wrong_length_is_refused(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    vault = Vault(tmp_path / "d", keys)
    name = entry_name(vault.vault_id, vault.key_id)
    vault.close()
    keys.entries[name] = keys.entries[name][:16]
    with pytest.raises(KeyAccessError, match="16 bytes"):
        Vault(tmp_path / "d", keys)


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_a_keyring_that_does_not_answer_times_out_and_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import keyring
    from keyring.backend import KeyringBackend

    class Silent(KeyringBackend):
        priority = 1  # type: ignore[assignment]

        def get_password(self, service: str, username: str) -> str | None:
            time.sleep(30)
            return None

        def set_password(self, service: str, username: str, password: str) -> None:
            time.sleep(30)

        def delete_password(self, service: str, username: str) -> None:
            time.sleep(30)

    previous = keyring.get_keyring()
    keyring.set_keyring(Silent())
    monkeypatch.setenv("GALAHAD_KEYRING_TIMEOUT_S", "0.5")
    try:
        with pytest.raises(KeyAccessError, match="did not answer"):
            Vault(tmp_path / "d", KeyringKeyStore())
    finally:
        keyring.set_keyring(previous)
    Vault(tmp_path / "d", MemoryKeyStore()).close()  # the lock was released


@pytest.mark.parametrize(
    "damage",
    ["not json", "entries", "weak", "absurd", "no salt", "parameters"],
)
def test_a_damaged_passphrase_key_file_is_refused_with_a_message(
    tmp_path: Path, damage: str
) -> None:
    data = tmp_path / "d"
    Vault(data, PassphraseKeyStore(data, "correct horse")).close()
    path = data / PassphraseKeyStore.FILE_NAME
    state = json.loads(path.read_text())
    if damage == "not json":
        path.write_text("{")
    else:
        if damage == "entries":
            state["entries"] = ["x"]
        elif damage == "weak":
            state["n"] = 2**10
        elif damage == "absurd":
            state["n"] = 2**30
        elif damage == "no salt":
            del state["salt"]
        else:
            state["n"] = 2**16  # in range, but not what the file was made with
        path.write_text(json.dumps(state))
    with pytest.raises(KeyAccessError) as refused:
        Vault(data, PassphraseKeyStore(data, "correct horse"))
    assert str(data / PassphraseKeyStore.FILE_NAME) in str(refused.value) or "passphrase" in str(
        refused.value
    )


def test_passphrase_on_a_keyring_directory_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    data = tmp_path / "d"
    Vault(data, MemoryKeyStore()).close()
    with pytest.raises(KeyAccessError, match="keeps its key in the OS keyring"):
        open_keystore(data, "correct horse")
    assert not (data / PassphraseKeyStore.FILE_NAME).exists()


# -- odd input --------------------------------------------------------------------------
def test_nul_and_broken_characters_are_refused_everywhere(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    core = make_fake_core()
    conversation = core.new_conversation()
    for text in ("before\x00after", "broken \ud800 text"):
        with pytest.raises(InputError, match=r"NUL|Unicode"):
            core.send(conversation, text)
        with pytest.raises(InputError, match=r"NUL|Unicode"):
            core.deposit_text("doc.txt", text)
        with pytest.raises(InputError, match=r"NUL|Unicode"):
            core.verified_add(text, "42", user_verified=True)
    late = tmp_path / "late.txt"
    late.write_bytes(b"a" * 70_000 + b"\x00tail")  # past the first 64 KiB
    with pytest.raises(InputError, match="NUL"):
        core.add_document_file(conversation, late)
    assert core.list_documents() == [] and core.messages(conversation) == []


def test_an_unbounded_exact_power_is_refused_at_once() -> None:
    question = "What is ((((1/999999)**64)**64)**64)**64?"
    outcome: list[Any] = []

    def check() -> None:
        found = verifier_for(question)
        outcome.append(None if found is None else found[0].check(question, "0"))

    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(60)  # a hang guard, not a speed target: it returns in well under a second
    assert not worker.is_alive() and outcome
    assert outcome[0] is None or not outcome[0].ok


def test_every_error_the_core_raises_is_a_galahad_error(make_fake_core: CoreFactory) -> None:
    """One flipped byte in each kind of private field: a message naming the record."""
    core = make_fake_core()
    conversation = _chat(core, "Hello.")
    core.deposit_text("notes.txt", "The harbour ledger lists boats and nets.")
    core.close()
    conn = sqlite3.connect(core.data_dir / "catalog.sqlite")
    targets = [
        ("conversations", "title_enc"),
        ("messages", "text_enc"),
        ("documents", "name_enc"),
        ("parts", "text_enc"),
    ]
    original = {(t, c): conn.execute(f"SELECT id, {c} FROM {t}").fetchone() for t, c in targets}
    conn.close()
    for table, column in targets:
        row_id, blob = original[(table, column)]
        flipped = bytes([blob[0], blob[1] ^ 1, *blob[2:]])
        _edit(core.data_dir, (f"UPDATE {table} SET {column} = ? WHERE id = ?", (flipped, row_id)))
        again = make_fake_core()
        if table == "conversations":  # a damaged title is listed, marked, never shown
            [listed] = [c for c in again.list_conversations() if c.id == row_id]
            assert listed.damaged and listed.title == "(damaged record)"
            assert any(row_id in p for p in again.audit().problems)
            again.close()
            _edit(core.data_dir, (f"UPDATE {table} SET {column} = ? WHERE id = ?", (blob, row_id)))
            continue
        with pytest.raises(GalahadError) as refused:
            again.list_conversations()
            again.messages(conversation)
            again.list_documents()
            for document in again.list_documents():
                for part in again.parts(document.id):
                    again.documents.part_text(again.documents.part_row(part.id))
        named = (row_id, conversation)  # a message is named with its conversation's seal
        assert any(n in str(refused.value) for n in named)
        assert any(row_id in p for p in again.audit().problems)
        again.close()
        _edit(core.data_dir, (f"UPDATE {table} SET {column} = ? WHERE id = ?", (blob, row_id)))
    assert make_fake_core().audit().problems == []


def test_a_refused_data_dir_path_is_a_message(tmp_path: Path) -> None:
    from galahad_desktop.cli import main

    (tmp_path / "file").write_text("x")
    for where in (tmp_path / "file", Path("/proc/self")):
        assert main(["--data-dir", str(where), "list"]) == StorageError.exit_code


def test_environment_of_children_has_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    from galahad_desktop.system.child import clean_environment

    monkeypatch.setenv("GALAHAD_PASSPHRASE", "correct horse")
    monkeypatch.setenv("GALAHAD_RECOVERY_PASSPHRASE", "a recovery phrase 42")
    env = clean_environment()
    assert "GALAHAD_PASSPHRASE" not in env and "GALAHAD_RECOVERY_PASSPHRASE" not in env
    assert os.environ["GALAHAD_PASSPHRASE"] == "correct horse"


@pytest.mark.parametrize(
    ("key", "value"),
    [("active_key_id", b"\xff\xfe"), ("vault_id", "text, not bytes"), ("schema_version", b"x")],
)
def test_a_damaged_meta_entry_is_a_message(
    make_fake_core: CoreFactory, key: str, value: object
) -> None:
    core = make_fake_core()
    path = core.data_dir
    core.close()
    _edit(path, ("UPDATE meta SET value = ? WHERE key = ?", (value, key)))
    with pytest.raises(IntegrityError, match="damaged"):
        make_fake_core()


def test_a_damaged_routing_log_line_is_named(make_fake_core: CoreFactory) -> None:
    core = make_fake_core(n_ctx=1024)
    core.deposit_text("ledger.txt", "The harbour ledger lists boats and nets. " * 10)
    core.ask("What does the harbour ledger list?", params=core.sampling(max_tokens=2))
    line = core.vault.catalog.select("routing_log")[0]
    core.close()
    blob = bytes(line["entry_enc"])
    _edit(
        core.data_dir,
        (
            "UPDATE routing_log SET entry_enc = ? WHERE id = ?",
            (blob[:-1] + bytes([blob[-1] ^ 1]), line["id"]),
        ),
    )
    again = make_fake_core()
    assert again.routing_log() == []  # a diagnostics line: skipped when unreadable…
    assert any(line["id"] in p for p in again.audit().problems)  # …and named by the audit


def test_crash_trials_refuse_to_run_outside_a_throwaway_keyring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from galahad_dev import hardening

    monkeypatch.delenv("GALAHAD_KEYRING_READY", raising=False)
    with pytest.raises(RuntimeError, match="throwaway keyring"):
        hardening.crash_trials(1, seed=0, log=lambda _m: None)


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_terminal_escapes_in_names_are_never_printed_raw(tmp_path: Path) -> None:
    import subprocess
    import sys

    from galahad_dev.fake_engine import fake_factory

    data = tmp_path / "data"
    core = Galahad(
        data,
        model_path=tmp_path / "fake.gguf",
        passphrase="correct horse battery",
        engine_factory=fake_factory("gemma3"),
    )
    core.deposit_text("evil\x1b[2J\x1b]0;owned\x07.txt", "The harbour ledger lists boats.")
    core.close()
    proc = subprocess.run(
        [sys.executable, "-m", "galahad_desktop.cli", "--data-dir", str(data), "list"],
        capture_output=True,
        text=True,
        env={**os.environ, "GALAHAD_PASSPHRASE": "correct horse battery"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "evil" in proc.stdout and "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b" in proc.stdout  # shown as a code, not obeyed by the terminal


def test_key_storage_says_how_a_directory_keeps_its_key(tmp_path: Path) -> None:
    """Before the window opens it asks how the key is kept: a directory made with a
    passphrase says so (typed, never a loose tuple)."""
    from galahad_desktop.vault.keys import KeyStorage

    data = tmp_path / "d"
    Vault(data, PassphraseKeyStore(data, "correct horse")).close()
    assert Galahad.key_storage(data) == KeyStorage("passphrase")
