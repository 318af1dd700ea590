"""The destination matrix: export, backup and restore aimed at every kind of place a hostile
or careless path can name — inside the data directory, an existing file, a symbolic link, a
FIFO, a directory, a read-only folder, a full disk — each cell's outcome recorded, and the
data directory checked (audit clean, conversation intact) after every one.

Read-only and full destinations need a small tmpfs (root, as in CI); without root they are
reported as not run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from galahad_desktop.errors import GalahadError, as_user_error
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.vault.keys import MemoryKeyStore
from galahad_dev.fake_engine import fake_factory

PLACES = (
    "inside the data directory",
    "an existing file",
    "a symbolic link",
    "a FIFO",
    "a directory",
    "a read-only folder",
    "a full disk",
)


@contextlib.contextmanager
def _tmpfs(where: Path, size_kb: int, read_only: bool) -> Iterator[Path | None]:
    where.mkdir()
    if os.geteuid() != 0:
        yield None
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k,mode=0700", "tmpfs", str(where)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        yield None
        return
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        else:
            with contextlib.suppress(OSError), open(where / "filler", "wb") as filler:
                while True:
                    filler.write(b"\0" * 4096)
                    filler.flush()
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@contextlib.contextmanager
def backup_at(kind: str, root: Path, data: Path, good: Path) -> Iterator[Path | None]:
    """A restore's source of `kind`: a copy of the good backup there (a link: to it)."""
    if kind == "a symbolic link":
        (root / "target").symlink_to(good)
        yield root / "target"
    elif kind == "a directory":
        shutil.copytree(good, root / "target")
        yield root / "target"
    elif kind == "inside the data directory":
        shutil.copytree(good, data / "backup-inside")
        yield data / "backup-inside"
    elif kind == "a read-only folder":
        with _tmpfs(root / "mnt", 4096, read_only=False) as mount:
            if mount is None:
                yield None
                return
            (mount / "filler").unlink()
            shutil.copytree(good, mount / "target")
            subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
            yield mount / "target"
    elif kind == "a full disk":
        yield None  # the data directory's own disk: tests/test_reliability_cli.py
    else:
        with place(kind, root, data, "target") as target:
            yield target


@contextlib.contextmanager
def place(kind: str, root: Path, data: Path, name: str) -> Iterator[Path | None]:
    """A destination of `kind` for a file or folder called `name` (None: cannot be made)."""
    if kind == "inside the data directory":
        yield data / name
    elif kind == "an existing file":
        (root / name).write_text("the user's own file")
        yield root / name
    elif kind == "a symbolic link":
        (root / "elsewhere").mkdir(exist_ok=True)
        (root / name).symlink_to(data / "catalog.sqlite")
        yield root / name
    elif kind == "a FIFO":
        os.mkfifo(root / name)
        yield root / name
    elif kind == "a directory":
        (root / name).mkdir()
        (root / name / "keep.txt").write_text("mine")
        yield root / name
    else:
        with _tmpfs(root / "mnt", 64, read_only=kind == "a read-only folder") as mount:
            yield None if mount is None else mount / name


def _outcome(action: Callable[[], Any]) -> str:
    try:
        action()
    except GalahadError as exc:
        return f"refused, exit {exc.exit_code}: {str(exc)[:110]}"
    except OSError as exc:
        error = as_user_error(exc)
        if error is None:
            return f"internal error ({type(exc).__name__})"
        return f"refused, exit {error.exit_code}: {str(error)[:110]}"
    except Exception as exc:  # what the matrix is here to find
        return f"internal error ({type(exc).__name__})"
    return "written"


def _run(
    operation: str,
    kind: str,
    case: Path,
    data: Path,
    good: Path,
    core: Callable[[], Galahad],
    conversation: str,
) -> str:
    """One cell: export or back up *to* a place of `kind`, or restore *from* one."""
    if operation == "restore":
        with backup_at(kind, case, data, good) as source:
            if source is None:
                return (
                    "not run here (see the full-disk test)"
                    if kind == "a full disk"
                    else ("not run (needs root for a tmpfs)")
                )
            return _outcome(lambda: Galahad.restore(source, data))
    with place(kind, case, data, "target") as target:
        if target is None:
            return "not run (needs root for a tmpfs)"
        opened = core()
        try:
            if operation == "export":
                return _outcome(lambda: opened.export(conversation, "md", target))
            return _outcome(lambda: opened.backup(target))
        finally:
            opened.close()


def destination_matrix(log: Callable[[str], None]) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="galahad-destinations-"))
    keystore = MemoryKeyStore()
    data = root / "data"
    rows: list[dict[str, str]] = []
    problems: list[str] = []

    def core() -> Galahad:
        return Galahad(
            data, keystore=keystore, engine_factory=fake_factory(), overrides={"n_ctx": 4096}
        )

    # Restores open the directory's keystore themselves: the throwaway one, not the user's.
    patch = mock.patch("galahad_desktop.memory.facade_store.open_keystore", lambda *_a: keystore)
    patch.start()
    first = core()
    conversation = first.new_conversation()
    first.send(conversation, "Hello there.", params=first.sampling(max_tokens=8))
    first.backup(root / "good-backup")
    first.close()
    expected = 2
    try:
        for kind in PLACES:
            row = {"destination": kind}
            for operation in ("export", "backup", "restore"):
                case = root / f"case-{len(rows)}-{operation}"
                case.mkdir()
                row[operation] = _run(
                    operation, kind, case, data, root / "good-backup", core, conversation
                )
                check = core()
                try:
                    report = check.audit()
                    messages = len(check.messages(conversation))
                finally:
                    check.close()
                if report.problems or messages != expected:
                    problems.append(f"{operation} to {kind}: the data directory changed")
                if row.get(operation, "").startswith("internal"):
                    problems.append(f"{operation} to {kind}: {row[operation]}")
            rows.append(row)
            log(f"destinations: {kind}")
    finally:
        patch.stop()
        shutil.rmtree(root, ignore_errors=True)
    for row in rows:  # the throwaway folder's name says nothing
        for key, value in row.items():
            row[key] = value.replace(str(root), "…")
    return {"command": "eval destinations", "rows": rows, "problems": problems}
