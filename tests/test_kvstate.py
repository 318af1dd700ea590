"""The state splicer on synthetic bytes: llama.cpp's per-sequence format written by a small,
independent writer (every layer type: row-major and transposed V, several layers, a full and
a sliding-window section), then parsed, cut, spliced and relabelled — and truncated or
malformed inputs, which must raise KVLayoutError and nothing else. Fast: no model."""

from __future__ import annotations

import ctypes
import random
import struct

import numpy as np
import pytest

from galahad_desktop.engine import kvstate
from galahad_desktop.engine.kvstate import KVLayoutError

# (k_row bytes, v_elem bytes, v_embd rows) per layer; v_embd is used when V is transposed.
LAYERS = [(8, 2, 3), (4, 2, 5)]


def cell_bytes(pos: int, layer: int, part: str, n: int) -> bytes:
    """A cell's bytes depend only on its position (as llama.cpp's do on the tokens so far)."""
    seed = pos * 131 + layer * 17 + {"k": 1, "v": 2}[part] * 7
    return bytes((seed + i * 29) % 256 for i in range(n))


def section(positions: list[int], v_trans: int, seq: int = 0, layers=LAYERS) -> bytes:  # type: ignore[no-untyped-def]
    out = struct.pack("<II", 1, len(positions))
    if not positions:
        return out
    for pos in positions:
        out += struct.pack("<iIi", pos, 1, seq)
    out += struct.pack("<II", v_trans, len(layers))
    for il, (k_row, _v_elem, _v_embd) in enumerate(layers):
        out += struct.pack("<iQ", 1, k_row)
        out += b"".join(cell_bytes(p, il, "k", k_row) for p in positions)
    for il, (_k_row, v_elem, v_embd) in enumerate(layers):
        if v_trans:
            out += struct.pack("<iII", 1, v_elem, v_embd)
            for row in range(v_embd):
                out += b"".join(cell_bytes(p + 1000 * row, il, "v", v_elem) for p in positions)
        else:
            out += struct.pack("<iQ", 1, v_elem * 4)
            out += b"".join(cell_bytes(p, il, "v", v_elem * 4) for p in positions)
    return out


def state(full: list[int], window: list[int], v_trans: int = 1, seq: int = 0) -> bytes:
    """A Gemma-3-like state: the full-attention section, then the sliding-window section."""
    return (
        struct.pack("<Ii", kvstate.STATE_MAGIC, seq)
        + section(full, v_trans, seq)
        + section(window, v_trans, seq)
    )


def buffer_of(data: bytes) -> ctypes.Array[ctypes.c_uint8]:
    return (ctypes.c_uint8 * len(data)).from_buffer_copy(data)


@pytest.mark.parametrize("v_trans", [0, 1])
def test_parse_reads_every_cell_and_layer(v_trans: int) -> None:
    data = state(list(range(10)), list(range(6, 10)), v_trans)
    parsed = kvstate.parse(data)
    assert parsed.layout() == [[(0, 10)], [(6, 10)]]
    full, window = parsed.sections
    assert full.v_trans == v_trans and len(full.layers) == len(LAYERS)
    assert full.layers[1].k[3].tobytes() == cell_bytes(3, 1, "k", 4)
    assert window.layers[0].k[0].tobytes() == cell_bytes(6, 0, "k", 8)
    if v_trans:
        assert window.layers[1].v.shape == (5, 4, 2)
        assert window.layers[1].v[2, 1].tobytes() == cell_bytes(7 + 2000, 1, "v", 2)


@pytest.mark.parametrize("v_trans", [0, 1])
@pytest.mark.parametrize("cut_at", [1, 4, 7, 9])
def test_cut_then_splice_rebuilds_the_state_byte_for_byte(v_trans: int, cut_at: int) -> None:
    """A root block up to `cut_at`, then the child cut from the later state: spliced, they
    are exactly the later state (the window section included)."""
    root = state(list(range(cut_at)), list(range(max(0, cut_at - 4), cut_at)), v_trans)
    later = state(list(range(12)), list(range(8, 12)), v_trans)
    child, child_size = kvstate.cut(kvstate.parse(later), cut_at)
    head_layout = kvstate.parse(later).layout()
    spliced, size = kvstate.splice(
        [(root, len(root)), (child, child_size)], head_layout, kvstate.bytes_buffer
    )
    assert bytes(spliced)[:size] == later


def test_a_three_link_chain_splices_and_a_missing_link_is_refused() -> None:
    links = [state(list(range(0, 4)), []), state(list(range(4, 8)), []), state([], [])]
    full = state(list(range(8)), [])
    layout = kvstate.parse(full).layout()
    spliced, size = kvstate.splice(
        [(links[0], len(links[0])), (links[1], len(links[1]))], layout, kvstate.bytes_buffer
    )
    assert bytes(spliced)[:size] == full
    with pytest.raises(KVLayoutError, match="missing 4 cells"):
        kvstate.splice([(links[0], len(links[0]))], layout, kvstate.bytes_buffer)


