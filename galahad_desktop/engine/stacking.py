"""A stored block placed at later positions than it was read at ("stacked"), without reading
it again: its cells' positions moved, its keys re-rotated for the new positions.

Keys are stored after RoPE: a rotation of each head's first `n_rot` dimensions by an angle
proportional to the position. Rotations compose, so moving a key by `delta` positions is one
more rotation by `delta` times each pair's frequency — what llama.cpp's own K-shift does, done
here on the stored bytes, because llama.cpp refuses to shift a sliding-window cache kept as a
ring (the app's default) and a shift would have to restore the block into the live context
first. llama.cpp's Gemma models use NeoX RoPE (pair i with i + n_rot/2); the frequencies are
`freq_scale * freq_base^(-2i/n_rot) / factor_i`, with Gemma 4's `rope_freqs` factors on its
global layers. The parameters are read per cache section (global, then sliding window) from
the GGUF by the engine.

The result is not what a full read would have computed: the block's tokens never attended to
what now precedes them. That is why a stack is never called exact (its verdict is `stacked`,
with KL measured against a full read when asked), and why its first tokens are recomputed on
top of what precedes them (each block otherwise starts with a false "attention sink").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from galahad_desktop.engine import kvquant, kvstate

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
STACKABLE_K_TYPES = (GGML_TYPE_F32, GGML_TYPE_F16, kvquant.GGML_TYPE_Q8_0)


@dataclass(frozen=True)
class RopeSpec:
    """One cache section's rotary embedding (every layer of a section shares it)."""

    head_dim: int
    n_rot: int
    freq_base: float
    freq_scale: float = 1.0
    factors: tuple[float, ...] | None = None  # per pair (n_rot / 2), Gemma 4's global layers
    hadamard: int = 0  # a quantized cache's K rows are also rotated by a Hadamard matrix

    def angles(self, delta: int) -> np.ndarray:
        """Each pair's rotation for moving by `delta` positions (float64, (n_rot/2,))."""
        half = self.n_rot // 2
        theta = self.freq_base ** (-2.0 * np.arange(half, dtype=np.float64) / self.n_rot)
        theta = theta * self.freq_scale * delta
        if self.factors is not None:
            theta = theta / np.asarray(self.factors[:half], dtype=np.float64)
        return theta


class StackError(kvstate.KVLayoutError):
    """A block that cannot be moved to other positions here (the caller reads it instead)."""


def _rotate_heads(x: np.ndarray, spec: RopeSpec, delta: int) -> np.ndarray:
    """x: (cells, heads, head_dim) float32, rotated in place by `delta` positions."""
    half = spec.n_rot // 2
    theta = spec.angles(delta)
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    first = x[..., :half].copy()
    second = x[..., half : spec.n_rot]
    x[..., :half] = first * cos - second * sin
    x[..., half : spec.n_rot] = first * sin + second * cos
    return x


