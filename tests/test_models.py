"""Models: the Gemma 4 catalog and the machine's fit, and downloads from a (fake, loopback)
Hugging Face Hub: verified, resumable, cancellable, and switched to."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from galahad_desktop.errors import CancelledError, InputError, IntegrityError
from galahad_desktop.models import catalog
from galahad_desktop.models.hub import download_gguf
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


def test_an_existing_file_of_that_name_is_hashed_not_trusted(hub: FakeHub, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    impostor = models / hub.filename
    impostor.write_bytes(b"X" * len(CONTENT))  # the right size, the wrong bytes
    done = download_gguf(hub.repo, hub.filename, models)
    assert done.resumed_from == 0 and done.path.read_bytes() == CONTENT
    again = download_gguf(hub.repo, hub.filename, models)  # now it matches: kept
    assert again.resumed_from == len(CONTENT)


def test_kv_bytes_per_token_follow_the_architecture() -> None:
    e2b, e4b, moe, dense = (catalog.model_for(s) for s in ("E2B", "e4b", "26B-A4B", "31B"))
    # E2B: 15 layers own KV (20 share it), 3 of them global, one KV head of 512: K+V in f16.
    assert e2b.kv_bytes_per_token == 3 * 2 * 1 * 512 * 2
    assert e4b.kv_bytes_per_token == 4 * 2 * 2 * 512 * 2
    assert moe.kv_bytes_per_token == 5 * 2 * 2 * 512 * 2
    assert dense.kv_bytes_per_token == 10 * 2 * 4 * 512 * 2
    assert e2b.block_bytes(10_000) == 10_000 * e2b.kv_bytes_per_token + e2b.window_bytes
    with pytest.raises(InputError, match="no Gemma 4 '7B'"):
        catalog.model_for("7B")


@pytest.mark.parametrize(
    ("gib", "expected"), [(2.0, None), (5.0, "E2B"), (8.0, "E4B"), (20.0, "26B-A4B"),
                          (48.0, "31B")]
)
def test_the_largest_model_that_fits_is_recommended(gib: float, expected: str | None) -> None:
    machine = catalog.Machine("GPU", "test GPU", int(gib * catalog.GIB))
    rec = catalog.recommend(8192, machine)
    assert rec.recommended == expected
    assert [c.size for c in rec.candidates] == ["E2B", "E4B", "26B-A4B", "31B"]
    assert all(c.fits == (c.memory_needed <= machine.memory_bytes) for c in rec.candidates)
    assert ("GPU" in rec.reason) or expected is None


def test_without_a_gpu_the_dense_31b_is_not_recommended() -> None:
    machine = catalog.Machine("CPU", "test CPU", 64 * catalog.GIB)
    rec = catalog.recommend(8192, machine)
    assert rec.recommended == "26B-A4B"  # 4B active: quick enough on a CPU
    assert "31B would answer too slowly" in rec.reason


def test_this_machine_is_measured_through_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    found = catalog.devices()
    assert found and found[0].total_bytes > 0  # at least the CPU with system memory
    monkeypatch.setenv("GALAHAD_FAKE_MEMORY_GIB", "5")
    assert catalog.Machine.detect().memory_bytes == 5 * catalog.GIB
