"""Hardening: tampering, hostile documents, crashes, keyring failures and passphrase mode.
The full-size runs are `python -m galahad_dev eval tamper|hostile|crashes` (docs/reliability.md)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from galahad_dev import hardening
from tests.helpers import cli_json, on_the_real_keyring, run_cli, story


@pytest.mark.model  # not the model: the tamper fuzzer takes ~20 s, too slow for the fast tier
def test_tamper_fuzzer_refuses_every_mutation() -> None:
    result = hardening.tamper_fuzz(1000, seed=1, log=lambda _m: None)
    assert result["refused"] == 1000
    assert result["grafted"] == 0 and result["crashed"] == 0
    assert result["originals_intact"]
    assert min(result["by_kind"].values()) >= 40  # every kind of mutation was tried
    assert result["catalog_also_edited"] > 100
    assert result["refused_by"]["header digest binding"] > 0
    assert result["refused_by"]["owner binding"] > 0


@pytest.mark.model  # not the model: 400 trials take ~18 s (the fast tier runs 190; the
# evaluation, `eval catalog --mutations 1000`, writes docs/reliability.md's figures)
def test_catalog_fuzzer_at_four_hundred_mutations() -> None:
    from galahad_dev.catalog_fuzz import catalog_fuzz

    result = catalog_fuzz(400, seed=11, log=lambda _m: None)
    assert result["silent"] == 0 and result["crashed"] == 0, result["examples"]
    assert result["refused"] + result["unchanged"] == 400 and result["refused"] >= 380
    assert result["pristine_intact"]


@pytest.mark.model  # not the model: child processes per input, too slow for the fast tier
def test_hostile_documents_get_clear_errors_within_limits() -> None:
    result = hardening.eval_hostile(log=lambda _m: None, timeout_s=30)
    assert result["inputs"] >= 19 and result["crashed"] == 0
    assert result["refused"] == result["inputs"]
    assert all(r["message"] and "Traceback" not in r["message"] for r in result["results"])
    assert result["slowest_s"] < 30
    assert result["cancel_honoured"] and result["cancel_s"] < 5


@pytest.mark.model
def test_passphrase_mode_without_any_keyring(tmp_path: Path) -> None:
    data = tmp_path / "data"
    no_keyring = {"PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"}
    good = {**no_keyring, "GALAHAD_PASSPHRASE": "correct horse battery"}
    doc = tmp_path / "doc.txt"
    doc.write_text(story(10))
    deposited = cli_json("deposit", str(doc), "--passphrase", data_dir=data, env=good)
    key_file = (data / "passphrase-keys.json").read_text()
    assert "correct horse" not in key_file
    before = {p: p.read_bytes() for p in data.rglob("*.gkv")}
    wrong = run_cli(
        "ask",
        deposited["document_id"],
        "hi",
        data_dir=data,
        check=False,
        env={**no_keyring, "GALAHAD_PASSPHRASE": "wrong passphrase!"},
    )
    assert wrong.returncode == 6 and "passphrase is wrong" in wrong.stderr
    missing = run_cli("list", data_dir=data, check=False, env=no_keyring)
    assert missing.returncode == 6 and "uses a passphrase" in missing.stderr
    assert before == {p: p.read_bytes() for p in data.rglob("*.gkv")}
    asked = cli_json(
        "ask", deposited["document_id"], "hi", "--max-tokens", "2", data_dir=data, env=good
    )
    assert asked["proof"] == "exact" and asked["recomputed_tokens"] == 0


@on_the_real_keyring
@pytest.mark.parametrize(
    "point", ["rotate-after-put", "rotate-before-commit", "rotate-after-commit"]
)
def test_key_rotation_killed_midway_leaves_one_working_key(tmp_path: Path, point: str) -> None:
    import keyring

    data = tmp_path / "data"
    doc = tmp_path / "doc.txt"
    doc.write_text(story(8))
    deposited = cli_json("deposit", str(doc), data_dir=data)
    old = cli_json("keys", "status", data_dir=data)["key_id"]
    proc = run_cli("keys", "rotate", data_dir=data, check=False, env={"GALAHAD_CRASHPOINT": point})
    assert proc.returncode == -signal.SIGKILL
    asked = cli_json("ask", deposited["document_id"], "hi", "--max-tokens", "2", data_dir=data)
    assert asked["proof"] == "exact"
    active = cli_json("keys", "status", data_dir=data)["key_id"]
    assert (active == old) == (point != "rotate-after-commit")
    import sqlite3

    conn = sqlite3.connect(data / "catalog.sqlite")
    vault_id = bytes(conn.execute("SELECT value FROM meta WHERE key='vault_id'").fetchone()[0])
    markers = conn.execute(
        "SELECT count(*) FROM meta WHERE key IN ('pending_key_id', 'retired_key_id')"
    ).fetchone()[0]
    retired = conn.execute("SELECT value FROM meta WHERE key = 'retired_key_ids'").fetchone()
    conn.close()
    assert markers == 0  # whatever the crash left was finished or undone on open
    old_entry = f"master-key/{vault_id.decode()}/{old}"
    if point == "rotate-after-commit":
        # The retired key is kept (copies made before need it) until dropped on purpose.
        assert json.loads(retired[0]) == [old]
        assert keyring.get_password("galahad-desktop", old_entry) is not None
    else:
        assert retired is None and active == old


@on_the_real_keyring
def test_the_hostile_input_harness_scaled_down() -> None:
    """Issue #34's harness, one input of each kind (chosen by the seed) and one kill trial:
    no internal error, abort, hang, silent failure, leftover folder or empty conversation,
    and nothing stored changed (`python -m galahad_dev eval redteam` runs them all)."""
    from galahad_dev.redteam import redteam

    result = redteam(1, seed=3, log=lambda _m: None, per_kind=1, server=False)
    assert result["findings"] == []
    assert result["internal_errors"] == result["aborts"] == result["hangs"] == 0
    assert result["silent_failures"] == result["empty_conversations"] == 0
    assert result["leftover_folders"] == result["audit_problems"] == 0
    assert set(result["by_area"]) >= {
        "chat",
        "flags",
        "settings",
        "file",
        "paths",
        "device",
        "tools",
    }
    assert result["by_area"]["device"].get("refused") == 3  # settings, info, chat: all named


@on_the_real_keyring
def test_crash_trials_scaled_down() -> None:
    # One trial of each operation (seed 5 kills two of the three mid-work; `eval crashes
    # --trials 30` runs the whole evaluation).
    result = hardening.crash_trials(3, seed=5, log=lambda _m: None)
    assert result["survived"] == result["trials"] == 3
    assert result["by_operation"] == {"deposit": 1, "persist": 1, "rotate": 1}
    assert result["killed"] >= 1
