"""Shared fixtures (the helpers tests import are in tests/helpers.py).

Two tiers. The fast tier (`pytest -m "not model"`) runs the core's logic on a deterministic
fake engine (galahad_dev/fake_engine.py) and an in-memory keystore: conversations, chains, routing,
vault, CLI parsing. The model tier uses real parts: the PyPI Gemma 3 270M and a generated
Gemma 4 test model through llama.cpp, real SQLite files, and (tests marked `keyring`) the
real OS keyring via Secret Service in a private session.

Tests that need the real keyring fail in CI when it is missing (the test command starts
gnome-keyring in a private D-Bus session: scripts/with-keyring.sh); outside CI they skip,
saying why. They never run against a developer's own login keyring.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.vault.keys import MemoryKeyStore
from galahad_dev.fake_engine import fake_factory
from tests.helpers import TEST_OVERRIDES

FAMILIES = ("gemma3", "gemma4")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    from galahad_desktop.paths import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def gemma4_path(gemma3_path: Path) -> Path:
    """The Gemma 4 test model: random weights, real architecture, tokenizer and template."""
    from galahad_dev.gemma4_model import build

    return build(gemma3_path)


@pytest.fixture(scope="session")
def vision_model(gemma4_path: Path) -> Path:
    """The Gemma 4 test model with its test vision projector beside it (where Galahad finds
    a projector on its own)."""
    from galahad_dev.gemma4_projector import build

    build(out_dir=gemma4_path.parent)
    return gemma4_path


@pytest.fixture(scope="session")
def hearing_model(gemma4_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Gemma 4 test model in a folder of its own, beside a test projector that sees and
    hears (where Galahad finds a projector on its own)."""
    from galahad_dev.gemma4_projector import AudioShape, build

    folder = tmp_path_factory.mktemp("hearing")
    model = folder / gemma4_path.name
    os.symlink(gemma4_path, model)
    build(out_dir=folder, audio=AudioShape())
    return model


@pytest.fixture(scope="session")
def model_path(gemma3_path: Path) -> Path:
    return gemma3_path


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def family_model(family: str, request: pytest.FixtureRequest) -> Path | None:
    """The model file of the parametrized family (None: the embedded Gemma 3)."""
    if family == "gemma4":
        return Path(request.getfixturevalue("gemma4_path"))
    return None


@pytest.fixture()
def keystore() -> MemoryKeyStore:
    return MemoryKeyStore()


@contextlib.contextmanager
def _closed_after() -> Iterator[list[Galahad]]:
    """The cores a factory opened, each closed when the test is done."""
    opened: list[Galahad] = []
    try:
        yield opened
    finally:
        for core in opened:
            with contextlib.suppress(Exception):
                core.close()


@pytest.fixture()
def make_core(
    tmp_path: Path, keystore: MemoryKeyStore, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Galahad]]:
    """Open a Galahad core on tmp_path/data (a fresh engine each call) with the real model:
    the parametrized family when the test asks for `family`, else the embedded Gemma 3."""
    model = None
    if "family" in request.fixturenames:
        model = request.getfixturevalue("family_model")
    with _closed_after() as opened:

        def factory(data: Path | None = None, **overrides: Any) -> Galahad:
            core = Galahad(
                data or tmp_path / "data",
                model_path=model,
                keystore=keystore,
                overrides={**TEST_OVERRIDES, **overrides},
            )
            opened.append(core)
            return core

        yield factory


@pytest.fixture()
def make_fake_core(tmp_path: Path, keystore: MemoryKeyStore) -> Iterator[Callable[..., Galahad]]:
    """A core on the fake engine (fast tier): real vault, catalog, chains and proofs."""
    with _closed_after() as opened:

        def factory(flavour: str = "gemma3", data: Path | None = None, **overrides: Any) -> Galahad:
            core = Galahad(
                data or tmp_path / "data",
                model_path=tmp_path / f"fake-{flavour}.gguf",
                keystore=keystore,
                overrides={"n_ctx": 2048, "temperature": 0.0, **overrides},
                engine_factory=fake_factory(flavour),
            )
            opened.append(core)
            return core

        yield factory


def _private_keyring() -> bool:
    """Only the throwaway keyring scripts/with-keyring.sh starts may be written to."""
    return os.environ.get("GALAHAD_KEYRING_READY") == "1"


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
    if _private_keyring() and _secret_service_available():
        return
    message = (
        "The real OS keyring (Secret Service) in a private session is not available; run the "
        "suite through scripts/test.sh, which starts a throwaway gnome-keyring (the tests "
        "never write into your own login keyring)."
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture()
def serve(make_fake_core: Callable[..., Galahad]) -> Iterator[Callable[..., Any]]:
    """Start a local server on a fake core: `serve(core=None, limits=None) -> Served`."""
    from tests.served import Served  # the server's stack, imported only where it is used

    started: list[Served] = []

    def start(core: Galahad | None = None, limits: Any = None) -> Served:
        served = Served(core or make_fake_core(), limits)
        started.append(served)
        return served

    yield start
    for served in started:
        served.close()