def shift_keys(layer: kvstate.Layer, spec: RopeSpec, delta: int) -> np.ndarray:
    """The layer's K rows (uint8, (cells, k_row)) as they would be `delta` positions later."""
    cells = layer.k.shape[0]
    if cells == 0 or delta == 0:
        return layer.k.copy()
    if layer.k_type == GGML_TYPE_F16:
        values = np.ascontiguousarray(layer.k).view(np.float16).astype(np.float32)
    elif layer.k_type == GGML_TYPE_F32:
        values = np.ascontiguousarray(layer.k).view(np.float32).copy()
    elif layer.k_type == kvquant.GGML_TYPE_Q8_0:
        values = kvquant.rotate(kvquant.dequantize_q8_0(layer.k), spec.hadamard)
    else:
        raise StackError(f"keys of ggml type {layer.k_type} cannot be moved (f16, f32, q8_0 can)")
    width = values.shape[1]
    if width % spec.head_dim or spec.n_rot > spec.head_dim or spec.n_rot % 2:
        raise StackError(
            f"a key row of {width} values is not whole heads of {spec.head_dim} "
            f"(rotating {spec.n_rot})"
        )
    heads = values.reshape(cells, width // spec.head_dim, spec.head_dim)
    _rotate_heads(heads, spec, delta)
    values = heads.reshape(cells, width)
    if layer.k_type == GGML_TYPE_F16:
        return values.astype(np.float16).view(np.uint8).reshape(cells, layer.k_row)
    if layer.k_type == GGML_TYPE_F32:
        return values.view(np.uint8).reshape(cells, layer.k_row)
    return kvquant.quantize_q8_0(kvquant.rotate(values, spec.hadamard))


def moved(
    section: kvstate.Section, cells: np.ndarray, spec: RopeSpec | None, delta: int
) -> kvstate.Section:
    """The chosen cells of a section, `delta` positions later (keys re-rotated by `spec`;
    None: positions only, for an engine whose keys carry no rotation)."""
    pos = section.pos[cells] + np.int32(delta)
    meta = section.meta[cells].copy()
    meta["pos"] = pos
    layers = []
    for layer in section.layers:
        picked = kvstate.Layer(
            layer.k_type,
            layer.k_row,
            layer.k[cells],
            layer.v_type,
            layer.v_elem,
            layer.v_embd,
            layer.v[:, cells] if section.v_trans else layer.v[cells],
        )
        if spec is not None:
            picked.k = shift_keys(picked, spec, delta)
        layers.append(picked)
    return kvstate.Section(pos, meta, section.v_trans, layers)


def _joined(first: kvstate.Section, second: kvstate.Section) -> kvstate.Section:
    if first.n_cells == 0:
        return second
    if second.n_cells == 0:
        return first
    layers = []
    for a, b in zip(first.layers, second.layers, strict=True):
        if (a.k_type, a.k_row, a.v_type, a.v_elem, a.v_embd) != (
            b.k_type,
            b.k_row,
            b.v_type,
            b.v_elem,
            b.v_embd,
        ):
            raise StackError("the block was stored with another KV layout than the context's")
        v = np.concatenate((a.v, b.v), axis=1 if first.v_trans else 0)
        layers.append(
            kvstate.Layer(
                a.k_type, a.k_row, np.concatenate((a.k, b.k)), a.v_type, a.v_elem, a.v_embd, v
            )
        )
    return kvstate.Section(
        np.concatenate((first.pos, second.pos)),
        np.concatenate((first.meta, second.meta)),
        first.v_trans,
        layers,
    )


def stack_state(
    base: kvstate.SeqState,
    block: kvstate.SeqState,
    skip: int,
    stop: int,
    delta: int,
    specs: Sequence[RopeSpec] | None,
    windows: Sequence[int],
) -> kvstate.SeqState:
    """`base` (what the context holds, ending at position `delta + skip`) followed by the
    block's cells at positions [skip, stop), moved `delta` later. `windows[i]`: how many of
    the last positions section i keeps (0: all; a sliding window keeps its last window).
    The block's cells before `skip` are the ones recomputed on top of `base` (or the turn
    opening the base already holds)."""
    if len(base.sections) != len(block.sections):
        raise StackError("the block has other cache sections than the context")
    if specs is not None and len(specs) != len(block.sections):
        raise StackError("no rotary parameters for every cache section")
    base = kvstate.in_position_order(base)
    block = kvstate.in_position_order(block)
    sections = []
    for index, (here, stored) in enumerate(zip(base.sections, block.sections, strict=True)):
        if here.n_cells and stored.n_cells and here.v_trans != stored.v_trans:
            raise StackError("the block was stored with another V layout than the context's")
        chosen = np.flatnonzero((stored.pos >= skip) & (stored.pos < stop))
        spec = specs[index] if specs is not None else None
        joined = _joined(here, moved(stored, chosen, spec, delta))
        if joined.n_cells and np.any(np.diff(joined.pos) <= 0):
            raise StackError("the block's positions overlap what the context holds")
        window = windows[index] if index < len(windows) else 0
        if window and joined.n_cells:
            end = int(joined.pos[-1]) + 1
            keep = np.flatnonzero(joined.pos >= end - window)
            if keep.size < joined.n_cells:
                joined = moved(joined, keep, None, 0)
        sections.append(joined)
    return kvstate.SeqState(sections)
