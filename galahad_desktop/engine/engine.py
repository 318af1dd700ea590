"""The engine on llama.cpp: opens the model and its context on the planned devices.

Everything done to the context (evaluate, generate, capture, restore) is ContextEngine's
(engine/context_engine.py); this subclass adds what needs llama.cpp itself: loading onto
devices and device servers, the placement report, the f16 reader, llama.cpp's own state
files, and freeing the native memory.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from galahad_desktop.engine import device_guard, devices, gguf, kvquant, stacking
from galahad_desktop.engine.context_engine import (
    READ_IN_F16_MIN,
    SCRATCH_SEQ,
    ContextEngine,
    Opened,
)
from galahad_desktop.engine.llama_api import KV_TYPES
from galahad_desktop.engine.modelinfo import ModelInfo, check_model_file
from galahad_desktop.engine.native import (
    ContextSettings,
    GrammarSampler,
    NativeContext,
    NativeModel,
)
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.reader import F16Reader
from galahad_desktop.engine.values import Counters, EngineConfig, Placement
from galahad_desktop.errors import DeviceLostError, ModelError
from galahad_desktop.jobs import Job

_BUFFER_LINE = re.compile(r"^\S*?:?\s*(\S+)\s+(model|KV) buffer size =\s+([\d.]+) MiB")


def _buffers(lines: list[str], kind: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in "".join(lines).splitlines():
        found = _BUFFER_LINE.match(line.strip())
        if found and found.group(2) == kind:
            out[found.group(1)] = out.get(found.group(1), 0.0) + float(found.group(3))
    return out


__all__ = ["READ_IN_F16_MIN", "Counters", "Engine", "EngineConfig", "Placement"]


class Engine(ContextEngine):
    model: NativeModel
    context: NativeContext

    def __init__(self, config: EngineConfig, hash_cache: Path | None = None) -> None:
        self._reader: F16Reader | None = None
        self._rotations: list[kvquant.Rotation] = []
        self._rope_specs: list[stacking.RopeSpec] | None = None
        super().__init__(config, hash_cache)
        self.reads_in_f16 = config.read_in_f16 and config.kv_type == "q8_0" and config.flash_attn

    def _open(self, config: EngineConfig) -> Opened:
        check_model_file(config.model_path)
        devices.load_backends()
        for endpoint in config.rpc_servers:
            if endpoint in device_guard.lost_servers():
                raise DeviceLostError(
                    f"The device server at {endpoint} went away earlier in this session; "
                    "restart Galahad to use it again."
                )
            devices.add_rpc_server(endpoint)
        offload = self._plan_offload(config)
        gpu_layers = offload.gpu_layers
        used = list(offload.devices) if gpu_layers else []
        served = tuple(e for e in config.rpc_servers if any(e in d.description for d in used))
        # A model on a device server makes its calls on a thread of its own: if the server
        # goes away, the caller gets an error instead of the process aborting.
        self.calls = device_guard.NativeThread(served) if served else self.calls
        try:
            with devices.captured_log() as log:
                model, context = self.calls.call(self._load, config, used, gpu_layers, log)
        except ValueError as exc:
            self._stop_calls()
            raise ModelError(f"llama.cpp could not load {config.model_path}: {exc}") from None
        except BaseException:
            self._stop_calls()
            raise
        gpu_layers = min(gpu_layers, model.facts.n_layer + 1)
        on_device = offload.device is not None and gpu_layers > 0
        placement = Placement(
            device=offload.device.label() if offload.device and on_device else "CPU",
            backend=offload.device.backend if offload.device and on_device else "CPU",
            gpu_layers=gpu_layers,
            total_layers=model.facts.n_layer + 1,
            model_buffers=_buffers(log, "model"),
            kv_buffers=_buffers(log, "KV"),
            cpu_variant=devices.cpu_variant(),
            cpu_features=devices.cpu_features(),
            reason=offload.reason,
        )
        self._rotations = kvquant.rotations_from_log(log)
        return Opened(model, context, placement)

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
        self,
        config: EngineConfig,
        used: list[devices.Device],
        gpu_layers: int,
        log: list[str],
    ) -> tuple[NativeModel, NativeContext]:
        """The model on exactly the planned devices (weights another engine in this process
        loaded are reused), and a context with a second sequence in one unified cache (so a
        position range can be serialized through a scratch sequence)."""
        mark = len(log)
        model = NativeModel(
            config.model_path, gpu_layers, devices.handles(used), calls=self.calls, shared=True
        )
        if model.reused:  # what llama.cpp said loading them: where the weights live
            log[mark:mark] = model.load_log
        else:
            model.load_log.extend(log[mark:])
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
    def _runtime(self) -> tuple[str, str]:
        system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
        return llama_cpp.__version__, system_info

    def attn_rotation_disabled(self) -> bool:
        return os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") not in ("", "0")

    def model_info(self) -> ModelInfo:
        return gguf.describe(self.model, self.config.model_path, self.config.embedded)

    def _constraint(self, grammar: str) -> GrammarSampler:
        return GrammarSampler(self.model, grammar)

    def rope_specs(self) -> list[stacking.RopeSpec] | None:
        """Each cache section's rotary parameters, read from the GGUF as llama.cpp reads
        them (`llama_model::get_rope_freq_base/scale`, `hparams.n_rot(il)`): the global
        layers first, then the sliding-window ones."""
        if self._rope_specs is None:
            self._rope_specs = rope_specs_from(
                self.model.metadata, self.config.model_path, self._rotations
            )
        return self._rope_specs

    # -- llama.cpp's own state files (the benchmark's baseline) ---------------------------
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

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        super().close()
        self._stop_calls()

    def _stop_calls(self) -> None:
        if isinstance(self.calls, device_guard.NativeThread):
            self.calls.close()


def rope_specs_from(
    meta: dict[str, str], path: Path, rotations: Sequence[kvquant.Rotation]
) -> list[stacking.RopeSpec]:
    arch = str(meta.get("general.architecture", ""))

    def number(key: str, default: float) -> float:
        value = meta.get(f"{arch}.{key}")
        return float(value) if value not in (None, "") else default

    scaling = str(meta.get(f"{arch}.rope.scaling.type", "linear") or "linear")
    if scaling not in ("linear", "none"):
        raise stacking.StackError(f"RoPE scaling '{scaling}' cannot be re-rotated here")
    factor = number("rope.scaling.factor", 0.0)
    heads = _first_int(meta.get(f"{arch}.attention.head_count"), 1)
    head_global = int(number("attention.key_length", number("embedding_length", 0) / heads))
    head_swa = int(number("attention.key_length_swa", head_global))
    rot_global = int(number("rope.dimension_count", head_global))
    rot_swa = int(number("rope.dimension_count_swa", rot_global))
    factors = _rope_factors(path) if arch == "gemma4" else None
    hadamard = [r.k for r in rotations] + [0, 0]
    global_spec = stacking.RopeSpec(
        head_global,
        rot_global,
        number("rope.freq_base", 10_000.0),
        1.0 / factor if factor else 1.0,
        factors,
        hadamard[0],
    )
    if not number("attention.sliding_window", 0):
        return [global_spec]
    swa_spec = stacking.RopeSpec(
        head_swa, rot_swa, number("rope.freq_base_swa", 10_000.0), 1.0, None, hadamard[1]
    )
    return [global_spec, swa_spec]


def _rope_factors(path: Path) -> tuple[float, ...] | None:
    """Gemma 4's `rope_freqs` (its global layers' proportional RoPE), read from the file."""
    values = gguf.tensor(path, "rope_freqs.weight")
    return None if values is None else tuple(float(v) for v in values)


def _first_int(value: Any, default: int) -> int:
    """A GGUF number, or the first of a per-layer array (stored as text in the metadata)."""
    found = re.search(r"\d+", str(value)) if value is not None else None
    return int(found.group()) if found else default


def _the_real_engine_conforms(engine: Engine) -> ChatEngine:
    return engine  # mypy checks the structural match here
