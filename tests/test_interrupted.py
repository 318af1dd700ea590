"""Backup and restore killed at their worst moments (SIGKILL at a crash point, like a power
cut), then the next start: a restore is finished or rolled back with a message that says
which, a backup leaves no temporary folder and no phantom record, and nothing is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from galahad_desktop.errors import IntegrityError
from galahad_desktop.memory.galahad import Galahad
from tests.helpers import ROOT

# Each trial starts processes and kills them: seconds, so the full suite's, not the fast tier's.
pytestmark = pytest.mark.model

SCRIPT = r"""
import json, sys
from pathlib import Path
from galahad_desktop.memory.galahad import Galahad
from galahad_dev.fake_engine import fake_factory

mode, data, backup = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
phrase = "a long test passphrase for the crash trials 42"

def core():
    return Galahad(data, model_path=data.parent / "fake.gguf", passphrase=phrase,
                   engine_factory=fake_factory(), overrides={"n_ctx": 2048})

if mode == "make":
    c = core()
    conversation = c.send(None, "Hello there.", max_tokens=8).conversation_id
    c.backup(backup)
    c.send(conversation, "Later.", max_tokens=8)
    print(conversation)
    c.close()
elif mode == "restore":
    Galahad.restore(backup, data, passphrase=phrase)
elif mode == "backup":
    c = core()
    c.backup(backup)
    c.close()
elif mode == "open":
    c = core()
    conversation = sys.argv[4]
    print(json.dumps({"notes": c.start_notes(), "messages": len(c.messages(conversation)),
                      "backups": [b.path for b in c.backups()],
                      "problems": c.audit().problems}))
    c.close()
"""


def _run(*args: str, crash: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GALAHAD_CRASHPOINT", None)
    if crash:
        env["GALAHAD_CRASHPOINT"] = crash
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _made(tmp_path: Path) -> tuple[Path, Path, str]:
    data, backup = tmp_path / "data", tmp_path / "backup"
    made = _run("make", str(data), str(backup))
    assert made.returncode == 0, made.stderr
    return data, backup, made.stdout.strip()


def _opened(data: Path, conversation: str) -> dict[str, object]:
    opened = _run("open", str(data), str(data.parent / "unused"), conversation)
    assert opened.returncode == 0, opened.stderr
    result: dict[str, object] = json.loads(opened.stdout)
    return result


@pytest.mark.parametrize(
    ("crash", "finished"),
    [("restore-swapping", False), ("restore-moved-aside", True), ("restore-accepting", True)],
)
def test_a_restore_killed_midway_is_rolled_back_or_finished_at_the_next_start(
    tmp_path: Path, crash: str, finished: bool
) -> None:
    data, backup, conversation = _made(tmp_path)
    killed = _run("restore", str(data), str(backup), crash=crash)
    assert killed.returncode == -9
    opened = _opened(data, conversation)
    notes = " ".join(map(str, opened["notes"]))  # type: ignore[call-overload]
    if finished:
        assert "has been finished" in notes and opened["messages"] == 2  # the backup's
        assert list(tmp_path.glob("data.before-restore-*"))  # what it replaced is kept
    else:
        assert "before it changed anything" in notes and opened["messages"] == 4
    assert opened["problems"] == []
    assert not list(tmp_path.glob(".tmp-galahad-restore-*"))
    assert not list(tmp_path.glob(".galahad-restore-*"))
    again = _opened(data, conversation)
    assert again["notes"] == []  # said once


def test_a_backup_killed_midway_leaves_no_folder_and_no_phantom_record(tmp_path: Path) -> None:
    data, _backup, conversation = _made(tmp_path)
    second = tmp_path / "second"
    killed = _run("backup", str(data), str(second), crash="backup-copied")
    assert killed.returncode == -9 and list(tmp_path.glob(".tmp-galahad-backup-*"))
    opened = _opened(data, conversation)
    assert not list(tmp_path.glob(".tmp-galahad-backup-*")) and not second.exists()
    assert "was interrupted" in " ".join(map(str, opened["notes"]))  # type: ignore[call-overload]
    assert opened["backups"] == [str((tmp_path / "backup").resolve())]
    assert opened["problems"] == []


@pytest.mark.parametrize("kind", ["sparse", "unlisted", "resized"])
def test_a_crafted_backup_is_refused_before_anything_is_copied(
    tmp_path: Path, make_fake_core: Any, kind: str
) -> None:
    """Restore checks the backup's block files against its catalog before it copies a byte:
    a huge sparse file, a file the catalog does not list, or one of another size."""
    core = make_fake_core()
    core.send(None, "Remember the harbour.")
    backup = tmp_path / "backup"
    core.backup(backup)
    core.close()
    blocks = backup / "blocks"
    listed = sorted(blocks.iterdir())
    if kind == "sparse":
        with open(listed[0], "r+b") as handle:
            handle.truncate(2 * 1024**3)  # 2 GiB declared, nothing written
    elif kind == "unlisted":
        (blocks / "extra.gkv").write_bytes(b"x" * 1024)
    else:
        listed[0].write_bytes(listed[0].read_bytes() + b"more")
    target = tmp_path / "restored"
    with pytest.raises(IntegrityError, match="refused"):
        Galahad.restore(backup, target)
    assert not target.exists() or not any(target.iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-galahad-restore")]
