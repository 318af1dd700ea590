"""The Gemma 4 family as Galahad offers it, and which one fits this machine.

One instruction-tuned Q4_K_M GGUF of each size from a well-known publisher. File sizes here
are the catalog's estimates; the download takes the real size and SHA-256 from the Hub's
file metadata. KV bytes per token follow from the architecture (f16 cache): only layers that
own KV store anything (E2B/E4B share KV in their last layers), global layers keep every
position, sliding-window layers keep only the last window — so a block on disk costs
`window_bytes` once plus `kv_bytes_per_token` for every token of chat or document.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from galahad_desktop.errors import InputError

SpeedSource = Literal["measured", "cached", "given"]

F16 = 2
# Bytes per stored K or V value: q8_0 keeps 32 values in 34 bytes (an f16 scale, 32 bytes),
# q4_0 in 18 (an f16 scale, 32 nibbles).
ELEMENT_BYTES = {"f16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
GIB = 1024**3
HEAD_SLIDING, HEAD_GLOBAL = 256, 512
OVERHEAD_BYTES = 768 * 1024**2  # compute buffers, the runtime itself
HEADROOM = 1.15  # never plan to fill the last 15% of memory
# Quick enough to live with: a reply at about reading speed, and a page (~500 tokens) of a
# document or a long question read in about ten seconds.
MIN_DECODE_TPS = 4.0
MIN_PREFILL_TPS = 50.0


@dataclass(frozen=True)
class Gemma4Model:
    size: str
    repo: str
    file: str
    bytes: int  # estimated file size
    layers: int
    global_every: int  # every n-th layer attends globally (4:1 -> 5, 5:1 -> 6)
    window: int
    kv_heads_sliding: int
    kv_heads_global: int
    shared_kv_layers: int
    context: int
    active_params: str
    active_billions: float  # parameters computed per token (what speed depends on)
    # The vision (and, on E2B/E4B, audio) projector from the same repository: what lets
    # the model read pictures (and hear voice memos). Downloaded with the model when asked
    # for (--vision); its size as the repository lists it (the download checks the Hub's).
    projector: str = ""
    projector_bytes: int = 0

    @property
    def hears(self) -> bool:
        """Whether its projector has an audio encoder (Gemma 4's small sizes)."""
        return self.size in ("E2B", "E4B")

    def _owning(self) -> tuple[int, int]:
        """(sliding, global) layers that own KV."""
        owners = self.layers - self.shared_kv_layers
        global_layers = sum(1 for i in range(owners) if (i + 1) % self.global_every == 0)
        return owners - global_layers, global_layers

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_as("f16")

    def kv_bytes_per_token_as(self, kv_type: str) -> int:
        """Bytes per token of the global layers' K and V, in a cache of `kv_type`."""
        _sliding, global_layers = self._owning()
        values = global_layers * 2 * self.kv_heads_global * HEAD_GLOBAL
        return int(values * ELEMENT_BYTES[kv_type])

    @property
    def window_bytes(self) -> int:
        return self.window_bytes_as("f16")

    def window_bytes_as(self, kv_type: str) -> int:
        """The sliding layers' cells as a stored block holds them (the last window)."""
        sliding, _global = self._owning()
        values = sliding * self.window * 2 * self.kv_heads_sliding * HEAD_SLIDING
        return int(values * ELEMENT_BYTES[kv_type])

    def window_cells(self, n_ubatch: int = 512) -> int:
        """What llama.cpp allocates for a sliding layer: the window plus one micro-batch,
        rounded up to 256 cells (1,024 for E4B at 512, 1,536 for 31B)."""
        return -(-(self.window + n_ubatch) // 256) * 256

    def memory_needed(self, n_ctx: int) -> int:
        """Weights, the KV cache for `n_ctx` tokens, and the runtime's own buffers."""
        sliding, _global = self._owning()
        window = sliding * self.window_cells() * 2 * self.kv_heads_sliding * HEAD_SLIDING * F16
        kv = n_ctx * self.kv_bytes_per_token + window
        return int((self.bytes + kv + OVERHEAD_BYTES) * HEADROOM)

    def block_bytes(self, tokens: int) -> int:
        """What a stored block of `tokens` tokens costs on disk (before encryption)."""
        sliding, _global = self._owning()
        cells = min(tokens, self.window)
        return tokens * self.kv_bytes_per_token + cells * (
            sliding * 2 * self.kv_heads_sliding * HEAD_SLIDING * F16
        )


# One publisher for every size: ggml-org, the llama.cpp team's own quantizations. Projector
# names and sizes are the repositories' listings at the revisions a third-party catalog
# pinned on 2026-10-07 (E2B b4243c15, E4B b8093469, 26B-A4B bb4531cd, 31B 4fa4fdf3);
# tests/test_models.py pins them. Model sizes are estimates (the download takes the Hub's).
GEMMA4: tuple[Gemma4Model, ...] = (
    Gemma4Model(
        size="E2B", repo="ggml-org/gemma-4-E2B-it-GGUF", file="gemma-4-E2B-it-Q4_K_M.gguf",
        bytes=3_400_000_000, layers=35, global_every=5, window=512, kv_heads_sliding=1,
        kv_heads_global=1, shared_kv_layers=20, context=131_072,
        active_params="2.3B effective", active_billions=2.3,
        projector="mmproj-gemma-4-E2B-it-Q8_0.gguf", projector_bytes=557_368_064,
    ),
    Gemma4Model(
        size="E4B", repo="ggml-org/gemma-4-E4B-it-GGUF", file="gemma-4-E4B-it-Q4_K_M.gguf",
        bytes=5_335_289_824, layers=42, global_every=6, window=512, kv_heads_sliding=2,
        kv_heads_global=2, shared_kv_layers=18, context=131_072,
        active_params="4.5B effective", active_billions=4.5,
        projector="mmproj-gemma-4-E4B-it-Q8_0.gguf", projector_bytes=559_874_816,
    ),
    Gemma4Model(
        size="26B-A4B", repo="ggml-org/gemma-4-26B-A4B-it-GGUF",
        file="gemma-4-26B-A4B-it-Q4_K_M.gguf", bytes=16_800_000_000, layers=30, global_every=6,
        window=1024, kv_heads_sliding=8, kv_heads_global=2, shared_kv_layers=0, context=262_144,
        active_params="3.8B active of 25B (MoE)", active_billions=3.8,
        projector="mmproj-gemma-4-26B-A4B-it-Q8_0.gguf", projector_bytes=806_408_320,
    ),
    Gemma4Model(
        size="31B", repo="ggml-org/gemma-4-31B-it-GGUF", file="gemma-4-31B-it-Q4_K_M.gguf",
        bytes=18_700_000_000, layers=60, global_every=6, window=1024, kv_heads_sliding=16,
        kv_heads_global=4, shared_kv_layers=0, context=262_144,
        active_params="30.7B dense", active_billions=30.7,
        projector="mmproj-gemma-4-31B-it-Q8_0.gguf", projector_bytes=809_541_728,
    ),
)  # fmt: skip
BY_SIZE = {m.size.lower(): m for m in GEMMA4}


@dataclass(frozen=True)
class EmbeddingModel:
    """The router's semantic half: a small multilingual embedding model (runs beside the chat
    model on the CPU; vectors exist only in memory after unlock)."""

    name: str
    repo: str
    file: str
    bytes: int  # estimated file size
    dimensions: int
    languages: str


EMBEDDING_GEMMA = EmbeddingModel(
    name="EmbeddingGemma 300M",
    repo="ggml-org/embeddinggemma-300M-GGUF",
    file="embeddinggemma-300M-Q8_0.gguf",
    bytes=330_000_000,
    dimensions=768,
    languages="100+ languages",
)


def model_for(size: str) -> Gemma4Model:
    found = BY_SIZE.get(size.strip().lower())
    if found is None:
        raise InputError(
            f"There is no Gemma 4 '{size}' in the catalog; choose one of "
            f"{', '.join(m.size for m in GEMMA4)}."
        )
    return found


def system_memory() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 8 * GIB


# The embedded Gemma 3 270M, measured as the probe: parameters computed per token (its tied
# 262k-word output matrix included: every token multiplies through it).
PROBE_ACTIVE_BILLIONS = 0.268


@dataclass(frozen=True)
class Speed:
    """This machine's measured speed with the embedded model; larger models are estimated
    from it by active parameters (prompt reading is compute-bound, replies memory-bound:
    both scale with the weights each token touches, at the same 4-bit quantization)."""

    prefill_tps: float
    decode_tps: float
    source: SpeedSource

    def estimate(self, active_billions: float) -> tuple[float, float]:
        factor = PROBE_ACTIVE_BILLIONS / active_billions
        return self.prefill_tps * factor, self.decode_tps * factor


def _speed_key() -> str:
    from galahad_desktop.engine import devices

    gpus = ",".join(d.label() for d in devices.gpu_devices())
    return "|".join(
        [devices.llama_cpp_version(), devices.cpu_variant(), str(os.cpu_count()), gpus or "no GPU"]
    )


def measure_speed(refresh: bool = False) -> Speed:
    """The embedded model's speed on this machine, measured once (a few seconds) and kept
    in the cache directory per build, CPU kernels and GPU. GALAHAD_FAKE_SPEED='PREFILL,DECODE'
    (tests, what-if) replaces it."""
    fake = os.environ.get("GALAHAD_FAKE_SPEED")
    if fake:
        try:
            prefill, decode = (float(x) for x in fake.split(","))
            return Speed(prefill, decode, "given")
        except ValueError:
            raise InputError("GALAHAD_FAKE_SPEED must be 'PREFILL,DECODE' tokens/s.") from None
    import json

    import platformdirs

    from galahad_desktop.engine import devices
    from galahad_desktop.paths import APP_NAME, default_model_path
    from galahad_desktop.system.files import atomic_write_bytes

    cache = Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)) / "speed.json"
    key = _speed_key()
    known: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(cache.read_text("utf-8"))
        known = loaded if isinstance(loaded, dict) else {}
    entry = known.get(key)
    if not refresh and isinstance(entry, list) and len(entry) == 2:
        with contextlib.suppress(TypeError, ValueError):
            return Speed(float(entry[0]), float(entry[1]), "cached")
    threads = max(1, min(8, os.cpu_count() or 1))
    prefill, decode = devices.measure_speed(default_model_path(), threads)
    known[key] = [prefill, decode]
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache, json.dumps(known, indent=1).encode("utf-8"))
    return Speed(prefill, decode, "measured")


