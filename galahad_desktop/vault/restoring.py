"""Restore: a backup (or an older copy) made the data directory, on purpose, journalled so
that a restore killed at any point is finished or rolled back by the next start."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from galahad_desktop.errors import (
    DiskFullError,
    InputError,
    IntegrityError,
    StorageError,
    user_path,
)
from galahad_desktop.faults import crashpoint
from galahad_desktop.paths import ensure_private_dir
from galahad_desktop.system.files import atomic_write_bytes, fsync_dir, read_regular_file
from galahad_desktop.system.lock import LOCK_NAME, DataDirLock
from galahad_desktop.vault.custody import COPIED_FILES, copy_file
from galahad_desktop.vault.names import AuditReport


@dataclass
class RestoreResult:
    data_dir: str
    restored_from: str
    previous_kept_at: str | None


def restore(
    backup_dir: Path,
    data_dir: Path,
    check: Callable[[Path], AuditReport],
    accept: Callable[[Path], None],
) -> tuple[RestoreResult, AuditReport]:
    """Make a backup (or an older copy) the data directory, on purpose.

    The data directory is locked first (a busy one changes nothing). The backup's regular
    files are copied into a temporary directory — a link, a device or a FIFO anywhere in it
    is refused — and `check` audits the copy without touching the rollback counter. Only a
    copy the audit passes is installed; what was there is moved aside, never deleted; then
    `accept` opens the new directory as the current generation. A refusal at any step
    (exit 5 for a damaged backup) leaves the data directory and the counter as they were.
    """
    backup_dir, data_dir = user_path(backup_dir), user_path(data_dir)
    recover_restore(data_dir)  # an earlier restore interrupted: resolved first
    catalog = backup_dir / "catalog.sqlite"
    if backup_dir.is_symlink() or catalog.is_symlink() or (backup_dir / "blocks").is_symlink():
        raise IntegrityError(f"{backup_dir} holds links where a backup holds files; refused.")
    if not catalog.is_file() or not (backup_dir / "blocks").is_dir():
        raise InputError(f"{backup_dir} is not a Galahad backup (no catalog and blocks).")
    if backup_dir.resolve() == data_dir.resolve():  # in place: accept it as it is
        report = check(data_dir)
        accept(data_dir)
        return RestoreResult(str(data_dir), str(backup_dir), None), report
    lock: DataDirLock | None = None
    if data_dir.is_dir() and any(data_dir.iterdir()):
        lock = DataDirLock(data_dir, 2.0)
        lock.acquire()  # never replace a directory another Galahad is using
    data_dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = data_dir.parent / f"{RESTORE_TMP}{data_dir.name}-{secrets.token_hex(4)}"
    journal = _journal_path(data_dir)
    aside: Path | None = None
    try:
        _check_backup_sizes(backup_dir, data_dir.parent)
        # Journalled first: a restore killed at any point is rolled back, or finished, by
        # the next start (recover_restore), never left as debris or a refused directory.
        _write_journal(journal, {"stage": "copying", "tmp": str(tmp), "backup": str(backup_dir)})
        report = _copy_and_audit(backup_dir, tmp, check)
        aside = _aside_name(data_dir)
        _write_journal(
            journal,
            {
                "stage": "swapping",
                "tmp": str(tmp),
                "backup": str(backup_dir),
                "aside": str(aside) if aside else None,
            },
        )
        crashpoint("restore-swapping")
        if aside is not None:
            os.replace(data_dir, aside)
            crashpoint("restore-moved-aside")
        elif data_dir.exists():
            shutil.rmtree(data_dir)
        os.replace(tmp, data_dir)
        fsync_dir(data_dir.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_journal(journal)
        raise StorageError(f"The backup could not be restored: {exc.strerror}.") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_journal(journal)
        raise
    finally:
        if lock is not None:
            lock.release()
    accept(data_dir)
    _remove_journal(journal)
    return RestoreResult(str(data_dir), str(backup_dir), str(aside) if aside else None), report


def _copy_and_audit(
    backup_dir: Path, tmp: Path, check: Callable[[Path], AuditReport]
) -> AuditReport:
    """Copy the backup's regular files into `tmp` and audit the copy; a copy with any
    problem is refused (IntegrityError), the data directory untouched."""
    ensure_private_dir(tmp / "blocks")
    for name in COPIED_FILES:
        if (backup_dir / name).exists() or (backup_dir / name).is_symlink():
            copy_file(backup_dir / name, tmp / name)
    for path in (backup_dir / "blocks").iterdir():
        copy_file(path, tmp / "blocks" / path.name)
    fsync_dir(tmp / "blocks")
    report = check(tmp)
    if report.problems:
        more = f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise IntegrityError(
            f"The backup did not pass the audit: {report.problems[0]}{more}. It was not "
            "restored; the data directory is as it was."
        )
    return report


def _aside_name(data_dir: Path) -> Path | None:
    """Where what the data directory holds now is moved (None: it holds nothing)."""
    if not (data_dir.exists() and any(p.name != LOCK_NAME for p in data_dir.iterdir())):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = data_dir.with_name(f"{data_dir.name}.before-restore-{stamp}")
    if aside.exists():
        aside = aside.with_name(f"{aside.name}-{secrets.token_hex(2)}")
    return aside


RESTORE_TMP = ".tmp-galahad-restore-"  # + the data directory's name and a token


def _journal_path(data_dir: Path) -> Path:
    return data_dir.parent / f".galahad-restore-{data_dir.name}.json"


def _write_journal(journal: Path, entry: dict[str, Any]) -> None:
    atomic_write_bytes(journal, json.dumps(entry).encode("utf-8"))


def _remove_journal(journal: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        journal.unlink()


def _check_backup_sizes(backup_dir: Path, target: Path) -> None:
    """Before anything is copied: every block file is one the backup's catalog lists, of
    the size it lists, not sparse, and the whole fits on the disk with room to spare (a
    crafted backup must not fill the disk before the audit refuses it)."""
    listed: dict[str, int] = {}
    try:
        conn = sqlite3.connect(f"file:{backup_dir / 'catalog.sqlite'}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT id, file_name, file_bytes FROM blocks").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        raise IntegrityError(
            f"{backup_dir} does not hold a readable Galahad catalog; refused. Nothing was changed."
        ) from None
    for block_id, file_name, file_bytes in rows:
        name = str(file_name or f"{block_id}.gkv")
        if Path(name).name != name or name in (".", ".."):
            raise IntegrityError(
                f"The backup's catalog names an invalid file for block {block_id} ({name!r}); "
                "refused. Nothing was changed."
            )
        listed[name] = file_bytes if isinstance(file_bytes, int) else -1  # -1: never matches
    total = 0
    for path in (backup_dir / "blocks").iterdir():
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode):
            raise IntegrityError(
                f"{path} is not a regular file (a link, a device or unreadable); refused. "
                "Nothing was changed."
            )
        expected = listed.get(path.name)
        if expected is None:
            raise IntegrityError(
                f"{path.name} in the backup is not a block its catalog lists; refused. "
                "Nothing was changed."
            )
        if info.st_size != expected or (
            hasattr(info, "st_blocks") and info.st_blocks * 512 < info.st_size // 2
        ):
            raise IntegrityError(
                f"{path.name} in the backup is not the size its catalog lists (or is "
                "sparse); refused. Nothing was changed."
            )
        total += info.st_size
    for name in COPIED_FILES:
        if (backup_dir / name).is_file():
            total += (backup_dir / name).stat().st_size
    free = shutil.disk_usage(target).free
    if total + 64 * 2**20 > free:
        raise DiskFullError(
            f"The backup needs {total / 2**20:,.0f} MiB and the disk has {free / 2**20:,.0f} "
            "MiB free; nothing was changed."
        )


def recover_restore(data_dir: Path) -> tuple[str | None, bool]:
    """At start, before anything opens `data_dir`: finish or roll back a restore that was
    interrupted. Returns (what happened, in words, or None; whether the restored copy is
    to be accepted as the current generation)."""
    journal = _journal_path(data_dir)
    if not journal.is_file() or journal.is_symlink():
        return None, False
    try:
        entry = json.loads(read_regular_file(journal, 64 * 1024, "a restore journal"))
        tmp = Path(str(entry["tmp"]))
        aside = Path(str(entry["aside"])) if entry.get("aside") else None
        stage, backup_dir = str(entry["stage"]), str(entry.get("backup", ""))
    except (InputError, ValueError, KeyError, TypeError):
        _remove_journal(journal)
        return None, False
    if not tmp.name.startswith(RESTORE_TMP) or tmp.parent != data_dir.parent:
        _remove_journal(journal)  # not one this code wrote: nothing is removed on its word
        return None, False
    moved = aside is not None and aside.exists()
    kept = f" The directory it replaced is kept at {aside}." if aside else ""
    finished = f"A restore from {backup_dir} was interrupted and has been finished.{kept}"
    if stage == "accepting" and data_dir.is_dir():
        return finished, True  # in place, not yet opened as the current generation
    if stage == "copying" or (stage == "swapping" and not moved and data_dir.exists()):
        # Killed before anything was swapped: the data directory is as it was.
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_journal(journal)
        return (
            f"A restore from {backup_dir} was interrupted before it changed anything; its "
            "temporary copy was removed and the data directory is as it was.",
            False,
        )
    if stage == "swapping" and tmp.is_dir():
        # Killed between the two moves: the second is made now. Whatever appeared at the
        # directory's place meanwhile is set aside, never deleted.
        if data_dir.exists() or data_dir.is_symlink():
            os.replace(
                data_dir,
                data_dir.with_name(f"{data_dir.name}.during-restore-{secrets.token_hex(2)}"),
            )
        os.replace(tmp, data_dir)
        fsync_dir(data_dir.parent)
    if data_dir.is_dir():
        # Kept until the restored copy has been opened as the current generation
        # (`accepted`): a start killed before that must still know it is to be accepted.
        _write_journal(journal, {**entry, "stage": "accepting"})
        return finished, True
    _remove_journal(journal)
    return None, False


def accepted(data_dir: Path) -> None:
    """The restored copy was opened as the current generation: its journal can go."""
    journal = _journal_path(data_dir)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(journal.read_text("utf-8")).get("stage") == "accepting":
            _remove_journal(journal)


# -- retired keys ------------------------------------------------------------------------