def test_relabel_makes_a_scratch_sequence_sequence_zero() -> None:
    data = buffer_of(state(list(range(5)), [3, 4], seq=3))
    kvstate.relabel(data, len(data), 3)
    assert bytes(data) == state(list(range(5)), [3, 4], seq=0)
    other = buffer_of(state(list(range(5)), [], seq=2))
    with pytest.raises(KVLayoutError):
        kvstate.relabel(other, len(other), 3)  # the header says another sequence


def test_every_truncation_is_a_layout_error() -> None:
    """Cut anywhere, the state is refused; cut exactly between its sections it parses as a
    state with one section fewer, which the splice refuses against the block's layout."""
    data = state(list(range(6)), [4, 5])
    boundary = 8 + len(section(list(range(6)), 1))
    layout = kvstate.parse(data).layout()
    for length in range(len(data)):
        if length == boundary:
            short = data[:length]
            with pytest.raises(KVLayoutError, match="1 cache sections where 2"):
                kvstate.splice([(short, len(short))], layout, kvstate.bytes_buffer)
            continue
        with pytest.raises(KVLayoutError):
            kvstate.parse(data[:length])
    with pytest.raises(KVLayoutError, match="empty"):
        kvstate.parse(data[:8])


def header_patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    patched = bytearray(data)
    struct.pack_into(fmt, patched, offset, value)
    return bytes(patched)


def test_malformed_states_are_named() -> None:
    data = state([0, 1, 2], [])
    cells = 8 + 8  # magic, seq; then n_stream, cell_count
    cases = {
        "header is unknown": header_patch(data, 0, "<I", 0x1234),
        "2 streams": header_patch(data, 8, "<I", 2),
        "shared by several sequences": header_patch(data, cells + 4, "<I", 2),
        "unknown header": header_patch(data, cells + 3 * 12, "<I", 2),  # v_trans 2
        "K row of 0 bytes": header_patch(data, cells + 3 * 12 + 8 + 4, "<Q", 0),
    }
    for message, bad in cases.items():
        with pytest.raises(KVLayoutError, match=message):
            kvstate.parse(bad)
    shuffled = state([0, 2, 1], [])
    with pytest.raises(KVLayoutError, match="position order"):
        kvstate.parse(shuffled).layout()
    with pytest.raises(KVLayoutError, match="not readable"):
        kvstate.splice([(data, len(data))], [[("a", "b")]], kvstate.bytes_buffer)
    narrow = struct.pack("<Ii", kvstate.STATE_MAGIC, 0) + section([3, 4], 1, layers=[(4, 2, 3)])
    wide = struct.pack("<Ii", kvstate.STATE_MAGIC, 0) + section([0, 1, 2], 1, layers=[(8, 2, 3)])
    with pytest.raises(KVLayoutError, match="differs in shape"):
        kvstate.splice([(wide, len(wide)), (narrow, len(narrow))], [[(0, 5)]], kvstate.bytes_buffer)


def test_random_damage_raises_only_layout_errors() -> None:
    """1,000 random byte changes: each either still parses (a changed payload byte) or raises
    KVLayoutError — never IndexError, ValueError or a crash."""
    data = state(list(range(6)), [4, 5], v_trans=1)
    rng = random.Random(0)
    refused = 0
    for _ in range(1000):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            parsed = kvstate.parse(bytes(damaged))
            parsed.layout()
        except KVLayoutError:
            refused += 1
    assert refused > 100  # the header and cell list are a good share of these bytes


def test_to_ranges_and_back() -> None:
    positions = np.array([0, 1, 2, 5, 6, 9])
    assert kvstate.to_ranges(positions) == [(0, 3), (5, 7), (9, 10)]
    assert kvstate.from_ranges([(0, 3), (5, 7), (9, 10)]).tolist() == positions.tolist()
    assert kvstate.to_ranges(np.array([], dtype=np.int64)) == []


# -- q8_0 conversion (engine/kvquant.py) ------------------------------------------------------
def test_the_hadamard_matrix_is_ggmls_and_orthonormal() -> None:
    from galahad_desktop.engine import kvquant

    for n in (64, 256, 512):
        h = kvquant.hadamard(n)
        assert h.dtype == np.float32 and np.allclose(h @ h, np.eye(n), atol=1e-5)
        assert np.allclose(np.abs(h), 1 / np.sqrt(n))
    h4 = kvquant.hadamard(4) * 2
    assert h4.tolist() == [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]
    assert [kvquant.k_rotation_size(n) for n in (64, 128, 256, 512, 80, 96)] == [
        64,
        128,
        256,
        512,
        0,
        0,  # 80 and 96: llama.cpp does not rotate (not % 64)
    ]


