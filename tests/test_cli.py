"""The `galahad` command in separate processes with the real OS keyring: the JSON contract,
byte-exact grafts across processes, clear errors for bad input, and crash safety."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers import cli_json, run_cli, story

pytestmark = [pytest.mark.model, pytest.mark.keyring, pytest.mark.usefixtures("real_keyring")]


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _deposit(tmp_path: Path, data_dir: Path, n: int = 40) -> dict:
    doc = tmp_path / "doc.txt"
    doc.write_text(story(n))
    return cli_json("deposit", str(doc), data_dir=data_dir)


def _snapshot(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*.gkv"))}


def test_deposit_ask_chat_resume_across_processes(tmp_path: Path, data_dir: Path) -> None:
    deposited = _deposit(tmp_path, data_dir)
    assert {"document_id", "tokens", "prefill_ms", "block_bytes"} <= deposited.keys()
    asked = cli_json(
        "ask",
        deposited["document_id"],
        "What is Arthur's access code?",
        "--max-tokens",
        "10",
        data_dir=data_dir,
    )
    for key in (
        "conversation_id",
        "restored_tokens",
        "recomputed_tokens",
        "restore_ms",
        "proof_ms",
        "proof",
        "reply",
    ):
        assert key in asked
    assert asked["proof"] == "exact"
    assert asked["restored_tokens"] == deposited["tokens"] and asked["recomputed_tokens"] == 0
    conversation = asked["conversation_id"]
    turn = cli_json(
        "chat",
        "--conversation",
        conversation,
        "--message",
        "And Kay?",
        "--max-tokens",
        "6",
        data_dir=data_dir,
    )
    assert turn["proof"] == "exact" and turn["recomputed_tokens"] == 0
    assert turn["restored_tokens"] > deposited["tokens"]
    resumed = cli_json("resume", conversation, data_dir=data_dir)
    assert resumed["proof"] == "exact" and resumed["recomputed_tokens"] == 0
    assert resumed["restored_tokens"] > turn["restored_tokens"]
    listed = cli_json("list", data_dir=data_dir)
    assert [c["id"] for c in listed["conversations"]] == [conversation]
    assert listed["documents"][0]["name"] == "doc.txt"
    verified = cli_json("verify", "--all", data_dir=data_dir)
    assert verified["ok"] and {r["proof"] for r in verified["results"]} == {"exact"}
    audit = cli_json("audit", data_dir=data_dir)
    assert audit == {
        "blocks": len(verified["results"]),
        "ok": len(verified["results"]),
        "given_back": 0,
        "problems": [],
        "repaired": [],
    }
    shown = cli_json("show", conversation, data_dir=data_dir)
    assert [m["role"] for m in shown["messages"]] == ["user", "model", "user", "model"]


def test_bad_input_gets_one_clear_error_and_changes_nothing(tmp_path: Path, data_dir: Path) -> None:
    deposited = _deposit(tmp_path, data_dir, n=10)
    before = _snapshot(data_dir)
    cases = [
        (("ask", "d-doesnotexist", "hi"), 3, "No document has the id 'd-doesnotexist'"),
        (("resume", "c-nope"), 3, "No conversation has the id 'c-nope'"),
        (("deposit", str(tmp_path / "missing.txt")), 4, "does not exist"),
        (("deposit", str(tmp_path)), 4, "is not a file"),
    ]
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01\x02")
    cases.append((("deposit", str(tmp_path / "binary.txt")), 4, "binary"))
    cases.append((("ask", "What is it?"), 4, "The question has no words"))
    cases.append((("compact", "c-nope"), 3, "No conversation has the id 'c-nope'"))
    for args, code, message in cases:
        proc = run_cli(*args, data_dir=data_dir, check=False)
        assert proc.returncode == code, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert _snapshot(data_dir) == before
    assert len(cli_json("list", data_dir=data_dir)["documents"]) == 1
    del deposited


def test_tampered_block_is_refused_by_the_command(tmp_path: Path, data_dir: Path) -> None:
    deposited = _deposit(tmp_path, data_dir, n=10)
    block = next((data_dir / "blocks").glob("*.gkv"))
    data = bytearray(block.read_bytes())
    data[-100] ^= 0x01
    block.write_bytes(bytes(data))
    proc = run_cli("ask", deposited["document_id"], "hi", "--json", data_dir=data_dir, check=False)
    assert proc.returncode == 5
    assert "was refused" in proc.stderr and "failed authentication" in proc.stderr
    assert block.read_bytes() == bytes(data)
    audit = run_cli("audit", "--json", data_dir=data_dir, check=False)
    assert audit.returncode == 1 and "failed authentication" in audit.stdout


def test_wrong_master_key_and_missing_keyring_are_refused(tmp_path: Path, data_dir: Path) -> None:
    import keyring

    deposited = _deposit(tmp_path, data_dir, n=10)
    status = cli_json("keys", "status", data_dir=data_dir)
    assert "SecretService" in status["backend"]
    before = _snapshot(data_dir)
    vault_id = _vault_id(data_dir)
    name = f"master-key/{vault_id}/{status['key_id']}"
    good = keyring.get_password("galahad-desktop", name)
    assert good is not None
    keyring.set_password("galahad-desktop", name, "A" * 43 + "=")  # another 32-byte key
    try:
        proc = run_cli("ask", deposited["document_id"], "hi", data_dir=data_dir, check=False)
        assert proc.returncode == 6 and "wrong key" in proc.stderr
    finally:
        keyring.set_password("galahad-desktop", name, good)
    assert _snapshot(data_dir) == before

    fresh = tmp_path / "no-keyring"
    proc = run_cli(
        "list",
        data_dir=fresh,
        check=False,
        env={"PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"},
    )
    assert proc.returncode == 6 and "No usable OS keyring" in proc.stderr
    assert not (fresh / "catalog.sqlite").exists()


def _vault_id(data_dir: Path) -> str:
    import sqlite3

    conn = sqlite3.connect(data_dir / "catalog.sqlite")
    try:
        return bytes(
            conn.execute("SELECT value FROM meta WHERE key='vault_id'").fetchone()[0]
        ).decode()
    finally:
        conn.close()


def test_another_runtime_falls_back_with_a_reason(tmp_path: Path, data_dir: Path) -> None:
    deposited = _deposit(tmp_path, data_dir, n=10)
    asked = cli_json(
        "ask",
        deposited["document_id"],
        "hi",
        "--max-tokens",
        "4",
        "--set",
        "n_batch=256",
        data_dir=data_dir,
    )
    assert asked["recomputed_tokens"] == deposited["tokens"] and asked["restored_tokens"] == 0
    assert asked["fallback_reason"] == "the model or its runtime settings changed"
    again = cli_json("resume", asked["conversation_id"], "--set", "n_batch=256", data_dir=data_dir)
    assert again["proof"] == "exact" and again["recomputed_tokens"] == 0


def test_key_rotation_keeps_every_block_readable(tmp_path: Path, data_dir: Path) -> None:
    import keyring

    deposited = _deposit(tmp_path, data_dir, n=10)
    old = cli_json("keys", "status", data_dir=data_dir)["key_id"]
    rotated = cli_json("keys", "rotate", data_dir=data_dir)
    assert rotated["blocks_rewrapped"] == 1 and rotated["key_id"] != old
    entry = f"master-key/{_vault_id(data_dir)}/{old}"
    assert keyring.get_password("galahad-desktop", entry) is not None  # kept for old copies
    asked = cli_json("ask", deposited["document_id"], "hi", "--max-tokens", "2", data_dir=data_dir)
    assert asked["proof"] == "exact"
    dropped = cli_json("keys", "drop-retired", data_dir=data_dir)
    assert dropped["dropped"] == [old] and keyring.get_password("galahad-desktop", entry) is None
    asked = cli_json("ask", deposited["document_id"], "hi", "--max-tokens", "2", data_dir=data_dir)
    assert asked["proof"] == "exact"


@pytest.mark.parametrize(
    "point", ["block-write-midway", "persist-before-commit", "persist-after-commit"]
)
def test_killed_while_saving_a_turn_keeps_the_previous_state(
    tmp_path: Path, data_dir: Path, point: str
) -> None:
    deposited = _deposit(tmp_path, data_dir, n=10)
    first = cli_json(
        "ask", deposited["document_id"], "First?", "--max-tokens", "4", data_dir=data_dir
    )
    conversation = first["conversation_id"]
    proc = run_cli(
        "chat",
        "--conversation",
        conversation,
        "--message",
        "Second?",
        "--max-tokens",
        "4",
        data_dir=data_dir,
        check=False,
        env={"GALAHAD_CRASHPOINT": point},
    )
    assert proc.returncode == -signal.SIGKILL
    shown = cli_json("show", conversation, data_dir=data_dir)
    committed = point == "persist-after-commit"
    assert len(shown["messages"]) == (4 if committed else 2)
    # The next start (the `show` above) removed the unfinished or uncommitted file.
    assert cli_json("audit", data_dir=data_dir)["problems"] == []
    resumed = cli_json("resume", conversation, data_dir=data_dir)
    assert resumed["proof"] == "exact" and resumed["recomputed_tokens"] == 0
    leftovers = [p for p in (data_dir / "blocks").iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []


def test_killed_during_deposit_stores_nothing(tmp_path: Path, data_dir: Path) -> None:
    _deposit(tmp_path, data_dir, n=10)
    doc = tmp_path / "second.txt"
    doc.write_text(story(12))
    proc = run_cli(
        "deposit",
        str(doc),
        data_dir=data_dir,
        check=False,
        env={"GALAHAD_CRASHPOINT": "deposit-before-commit"},
    )
    assert proc.returncode == -signal.SIGKILL
    assert len(cli_json("list", data_dir=data_dir)["documents"]) == 1
    cli_json("audit", "--repair", data_dir=data_dir)
    assert cli_json("audit", data_dir=data_dir) == {
        "blocks": 1,
        "ok": 1,
        "given_back": 0,
        "problems": [],
        "repaired": [],
    }
    assert os.listdir(data_dir / "blocks") and len(os.listdir(data_dir / "blocks")) == 1


def test_the_disk_budget_through_the_command(tmp_path: Path, data_dir: Path) -> None:
    """`galahad storage` against the bytes on disk, a give-back killed half way, a document
    given back and read again, and the budget choosing what was used longest ago."""
    first = _deposit(tmp_path, data_dir, n=10)["document_id"]
    doc = tmp_path / "second.txt"
    doc.write_text(story(12))
    second = cli_json("deposit", str(doc), data_dir=data_dir)["document_id"]
    report = cli_json("storage", data_dir=data_dir)
    on_disk = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
    assert abs(report["total_bytes"] - on_disk) <= 0.05 * on_disk
    proc = run_cli(
        "storage",
        "--give-back",
        first,
        data_dir=data_dir,
        check=False,
        env={"GALAHAD_CRASHPOINT": "give-back-before-unlink"},
    )
    assert proc.returncode == -signal.SIGKILL
    assert cli_json("audit", data_dir=data_dir)["problems"] == []
    states = {i["id"]: i["state"] for i in cli_json("storage", data_dir=data_dir)["items"]}
    assert states == {first: "needs re-reading", second: "stored"}
    asked = cli_json("ask", first, "What is Arthur's access code?", "--max-tokens", "4",
                     data_dir=data_dir)  # fmt: skip
    assert asked["recomputed_tokens"] > 0
    report = cli_json("storage", data_dir=data_dir)
    assert {i["id"]: i["state"] for i in report["items"]}[first] == "stored"
    # Room for one more document the size of the second (give or take a line), not two.
    run_cli("settings", f"disk_budget={report['total_bytes'] + 200_000}", data_dir=data_dir)
    doc.write_text(story(12) + "\nThe ferry leaves at dawn.")
    cli_json("deposit", str(doc), data_dir=data_dir)
    report = cli_json("storage", data_dir=data_dir)
    states = {i["id"]: i["state"] for i in report["items"]}
    assert states[second] == "needs re-reading" and states[first] == "stored"
    assert report["total_bytes"] <= report["budget_bytes"] + max(
        i["bytes"] for i in report["items"]
    )
    assert cli_json("audit", data_dir=data_dir)["problems"] == []
    bad = run_cli("storage", "--give-back", "c-0000000000000000", data_dir=data_dir, check=False)
    assert bad.returncode not in (0, 70) and "Traceback" not in bad.stderr
    assert "No conversation or document" in bad.stderr
    # A document whose memory cannot fit even once all else gives its memory back: refused
    # before it is read (nothing changes), then read when the person says so.
    run_cli("settings", "disk_budget=1", data_dir=data_dir)
    before = _snapshot(data_dir)
    doc.write_text(story(14))
    refused = run_cli("deposit", str(doc), data_dir=data_dir, check=False)
    assert refused.returncode == 11 and "Traceback" not in refused.stderr
    assert "Nothing was read" in refused.stderr and "--anyway" in refused.stderr
    assert _snapshot(data_dir) == before
    assert cli_json("deposit", str(doc), "--anyway", data_dir=data_dir)["tokens"] > 0
    assert cli_json("audit", data_dir=data_dir)["problems"] == []
