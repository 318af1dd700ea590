"""Convert a per-sequence state read with an f16 KV cache into the q8_0 state a quantized
cache holds: half the bytes per stored token, while reading keeps f16's speed.

llama.cpp (as vendored by llama-cpp-python 0.3.36, `llama_kv_cache` and `llama-graph.cpp`)
stores a quantized cache's K rows rotated by an orthonormal Walsh-Hadamard matrix (Q is
rotated the same way, so attention is unchanged) in chunks of the largest power of two that
divides the head size, and V rows in chunks of 64 (the attention output is rotated back);
`LLAMA_ATTN_ROT_DISABLE=1` turns both off. Each row is then quantized in blocks of 32: one
f16 scale (the block's largest magnitude / 127) and 32 signed bytes, rounded to nearest
even as llama.cpp's x86 kernel does.

The conversion rounds twice (the f32 value to f16 when read, the f16 value to 8 bits here)
where llama.cpp's own q8_0 cache rounds once; `python -m galahad_dev bench kv-quality`
measures what that costs. A converted state is grafted into the q8_0 context and proven
there like any capture, so restores of it are exact by construction; only the stored values
differ.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from galahad_desktop.engine import kvstate

GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8
QK8_0 = 32
Q8_0_BLOCK_BYTES = 2 + QK8_0
V_ROTATION = 64  # llama.cpp rotates V in chunks of 64 (smaller matrices measured better)

_ROT_LINE = re.compile(r"attn_rot_([kv]) = (\d), n_embd_head_k_all = (-?\d+)")


@dataclass(frozen=True)
class Rotation:
    """How one cache section stores quantized rows: the Hadamard chunk size for K and V
    (0: not rotated)."""

    k: int
    v: int


def k_rotation_size(head_size: int) -> int:
    """The largest power of two (from 64) dividing the head size, as llama.cpp picks it."""
    size = 64
    while head_size % (size * 2) == 0:
        size *= 2
    return size if head_size % size == 0 else 0


def rotations_from_log(lines: Sequence[str]) -> list[Rotation]:
    """Each cache's rotation, in the order llama.cpp created the caches (the full-attention
    cache first, then the sliding-window one: the order of a state's sections)."""
    found: list[Rotation] = []
    k_size = 0
    for line in "".join(lines).splitlines():
        match = _ROT_LINE.search(line)
        if match is None:
            continue
        which, on, head = match.group(1), match.group(2) == "1", int(match.group(3))
        if which == "k":
            k_size = k_rotation_size(head) if on and head > 0 else 0
        else:
            found.append(Rotation(k_size, V_ROTATION if on else 0))
    return found


@cache
def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of size n (Sylvester order), as ggml builds it:
    every entry ±1/sqrt(n) in float32."""
    h = np.full((1, 1), np.float32(1.0) / np.sqrt(np.float32(n)), dtype=np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rotate(rows: np.ndarray, size: int) -> np.ndarray:
    """Each row's consecutive chunks of `size` values multiplied by the Hadamard matrix."""
    if size == 0:
        return rows
    cells, width = rows.shape
    chunks = rows.reshape(cells * width // size, size)
    rotated: np.ndarray = (chunks @ hadamard(size)).reshape(cells, width)
    return rotated


def quantize_q8_0(rows: np.ndarray) -> np.ndarray:
    """float32 rows (width a multiple of 32) as q8_0 rows of bytes."""
    cells, width = rows.shape
    blocks = rows.reshape(cells, width // QK8_0, QK8_0)
    amax = np.abs(blocks).max(axis=2)
    scale = (amax / np.float32(127.0)).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    quants = np.rint(blocks * inverse[..., None]).astype(np.int8)
    out = np.empty((cells, width // QK8_0, Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[..., :2] = scale.view(np.uint8).reshape(cells, width // QK8_0, 2)
    out[..., 2:] = quants.view(np.uint8)
    return out.reshape(cells, width // QK8_0 * Q8_0_BLOCK_BYTES)


def dequantize_q8_0(rows: np.ndarray) -> np.ndarray:
    """q8_0 rows of bytes as float32 (for tests and the quality measurement)."""
    cells, width = rows.shape
    blocks = rows.reshape(cells, width // Q8_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES)
    scale = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    quants = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
    return (quants * scale).reshape(cells, width // Q8_0_BLOCK_BYTES * QK8_0)


def _f16_rows(raw: np.ndarray, what: str) -> np.ndarray:
    if raw.shape[1] % (2 * QK8_0):
        raise kvstate.KVLayoutError(f"{what} rows of {raw.shape[1]} bytes cannot be q8_0 blocks")
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def to_q8_0(
    buffer: object,
    size: int,
    rotations: Sequence[Rotation],
    buffer_for: Callable[[int], ctypes.Array[ctypes.c_uint8]] = kvstate.bytes_buffer,
) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
    """The q8_0 state for an f16 state: every section's K and V rows rotated as its cache
    does and quantized; positions, sequences and layout unchanged."""
    state = kvstate.parse(buffer, size)
    if len(rotations) != len(state.sections):
        raise kvstate.KVLayoutError(
            f"the state has {len(state.sections)} cache sections but {len(rotations)} were "
            "described by llama.cpp"
        )
    sections = []
    for index, (section, rotation) in enumerate(zip(state.sections, rotations, strict=True)):
        layers = []
        for il, layer in enumerate(section.layers):
            where = f"cache section {index} layer {il}"
            if layer.k_type != GGML_TYPE_F16 or layer.v_type != GGML_TYPE_F16:
                raise kvstate.KVLayoutError(
                    f"{where} is not f16 (types {layer.k_type}, {layer.v_type})"
                )
            if section.v_trans:
                raise kvstate.KVLayoutError(f"{where}: V is transposed (flash attention is off)")
            k = quantize_q8_0(rotate(_f16_rows(layer.k, where + " K"), rotation.k))
            v = quantize_q8_0(rotate(_f16_rows(layer.v, where + " V"), rotation.v))
            layers.append(
                kvstate.Layer(GGML_TYPE_Q8_0, k.shape[1], k, GGML_TYPE_Q8_0, v.shape[1], 0, v)
            )
        sections.append(kvstate.Section(section.pos, section.meta, section.v_trans, layers))
    return kvstate.write(kvstate.SeqState(sections), buffer_for)
