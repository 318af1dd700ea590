"""Models: the Gemma 4 catalog and the machine's fit, and downloads from a (fake, loopback)
Hugging Face Hub: verified, resumable, cancellable, and switched to."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from galahad_desktop.errors import CancelledError, InputError, IntegrityError
from galahad_desktop.jobs import Job
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
        hub.repo,
        hub.filename,
        tmp_path / "models",
        job=Job(on_progress=lambda p: seen.append(p.done)),
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
            job=Job(on_progress=lambda p: cancel.set(), cancel=cancel),
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


GPU_SPEED = catalog.Speed(8000.0, 250.0, "given")  # a mid-range GPU with the embedded model


@pytest.mark.parametrize(
    ("gib", "expected"), [(2.0, None), (5.0, "E2B"), (8.0, "E4B"), (20.0, "26B-A4B"), (48.0, "31B")]
)
def test_the_largest_model_that_fits_is_recommended(gib: float, expected: str | None) -> None:
    machine = catalog.Machine("GPU", "test GPU", int(gib * catalog.GIB))
    rec = catalog.recommend(8192, machine, GPU_SPEED)
    assert rec.recommended == expected
    assert [c.size for c in rec.candidates] == ["E2B", "E4B", "26B-A4B", "31B"]
    assert all(c.fits == (c.memory_needed <= machine.memory_bytes) for c in rec.candidates)
    assert ("GPU" in rec.reason) or expected is None


def test_the_catalog_sizes_are_the_hubs_and_the_window_is_what_llama_cpp_allocates() -> None:
    e4b, dense = catalog.model_for("E4B"), catalog.model_for("31B")
    assert e4b.bytes == 5_335_289_824
    assert e4b.window_cells(512) == 1024 and dense.window_cells(512) == 1536
    assert dense.memory_needed(8192) > int(dense.bytes * catalog.HEADROOM)


@pytest.mark.parametrize(
    ("prefill", "decode", "gib", "expected"),
    [
        (700.0, 45.0, 64, "E2B"),  # a 2-core laptop: only the smallest is quick
        (1600.0, 80.0, 64, "26B-A4B"),  # a fast desktop: the MoE (3.8B active) is quick
        (1600.0, 80.0, 12, "E4B"),  # ... and with less memory the largest that fits
        (200.0, 10.0, 64, None),  # too slow for any Gemma 4
    ],
)
def test_the_recommendation_on_a_cpu_is_by_speed_not_only_by_fit(
    prefill: float, decode: float, gib: int, expected: str | None
) -> None:
    machine = catalog.Machine("CPU", "test CPU", gib * catalog.GIB)
    rec = catalog.recommend(8192, machine, catalog.Speed(prefill, decode, "given"))
    assert rec.recommended == expected, rec.reason
    for c in rec.candidates:
        assert c.quick == (
            c.decode_tps >= catalog.MIN_DECODE_TPS and c.prefill_tps >= catalog.MIN_PREFILL_TPS
        )
    if expected is None:
        assert "too slow" in rec.reason
    else:
        assert "tokens/s" in rec.reason


def test_26b_a4b_is_not_recommended_on_two_cores_for_fitting() -> None:
    """The old rule picked the MoE because it fit and had few active parameters."""
    machine = catalog.Machine("CPU", "test CPU", int(23.5 * catalog.GIB))
    rec = catalog.recommend(8192, machine, catalog.Speed(700.0, 45.0, "given"))
    assert rec.recommended == "E2B" and "26B-A4B" in rec.reason  # fits, too slow


def test_this_machine_is_measured_through_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    from galahad_desktop.engine import devices

    found = devices.devices()
    assert found and found[-1].kind == "CPU" and found[-1].total_bytes > 0
    monkeypatch.setenv("GALAHAD_FAKE_MEMORY_GIB", "5")
    assert catalog.Machine.detect().memory_bytes == 5 * catalog.GIB


def test_no_connection_to_the_hub_is_said_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    with pytest.raises(InputError, match="No connection to the model hub"):
        download_gguf("google/x", "x.gguf", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_every_projector_is_pinned_to_its_repository_listing() -> None:
    """Each size's projector, by name and size, as its repository lists it. Source for all
    four: the listings at the revisions a third-party catalog pinned (publisher file sizes
    and LFS SHA-256 checked on 2026-10-07): ggml-org/gemma-4-E2B-it-GGUF@b4243c15,
    ggml-org/gemma-4-E4B-it-GGUF@b8093469 (also shared/GEMMA4-NOTES.md: 559,874,816 B),
    ggml-org/gemma-4-26B-A4B-it-GGUF@bb4531cd (a public recipe also gives 806 MB for its
    Q8_0 mmproj) and ggml-org/gemma-4-31B-it-GGUF@4fa4fdf3."""
    pinned = {
        "E2B": ("ggml-org/gemma-4-E2B-it-GGUF", "mmproj-gemma-4-E2B-it-Q8_0.gguf", 557_368_064),
        "E4B": ("ggml-org/gemma-4-E4B-it-GGUF", "mmproj-gemma-4-E4B-it-Q8_0.gguf", 559_874_816),
        "26B-A4B": (
            "ggml-org/gemma-4-26B-A4B-it-GGUF",
            "mmproj-gemma-4-26B-A4B-it-Q8_0.gguf",
            806_408_320,
        ),
        "31B": ("ggml-org/gemma-4-31B-it-GGUF", "mmproj-gemma-4-31B-it-Q8_0.gguf", 809_541_728),
    }
    listed = {m.size: (m.repo, m.projector, m.projector_bytes) for m in catalog.GEMMA4}
    assert listed == pinned
    for model in catalog.GEMMA4:  # each projector is its model's, from the same repository
        assert model.size in model.projector and model.file.startswith("gemma-4-" + model.size)
    assert [m.size for m in catalog.GEMMA4 if m.hears] == ["E2B", "E4B"]
