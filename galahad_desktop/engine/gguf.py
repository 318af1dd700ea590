"""A GGUF file read by llama.cpp itself: its metadata and what the model is, from the
vocabulary alone (no weights are loaded), or from a model already loaded."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from galahad_desktop.engine.modelinfo import (
    ModelInfo,
    check_model_file,
    model_kind,
    quantization_name,
)
from galahad_desktop.errors import ModelError

if TYPE_CHECKING:
    from galahad_desktop.engine.native import NativeModel


def describe(model: NativeModel, path: Path, embedded: bool) -> ModelInfo:
    meta = model.metadata
    arch = meta.get("general.architecture", "unknown")
    has_template = bool(meta.get("tokenizer.chat_template"))
    kind, label = model_kind(has_template, embedded)
    return ModelInfo(
        path=str(path),
        name=meta.get("general.name", path.stem),
        architecture=arch,
        description=model.facts.description,
        n_params=model.facts.n_params,
        size_bytes=path.stat().st_size,
        n_ctx_train=int(meta.get(f"{arch}.context_length", 0) or 0),
        n_layers=int(meta.get(f"{arch}.block_count", 0) or 0),
        has_chat_template=has_template,
        quantization=quantization_name(meta),
        kind=kind,
        label=label,
        window=int(meta.get(f"{arch}.attention.sliding_window", 0) or 0),
    )


def vocabulary(path: Path) -> NativeModel:
    """The file's vocabulary and metadata only, on the CPU; the caller closes it."""
    # llama.cpp is imported when a file is read, not with this module (the window's start).
    from galahad_desktop.engine import devices
    from galahad_desktop.engine.native import NativeModel

    devices.load_backends()
    try:
        return NativeModel(path, vocab_only=True)
    except ValueError as exc:
        raise ModelError(f"llama.cpp could not read {path}: {exc}") from None


def read_metadata(path: Path) -> dict[str, str]:
    """A GGUF's metadata without its weights (to size the offload before loading)."""
    model = vocabulary(path)
    try:
        return dict(model.metadata)
    finally:
        model.close()


def inspect_gguf(path: Path, embedded: bool = False) -> ModelInfo:
    """What a model file is, read with the vocabulary only."""
    check_model_file(path)
    model = vocabulary(path)
    try:
        return describe(model, path, embedded)
    finally:
        model.close()


# GGUF value types' sizes (8: string, 9: array, which have none of their own).
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_FLOATS = {0: np.float32, 1: np.float16}  # tensor types read here: F32, F16


def tensor(path: Path, name: str) -> np.ndarray | None:
    """One small F32/F16 tensor of a GGUF file, found by walking its header: the `gguf`
    package's reader parses every metadata value into NumPy first (13 s for Gemma 4's
    262,144-token vocabulary on 2 cores), this skips them (~0.3 s). None: no such tensor."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ModelError(f"{path.name} is not a GGUF file.")
        n_tensors, n_kv = struct.unpack_from("<QQ", m, 8)
        at = 24
        alignment = 32

        def string(at: int) -> tuple[bytes, int]:
            (length,) = struct.unpack_from("<Q", m, at)
            return m[at + 8 : at + 8 + length], at + 8 + length

        def skip(kind: int, at: int) -> int:
            if kind == 8:
                return string(at)[1]
            if kind == 9:
                inner, count = struct.unpack_from("<IQ", m, at)
                at += 12
                if inner in _GGUF_SIZES:
                    return int(at + count * _GGUF_SIZES[inner])
                for _ in range(count):
                    at = skip(inner, at)
                return at
            return int(at + _GGUF_SIZES[kind])

        for _ in range(n_kv):
            key, at = string(at)
            (kind,) = struct.unpack_from("<I", m, at)
            if key == b"general.alignment" and kind == 4:
                (alignment,) = struct.unpack_from("<I", m, at + 4)
            at = skip(kind, at + 4)
        found: tuple[list[int], int, int] | None = None
        for _ in range(n_tensors):
            tensor, at = string(at)
            (n_dims,) = struct.unpack_from("<I", m, at)
            dims = list(struct.unpack_from(f"<{n_dims}Q", m, at + 4))
            kind, offset = struct.unpack_from("<IQ", m, at + 4 + 8 * n_dims)
            at += 4 + 8 * n_dims + 12
            if tensor == name.encode():
                found = (dims, kind, offset)
        if found is None:
            return None
        dims, kind, offset = found
        if kind not in _GGUF_FLOATS:
            raise ModelError(f"{path.name}: {name} is stored in a type this app cannot read.")
        start = (at + alignment - 1) // alignment * alignment + offset
        count = int(np.prod(dims))
        view = np.frombuffer(m, _GGUF_FLOATS[kind], count, start)
        values = view.astype(np.float32)  # a copy: the map closes below
        del view
        return values
