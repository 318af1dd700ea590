"""Weights loaded once per process (engine/native.py `_SharedWeights`): a second engine on the
same file and placement reuses them and computes the same logits; other weights loaded
free the idle ones first; a file whose bytes may have changed is loaded again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from galahad_desktop.engine.engine import Engine
from galahad_desktop.engine.native import free_idle_weights
from galahad_desktop.engine.values import EngineConfig

pytestmark = pytest.mark.model


def _logits(engine: Engine) -> bytes:
    engine.evaluate(engine.bos() + engine.encode_text("The heron archive keeps scrolls."))
    return np.asarray(engine.last_logits(), dtype=np.float32).tobytes()


def _reused_and_computes(path: Path, expected: bytes) -> None:
    engine = Engine(EngineConfig(path, n_ctx=1024))
    try:
        assert engine.model.reused
        assert _logits(engine) == expected
    finally:
        engine.close()


def test_a_second_engine_reuses_the_weights_and_computes_the_same(gemma3_path: Path) -> None:
    free_idle_weights()
    first = Engine(EngineConfig(gemma3_path, n_ctx=1024))
    try:
        assert not first.model.reused
        expected = _logits(first)
        # Another context size and cache type: the same weights, a context of its own.
        second = Engine(EngineConfig(gemma3_path, n_ctx=2048, kv_type="q8_0", flash_attn=True))
        try:
            assert second.model.reused
            assert second.model.handle == first.model.handle
            assert second.placement.model_buffers == first.placement.model_buffers
            assert second.placement.model_buffers  # the load's log, kept for the reuse
        finally:
            second.close()
        _reused_and_computes(gemma3_path, expected)
    finally:
        first.close()
    assert free_idle_weights() == 1  # nobody uses them: freed on request
    assert free_idle_weights() == 0
    again = Engine(EngineConfig(gemma3_path, n_ctx=1024))
    try:
        assert not again.model.reused
        assert _logits(again) == expected
    finally:
        again.close()


def test_other_weights_free_the_idle_ones_but_not_those_in_use(
    gemma3_path: Path, gemma4_path: Path
) -> None:
    free_idle_weights()
    Engine(EngineConfig(gemma3_path, n_ctx=1024)).close()  # idle now
    in_use = Engine(EngineConfig(gemma4_path, n_ctx=1024))
    try:
        expected = _logits(in_use)
        fresh = Engine(EngineConfig(gemma3_path, n_ctx=1024))
        try:
            assert not fresh.model.reused  # loading Gemma 4 freed the idle Gemma 3
        finally:
            fresh.close()
        # Gemma 4 was in use when Gemma 3 loaded again: still loaded, still right.
        _reused_and_computes(gemma4_path, expected)
    finally:
        in_use.close()
    free_idle_weights()


def test_a_file_that_may_have_changed_is_loaded_again(gemma3_path: Path, tmp_path: Path) -> None:
    free_idle_weights()
    copy = tmp_path / gemma3_path.name
    shutil.copyfile(gemma3_path, copy)
    Engine(EngineConfig(copy, n_ctx=1024)).close()
    same = Engine(EngineConfig(copy, n_ctx=1024))
    same.close()
    assert same.model.reused
    info = copy.stat()
    os.utime(copy, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    touched = Engine(EngineConfig(copy, n_ctx=1024))
    touched.close()
    assert not touched.model.reused
    other_path = Engine(EngineConfig(gemma3_path, n_ctx=1024))  # the same bytes elsewhere
    other_path.close()
    assert not other_path.model.reused
    free_idle_weights()
