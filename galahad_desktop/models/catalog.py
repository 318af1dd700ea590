"""The Gemma 4 family as Galahad offers it, and which one fits this machine.

One instruction-tuned Q4_K_M GGUF of each size from a well-known publisher. File sizes here
are the catalog's estimates; the download takes the real size and SHA-256 from the Hub's
file metadata. KV bytes per token follow from the architecture (f16 cache): only layers that
own KV store anything (E2B/E4B share KV in their last layers), global layers keep every
position, sliding-window layers keep only the last window — so a block on disk costs
`window_bytes` once plus `kv_bytes_per_token` for every token of chat or document.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from galahad_desktop.errors import InputError

F16 = 2
GIB = 1024**3
HEAD_SLIDING, HEAD_GLOBAL = 256, 512
OVERHEAD_BYTES = 768 * 1024**2  # compute buffers, the runtime itself
HEADROOM = 1.15  # never plan to fill the last 15% of memory
CPU_ACTIVE_LIMIT = 4.0  # without a GPU, more active parameters than this answer too slowly


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

    def _owning(self) -> tuple[int, int]:
        """(sliding, global) layers that own KV."""
        owners = self.layers - self.shared_kv_layers
        global_layers = sum(1 for i in range(owners) if (i + 1) % self.global_every == 0)
        return owners - global_layers, global_layers

    @property
    def kv_bytes_per_token(self) -> int:
        _sliding, global_layers = self._owning()
        return global_layers * 2 * self.kv_heads_global * HEAD_GLOBAL * F16

    @property
    def window_bytes(self) -> int:
        sliding, _global = self._owning()
        return sliding * self.window * 2 * self.kv_heads_sliding * HEAD_SLIDING * F16

    def memory_needed(self, n_ctx: int) -> int:
        """Weights, the KV cache for `n_ctx` tokens, and the runtime's own buffers."""
        kv = n_ctx * self.kv_bytes_per_token + self.window_bytes
        return int((self.bytes + kv + OVERHEAD_BYTES) * HEADROOM)

    def block_bytes(self, tokens: int) -> int:
        """What a stored block of `tokens` tokens costs on disk (before encryption)."""
        sliding, _global = self._owning()
        cells = min(tokens, self.window)
        return tokens * self.kv_bytes_per_token + cells * (
            sliding * 2 * self.kv_heads_sliding * HEAD_SLIDING * F16
        )


