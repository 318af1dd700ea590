"""A GGUF file read by llama.cpp itself: its metadata and what the model is, from the
vocabulary alone (no weights are loaded), or from a model already loaded."""

from __future__ import annotations

from pathlib import Path

from galahad_desktop.engine import devices
from galahad_desktop.engine.modelinfo import (
    ModelInfo,
    check_model_file,
    model_kind,
    quantization_name,
)
from galahad_desktop.engine.native import NativeModel
from galahad_desktop.errors import ModelError


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