@dataclass(frozen=True)
class Machine:
    backend: Literal["GPU", "CPU"]
    device: str
    memory_bytes: int  # what a model may use: free GPU memory, else system RAM
    speed: Speed | None = None  # measured when the recommendation needs it

    @classmethod
    def detect(cls, override_gib: float | None = None) -> Machine:
        """The largest GPU's free memory when llama.cpp has one, else system RAM.
        GALAHAD_FAKE_MEMORY_GIB (tests, what-if) replaces the measured amount."""
        fake = os.environ.get("GALAHAD_FAKE_MEMORY_GIB")
        if override_gib is None and fake:
            try:
                override_gib = float(fake)
            except ValueError:
                override_gib = None
        from galahad_desktop.engine import devices

        found = devices.devices()
        gpus = sorted((d for d in found if d.is_gpu), key=lambda d: -d.free_bytes)
        if gpus:
            machine = cls("GPU", gpus[0].label(), gpus[0].free_bytes)
        else:
            cpu = next((d for d in found if d.kind == "CPU"), None)
            total = cpu.total_bytes if cpu and cpu.total_bytes else system_memory()
            machine = cls("CPU", cpu.description if cpu else "CPU", total)
        if override_gib is not None:
            machine = cls(machine.backend, machine.device, int(override_gib * GIB))
        return machine