GEMMA4: tuple[Gemma4Model, ...] = (
    Gemma4Model(
        size="E2B", repo="unsloth/gemma-4-E2B-it-GGUF", file="gemma-4-E2B-it-Q4_K_M.gguf",
        bytes=3_110_000_000, layers=35, global_every=5, window=512, kv_heads_sliding=1,
        kv_heads_global=1, shared_kv_layers=20, context=131_072,
        active_params="2B effective", active_billions=2.0,
    ),
    Gemma4Model(
        size="E4B", repo="ggml-org/gemma-4-E4B-it-GGUF", file="gemma-4-E4B-it-Q4_K_M.gguf",
        bytes=4_230_000_000, layers=42, global_every=6, window=512, kv_heads_sliding=2,
        kv_heads_global=2, shared_kv_layers=18, context=131_072,
        active_params="4B effective", active_billions=4.0,
    ),
    Gemma4Model(
        size="26B-A4B", repo="lmstudio-community/gemma-4-26B-A4B-it-GGUF",
        file="gemma-4-26B-A4B-it-Q4_K_M.gguf", bytes=14_500_000_000, layers=30, global_every=6,
        window=1024, kv_heads_sliding=8, kv_heads_global=2, shared_kv_layers=0, context=262_144,
        active_params="4B active of 26B (MoE)", active_billions=4.0,
    ),
    Gemma4Model(
        size="31B", repo="ggml-org/gemma-4-31B-it-GGUF", file="gemma-4-31B-it-Q4_K_M.gguf",
        bytes=17_400_000_000, layers=60, global_every=6, window=1024, kv_heads_sliding=16,
        kv_heads_global=4, shared_kv_layers=0, context=262_144,
        active_params="31B dense", active_billions=31.0,
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


@dataclass(frozen=True)
class Device:
    kind: str  # GPU | CPU
    name: str
    free_bytes: int
    total_bytes: int


def _ggml_library() -> ctypes.CDLL | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
    names = {"win32": "ggml.dll", "darwin": "libggml.dylib"}.get(sys.platform, "libggml.so")
    for candidate in (lib_dir / names, Path(names)):
        try:
            return ctypes.CDLL(str(candidate))
        except OSError:
            continue
    return None


def devices() -> list[Device]:
    """llama.cpp's device list (GPUs with their free memory, and the CPU with system RAM)."""
    lib = _ggml_library()
    if lib is None:
        return []
    try:
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_description.restype = ctypes.c_char_p
        lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_size_t),
        ]
        out = []
        for i in range(int(lib.ggml_backend_dev_count())):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            kind = {1: "GPU", 2: "GPU"}.get(int(lib.ggml_backend_dev_type(dev)), "CPU")
            name = (lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace")
            out.append(Device(kind, name, int(free.value), int(total.value)))
        return out
    except (AttributeError, OSError):
        return []


def system_memory() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 8 * GIB


@dataclass(frozen=True)
class Machine:
    backend: str  # GPU | CPU
    device: str
    memory_bytes: int  # what a model may use: free GPU memory, else system RAM

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
        found = devices()
        gpus = sorted((d for d in found if d.kind == "GPU"), key=lambda d: -d.free_bytes)
        if gpus:
            machine = cls("GPU", gpus[0].name, gpus[0].free_bytes)
        else:
            cpu = next((d for d in found if d.kind == "CPU"), None)
            total = cpu.total_bytes if cpu and cpu.total_bytes else system_memory()
            machine = cls("CPU", cpu.name if cpu else "CPU", total)
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
    context: int
    active_params: str
    fits: bool
    quick: bool  # fast enough on this machine's backend (a GPU, or few active parameters)


@dataclass(frozen=True)
class Recommendation:
    recommended: str | None
    reason: str
    machine: Machine
    n_ctx: int
    candidates: list[Candidate]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recommend(n_ctx: int = 8192, machine: Machine | None = None) -> Recommendation:
    """The largest Gemma 4 that fits this machine with room for `n_ctx` tokens of context."""
    machine = machine or Machine.detect()
    candidates = [
        Candidate(
            m.size,
            m.repo,
            m.file,
            m.bytes,
            m.memory_needed(n_ctx),
            m.kv_bytes_per_token,
            m.window_bytes,
            m.context,
            m.active_params,
            m.memory_needed(n_ctx) <= machine.memory_bytes,
            machine.backend == "GPU" or m.active_billions <= CPU_ACTIVE_LIMIT,
        )
        for m in GEMMA4
    ]
    fitting = [c for c in candidates if c.fits and c.quick]
    where = (
        f"{machine.memory_bytes / GIB:.1f} GiB free on the {machine.device} GPU"
        if machine.backend == "GPU"
        else f"{machine.memory_bytes / GIB:.1f} GiB of system memory (no GPU backend)"
    )
    if not fitting:
        smallest = candidates[0]
        return Recommendation(
            None,
            f"Even Gemma 4 {smallest.size} needs {smallest.memory_needed / GIB:.1f} GiB with a "
            f"{n_ctx:,}-token context; this machine has {where}. The embedded demo model "
            "still runs.",
            machine,
            n_ctx,
            candidates,
        )
    best = fitting[-1]
    slow = [c.size for c in candidates if c.fits and not c.quick]
    note = (
        f" Without a GPU, {', '.join(slow)} would answer too slowly (over "
        f"{CPU_ACTIVE_LIMIT:.0f}B parameters active per token)."
        if slow
        else ""
    )
    return Recommendation(
        best.size,
        f"Gemma 4 {best.size} is the largest that fits: it needs "
        f"{best.memory_needed / GIB:.1f} GiB with a {n_ctx:,}-token context, and this machine "
        f"has {where}.{note}",
        machine,
        n_ctx,
        candidates,
    )
