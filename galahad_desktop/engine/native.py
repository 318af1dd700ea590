"""llama.cpp's model, context and batch, owned here through its C API.

This is the one module that holds llama.cpp handles. It builds them the way
llama-cpp-python's `Llama` does (the same defaults, the same decode call), but owns them
itself, so the engine never reaches into `Llama`'s private attributes and needs no
process-wide patch for what `Llama` has no parameter for (the devices a model loads onto,
a second sequence, a unified cache). Every handle is freed by `close()`; one thread owns
each object (llama.cpp contexts are not thread-safe). What the engine needs of them is
written in llama_api.py, which imports no llama.cpp.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from galahad_desktop.engine.grammar import GrammarError
from galahad_desktop.engine.llama_api import DIRECT, BufferFor, ModelFacts, NativeCalls
from galahad_desktop.errors import ModelError

ALL_LAYERS = 0x7FFFFFFF  # what llama.cpp reads as "every layer"


_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


@dataclass
class _KeptWeights:
    handle: Any  # llama_cpp.llama_model_p
    users: int
    load_log: list[str]  # what llama.cpp said while loading them (the engine reads it)


class _SharedWeights:
    """Weights loaded once per process for every engine on the same file and placement.

    A settings change that rebuilds the context (size, cache type, flash attention), a
    lock and unlock, or a second core in the same process reuses the loaded weights instead
    of reading and repacking the file again. Weights nobody uses stay loaded until other
    weights are loaded (then they go first, so two models never sit in memory for one), or
    until `free_idle_weights()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[Any, ...], _KeptWeights] = {}

    def acquire(self, key: tuple[Any, ...], load: Callable[[], Any]) -> tuple[_KeptWeights, bool]:
        """The weights for `key` and whether they were already loaded."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                kept.users += 1
                return kept, True
            self._free_idle()
            handle = load()
            kept = _KeptWeights(handle, 1, [])
            self._kept[key] = kept
            return kept, False

    def release(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                kept.users = max(kept.users - 1, 0)

    def free_idle(self) -> int:
        with self._lock:
            return self._free_idle()

    def _free_idle(self) -> int:
        idle = [key for key, kept in self._kept.items() if kept.users == 0]
        for key in idle:
            llama_cpp.llama_model_free(self._kept.pop(key).handle)
        return len(idle)


_SHARED_WEIGHTS = _SharedWeights()


def free_idle_weights() -> int:
    """Free the shared weights no engine uses any more; returns how many models."""
    return _SHARED_WEIGHTS.free_idle()


def _weights_key(path: Path, n_gpu_layers: int, devices: Sequence[int]) -> tuple[Any, ...]:
    """The file's exact bytes (as its identity and times say) and where its layers go."""
    info = path.stat()
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return (os.path.realpath(path), *identity, n_gpu_layers, tuple(devices))


class NativeModel:
    """A model file's weights (or only its vocabulary) and its metadata."""

    def __init__(
        self,
        path: Path,
        n_gpu_layers: int = 0,
        devices: Sequence[int] = (),
        vocab_only: bool = False,
        calls: NativeCalls = DIRECT,
        shared: bool = False,
    ) -> None:
        """`devices` are llama.cpp device handles: the model loads onto exactly these (none:
        the CPU alone). `calls` frees it (on a device server, on the model's own thread).
        `shared`: the weights come from (and go back to) this process's shared weights,
        where another engine on the same file and placement may have loaded them already
        (`reused`); never for a model on a device server, whose calls have a thread of
        their own. Raises ValueError when llama.cpp cannot load the file."""
        _init_backend()
        self._calls = calls
        self._shared_key: tuple[Any, ...] | None = None
        self.reused = False
        self.load_log: list[str] = []
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
        params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_LAYER
        params.main_gpu = 0
        params.vocab_only = vocab_only
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
        # A NULL-terminated list; without one llama.cpp takes every device it knows.
        self._devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
        params.devices = ctypes.cast(self._devices, ctypes.c_void_p)

        def load() -> Any:
            handle = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
            if not handle:
                raise ValueError(f"the file is not a model llama.cpp can load: {path.name}")
            return handle

        if shared and not vocab_only and calls is DIRECT:
            key = _weights_key(path, params.n_gpu_layers, devices)
            kept, self.reused = _SHARED_WEIGHTS.acquire(key, load)
            self._shared_key, handle, self.load_log = key, kept.handle, kept.load_log
        else:
            handle = load()
        self.handle: llama_cpp.llama_model_p | None = handle
        self.vocab = llama_cpp.llama_model_get_vocab(handle)
        self.metadata = self._read_metadata()
        self.facts = self._read_facts()

    def _read_facts(self) -> ModelFacts:
        description = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.handle, description, 256)
        return ModelFacts(
            n_vocab=int(llama_cpp.llama_vocab_n_tokens(self.vocab)),
            bos=int(llama_cpp.llama_vocab_bos(self.vocab)),
            eos=int(llama_cpp.llama_vocab_eos(self.vocab)),
            n_layer=int(llama_cpp.llama_model_n_layer(self.handle)),
            n_params=int(llama_cpp.llama_model_n_params(self.handle)),
            n_embd=int(llama_cpp.llama_model_n_embd(self.handle)),
            description=description.value.decode("utf-8", "replace"),
        )

    def _read_metadata(self) -> dict[str, str]:
        out: dict[str, str] = {}
        size = 1024
        buffer = ctypes.create_string_buffer(size)
        for index in range(llama_cpp.llama_model_meta_count(self.handle)):
            texts: list[str] = []
            for read in (
                llama_cpp.llama_model_meta_key_by_index,
                llama_cpp.llama_model_meta_val_str_by_index,
            ):
                needed = read(self.handle, index, buffer, size)
                if needed >= size:
                    size = needed + 1
                    buffer = ctypes.create_string_buffer(size)
                    read(self.handle, index, buffer, size)
                texts.append(buffer.value.decode("utf-8", "replace"))
            out[texts[0]] = texts[1]
        return out

    # -- the vocabulary
    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        capacity = len(text) + 2
        for _attempt in range(2):
            out = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self.vocab, text, len(text), out, capacity, add_bos, special
            )
            if n >= 0:
                return list(out[:n])
            capacity = -n
        raise ModelError("llama.cpp could not tokenize the text.")

    def piece(self, token: int, special: bool = False) -> bytes:
        size = 32
        while True:
            buffer = (ctypes.c_char * size)()
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, size, 0, special)
            if n >= 0:
                return buffer.raw[:n]
            size = -n

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        out = b"".join(self.piece(int(t), special) for t in tokens)
        # As llama-cpp-python does: a leading space after a BOS is the tokenizer's own.
        if tokens and tokens[0] == self.facts.bos and out[:1] == b" ":
            return out[1:]
        return out

    def token_attr(self, token: int) -> int:
        return int(llama_cpp.llama_vocab_get_attr(self.vocab, token))

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    # -- the weights

    def close(self) -> None:
        if self.handle is not None:
            if self._shared_key is not None:
                _SHARED_WEIGHTS.release(self._shared_key)
            else:
                self._calls.release(llama_cpp.llama_model_free, self.handle)
            self.handle = None


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _stderr_discarded() -> Iterator[None]:
    """llama.cpp's grammar parser prints a grammar it refuses, whole, on stderr (fprintf,
    not its log): a request's field names and enum values would reach the server's log.
    Another thread's stderr line in these few milliseconds is lost with it."""
    with _stderr_lock:
        try:
            saved = os.dup(2)
        except OSError:  # no stderr at all: nothing to keep clean
            yield
            return
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class GrammarSampler:
    """llama.cpp's grammar sampler on a model's vocabulary: the real engine's constraint
    (decoding.Constraint). One token is checked through a one-entry array; the whole
    vocabulary only when the sampled token was refused."""

    _TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])

    def __init__(self, model: NativeModel, grammar: str) -> None:
        with _stderr_discarded():
            self.sampler = llama_cpp.llama_sampler_init_grammar(
                model.vocab, grammar.encode("utf-8"), b"root"
            )
        if not self.sampler:  # e.g. a schema's pattern the converter wrote but llama.cpp refuses
            raise GrammarError(
                "llama.cpp could not read the grammar made from the reply's schema: "
                "simplify its patterns, or lower its counts (maxItems, maxLength)."
            )
        self.one = (llama_cpp.llama_token_data * 1)()
        self.all = np.zeros(model.facts.n_vocab, dtype=self._TOKEN_DATA)

    def _apply(self, data: Any, size: int) -> None:  # a pointer to llama_token_data
        array = llama_cpp.llama_token_data_array(data=data, size=size, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.sampler, ctypes.byref(array))

    def allows(self, token: int) -> bool:
        entry = self.one[0]
        entry.id, entry.logit, entry.p = token, 0.0, 0.0  # type: ignore[assignment]
        self._apply(ctypes.cast(self.one, ctypes.POINTER(llama_cpp.llama_token_data)), 1)
        return bool(np.isfinite(self.one[0].logit))

    def restrict(self, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
        data = self.all[: len(ids)]
        data["id"], data["logit"] = ids, logits[ids]
        pointer = data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        self._apply(pointer, len(ids))
        out = np.full(len(logits), -np.inf, dtype=np.float32)
        out[data["id"]] = data["logit"]  # a sampler may reorder the array: by id
        return out

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.sampler, token)

    def close(self) -> None:
        if self.sampler:
            llama_cpp.llama_sampler_free(self.sampler)
            self.sampler = None


@dataclass(frozen=True)
class ContextSettings:
    """A context's parameters; the rest are llama.cpp's defaults, as Llama leaves them."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    flash_attn: bool = False
    type_k: int = llama_cpp.GGML_TYPE_F16
    type_v: int = llama_cpp.GGML_TYPE_F16
    swa_full: bool = True
    n_seq_max: int = 1
    kv_unified: bool = False
    embeddings: bool = False


class NativeContext:
    """A context on a model, with its batch. Every decode is counted by `on_decode`. Every
    call that may reach a device goes through `calls` (engine/device_guard.py)."""

    def __init__(
        self,
        model: NativeModel,
        settings: ContextSettings,
        on_decode: Callable[[int], None] = lambda n: None,
        calls: NativeCalls = DIRECT,
    ) -> None:
        self._calls = calls
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = settings.n_ctx
        params.n_batch = settings.n_batch
        params.n_ubatch = min(settings.n_batch, settings.n_ubatch)
        params.n_threads = settings.n_threads
        params.n_threads_batch = settings.n_threads
        params.rope_scaling_type = llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
        params.attention_type = llama_cpp.LLAMA_ATTENTION_TYPE_UNSPECIFIED
        params.rope_freq_base = 0.0
        params.rope_freq_scale = 0.0
        params.yarn_ext_factor = -1.0
        params.yarn_attn_factor = 1.0
        params.yarn_beta_fast = 32.0
        params.yarn_beta_slow = 1.0
        params.yarn_orig_ctx = 0
        params.embeddings = settings.embeddings
        params.offload_kqv = True
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if settings.flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.swa_full = settings.swa_full
        params.type_k = settings.type_k
        params.type_v = settings.type_v
        params.no_perf = False
        params.n_seq_max = settings.n_seq_max
        params.kv_unified = settings.kv_unified
        handle = llama_cpp.llama_init_from_model(model.handle, params)
        if not handle:
            raise ValueError("llama.cpp could not create a context for the model")
        self.handle: llama_cpp.llama_context_p | None = handle
        self.params = params  # a second context copies them (engine/reader.py)
        self.n_batch = settings.n_batch
        self._batch = llama_cpp.llama_batch_init(settings.n_batch, 0, 1)
        self._on_decode = on_decode

    @property
    def memory(self) -> llama_cpp.llama_memory_t:
        memory: llama_cpp.llama_memory_t = llama_cpp.llama_get_memory(self.handle)
        return memory

    def n_ctx(self) -> int:
        return int(llama_cpp.llama_n_ctx(self.handle))

    def decode(self, tokens: Sequence[int], n_past: int, logits_all: bool = False) -> None:
        """Evaluate up to n_batch tokens at positions n_past.. of sequence 0 (logits for
        the last, or for every one); cells at or after n_past are dropped first."""
        self._calls.call(self._decode, tokens, n_past, logits_all)

    def _decode(self, tokens: Sequence[int], n_past: int, logits_all: bool) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, -1, n_past, -1)
        batch = self._batch
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = n_past + i
            batch.seq_id[i][0] = 0
            batch.n_seq_id[i] = 1
            batch.logits[i] = logits_all
        batch.logits[len(tokens) - 1] = True
        self._run(len(tokens))

    def _run(self, n: int) -> None:
        status = llama_cpp.llama_decode(self.handle, self._batch)
        if status != 0:
            raise ModelError(f"llama.cpp could not evaluate the text (llama_decode: {status}).")
        self._on_decode(n)

    def embed(self, sequences: Sequence[Sequence[int]], n_embd: int) -> list[list[float]]:
        """Pooled vectors of token sequences (an embedding context), packed into batches
        of n_batch tokens as llama-cpp-python's embed() packs them."""
        out: list[list[float]] = []
        limit = int(self.params.n_seq_max)
        pending: list[Sequence[int]] = []

        def flush() -> None:
            if not pending:
                return
            llama_cpp.llama_memory_clear(self.memory, True)
            batch = self._batch
            batch.n_tokens = 0
            for seq, tokens in enumerate(pending):
                for pos, token in enumerate(tokens):
                    j = batch.n_tokens + pos
                    batch.token[j] = token
                    batch.pos[j] = pos
                    batch.seq_id[j][0] = seq
                    batch.n_seq_id[j] = 1
                    batch.logits[j] = True
                batch.n_tokens += len(tokens)
            self._run(batch.n_tokens)
            for seq in range(len(pending)):
                out.append(list(llama_cpp.llama_get_embeddings_seq(self.handle, seq)[:n_embd]))
            pending.clear()

        for tokens in sequences:
            tokens = tokens[: self.n_batch]
            if sum(map(len, pending)) + len(tokens) > self.n_batch or len(pending) >= limit:
                flush()
            pending.append(tokens)
        flush()
        return out

    def whole_state(self) -> bytes:
        """Every sequence's state (llama_state_get_data, what Llama.save_state keeps)."""
        size = self._calls.call(llama_cpp.llama_state_get_size, self.handle)
        buffer = (ctypes.c_uint8 * size)()
        used = self._calls.call(llama_cpp.llama_state_get_data, self.handle, buffer, size)
        return bytes(buffer[:used])

    def set_whole_state(self, state: bytes) -> None:
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        done = self._calls.call(llama_cpp.llama_state_set_data, self.handle, buffer, len(state))
        if done != len(state):
            raise ModelError("llama.cpp refused the saved state.")

    # -- sequences and their state (what the engine grafts, holds and captures)
    def clear(self, wipe: bool) -> None:
        """Empty every sequence; `wipe` also zeroes the KV buffers."""
        self._calls.call(llama_cpp.llama_memory_clear, self.memory, wipe)

    def seq_remove(self, seq: int, start: int = -1, end: int = -1) -> None:
        self._calls.call(llama_cpp.llama_memory_seq_rm, self.memory, seq, start, end)

    def seq_copy(self, source: int, target: int, start: int = -1, end: int = -1) -> None:
        """Share a range of cells into another sequence (no copy in a unified cache)."""
        self._calls.call(llama_cpp.llama_memory_seq_cp, self.memory, source, target, start, end)

    def logits(self, rows: int, n_vocab: int) -> np.ndarray:
        """A copy of the logits of the last decode: its last row (rows=1) or its `rows`
        rows (a decode with logits for every token)."""
        return self._calls.call(self._logits, rows, n_vocab)

    def _logits(self, rows: int, n_vocab: int) -> np.ndarray:
        if rows == 1:
            ptr = llama_cpp.llama_get_logits_ith(self.handle, -1)
            return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()
        ptr = llama_cpp.llama_get_logits(self.handle)
        return np.ctypeslib.as_array(ptr, shape=(rows, n_vocab)).copy()

    def seq_state(
        self, seq: int, flags: int = 0, into: BufferFor | None = None
    ) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        """One sequence's state (flags: llama.cpp's LLAMA_STATE_SEQ_FLAGS_*): the buffer and
        the bytes used (0: llama.cpp could not serialize it); `into` supplies the buffer."""
        return self._calls.call(self._seq_state, seq, flags, into)

    def _seq_state(
        self, seq: int, flags: int, into: BufferFor | None
    ) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        size = llama_cpp.llama_state_seq_get_size_ext(self.handle, seq, flags)
        buffer = into(size) if into is not None else (ctypes.c_uint8 * size)()
        used = llama_cpp.llama_state_seq_get_data_ext(self.handle, buffer, size, seq, flags)
        return buffer, int(used)

    def set_seq_state(
        self, state: ctypes.Array[ctypes.c_uint8], size: int, seq: int = 0, flags: int = 0
    ) -> bool:
        """Graft a sequence's state at its own positions; False when llama.cpp refuses it."""
        done = self._calls.call(
            llama_cpp.llama_state_seq_set_data_ext, self.handle, state, size, seq, flags
        )
        return int(done) == size

    def save_seq_file(self, path: Path, tokens: Sequence[int]) -> None:
        """llama.cpp's own plain state file of sequence 0 (the benchmark's baseline)."""
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        self._calls.call(
            llama_cpp.llama_state_seq_save_file,
            self.handle,
            str(path).encode(),
            0,
            array,
            len(tokens),
        )

    def load_seq_file(self, path: Path, n: int) -> bool:
        """Load a file save_seq_file wrote (n tokens) into sequence 0."""
        out_tokens = (llama_cpp.llama_token * (n + 16))()
        count = ctypes.c_size_t(0)
        loaded = self._calls.call(
            llama_cpp.llama_state_seq_load_file,
            self.handle,
            str(path).encode(),
            0,
            out_tokens,
            n + 16,
            ctypes.byref(count),
        )
        return int(loaded) != 0

    def close(self) -> None:
        if self.handle is not None:
            self._calls.release(llama_cpp.llama_batch_free, self._batch)
            self._calls.release(llama_cpp.llama_free, self.handle)
            self.handle = None
