"""Random-weight Gemma 4 GGUFs with a real size's attention shapes, for measuring memory.

Each shape takes from the catalog (models/catalog.py, one source of truth) what decides
the KV cache: the layer count, the sliding/global pattern, the window, the KV heads of
each kind of layer, the head sizes (256 sliding, 512 global) and the KV-shared layers.
Everything else is as narrow as llama.cpp allows, so they compute quickly on 2 cores: a
32-wide residual stream, as many query heads as the widest KV layer, no per-layer
embeddings, a dense 64-wide feed-forward (26B-A4B's experts hold no KV). Their KV bytes
per token, windows and blocks are those of the real sizes; their words are nonsense.
"""

from __future__ import annotations

from pathlib import Path

from galahad_desktop.models.catalog import BY_SIZE, GEMMA4, HEAD_GLOBAL, HEAD_SLIDING, Gemma4Model
from galahad_dev.gemma4_model import Gemma4Shape, build

SIZES = tuple(m.size for m in GEMMA4)
WIDTH = 32


def shape_of(model: Gemma4Model) -> Gemma4Shape:
    """The real size's attention shape, narrow everywhere else."""
    pattern = tuple((i + 1) % model.global_every != 0 for i in range(model.layers))
    kv_heads = tuple(model.kv_heads_sliding if s else model.kv_heads_global for s in pattern)
    return Gemma4Shape(
        n_embd=WIDTH,
        n_ff=2 * WIDTH,
        n_head=max(model.kv_heads_sliding, model.kv_heads_global),
        head_swa=HEAD_SLIDING,
        head_global=HEAD_GLOBAL,
        kv_heads=kv_heads,
        swa_pattern=pattern,
        shared_kv_layers=model.shared_kv_layers,
        window=model.window,
        per_layer_embd=0,
        context=model.context,
        seed=11,
    )


def real_shape_model(size: str, gemma3_path: Path, out_dir: Path | None = None) -> Path:
    """The GGUF for a Gemma 4 size's shape (built once, then cached)."""
    return build(gemma3_path, out_dir, shape_of(BY_SIZE[size.lower()]))
