"""What the engine needs of llama.cpp's model and context, written without importing llama.cpp.

`native.py` implements these with llama.cpp's C API; the fast tier's fake engine implements
them in Python (galahad_dev/fake_engine.py). The engine's logic (engine/context_engine.py)
sees only these, so the fake replaces the llama.cpp calls and nothing else. The numbers
below are llama.cpp's own; tests/test_engine_seams.py checks them against llama_cpp.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

T = TypeVar("T")

# ggml's type ids for the KV cache types a user can choose.
# Supplies a buffer of at least N bytes for a state (a reused one: a fresh zeroed buffer of
# hundreds of MB costs more in page faults than llama.cpp's copy into it).
BufferFor = Callable[[int], "ctypes.Array[ctypes.c_uint8]"]
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2}
# llama_token_attr bits
TOKEN_ATTR_NORMAL = 4
TOKEN_ATTR_CONTROL = 8
TOKEN_ATTR_USER_DEFINED = 16
# llama_state_seq_flags: only the partial (sliding-window) cache of an iSWA model
SEQ_PARTIAL_ONLY = 1


class NativeCalls(Protocol):
    """How a model's llama.cpp calls are made: here and now, or on the model's own thread."""

    def call(self, fn: Callable[..., T], *args: Any) -> T: ...
    def release(self, fn: Callable[..., Any], *args: Any) -> None: ...


class DirectCalls:
    """A model on this computer's own devices: its calls run on the caller's thread."""

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def release(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)


DIRECT = DirectCalls()


@dataclass(frozen=True)
class ModelFacts:
    """What a loaded model is, read once: it does not change while it is loaded."""

    n_vocab: int
    bos: int  # the beginning-of-sequence token
    eos: int
    n_layer: int
    n_params: int
    n_embd: int
    description: str  # llama.cpp's one line: architecture, size, quantization


class LoadedModel(Protocol):
    """A model's vocabulary and metadata (native.NativeModel)."""

    metadata: dict[str, str]
    facts: ModelFacts

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes: ...
    def token_attr(self, token: int) -> int: ...
    def is_end_of_generation(self, token: int) -> bool: ...
    def close(self) -> None: ...


class LoadedContext(Protocol):
    """A context on a model, with two sequences in one unified cache (native.NativeContext)."""

    def n_ctx(self) -> int: ...
    def decode(self, tokens: Sequence[int], n_past: int, logits_all: bool = False) -> None: ...
    def logits(self, rows: int, n_vocab: int) -> np.ndarray: ...
    def clear(self, wipe: bool) -> None: ...
    def seq_remove(self, seq: int, start: int = -1, end: int = -1) -> None: ...
    def seq_copy(self, source: int, target: int, start: int = -1, end: int = -1) -> None: ...
    def seq_state(
        self, seq: int, flags: int = 0, into: BufferFor | None = None
    ) -> tuple[ctypes.Array[ctypes.c_uint8], int]: ...
    def set_seq_state(
        self, state: ctypes.Array[ctypes.c_uint8], size: int, seq: int = 0, flags: int = 0
    ) -> bool: ...
    def close(self) -> None: ...
