"""Where files go and what is read, under hostile input (issue #26, findings 1, 4, 8 and 9):
an export never lands inside the data directory, onto an existing file unasked, through a
symbolic link or onto a device; imports and recovery kits read regular files only, bounded
by bytes actually read; a closed pipe ends the command quietly."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from galahad_desktop.errors import InputError
from galahad_desktop.system.files import check_export_destination, read_regular_file
from tests.helpers import cli_json, run_cli

PASSPHRASE_ENV = {
    "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
    "GALAHAD_PASSPHRASE": "correct horse battery",
}


# -- the rules, without a model ---------------------------------------------------------


def test_a_fifo_and_a_device_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_regular_file(fifo, 1024, "an import")  # no writer: would block forever
    with pytest.raises(InputError, match="not a regular file"):
        read_regular_file(Path("/dev/zero"), 1024, "an import")  # would fill memory


def test_reads_are_bounded_by_bytes_read(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 2049)
    with pytest.raises(InputError, match="larger than"):
        read_regular_file(big, 2048, "an import")
    assert read_regular_file(big, 4096, "an import") == b"x" * 2049


def test_export_destinations(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "catalog.sqlite").write_bytes(b"catalog")
    with pytest.raises(InputError, match="inside Galahad's data directory"):
        check_export_destination(data / "catalog.sqlite", data, force=True)
    with pytest.raises(InputError, match="inside Galahad's data directory"):
        check_export_destination(tmp_path / "data" / ".." / "data" / "new.md", data, force=False)
    existing = tmp_path / "notes.md"
    existing.write_text("mine")
    with pytest.raises(InputError, match="already exists"):
        check_export_destination(existing, data, force=False)
    assert check_export_destination(existing, data, force=True) == existing.resolve()
    link = tmp_path / "link.md"
    link.symlink_to(data / "catalog.sqlite")
    with pytest.raises(InputError, match="symbolic link"):
        check_export_destination(link, data, force=True)
    with pytest.raises(InputError, match="not a regular file"):
        check_export_destination(Path("/dev/full"), data, force=True)
    with pytest.raises(InputError, match="is a directory"):
        check_export_destination(tmp_path, data, force=True)
    with pytest.raises(InputError, match="does not exist"):
        check_export_destination(tmp_path / "nowhere" / "x.md", data, force=False)


# -- through the command, with the real model -------------------------------------------


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A data directory (passphrase-protected: no keyring needed) with one conversation."""
    data = tmp_path / "data"
    transcript = tmp_path / "chat.md"
    transcript.write_text("## You\n\nHello there.\n\n## Gemma\n\nHello, how can I help?\n")
    imported = cli_json(
        "import", str(transcript), "--passphrase", data_dir=data, env=PASSPHRASE_ENV
    )
    yield data, imported["conversations"][0]["conversation_id"]


def _digests(data: Path) -> dict[str, str]:
    """Block files and settings byte for byte (the catalog itself changes on every open: its
    rollback counter advances; it is checked by reading it back)."""
    return {
        str(p.relative_to(data)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted([*data.rglob("*.gkv"), *data.glob("settings.json")])
    }


@pytest.mark.model
def test_an_export_cannot_replace_what_is_stored(tmp_path: Path, store: tuple[Path, str]) -> None:
    data, conversation = store
    before = _digests(data)
    shown = cli_json("show", conversation, data_dir=data, env=PASSPHRASE_ENV)
    targets = [data / "catalog.sqlite", data / "settings.json"]
    targets += sorted(data.rglob("*.gkv"))[:1]
    link = tmp_path / "innocent.md"
    link.symlink_to(data / "catalog.sqlite")
    for target in [*targets, link]:
        proc = run_cli(
            "export",
            conversation,
            "--out",
            str(target),
            "--force",
            data_dir=data,
            env=PASSPHRASE_ENV,
            check=False,
        )
        assert proc.returncode == 4, (target, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert _digests(data) == before and len(before) >= 1
    assert cli_json("show", conversation, data_dir=data, env=PASSPHRASE_ENV) == shown
    mine = tmp_path / "mine.md"
    mine.write_text("my own notes")
    refused = run_cli(
        "export",
        conversation,
        "--out",
        str(mine),
        data_dir=data,
        env=PASSPHRASE_ENV,
        check=False,
    )
    assert refused.returncode == 4 and "--force" in refused.stderr
    assert mine.read_text() == "my own notes"
    cli_json(
        "export", conversation, "--out", str(mine), "--force", data_dir=data, env=PASSPHRASE_ENV
    )
    assert "Hello there." in mine.read_text()


@pytest.mark.model
def test_imports_and_kits_from_devices_and_fifos_end_at_once(
    tmp_path: Path, store: tuple[Path, str]
) -> None:
    data, _conversation = store
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for command in ("import", "keys import"):
        for source in ("/dev/zero", str(fifo)):
            proc = run_cli(
                *command.split(),
                source,
                data_dir=data,
                env={**PASSPHRASE_ENV, "GALAHAD_RECOVERY_PASSPHRASE": "a long recovery phrase"},
                check=False,
                timeout=60,
            )
            assert proc.returncode == 4, (command, source, proc.stderr)
            assert "not a regular file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.model
def test_a_closed_pipe_ends_the_command_quietly(store: tuple[Path, str]) -> None:
    data, _conversation = store
    cmd = [sys.executable, "-m", "galahad_desktop.cli", "--data-dir", str(data), "--json"]
    env = {**os.environ, **PASSPHRASE_ENV}
    for args in (["list"], ["show", "c-nope"]):
        reader = subprocess.Popen(["head", "-c", "0"], stdin=subprocess.PIPE)
        proc = subprocess.run(
            [*cmd, *args],
            stdout=reader.stdin,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
        assert reader.stdin is not None
        reader.stdin.close()
        reader.wait()
        assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 3, 141)


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_the_destination_matrix_changes_nothing_and_writes_only_where_allowed() -> None:
    """Export, backup and restore against every kind of place (docs/reliability.md has the
    table): no internal error, the data directory intact after every cell."""
    from galahad_dev.destinations import PLACES, destination_matrix

    result = destination_matrix(lambda _line: None)
    assert result["problems"] == []
    rows = {row["destination"]: row for row in result["rows"]}
    assert list(rows) == list(PLACES)
    for kind in ("inside the data directory", "an existing file", "a symbolic link", "a FIFO"):
        assert rows[kind]["export"].startswith("refused, exit 4"), rows[kind]
        assert rows[kind]["backup"].startswith("refused, exit 4"), rows[kind]
    assert rows["a symbolic link"]["restore"].startswith("refused, exit 5")  # never followed
    assert rows["a directory"]["restore"] == "written"  # a real backup restores
    if os.geteuid() == 0:  # a tmpfs can be mounted (CI runs as root)
        assert rows["a full disk"]["export"].startswith("refused, exit 11")
        assert rows["a read-only folder"]["backup"].startswith("refused, exit 10")
