"""Sizes in words people write: "20GB", "1.5 TB", "800 MiB", "0"."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from galahad_desktop.errors import InputError

UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str, what: str = "a size") -> int:
    """Bytes from '20GB' (decimal units, as disks are sold), '16GiB' (binary) or a plain
    number of bytes; an InputError naming `what` otherwise."""
    match = _SIZE.fullmatch(text) if len(text) < 40 else None
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in UNITS:
        raise InputError(
            f"{what} must be a size such as 20GB, 500MB or 1.5TB (0 for no limit), got {text!r}."
        )
    return int(float(match.group(1)) * UNITS[unit])


def human_size(n: float) -> str:
    """1,234,567,890 -> '1.2 GB' (decimal units, as `parse_size` reads them back)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or (unit == "GB" and abs(n) < 1000**2):
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def within_the_disk(size: int | None, folder: Path, what: str) -> None:
    """Refuse a limit larger than the whole disk under `folder`: it could never be reached
    (a budget of 9,000 TB was saved as given)."""
    if not size:
        return
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    disk = shutil.disk_usage(folder).total
    if size > disk:
        raise InputError(
            f"{what} is {human_size(size)}, more than the whole disk that holds the data "
            f"directory ({human_size(disk)}): it could never be reached. Choose at most "
            f"{human_size(disk)}, 0 for no limit, or leave it empty for the automatic "
            "budget. Nothing was saved."
        )
