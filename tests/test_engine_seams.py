"""The engine's seam with llama.cpp: one logic (ContextEngine) over what llama_api.py
declares, implemented by llama.cpp (native.py) and by the fast tier's fake."""

from __future__ import annotations

import ctypes
import inspect
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from galahad_desktop.engine import kvstate, llama_api
from galahad_desktop.engine.context_engine import SCRATCH_SEQ, ContextEngine
from galahad_desktop.engine.engine import Engine
from galahad_desktop.engine.values import EngineConfig
from galahad_desktop.errors import ModelError
from galahad_dev.fake_engine import WINDOW, FakeEngine

# What the fake may replace: opening the model (the llama.cpp calls), the runtime and file
# identity it has none of, and the scripted tokens of a reply.
FAKE_OWN = {
    "__init__",
    "_open",
    "_runtime",
    "_model_sha256",
    "_turn_format",
    "model_info",
    "generate",
    "_constraint",  # the same GBNF matched in Python (llama.cpp's sampler needs its vocab)
}
# What the llama.cpp engine adds: opening, identity, the f16 reader, its state files, freeing.
REAL_OWN = {
    "__init__",
    "_open",
    "_plan_offload",
    "_load",
    "_runtime",
    "attn_rotation_disabled",
    "rope_specs",  # read from the GGUF: the fake's keys carry no rotation
    "model_info",
    "save_sequence_file",
    "load_sequence_file",
    "_read_in_f16",
    "close",
    "_stop_calls",
    "_constraint",  # llama.cpp's grammar sampler
}


def test_the_seams_numbers_are_llama_cpps() -> None:
    assert llama_api.KV_TYPES == {
        "f32": llama_cpp.GGML_TYPE_F32,
        "f16": llama_cpp.GGML_TYPE_F16,
        "q8_0": llama_cpp.GGML_TYPE_Q8_0,
        "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    }
    assert llama_api.TOKEN_ATTR_NORMAL == llama_cpp.LLAMA_TOKEN_ATTR_NORMAL
    assert llama_api.TOKEN_ATTR_CONTROL == llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    assert llama_api.TOKEN_ATTR_USER_DEFINED == llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    assert llama_api.SEQ_PARTIAL_ONLY == llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def _own(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if inspect.isfunction(value)}


def test_the_fake_and_the_real_engine_share_one_logic() -> None:
    """Dangerzone's dummy pattern: both engines subclass ContextEngine and replace only
    what needs llama.cpp, so the fast tier tests the logic the app runs."""
    assert issubclass(FakeEngine, ContextEngine) and issubclass(Engine, ContextEngine)
    assert _own(FakeEngine) <= FAKE_OWN, _own(FakeEngine) - FAKE_OWN
    assert _own(Engine) <= REAL_OWN, _own(Engine) - REAL_OWN
    logic = {
        "evaluate",
        "score",
        "accept",
        "hold",
        "return_to_hold",
        "capture_from",
        "regraft_window",
        "restore",
        "stack",
        "encode_text",
        "_scan_markup",
    }
    assert logic <= _own(ContextEngine)


@pytest.fixture()
def engine(tmp_path: Path) -> FakeEngine:
    return FakeEngine(EngineConfig(tmp_path / "fake.gguf", n_ctx=512, n_batch=64), None, "gemma4")


def test_the_fake_context_keeps_held_cells_the_window_let_go(engine: FakeEngine) -> None:
    """hold() shares the cells into the scratch sequence; a thinking turn past the window
    then returns to exactly the state it held, window included."""
    engine.evaluate(list(b"a long enough prompt for the window to move on" * 2))
    before, size, _ms = engine.capture()
    held = bytes(before[:size])
    engine.hold()
    engine.evaluate(list(b"x" * (WINDOW * 2)))
    assert engine.return_to_hold() == WINDOW * 2
    after, size, _ms = engine.capture()
    assert bytes(after[:size]) == held
    window = kvstate.parse(after, size).sections[1]
    assert list(window.pos) == list(range(len(engine.tokens) - WINDOW, len(engine.tokens)))


def test_a_capture_from_a_position_holds_only_the_new_cells(engine: FakeEngine) -> None:
    engine.evaluate(list(b"first turn text " * 4))
    start = len(engine.tokens)
    engine.evaluate(list(b"second"))
    buffer, size, _ms = engine.capture_from(start)
    state = kvstate.parse(buffer, size)  # relabelled as sequence 0
    assert list(state.sections[0].pos) == list(range(start, len(engine.tokens)))
    assert all(int(seq) == 0 for seq in state.sections[0].meta["seq"])
    assert not any(SCRATCH_SEQ in c.seqs for s in engine.context.sections for c in s.values())


def test_a_restore_gives_back_the_cells_and_a_wrong_one_is_seen(engine: FakeEngine) -> None:
    engine.evaluate(list(b"some text to keep, longer than the window is wide"))
    buffer, size, _ms = engine.capture()
    saved = bytes(buffer[:size])
    tokens = list(engine.tokens)
    engine.evaluate(list(b"?"))
    expected = engine.last_logits()

    engine.reset()
    engine.restore(buffer, tokens, size)
    engine.evaluate(list(b"?"))
    assert np.array_equal(engine.last_logits(), expected)  # the same cells, the same logits

    damaged = (ctypes.c_uint8 * size).from_buffer_copy(saved)
    kvstate.parse(damaged, size).sections[0].layers[0].k[3, 0] ^= 1  # one K byte
    engine.restore(damaged, tokens, size)
    engine.evaluate(list(b"?"))
    assert not np.array_equal(engine.last_logits(), expected)

    foreign = (ctypes.c_uint8 * size).from_buffer_copy(saved)
    foreign[0] ^= 0xFF  # not llama.cpp's state magic
    with pytest.raises(ModelError, match="refused"):
        engine.restore(foreign, tokens, size)
    assert engine.tokens == []


def test_scoring_is_a_copy_model_over_what_the_context_holds(engine: FakeEngine) -> None:
    engine.evaluate(list(b"the orchard grows pears"))
    seen, _ms = engine.score(list(b" orchard grows"))
    engine.reset()
    engine.evaluate(list(b"the river runs fast here"))
    unseen, _ms = engine.score(list(b" orchard grows"))
    assert seen[2:].mean() > -1.5 and unseen[2:].mean() < -5.0
