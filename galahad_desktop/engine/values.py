"""The engine's value types: what it is configured with, where it runs, what a request
cost. Kept apart from the modules that load llama.cpp, so the core's results, the window
and the fake engine import them without loading the library."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from galahad_desktop.engine.chat_format import TurnFormat

KvType = Literal["f16", "f32", "q8_0", "q4_0"]
KV_TYPE_NAMES: tuple[KvType, ...] = ("f16", "f32", "q8_0", "q4_0")


@dataclass(frozen=True)
class Placement:
    """Where the model runs, as llama.cpp reported it while loading."""

    device: str  # "Vulkan0: NVIDIA ...", "RPC0: 127.0.0.1:50052", or "CPU"
    backend: str  # the backend running the offloaded layers (Vulkan, CUDA, RPC), or CPU
    gpu_layers: int
    total_layers: int
    model_buffers: dict[str, float]  # buffer name -> MiB (CPU_Mapped, CUDA0, RPC0[...], ...)
    kv_buffers: dict[str, float]  # device -> MiB of KV cache
    cpu_variant: str  # the CPU kernels chosen for this processor (haswell, zen4, ...)
    cpu_features: dict[str, str]
    reason: str  # why this many layers are offloaded, in words

    @property
    def kv_devices(self) -> list[str]:
        return sorted(self.kv_buffers)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kv_devices": self.kv_devices}


@dataclass(frozen=True)
class SamplingDefaults:
    """A model publisher's recommended sampling (what settings and a conversation's own
    values are laid over)."""

    temperature: float
    top_k: int
    top_p: float
    max_tokens: int = 1024  # the longest reply, unless Settings or a conversation say

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


# What Google recommends for every Gemma model (used when the GGUF carries no
# general.sampling.* keys); other families get llama.cpp's own defaults.
GEMMA_SAMPLING = SamplingDefaults(temperature=1.0, top_k=64, top_p=0.95)
GENERIC_SAMPLING = SamplingDefaults(temperature=0.8, top_k=40, top_p=0.95)


@dataclass(frozen=True)
class RuntimeDetails:
    """Everything the KV bytes of a block depend on: the runtime fingerprint is the hash of
    these (engine/fingerprint.py), so a block made under other ones is re-read, never
    grafted. `as_dict` is exactly what is hashed."""

    model_sha256: str
    llama_cpp_python: str  # "fake" for the fast tier's engine
    system_info: str  # llama.cpp's build and CPU features
    gpu_offload: bool
    n_gpu_layers: int
    # The device's kernels compute the KV bytes: a block made on a GPU is another runtime
    # on the CPU (and the reverse) and is re-read, never grafted silently.
    device: str
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    flash_attn: bool
    kv_type: str
    attn_rot_disabled: bool  # quantized caches store K and V rotated unless this is set
    swa_full: bool
    kv_unified: bool
    n_seq_max: int
    turn_format: TurnFormat

    @staticmethod
    def of(
        config: EngineConfig,
        runtime: tuple[str, str],
        model_sha256: str,
        n_ctx: int,
        placed: tuple[int, str],
        turn_format: TurnFormat,
        attn_rot_disabled: bool = False,
    ) -> RuntimeDetails:
        """Built from what the engine was configured with, its runtime (llama-cpp-python's
        version, llama.cpp's system info) and where it placed the model (layers, device)."""
        (version, system_info), (gpu_layers, device) = runtime, placed
        return RuntimeDetails(
            model_sha256=model_sha256,
            llama_cpp_python=version,
            system_info=system_info,
            gpu_offload=gpu_layers > 0,
            n_gpu_layers=gpu_layers,
            device=device,
            n_ctx=n_ctx,
            n_batch=config.n_batch,
            n_ubatch=config.n_ubatch,
            n_threads=config.n_threads,
            flash_attn=config.flash_attn,
            kv_type=config.kv_type,
            attn_rot_disabled=attn_rot_disabled,
            swa_full=config.swa_full,
            kv_unified=True,
            n_seq_max=2,  # sequence 0 and the scratch sequence (engine.SCRATCH_SEQ)
            turn_format=turn_format,
        )

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["turn_format"] = self.turn_format.as_dict()
        return out


@dataclass(frozen=True)
class VisionStatus:
    """Whether the model reads pictures and hears voice memos, with which projector, and how."""

    pictures: bool = False
    audio: bool = False  # its projector has an audio encoder (Gemma 4 E2B, E4B)
    projector: str | None = None
    problem: str = ""  # why a projector that is set up does not load
    projector_sha256: str = ""
    image_min_tokens: int = 0
    image_max_tokens: int = 0
    attention_within_image: str = ""  # "both ways" or "causal"
    audio_sample_rate: int = 0  # what the audio encoder hears (16 kHz on Gemma 4)
    audio_part_seconds: int = 0  # the longest part of a memo read at once


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    n_ctx: int = 8192
    n_gpu_layers: int = -1  # -1: as many as fit in the GPUs' free memory
    rpc_servers: tuple[str, ...] = ()  # llama.cpp RPC devices on this computer (host:port)
    n_threads: int = 2
    n_batch: int = 512
    n_ubatch: int = 512
    flash_attn: bool = False
    kv_type: str = "f16"
    # With a quantized cache, read long texts from an empty context in an f16 context and
    # convert (engine/kvquant.py): reading at f16's speed, storing q8_0's bytes.
    read_in_f16: bool = True
    swa_full: bool = True
    embedded: bool = False  # the demo model that ships with the app


@dataclass(frozen=True)
class Stacked:
    """What placing a stored block after the context cost (ContextEngine.stack)."""

    n_tokens: int  # the block's tokens now in the context
    recomputed: int  # of them, read on top of the context (the first ones and the last)
    recompute_ms: float
    elapsed_ms: float  # everything: the recompute, the move, the restore


@dataclass
class Counters:
    """Per-request token accounting (what the JSON output and the status line report)."""

    restored_tokens: int = 0
    recomputed_tokens: int = 0
    new_tokens: int = 0
    stacked_tokens: int = 0  # moved into place from stored blocks (close, not exact)
    generated_tokens: int = 0
    restore_ms: float = 0.0
    proof_ms: float = 0.0
    prefill_ms: float = 0.0
    generate_ms: float = 0.0
    persist_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
