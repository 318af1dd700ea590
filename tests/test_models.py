"""Model download from a (fake, loopback) Hugging Face Hub: verified, resumable, cancellable."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from galahad_desktop.errors import CancelledError, InputError, IntegrityError
from galahad_desktop.models import download_gguf
from tests.fakehub import FakeHub

CONTENT = b"GGUF" + os.urandom(3 * 1024 * 1024 + 123)


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    with FakeHub("google/gemma-test-GGUF", "gemma-test-Q4_K_M.gguf", CONTENT) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        yield fake


def test_download_is_verified_and_installed(hub: FakeHub, tmp_path: Path) -> None:
    seen: list[int] = []
    done = download_gguf(
        hub.repo, hub.filename, tmp_path / "models", progress=lambda have, total: seen.append(have)
    )
    assert done.path.read_bytes() == CONTENT and done.sha256 == hub.sha
    assert seen[-1] == len(CONTENT) and len(seen) >= 3
    assert oct(done.path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in (tmp_path / "models").iterdir()] == [hub.filename]


def test_interrupted_download_resumes_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    hub.drop_after = 1024 * 1024
    with pytest.raises(InputError, match="start it again to resume"):
        download_gguf(hub.repo, hub.filename, tmp_path)
    done = download_gguf(hub.repo, hub.filename, tmp_path)
    assert done.resumed_from == 1024 * 1024
    assert hub.ranges[-1] == f"bytes={1024 * 1024}-"
    assert done.path.read_bytes() == CONTENT


def test_cancel_keeps_the_partial_file_for_later(hub: FakeHub, tmp_path: Path) -> None:
    cancel = threading.Event()
    with pytest.raises(CancelledError, match="paused"):
        download_gguf(
            hub.repo,
            hub.filename,
            tmp_path,
            progress=lambda have, total: cancel.set(),
            cancel=cancel,
        )
    assert any(p.name.startswith(".partial-") for p in tmp_path.iterdir())
    assert download_gguf(hub.repo, hub.filename, tmp_path).resumed_from > 0


def test_a_file_that_does_not_match_its_sha256_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeHub("google/x", "x.gguf", CONTENT, advertised_sha="0" * 64) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        with pytest.raises(IntegrityError, match="does not match the SHA-256"):
            download_gguf(fake.repo, fake.filename, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_file_and_wrong_type(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="Could not find"):
        download_gguf(hub.repo, "missing.gguf", tmp_path)
    with pytest.raises(InputError, match=r"not a \.gguf"):
        download_gguf(hub.repo, "weights.bin", tmp_path)
