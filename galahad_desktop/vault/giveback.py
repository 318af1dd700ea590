"""Giving blocks back to the disk budget: a block's file is deleted while its catalog row,
its encrypted ledger and its place in a chain stay, so what it held is re-read once when it
is next needed (memory/storage.py decides which and when).

The order makes it crash-safe: the rows are marked in one transaction first, then the files
go. A process killed in between leaves files of blocks already marked: nothing reads them,
the audit does not count them as problems, and `audit --repair` (or `finish`) removes
them. A process killed before the commit changed nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import cast

from galahad_desktop.faults import crashpoint
from galahad_desktop.system.files import fsync_dir
from galahad_desktop.vault.held import HeldVault
from galahad_desktop.vault.names import (
    BLOCK_FILE,
    BLOCK_ID,
    BLOCK_SUFFIX,
    BlockRow,
    given_back,
)


def give_back(vault: HeldVault, block_ids: list[str]) -> int:
    """Mark the blocks given back and delete their files; the bytes their files held."""
    rows = [
        cast("BlockRow", r)
        for r in vault.catalog.select_in("blocks", "id", block_ids)
        if not given_back(r)
    ]
    if not rows:
        return 0
    with vault.catalog.transaction():
        vault.catalog.update_in(
            "blocks", {"evicted_at": time.time()}, "id", [r["id"] for r in rows]
        )
    crashpoint("give-back-before-unlink")
    _unlink(vault.blocks_dir, [r["id"] for r in rows])
    return sum(r["file_bytes"] if isinstance(r["file_bytes"], int) else 0 for r in rows)


def finish(vault: HeldVault) -> int:
    """Delete files left behind by a give-back that was interrupted; how many."""
    on_disk = {
        match.group(1)
        for path in vault.blocks_dir.iterdir()
        if (match := BLOCK_FILE.fullmatch(path.name)) is not None
    }
    left = [r["id"] for r in vault.catalog.select_in("blocks", "id", on_disk) if given_back(r)]
    _unlink(vault.blocks_dir, left)
    return len(left)


def _unlink(blocks_dir: Path, block_ids: list[str]) -> None:
    for block_id in block_ids:
        if not BLOCK_ID.fullmatch(block_id):
            continue  # never a pattern from an edited catalog
        for path in blocks_dir.glob(f"{block_id}*{BLOCK_SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    fsync_dir(blocks_dir)


def bytes_on_disk(data_dir: Path) -> int:
    """What the data directory holds on disk (every regular file, the catalog's log too):
    what the budget is held to, rather than what the catalog believes."""
    total = 0
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