@dataclass(frozen=True)
class Candidate:
    size: str
    repo: str
    file: str
    bytes: int
    memory_needed: int
    kv_bytes_per_token: int
    window_bytes: int
    kv_bytes_per_token_q8_0: int  # the same with the q8_0 cache (setting kv_type)
    window_bytes_q8_0: int
    context: int
    active_params: str
    fits: bool
    quick: bool  # held by a GPU, or estimated to reply at reading speed and read a page in
    # seconds on this CPU
    prefill_tps: float  # estimated prompt reading, tokens/s
    decode_tps: float  # estimated reply speed, tokens/s


@dataclass(frozen=True)
class Recommendation:
    recommended: str | None
    reason: str
    machine: Machine
    n_ctx: int
    candidates: list[Candidate]
    speed: Speed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recommend(
    n_ctx: int = 8192, machine: Machine | None = None, speed: Speed | None = None
) -> Recommendation:
    """The largest Gemma 4 that fits this machine with room for `n_ctx` tokens of context
    and is quick here: replies at about reading speed, a page read in about ten seconds,
    estimated from the embedded model measured on this machine."""
    machine = machine or Machine.detect()
    speed = speed or machine.speed or measure_speed()
    candidates = []
    for m in GEMMA4:
        prefill, decode = speed.estimate(m.active_billions)
        candidates.append(
            Candidate(
                m.size,
                m.repo,
                m.file,
                m.bytes,
                m.memory_needed(n_ctx),
                m.kv_bytes_per_token,
                m.window_bytes,
                m.kv_bytes_per_token_as("q8_0"),
                m.window_bytes_as("q8_0"),
                m.context,
                m.active_params,
                m.memory_needed(n_ctx) <= machine.memory_bytes,
                # A GPU holding the whole model reads and replies at its memory's speed (the
                # small probe is latency-bound there, so scaling it undersells large models).
                machine.backend == "GPU"
                or (decode >= MIN_DECODE_TPS and prefill >= MIN_PREFILL_TPS),
                prefill,
                decode,
            )
        )
    where = (
        f"{machine.memory_bytes / GIB:.1f} GiB free on {machine.device}"
        if machine.backend == "GPU"
        else f"{machine.memory_bytes / GIB:.1f} GiB of system memory and no GPU"
    )
    fitting = [c for c in candidates if c.fits]
    quick = [c for c in fitting if c.quick]
    if not quick:
        smallest = candidates[0]
        why = (
            f"Even Gemma 4 {smallest.size} needs {smallest.memory_needed / GIB:.1f} GiB with a "
            f"{n_ctx:,}-token context; this machine has {where}."
            if not fitting
            else f"Gemma 4 {fitting[0].size} fits ({where}) but would reply at about "
            f"{fitting[0].decode_tps:.1f} tokens/s and read about {fitting[0].prefill_tps:.0f} "
            "tokens/s here (estimated), too slow to live with."
        )
        return Recommendation(
            None, f"{why} The embedded demo model still runs.", machine, n_ctx, candidates, speed
        )
    best = max(quick, key=lambda c: c.memory_needed)  # the largest quick one
    slow = [c.size for c in fitting if not c.quick]
    note = f" {', '.join(slow)} would fit but answer too slowly here." if slow else ""
    return Recommendation(
        best.size,
        f"Gemma 4 {best.size}: about {best.decode_tps:.0f} tokens/s replies and "
        f"{best.prefill_tps:,.0f} tokens/s reading here (estimated from the embedded model, "
        f"measured on this machine); it needs {best.memory_needed / GIB:.1f} GiB with a "
        f"{n_ctx:,}-token context, and this machine has {where}.{note}",
        machine,
        n_ctx,
        candidates,
        speed,
    )
