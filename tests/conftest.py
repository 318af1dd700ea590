"""Shared fixtures. Real parts: the PyPI Gemma 3 270M model through llama.cpp, real SQLite
files, and (for tests marked `keyring`) the real OS keyring via Secret Service.

Tests that need the real keyring fail in CI when it is missing (the test command starts
gnome-keyring in a private D-Bus session: scripts/with-keyring.sh); outside CI they skip,
saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from galahad_desktop.memory.service import Galahad
from galahad_desktop.paths import default_model_path
from galahad_desktop.vault.keys import MemoryKeyStore

ROOT = Path(__file__).resolve().parent.parent
# Small context keeps model tests quick; byte-exactness does not depend on it.
TEST_OVERRIDES = {"n_ctx": 4096, "n_threads": 2}


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture()
def keystore() -> MemoryKeyStore:
    return MemoryKeyStore()


@pytest.fixture()
def make_core(tmp_path: Path, keystore: MemoryKeyStore) -> Iterator[Callable[..., Galahad]]:
    """Open a Galahad core on tmp_path/data (a fresh engine each call)."""
    opened: list[Galahad] = []

    def factory(**overrides: Any) -> Galahad:
        core = Galahad(
            tmp_path / "data", keystore=keystore, overrides={**TEST_OVERRIDES, **overrides}
        )
        opened.append(core)
        return core

    yield factory
    for core in opened:
        with contextlib.suppress(Exception):
            core.close()


def _secret_service_available() -> bool:
    try:
        import keyring
        from keyring.backends import SecretService

        return (
            isinstance(keyring.get_keyring(), SecretService.Keyring)
            and keyring.get_keyring().priority > 0
        )
    except Exception:
        return False


@pytest.fixture()
def real_keyring() -> None:
    if _secret_service_available():
        return
    message = (
        "The real OS keyring (Secret Service) is not reachable; run the suite through "
        "scripts/test.sh, which starts gnome-keyring in a private D-Bus session."
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def run_cli(
    *args: str,
    data_dir: Path,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run `galahad` in a new process (a fresh engine), as a user would."""
    full_env = {**os.environ, **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "galahad_desktop.cli",
        "--data-dir",
        str(data_dir),
        "--set",
        f"n_ctx={TEST_OVERRIDES['n_ctx']}",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"galahad {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return proc


def cli_json(*args: str, data_dir: Path, **kw: Any) -> dict[str, Any]:
    proc = run_cli(*args, "--json", data_dir=data_dir, **kw)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {proc.stdout!r}"
    result: dict[str, Any] = json.loads(lines[0])
    return result


def story(n_sentences: int, secret: str = "Arthur's access code is 8842.") -> str:
    """A document with a needle in the middle."""
    names = ["Gawain", "Percival", "Bors", "Tristan", "Kay", "Bedivere", "Gareth"]
    lines = [
        f"{names[i % len(names)]} rode {i % 17 + 2} miles to the castle on day {i}."
        for i in range(n_sentences)
    ]
    lines.insert(n_sentences // 2, secret)
    return "\n".join(lines) + "\n"
