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
