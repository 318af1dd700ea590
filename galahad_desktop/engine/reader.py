"""A second llama.cpp context on the same model, with an f16 KV cache, for long reads.

llama.cpp's CPU attention over a quantized (q8_0) cache makes reading 1.8-2.3x slower than
over f16 (measured: 4,000 tokens in 15.8 s against 6.8 s). When the main context keeps q8_0,
a read that starts from an empty context (a document, a conversation re-read from its text)
runs here instead, in f16; its state is converted to q8_0 (engine/kvquant.py) and grafted
into the main context. The model's weights are shared (one llama_model); only this
context's KV cache is extra, and it is wiped after every read, so no decrypted state stays
in it.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence

import llama_cpp

from galahad_desktop.engine.llama_api import DIRECT, NativeCalls
from galahad_desktop.errors import ModelError
from galahad_desktop.jobs import NO_JOB, Job, Progress


class F16Reader:
    def __init__(
        self,
        model: llama_cpp.llama_model_p,
        params: llama_cpp.llama_context_params,
        n_batch: int,
        on_decode: Callable[[int], None],
        calls: NativeCalls = DIRECT,
    ) -> None:
        self._calls = calls
        reading = llama_cpp.llama_context_params()
        ctypes.memmove(ctypes.byref(reading), ctypes.byref(params), ctypes.sizeof(reading))
        reading.type_k = llama_cpp.GGML_TYPE_F16
        reading.type_v = llama_cpp.GGML_TYPE_F16
        ctx = calls.call(llama_cpp.llama_init_from_model, model, reading)
        if ctx is None:
            raise ModelError("llama.cpp could not create the f16 reading context.")
        self._ctx = ctx
        self._n_batch = n_batch
        self._on_decode = on_decode

    def read(
        self, tokens: Sequence[int], job: Job = NO_JOB
    ) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        """Evaluate `tokens` from an empty context; return sequence 0's state (f16)."""
        return self._calls.call(self._read, tokens, job)

    def _read(self, tokens: Sequence[int], job: Job) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        memory = llama_cpp.llama_get_memory(self._ctx)
        llama_cpp.llama_memory_clear(memory, True)
        start = time.perf_counter()
        try:
            for offset in range(0, len(tokens), self._n_batch):
                job.check()
                piece = list(tokens[offset : offset + self._n_batch])
                array = (llama_cpp.llama_token * len(piece))(*piece)
                batch = llama_cpp.llama_batch_get_one(array, len(piece))
                if llama_cpp.llama_decode(self._ctx, batch):
                    raise ModelError("llama.cpp could not evaluate the text (f16 reading context).")
                self._on_decode(len(piece))
                job.progress(
                    Progress(offset + len(piece), len(tokens), time.perf_counter() - start)
                )
            size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
            buffer = (ctypes.c_uint8 * size)()
            used = int(llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, 0))
            if used == 0:
                raise ModelError("llama.cpp could not serialize the f16 reading context.")
            return buffer, used
        finally:
            llama_cpp.llama_memory_clear(memory, True)  # no decrypted state stays here

    def close(self) -> None:
        self._calls.release(llama_cpp.llama_free, self._ctx)
