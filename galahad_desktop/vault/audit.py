"""The audit: every block file against its catalog row, every catalog record against its
seal, and the blocks folder for leftovers (removed with repair) and entries that do not
belong there (links, folders: reported, never followed or removed)."""

from __future__ import annotations

import os
from pathlib import Path

from galahad_desktop.errors import IntegrityError
from galahad_desktop.paths import ensure_private_dir
from galahad_desktop.system.files import TMP_PREFIX
from galahad_desktop.vault import blockfile
from galahad_desktop.vault.blockfile import MAGIC
from galahad_desktop.vault.held import HeldVault
from galahad_desktop.vault.names import (
    BLOCK_FILE,
    AuditReport,
    BlockRow,
    block_file_of,
    given_back,
    tokens_digest,
)


def _block_rows(vault: HeldVault, report: AuditReport) -> tuple[dict[str, BlockRow], set[str]]:
    """The catalog's blocks by file name, and the ids of those given back (no file)."""
    rows: dict[str, BlockRow] = {}
    all_rows = vault.records.blocks()
    report.blocks = len(all_rows)
    returned: set[str] = set()
    for row in all_rows:
        if given_back(row):
            returned.add(row["id"])
            continue
        try:
            rows[block_file_of(row)] = row
        except IntegrityError as exc:
            report.problems.append(str(exc).removesuffix("; refused."))
    report.given_back = len(returned)
    report.blocks -= len(returned)
    return rows, returned


def remove_crash_leftovers(vault: HeldVault) -> list[str]:
    """At start (the data directory locked: no write can be under way): what a kill during
    a block write or a give-back left in the blocks folder — unfinished writes, block files
    whose catalog row was never committed, files of given-back blocks — is removed. Files
    Galahad did not write are left for the audit to report."""
    report = AuditReport()
    rows, returned = _block_rows(vault, report)
    if report.problems:  # a damaged catalog: the audit says what, nothing is removed here
        return []
    _sweep(vault, rows, returned, True, report, foreign=False)
    if not report.repaired:
        return []
    n = len(report.repaired)
    return [f"Removed {n} file{'s' if n > 1 else ''} an interrupted write left behind."]


def audit(vault: HeldVault, repair: bool = False) -> AuditReport:
    report = AuditReport()
    rows, returned = _block_rows(vault, report)
    for file_name, row in rows.items():
        path = vault.blocks_dir / file_name
        try:
            size = path.lstat().st_size
            if size != row["file_bytes"]:
                raise IntegrityError(f"size {size} differs from the catalog's {row['file_bytes']}")
            header, raw = blockfile.read_header(path)
            if blockfile.header_digest(raw) != row["header_sha256"]:
                raise IntegrityError("header does not match the catalog")
            meta = vault.authenticate_file(row, path, header)
            if meta.get("tokens_sha256") != tokens_digest(vault.block_tokens(row)):
                raise IntegrityError("its token record does not match the block")
            report.ok += 1
        except FileNotFoundError:
            report.problems.append(f"block {row['id']}: file missing")
        except (IntegrityError, blockfile.BlockFormatError) as exc:
            report.problems.append(f"block {row['id']}: {exc}")
        except OSError as exc:
            report.problems.append(f"block {row['id']}: cannot be read ({exc.strerror})")
    referenced = {r["head_block_id"] for r in vault.catalog.select("conversations")}
    referenced |= {r["parent_id"] for r in rows.values()}
    referenced |= {r["block_id"] for r in vault.catalog.select("parts")}
    referenced |= {r["block_id"] for r in vault.catalog.select("documents")}
    if any(b is not None and not isinstance(b, str) for b in referenced):
        report.problems.append("catalog refers to a block by a value that is not an id")
    for block_id in sorted(b for b in referenced if b and isinstance(b, str)):
        if vault.catalog.get("blocks", block_id) is None:
            report.problems.append(f"catalog refers to missing block {block_id}")
    report.problems += vault.records.audit()
    try:
        vault.retired_key_ids()
    except IntegrityError as exc:
        report.problems.append(str(exc))
    _sweep(vault, rows, returned, repair, report)
    return report


def _sweep(
    vault: HeldVault,
    rows: dict[str, BlockRow],
    returned: set[str],
    repair: bool,
    report: AuditReport,
    foreign: bool = True,
) -> None:
    """The blocks folder against the catalog: leftovers reported (or, with repair, removed);
    links and folders reported, never followed; with `foreign`, files Galahad did not write
    reported (or moved aside)."""
    for path in sorted(vault.blocks_dir.iterdir()):
        if path.name in rows and path.is_file() and not path.is_symlink():
            continue
        if path.is_symlink() or not path.is_file():
            # Never followed or removed: a link or folder here was put by someone else.
            report.problems.append(
                f"unexpected {'link' if path.is_symlink() else 'entry'} {path.name} in "
                "the blocks folder"
            )
            continue
        match = BLOCK_FILE.fullmatch(path.name)
        if match is not None and match.group(1) in returned:
            # A give-back interrupted before its files went: nothing reads them.
            if repair:
                path.unlink()
                report.repaired.append(f"removed {path.name}, given back to the disk budget")
            continue
        ours = path.name.startswith(TMP_PREFIX) or _is_block_file(path)
        what = "unfinished write" if path.name.startswith(TMP_PREFIX) else "orphan file"
        if not ours and not foreign:
            continue
        if not repair:
            report.problems.append(f"{what} {path.name} is not in the catalog")
        elif ours:
            path.unlink()
            report.repaired.append(f"removed {what} {path.name}")
        else:
            # Not Galahad's to delete (a recovery kit someone saved there, say): moved aside.
            quarantine = ensure_private_dir(vault.data_dir / QUARANTINE)
            moved = quarantine / path.name
            os.replace(path, moved)
            report.repaired.append(f"moved {what} {path.name} to {moved} (not deleted)")


QUARANTINE = "quarantine"  # where repair moves files in the blocks folder it did not write


def _is_block_file(path: Path) -> bool:
    """Whether a file starts as every block file Galahad writes does."""
    try:
        with path.open("rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False
