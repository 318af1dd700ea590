"""What the core needs of an engine: ContextEngine (context_engine.py), which the llama.cpp
engine (engine.py) and the fast tier's fake (galahad_dev/fake_engine.py) both subclass,
satisfies it, checked by mypy (context_engine.py and engine.py assert the match). Importing
it loads no llama.cpp."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from galahad_desktop.engine.chat_format import TurnFormat
from galahad_desktop.engine.decoding import Generation
from galahad_desktop.engine.modelinfo import ModelInfo
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.scoring import Snapshot
from galahad_desktop.engine.tool_format import ToolMarkers
from galahad_desktop.engine.turns import Turns
from galahad_desktop.engine.values import (
    EngineConfig,
    Placement,
    RuntimeDetails,
    SamplingDefaults,
    Stacked,
)
from galahad_desktop.errors import InputError
from galahad_desktop.jobs import NO_JOB, Job

StateBuffer = ctypes.Array[ctypes.c_uint8]


class ChatEngine(Protocol):
    config: EngineConfig
    n_ctx: int
    n_vocab: int
    tokens: list[int]  # what the context holds, in order
    turns: Turns
    turn_format: TurnFormat
    probe_tokens: list[int]  # the next user turn's opening: what a graft proof evaluates
    fingerprint: str  # the runtime a block was captured under (model, settings, device)
    fingerprint_details: RuntimeDetails
    placement: Placement
    gpu_layers: int
    model_sha256: str
    decoded_tokens: int  # counted at the decode call itself
    tool_markers: ToolMarkers | None  # Gemma 4's tool syntax by id (None: no tools)

    @property
    def backend(self) -> str: ...
    def model_info(self) -> ModelInfo: ...
    def sampling_defaults(self) -> SamplingDefaults: ...

    # -- tokens
    def encode_text(self, text: str) -> list[int]: ...
    def encode_template(self, text: str) -> list[int]: ...
    def bos(self) -> list[int]: ...
    def model_close(self) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    def is_end_of_generation(self, token: int) -> bool: ...

    # -- the context
    def reset(self, wipe: bool = True) -> None: ...
    def room(self) -> int: ...
    def evaluate(self, tokens: Sequence[int], job: Job = NO_JOB) -> float: ...
    def last_logits(self) -> np.ndarray: ...
    def score(self, tokens: Sequence[int], job: Job = NO_JOB) -> tuple[np.ndarray, float]: ...
    def generate(self, params: SamplingParams, job: Job = NO_JOB) -> Generation: ...
    def hold(self) -> None: ...
    def return_to_hold(self) -> int: ...
    def release_hold(self) -> None: ...

    # -- KV state
    def capture(self) -> tuple[StateBuffer, int, float]: ...
    def capture_from(self, start: int) -> tuple[StateBuffer, int, float]: ...
    def regraft_window(self) -> tuple[StateBuffer, int, float]: ...
    def restore(
        self, payload: StateBuffer, tokens: list[int], size: int | None = None
    ) -> float: ...
    def stack(
        self,
        payload: StateBuffer,
        size: int,
        block_tokens: Sequence[int],
        skip: int,
        recompute: int,
        job: Job = NO_JOB,
        lead: Sequence[int] = (),
        read_last: bool = True,
    ) -> Stacked: ...
    def snapshot(self) -> Snapshot: ...
    def resume(self, snapshot: Snapshot) -> float: ...
    def close(self) -> None: ...


def check_state_fits(n_tokens: int, n_ctx: int) -> None:
    """A stored state larger than the context is refused before anything is grafted."""
    if n_tokens > n_ctx:
        raise InputError(
            f"The stored state holds {n_tokens} tokens, more than the {n_ctx}-token context."
        )
