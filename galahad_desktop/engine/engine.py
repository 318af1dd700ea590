"""One llama.cpp context and everything done to it: evaluate, generate, capture, restore.

One thread owns an Engine (llama.cpp contexts are not thread-safe). `tokens` mirrors what the
context holds in sequence 0; it is the ledger the conversation is built from, so history is
never re-rendered or re-tokenized. Counters distinguish tokens restored from a block, tokens
recomputed (re-read because a block could not be used) and tokens newly evaluated.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from galahad_desktop.engine import device_guard, devices, gguf, kvquant, kvstate
from galahad_desktop.engine import fingerprint as fp
from galahad_desktop.engine.chat_format import (
    GEMMA3_TURNS,
    TemplateNotUnderstood,
    TurnFormat,
    derive_turn_format,
)
from galahad_desktop.engine.decoding import Generation, decode_reply, is_tag
from galahad_desktop.engine.markup import MarkupGuard
from galahad_desktop.engine.modelinfo import ModelInfo, check_model_file
from galahad_desktop.engine.native import (
    DIRECT,
    ContextSettings,
    NativeCalls,
    NativeContext,
    NativeModel,
)
from galahad_desktop.engine.protocol import ChatEngine, check_state_fits
from galahad_desktop.engine.reader import F16Reader
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.scoring import Snapshot, log_softmax_at
from galahad_desktop.engine.turns import Turns
from galahad_desktop.engine.values import (
    GEMMA_SAMPLING,
    GENERIC_SAMPLING,
    Counters,
    EngineConfig,
    Placement,
    RuntimeDetails,
    SamplingDefaults,
)
from galahad_desktop.errors import DeviceLostError, InputError, ModelError
from galahad_desktop.jobs import NO_JOB, Job, Progress

_BUFFER_LINE = re.compile(r"^\S*?:?\s*(\S+)\s+(model|KV) buffer size =\s+([\d.]+) MiB")


def _buffers(lines: list[str], kind: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in "".join(lines).splitlines():
        found = _BUFFER_LINE.match(line.strip())
        if found and found.group(2) == kind:
            out[found.group(1)] = out.get(found.group(1), 0.0) + float(found.group(3))
    return out


__all__ = ["Counters", "Engine", "EngineConfig", "Placement"]

KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "f32": llama_cpp.GGML_TYPE_F32,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
}


class Engine:
    def __init__(self, config: EngineConfig, hash_cache: Path | None = None) -> None:
        check_model_file(config.model_path)
        if config.kv_type not in KV_TYPES:
            raise InputError(f"Unknown KV cache type '{config.kv_type}'.")
        self.config = config
        devices.load_backends()
        for endpoint in config.rpc_servers:
            if endpoint in device_guard.lost_servers():
                raise DeviceLostError(
                    f"The device server at {endpoint} went away earlier in this session; "
                    "restart Galahad to use it again."
                )
            devices.add_rpc_server(endpoint)
        offload = self._plan_offload(config)
        self.gpu_layers = offload.gpu_layers
        used = list(offload.devices) if self.gpu_layers else []
        served = tuple(e for e in config.rpc_servers if any(e in d.description for d in used))
        # A model on a device server makes its calls on a thread of its own: if the server
        # goes away, the caller gets an error instead of the process aborting.
        self.calls: NativeCalls = device_guard.NativeThread(served) if served else DIRECT
        self.decoded_tokens = 0  # counted at the decode call itself (NativeContext)
        try:
            with devices.captured_log() as log:
                self.model, self.context = self.calls.call(self._load, config, used)
        except ValueError as exc:
            self._stop_calls()
            raise ModelError(f"llama.cpp could not load {config.model_path}: {exc}") from None
        except BaseException:
            self._stop_calls()
            raise
        total_layers = self.model.facts.n_layer + 1
        self.gpu_layers = min(self.gpu_layers, total_layers)
        self.placement = Placement(
            device=offload.device.label() if offload.device and self.gpu_layers else "CPU",
            backend=offload.device.backend if offload.device and self.gpu_layers else "CPU",
            gpu_layers=self.gpu_layers,
            total_layers=total_layers,
            model_buffers=_buffers(log, "model"),
            kv_buffers=_buffers(log, "KV"),
            cpu_variant=devices.cpu_variant(),
            cpu_features=devices.cpu_features(),
            reason=offload.reason,
        )
        self.n_vocab = self.model.facts.n_vocab
        self.n_ctx = self.context.n_ctx()
        user_defined, markup = self._markup_tokens()
        self.guard = MarkupGuard([self._special_text(t) for t in user_defined])
        self.turn_format = self._turn_format()
        self.turns = Turns(self, self.turn_format)
        self.stop_rules = self.turns.stop_rules(self.is_end_of_generation, markup)
        self.tokens: list[int] = []
        self.model_sha256 = fp.model_sha256(config.model_path, hash_cache)
        self.fingerprint_details = self._fingerprint_details()
        self.fingerprint = fp.runtime_fingerprint(self.fingerprint_details.as_dict())
        self.probe_tokens = self.turns.probe
        self._held: int | None = None
        self._rotations = kvquant.rotations_from_log(log)
        self._reader: F16Reader | None = None
        self._resumed_logits: np.ndarray | None = None  # after resume(), until the next eval
        self.reads_in_f16 = config.read_in_f16 and config.kv_type == "q8_0" and config.flash_attn

    @staticmethod
    def _plan_offload(config: EngineConfig) -> devices.OffloadPlan:
        gpus = devices.gpu_devices(config.rpc_servers)
        if not gpus or config.n_gpu_layers >= 0:
            return devices.plan_offload(config.n_gpu_layers, 0, 0, 0, gpus)
        meta = gguf.read_metadata(config.model_path)
        arch = str(meta.get("general.architecture", ""))
        n_layers = int(meta.get(f"{arch}.block_count", 0) or 0)
        kv_heads = _first_int(meta.get(f"{arch}.attention.head_count_kv"), 1)
        head = _first_int(meta.get(f"{arch}.attention.key_length"), 128)
        # Every layer as if it kept every position: an upper bound for sliding-window models.
        kv_bytes = config.n_ctx * n_layers * 2 * kv_heads * head * 2
        size = config.model_path.stat().st_size
        return devices.plan_offload(config.n_gpu_layers, max(n_layers, 1), size, kv_bytes, gpus)

    def _load(
        self, config: EngineConfig, used: list[devices.Device]
    ) -> tuple[NativeModel, NativeContext]:
        """The model on exactly the planned devices, and a context with a second sequence in
        one unified cache (so a position range can be serialized through a scratch
        sequence)."""
        model = NativeModel(
            config.model_path, self.gpu_layers, devices.handles(used), calls=self.calls
        )
        settings = ContextSettings(
            n_ctx=config.n_ctx,
            n_batch=config.n_batch,
            n_ubatch=config.n_ubatch,
            n_threads=config.n_threads,
            flash_attn=config.flash_attn,
            type_k=KV_TYPES[config.kv_type],
            type_v=KV_TYPES[config.kv_type],
            swa_full=config.swa_full,
            n_seq_max=SCRATCH_SEQ + 1,
            kv_unified=True,
        )
        try:
            return model, NativeContext(model, settings, self._counted, self.calls)
        except ValueError:
            model.close()
            raise

    # -- identity ------------------------------------------------------------------------
    def _fingerprint_details(self) -> RuntimeDetails:
        system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
        return RuntimeDetails.of(
            self.config,
            (llama_cpp.__version__, system_info),
            self.model_sha256,
            self.n_ctx,
            (self.gpu_layers, self.placement.device if self.gpu_layers else "CPU"),
            self.turn_format,
            attn_rot_disabled=os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") not in ("", "0"),
        )

    def _special_text(self, token: int) -> str:
        return self.model.detokenize([token], special=True).decode("utf-8", "replace")

    def _turn_format(self) -> TurnFormat:
        template = self.model.metadata.get("tokenizer.chat_template")
        if not template:
            return GEMMA3_TURNS
        bos = self._special_text(self.model.facts.bos)
        eos = self._special_text(self.model.facts.eos)
        try:
            return derive_turn_format(template, bos, eos)
        except TemplateNotUnderstood as exc:
            return dataclasses.replace(
                GEMMA3_TURNS,
                understood=False,
                problem=str(exc),
                source="Gemma 3 turn format (fallback: the model's template was not understood)",
            )

    def _markup_tokens(self) -> tuple[list[int], frozenset[int]]:
        """The user-defined tokens (llama.cpp matches their text inside raw text) and every
        markup token, never shown as reply text: control tokens, and user-defined ones
        written as a tag (`<|channel>`, `<start_of_image>`). Gemma also marks runs of
        whitespace and newlines user-defined: those are text, and stay text. The scan asks
        llama.cpp about every token (a third of a second for Gemma's 262k), so its result is
        kept for the process, per model file as it is on disk."""
        stat = self.config.model_path.stat()
        key = (str(self.config.model_path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _MARKUP_SCANS:
            _MARKUP_SCANS[key] = self._scan_markup()
        user_defined, markup = _MARKUP_SCANS[key]
        return list(user_defined), markup

    def _scan_markup(self) -> tuple[tuple[int, ...], frozenset[int]]:
        user_flag = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        control_flag = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        user_defined: list[int] = []
        markup: set[int] = set()
        for token in range(self.n_vocab):
            attr = self.model.token_attr(token)
            if attr & control_flag:
                markup.add(token)
            elif attr & user_flag:
                user_defined.append(token)
                if is_tag(self._special_text(token)):
                    markup.add(token)
        return tuple(user_defined), frozenset(markup)

    def is_end_of_generation(self, token: int) -> bool:
        return self.model.is_end_of_generation(token)

    @property
    def backend(self) -> str:
        return self.placement.backend

    def model_info(self) -> ModelInfo:
        return gguf.describe(self.model, self.config.model_path, self.config.embedded)

    def sampling_defaults(self) -> SamplingDefaults:
        """The publisher's recommended sampling: the GGUF's general.sampling.* keys, else
        Gemma's published defaults for a Gemma model."""
        meta = self.model.metadata
        arch = str(meta.get("general.architecture", ""))
        out = GEMMA_SAMPLING if arch.startswith("gemma") else GENERIC_SAMPLING
        published: dict[str, Any] = {}
        for key, name, kind in (
            ("general.sampling.temp", "temperature", float),
            ("general.sampling.top_k", "top_k", int),
            ("general.sampling.top_p", "top_p", float),
        ):
            raw = meta.get(key)
            if raw is not None:
                with contextlib.suppress(ValueError):
                    published[name] = kind(float(raw))
        return dataclasses.replace(out, **published)

    # -- tokens --------------------------------------------------------------------------
    def encode_template(self, text: str) -> list[int]:
        """Tokenize template text: turn markers like <|turn> are honoured."""
        return self.model.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def encode_text(self, text: str) -> list[int]:
        """Tokenize user or document text: no markup token can come out of it (markers a
        user typed stay characters)."""
        return self.guard.tokenize(
            text,
            lambda piece: self.model.tokenize(piece.encode("utf-8"), add_bos=False, special=False),
        )

    def bos(self) -> list[int]:
        return [self.model.facts.bos]

    def model_close(self) -> list[int]:
        return list(self.turns.model_close)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize(tokens).decode("utf-8", "replace")

    # -- evaluation ----------------------------------------------------------------------
    def reset(self, wipe: bool = True) -> None:
        """Empty the context. `wipe` also zeroes the KV buffers (lock uses it to drop
        decrypted state); a restore skips it: masked cells contribute exact zeros."""
        self.context.clear(wipe)
        self._resumed_logits = None
        self.tokens = []
        self._held = None

    def room(self) -> int:
        return self.n_ctx - len(self.tokens)

    def evaluate(self, tokens: Sequence[int], job: Job = NO_JOB) -> float:
        """Evaluate tokens after what the context holds, in n_batch slices, reporting progress
        to `job` and stopping when it is cancelled; return ms."""
        if len(tokens) > self.room():
            raise InputError(
                f"That needs {len(tokens)} more tokens but only {self.room()} of the "
                f"{self.n_ctx}-token context are left."
            )
        self._resumed_logits = None
        if self.reads_in_f16 and not self.tokens and len(tokens) >= READ_IN_F16_MIN:
            return self._read_in_f16(tokens, job)
        start = time.perf_counter()
        step = self.config.n_batch
        for offset in range(0, len(tokens), step):
            job.check()
            piece = list(tokens[offset : offset + step])
            self.context.decode(piece, len(self.tokens))
            self.tokens.extend(piece)
            job.progress(Progress(offset + len(piece), len(tokens), time.perf_counter() - start))
        return (time.perf_counter() - start) * 1e3

    def save_sequence_file(self, tokens: list[int], path: Path) -> tuple[float, int]:
        """llama.cpp's own per-sequence state file (llama-server's slot save): plain, no
        authentication; the benchmark's baseline. Returns (save ms, bytes)."""
        start = time.perf_counter()
        self.context.save_seq_file(path, tokens)
        return (time.perf_counter() - start) * 1e3, path.stat().st_size

    def load_sequence_file(self, n: int, path: Path) -> float:
        """Load a file save_sequence_file wrote (n tokens); returns ms."""
        start = time.perf_counter()
        if not self.context.load_seq_file(path, n):
            raise ModelError("llama.cpp could not load the sequence state file.")
        return (time.perf_counter() - start) * 1e3

    def last_logits(self) -> np.ndarray:
        if self._resumed_logits is not None:
            return self._resumed_logits.copy()
        return self.context.logits(1, self.n_vocab)

    def score(self, tokens: Sequence[int], job: Job = NO_JOB) -> tuple[np.ndarray, float]:
        """Evaluate tokens after what the context holds (as evaluate() does) and return each
        one's log-probability given everything before it, with ms. The first token's comes
        from the logits the context already has, so the context must hold something."""
        if not self.tokens:
            raise ModelError("Nothing to score against: the context is empty.")
        if len(tokens) > self.room():
            raise InputError(
                f"That needs {len(tokens)} more tokens but only {self.room()} of the "
                f"{self.n_ctx}-token context are left."
            )
        start = time.perf_counter()
        out = np.zeros(len(tokens), dtype=np.float64)
        if not tokens:
            return out, 0.0
        out[0] = log_softmax_at(self.last_logits()[None, :], tokens[:1])[0]
        self._resumed_logits = None
        step = self.config.n_batch
        for offset in range(0, len(tokens), step):
            job.check()
            piece = [int(t) for t in tokens[offset : offset + step]]
            self.context.decode(piece, len(self.tokens), logits_all=True)
            self.tokens.extend(piece)
            following = list(tokens[offset + 1 : offset + len(piece) + 1])
            if following:
                rows = self.context.logits(len(piece), self.n_vocab)
                out[offset + 1 : offset + 1 + len(following)] = log_softmax_at(
                    rows[: len(following)], following
                )
        return out, (time.perf_counter() - start) * 1e3

    def snapshot(self) -> Snapshot:
        """The context as it is now, in memory (to resume() from later)."""
        state, size, _ms = self.capture()
        return Snapshot(state, size, list(self.tokens), self.last_logits())

    def resume(self, snapshot: Snapshot) -> float:
        """Put the context back to a snapshot exactly (nothing re-read); returns ms."""
        elapsed = self.restore(snapshot.state, snapshot.tokens, snapshot.size)
        self._resumed_logits = snapshot.logits.copy()
        return elapsed

    def generate(self, params: SamplingParams, job: Job = NO_JOB) -> Generation:
        """Sample a reply (decoding.decode_reply: the stop rules, the thought channel)."""
        return decode_reply(self, self.stop_rules, params, job)

    # -- what decode_reply needs of the model
    def accept(self, token: int) -> None:
        self.context.decode([token], len(self.tokens))
        self._resumed_logits = None
        self.tokens.append(token)

    def token_bytes(self, token: int) -> bytes:
        return self.model.detokenize([token])

    # -- a held state, to return to after a thinking turn -------------------------------
    def hold(self) -> None:
        """Remember what the context holds now, so the turn can be re-read from here: its
        cells are shared into the scratch sequence (no copy in a unified cache), which
        keeps them even where the sliding window would let them go."""
        self.context.seq_remove(SCRATCH_SEQ)
        self.context.seq_copy(0, SCRATCH_SEQ)
        self._held = len(self.tokens)

    def return_to_hold(self) -> int:
        """Put the context back exactly as it was at hold() (never by trimming: the sliding
        window cannot roll back); returns how many tokens were dropped."""
        if self._held is None:
            raise ModelError("No held state to return to.")
        self.context.seq_remove(0)
        self.context.seq_copy(SCRATCH_SEQ, 0)
        self.context.seq_remove(SCRATCH_SEQ)
        dropped = len(self.tokens) - self._held
        self.tokens = self.tokens[: self._held]
        self._held = None
        return dropped

    def release_hold(self) -> None:
        if self._held is not None:
            self.context.seq_remove(SCRATCH_SEQ)
            self._held = None

    # -- state capture / restore ---------------------------------------------------------
    def capture(self) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        """Serialize sequence 0 into one buffer: (buffer, bytes used, ms)."""
        start = time.perf_counter()
        buf, used = self.context.seq_state(0)
        if used == 0:
            raise ModelError("llama.cpp could not serialize the sequence state.")
        return buf, used, (time.perf_counter() - start) * 1e3

    def capture_from(self, start: int) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        """Serialize only the cells at positions >= start (what a chain link holds), in
        O(new tokens): the range is shared into a scratch sequence (no copy in a unified
        cache), that sequence is serialized, and its cells are relabelled as sequence 0."""
        begin = time.perf_counter()
        self.release_hold()
        self.context.seq_copy(0, SCRATCH_SEQ, start)
        try:
            buf, used = self.context.seq_state(SCRATCH_SEQ)
        finally:
            self.context.seq_remove(SCRATCH_SEQ)
        if used == 0:
            raise ModelError("llama.cpp could not serialize the new cells.")
        kvstate.relabel(buf, used, SCRATCH_SEQ)
        return buf, used, (time.perf_counter() - begin) * 1e3

    def regraft_window(self) -> tuple[ctypes.Array[ctypes.c_uint8], int, float]:
        """Re-graft the sliding-window cache from its own capture, in place (O(window)):
        the live context then holds exactly the cells a restore rebuilds (with swa_full it
        otherwise keeps cells beyond the window that a saved state does not carry). Returns
        the window's state: its layout is the chain link's."""
        begin = time.perf_counter()
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        buf, used = self.context.seq_state(0, flags)
        if used == 0 or not self.context.set_seq_state(buf, used, 0, flags):
            self.reset()
            raise ModelError("llama.cpp could not re-graft the sliding-window cache.")
        return buf, used, (time.perf_counter() - begin) * 1e3

    def restore(
        self, payload: ctypes.Array[ctypes.c_uint8], tokens: list[int], size: int | None = None
    ) -> float:
        """Graft a captured state at its own positions into a cleared context; return ms."""
        check_state_fits(len(tokens), self.n_ctx)
        start = time.perf_counter()
        self.reset(wipe=False)  # puts the cell cursor back at 0, as in a fresh context
        size = ctypes.sizeof(payload) if size is None else size
        if not self.context.set_seq_state(payload, size):
            self.reset()
            raise ModelError("llama.cpp refused the stored state (layout does not match).")
        self.tokens = list(tokens)
        return (time.perf_counter() - start) * 1e3

    def _read_in_f16(self, tokens: Sequence[int], job: Job) -> float:
        """Read from an empty context in the f16 reader, convert its state to q8_0 and
        graft that here: the context then holds what reading here would (each value
        rounded twice instead of once); the caller's proof is computed from it. The last
        token is evaluated here, so its logits are there for whatever comes next."""
        start = time.perf_counter()
        if self._reader is None:
            if self.model.handle is None:
                raise ModelError("The model is closed.")
            self._reader = F16Reader(
                self.model.handle,
                self.context.params,
                self.config.n_batch,
                self._counted,
                self.calls,
            )
        head, last = list(tokens[:-1]), list(tokens[-1:])
        f16, size = self._reader.read(head, job)
        try:
            q8, q8_size = kvquant.to_q8_0(f16, size, self._rotations)
        finally:
            ctypes.memset(f16, 0, size)
        try:
            self.restore(q8, head, q8_size)
        finally:
            ctypes.memset(q8, 0, q8_size)
        self.context.decode(last, len(self.tokens))
        self.tokens.extend(last)
        return (time.perf_counter() - start) * 1e3

    def _counted(self, n: int) -> None:
        self.decoded_tokens += n

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.context.close()
        self.model.close()
        self._stop_calls()

    def _stop_calls(self) -> None:
        if isinstance(self.calls, device_guard.NativeThread):
            self.calls.close()


# Model file (path, size, mtime) -> its user-defined and markup tokens (Engine._markup_tokens).
_MARKUP_SCANS: dict[tuple[str, int, int], tuple[tuple[int, ...], frozenset[int]]] = {}

READ_IN_F16_MIN = 64  # shorter reads from empty run in the q8_0 context itself
SCRATCH_SEQ = 1  # a second sequence: serializes a range of sequence 0, or holds a state


def _first_int(value: Any, default: int) -> int:
    """A GGUF number, or the first of a per-layer array (stored as text in the metadata)."""
    found = re.search(r"\d+", str(value)) if value is not None else None
    return int(found.group()) if found else default


def _the_real_engine_conforms(engine: Engine) -> ChatEngine:
    return engine  # mypy checks the structural match here