def test_q8_0_blocks_round_trip_within_half_a_step() -> None:
    from galahad_desktop.engine import kvquant

    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((5, 256)) * rng.uniform(0.01, 10, (5, 1))).astype(np.float32)
    rows[2, :32] = 0.0  # an all-zero block: scale 0, quants 0
    packed = kvquant.quantize_q8_0(rows)
    assert packed.shape == (5, 256 // 32 * 34)
    back = kvquant.dequantize_q8_0(packed)
    step = np.abs(rows).reshape(5, 8, 32).max(axis=2, keepdims=True) / 127
    # half a step, plus what rounding the scale to f16 moves the largest value (127 × 2^-11)
    assert np.all(np.abs(back - rows).reshape(5, 8, 32) <= step * (0.5 + 127 / 2048) + 1e-6)
    assert np.all(back[2, :32] == 0)


def test_rotations_are_read_from_llama_cpps_log() -> None:
    from galahad_desktop.engine.kvquant import Rotation, rotations_from_log

    log = [
        "llama_kv_cache_iswa: creating non-SWA KV cache, size = 2048 cells\n",
        "llama_kv_cache: attn_rot_k = 1, n_embd_head_k_all = 512\n",
        "llama_kv_cache: attn_rot_v = 1, n_embd_head_k_all = 512\n",
        "llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells\n",
        "llama_kv_cache: attn_rot_k = 0, n_embd_head_k_all = 256\n",
        "llama_kv_cache: attn_rot_v = 0, n_embd_head_k_all = 256\n",
    ]
    assert rotations_from_log(log) == [Rotation(512, 64), Rotation(0, 0)]


def f16_state(positions: list[int], width: int, seed: int) -> bytes:
    """A one-section state with row-major f16 K and V rows (flash attention's layout)."""
    rng = np.random.default_rng(seed)
    out = struct.pack("<Ii", kvstate.STATE_MAGIC, 0) + struct.pack("<II", 1, len(positions))
    for pos in positions:
        out += struct.pack("<iIi", pos, 1, 0)
    out += struct.pack("<II", 0, 1)
    k = rng.standard_normal((len(positions), width)).astype(np.float16)
    v = rng.standard_normal((len(positions), width)).astype(np.float16)
    out += struct.pack("<iQ", 1, width * 2) + k.tobytes()
    out += struct.pack("<iQ", 1, width * 2) + v.tobytes()
    return out


def test_an_f16_state_converts_to_q8_0_rows_in_the_same_cell_order() -> None:
    from galahad_desktop.engine import kvquant

    positions = [8, 9, 10, 11, 4, 5, 6, 7]  # a sliding window kept as a ring buffer
    data = f16_state(positions, 256, seed=1)
    source = kvstate.parse(data)
    for rotation in (kvquant.Rotation(0, 0), kvquant.Rotation(256, 64)):
        buffer, size = kvquant.to_q8_0(data, len(data), [rotation])
        converted = kvstate.parse(buffer, size)
        [section] = converted.sections
        assert section.pos.tolist() == positions  # the cache order is kept
        layer = section.layers[0]
        assert (layer.k_type, layer.k_row, layer.v_type, layer.v_elem) == (8, 272, 8, 272)
        k = kvquant.dequantize_q8_0(layer.k)
        expected = kvquant.rotate(
            source.sections[0].layers[0].k.copy().view(np.float16).astype(np.float32),
            rotation.k,
        )
        assert np.allclose(k, expected, atol=np.abs(expected).max() / 127)
        assert size < len(data) * 0.56  # 34 bytes per 32 values against 64
    with pytest.raises(KVLayoutError, match="sections"):
        kvquant.to_q8_0(data, len(data), [])
    with pytest.raises(KVLayoutError, match="not f16"):
        converted_again = kvquant.to_q8_0(data, len(data), [kvquant.Rotation(0, 0)])
        kvquant.to_q8_0(converted_again[0], converted_again[1], [kvquant.Rotation(0, 0)])


def test_write_is_the_inverse_of_parse() -> None:
    for v_trans in (0, 1):
        data = state(list(range(10)), [8, 9, 6, 7], v_trans)
        buffer, size = kvstate.write(kvstate.parse(data))
        assert bytes(buffer)[:size] == data


@pytest.mark.parametrize("v_trans", [0, 1])
def test_a_wrapped_window_is_put_in_position_order_cell_for_cell(v_trans: int) -> None:
    """A sliding window's ring that wrapped (positions 8, 9, then 6, 7) cannot be cut; in
    position order it is exactly the state a ring that never wrapped would have saved, and
    a section already in order is left as it is (no copy)."""
    wrapped = kvstate.parse(state(list(range(10)), [8, 9, 6, 7], v_trans))
    with pytest.raises(KVLayoutError, match="position order"):
        wrapped.layout()
    ordered = kvstate.in_position_order(wrapped)
    assert ordered.layout() == [[(0, 10)], [(6, 10)]]
    assert ordered.sections[0] is wrapped.sections[0]
    buffer, size = kvstate.write(ordered)
    assert bytes(buffer)[:size] == state(list(range(10)), [6, 7, 8, 9], v_trans)
    twice = kvstate.parse(state(list(range(10)), [6, 7, 7, 9], v_trans))
    with pytest.raises(KVLayoutError, match="twice"):
        kvstate.in_position_order(twice)
