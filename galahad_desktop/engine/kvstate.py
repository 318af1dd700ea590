"""Parse, cut and splice llama.cpp per-sequence KV state, so blocks can form chains.

The buffer from `llama_state_seq_get_data` (llama.cpp as vendored by llama-cpp-python 0.3.36,
`llama_context::state_seq_get_data`) is u32 magic 0xaf143cd8, i32 seq_id, then one section
per KV cache (`llama_kv_cache::state_write`), written back to back; an iSWA
model (Gemma 3) writes the full-attention cache, then the sliding-window cache. A section is

    u32 n_stream; per stream: u32 cell_count, and when it is not 0:
      per cell:  i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id        (cells in cache order)
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes
      per layer: v_trans == 0: i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes
                 v_trans == 1: i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
                               n_embd_v x (cell_count x v_elem_bytes)     (V transposed)

A cell's bytes depend only on the tokens up to its position, and llama.cpp never rewrites a
cell once computed, so the state at a later turn holds the earlier turn's cells unchanged:
a child block stores only the cells at its own positions, and splicing the chain (root first)
rebuilds the later state byte for byte. The sliding-window section keeps only the last window;
each block records which positions every section holds (its layout), and the splice takes each
of those cells from the block that owns the position.

Anything this parser does not know (another stream count, cells shared by several sequences,
per-cell extensions, sizes that do not add up, cells out of position order) raises
KVLayoutError: a loud failure, never a guessed splice.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from galahad_desktop.errors import IntegrityError

# The layout below was read from this version's sources and is tested against it.
KNOWN_LLAMA_CPP_PYTHON = "0.3.36"
STATE_MAGIC = 0xAF143CD8
_CELL_META = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])

Ranges = list[tuple[int, int]]


class KVLayoutError(IntegrityError):
    """The state buffer is not in the layout this parser knows."""


@dataclass
class Layer:
    k_type: int
    k_row: int
    k: np.ndarray  # (cells, k_row) uint8
    v_type: int
    v_elem: int  # element size (transposed V) or row size (row-major V)
    v_embd: int  # transposed V: rows of the V matrix; 0 for row-major V
    v: np.ndarray  # transposed: (v_embd, cells, v_elem); row-major: (cells, v_elem)


@dataclass
class Section:
    pos: np.ndarray  # (cells,) int32, in cache order
    meta: np.ndarray  # (cells,) of _CELL_META
    v_trans: int
    layers: list[Layer]

    @property
    def n_cells(self) -> int:
        return len(self.pos)

    @property
    def cell_bytes(self) -> int:
        """The K and V bytes one cell (one position) holds across the section's layers."""
        return sum(
            layer.k_row + (layer.v_elem * layer.v_embd if self.v_trans else layer.v_elem)
            for layer in self.layers
        )


@dataclass
class SeqState:
    sections: list[Section]

    def layout(self) -> list[Ranges]:
        """Which positions each section holds, as [start, end) ranges in cache order."""
        return [to_ranges(section.pos) for section in self.sections]


def in_position_order(state: SeqState) -> SeqState:
    """The same cells with each section's in position order. A sliding-window cache is a
    ring: once a long read wraps it, its cells are saved in ring order, which the splicer
    cannot cut. Reordered, the state restores to the same positions and contents (a context
    restored from it is proved against itself, never against the ring it came from)."""
    sections: list[Section] = []
    for section in state.sections:
        if section.n_cells == 0 or bool(np.all(np.diff(section.pos) > 0)):
            sections.append(section)
            continue
        order = np.argsort(section.pos, kind="stable")
        if np.any(np.diff(section.pos[order]) <= 0):
            raise KVLayoutError("a cache section holds one position twice")
        layers = [
            Layer(
                layer.k_type,
                layer.k_row,
                layer.k[order],
                layer.v_type,
                layer.v_elem,
                layer.v_embd,
                layer.v[:, order] if section.v_trans else layer.v[order],
            )
            for layer in section.layers
        ]
        sections.append(Section(section.pos[order], section.meta[order], section.v_trans, layers))
    return SeqState(sections)


def to_ranges(positions: np.ndarray) -> Ranges:
    """Compress a strictly increasing position list into [start, end) ranges."""
    if len(positions) == 0:
        return []
    pos = np.asarray(positions, dtype=np.int64)
    if np.any(np.diff(pos) <= 0):
        raise KVLayoutError(
            "the KV cells are not in position order (a layout the splicer does not know)"
        )
    breaks = np.flatnonzero(np.diff(pos) != 1)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks + 1, [len(pos)]))
    return [(int(pos[a]), int(pos[b - 1]) + 1) for a, b in zip(starts, ends, strict=True)]


def from_ranges(ranges: Sequence[Sequence[int]]) -> np.ndarray:
    if not ranges:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(int(a), int(b), dtype=np.int64) for a, b in ranges])


class _Reader:
    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int, what: str) -> np.ndarray:
        if n < 0 or self.at + n > len(self.data):
            raise KVLayoutError(f"the state ends inside {what}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def unpack(self, fmt: str, what: str) -> int:
        raw = self.take(struct.calcsize(fmt), what)
        return int(struct.unpack(fmt, raw.tobytes())[0])


def _as_uint8(buffer: object, size: int | None = None) -> np.ndarray:
    view = memoryview(buffer).cast("B")  # type: ignore[arg-type]
    if size is not None:
        view = view[:size]
    return np.frombuffer(view, dtype=np.uint8)


def parse(buffer: object, size: int | None = None, seq: int = 0) -> SeqState:
    """Views into `buffer` (no copy): keep the buffer alive while the result is used."""
    reader = _Reader(_as_uint8(buffer, size))
    magic = reader.unpack("<I", "the state header")
    seq_id = reader.unpack("<i", "the state header")
    if magic != STATE_MAGIC or seq_id != seq:
        raise KVLayoutError(f"the state header is unknown (magic {magic:#x}, sequence {seq_id})")
    sections: list[Section] = []
    while reader.at < len(reader.data):
        sections.append(_parse_section(reader, len(sections)))
    if not sections:
        raise KVLayoutError("the state is empty")
    return SeqState(sections)


def _parse_section(reader: _Reader, index: int) -> Section:
    where = f"cache section {index}"
    n_stream = reader.unpack("<I", where)
    if n_stream != 1:
        raise KVLayoutError(f"{where} has {n_stream} streams; only 1 is known")
    n_cells = reader.unpack("<I", where)
    if n_cells == 0:
        return Section(np.zeros(0, np.int32), np.zeros(0, _CELL_META), 0, [])
    meta = reader.take(n_cells * _CELL_META.itemsize, f"{where} cell list").view(_CELL_META)
    if np.any(meta["n_seq"] != 1):
        raise KVLayoutError(f"{where} has cells shared by several sequences (or cell extensions)")
    v_trans = reader.unpack("<I", where)
    n_layer = reader.unpack("<I", where)
    if v_trans not in (0, 1) or not 0 < n_layer <= 4096:
        raise KVLayoutError(f"{where} has an unknown header (v_trans {v_trans}, {n_layer} layers)")
    layers: list[Layer] = []
    for il in range(n_layer):
        k_type = reader.unpack("<i", where)
        k_row = reader.unpack("<Q", where)
        if not 0 < k_row <= 1 << 24:
            raise KVLayoutError(f"{where} layer {il} has a K row of {k_row} bytes")
        k = reader.take(n_cells * k_row, f"{where} layer {il} K").reshape(n_cells, k_row)
        layers.append(Layer(k_type, k_row, k, 0, 0, 0, np.zeros(0, np.uint8)))
    for il, layer in enumerate(layers):
        layer.v_type = reader.unpack("<i", where)
        if v_trans:
            layer.v_elem = reader.unpack("<I", where)
            layer.v_embd = reader.unpack("<I", where)
            if not (0 < layer.v_elem <= 16 and 0 < layer.v_embd <= 1 << 20):
                raise KVLayoutError(f"{where} layer {il} has an unknown V shape")
            count = layer.v_embd * n_cells * layer.v_elem
            layer.v = reader.take(count, f"{where} layer {il} V").reshape(
                layer.v_embd, n_cells, layer.v_elem
            )
        else:
            layer.v_elem = reader.unpack("<Q", where)
            if not 0 < layer.v_elem <= 1 << 24:
                raise KVLayoutError(f"{where} layer {il} has a V row of {layer.v_elem} bytes")
            layer.v = reader.take(n_cells * layer.v_elem, f"{where} layer {il} V").reshape(
                n_cells, layer.v_elem
            )
    pos = np.ascontiguousarray(meta["pos"])
    return Section(pos, meta, v_trans, layers)


def relabel(buffer: ctypes.Array[ctypes.c_uint8], size: int, seq: int) -> None:
    """Rewrite, in place, a state serialized from sequence `seq` as sequence 0's."""
    state = parse(buffer, size, seq=seq)
    for section in state.sections:
        if section.n_cells and np.any(section.meta["seq"] != seq):
            raise KVLayoutError(f"the scratch sequence {seq} holds cells of another sequence")
        if section.n_cells:
            section.meta["seq"] = 0
    struct.pack_into("<i", buffer, 4, 0)


def _section_size(template: Section, n_cells: int) -> int:
    if n_cells == 0:
        return 8
    size = 8 + n_cells * _CELL_META.itemsize + 8
    for layer in template.layers:
        size += 4 + 8 + n_cells * layer.k_row
        # after the type: (u32 elem, u32 embd) when transposed, else u64 row: 8 bytes either way
        if template.v_trans:
            size += 4 + 8 + layer.v_embd * n_cells * layer.v_elem
        else:
            size += 4 + 8 + n_cells * layer.v_elem
    return size


def _check_compatible(a: Section, b: Section, index: int) -> None:
    same = a.v_trans == b.v_trans and len(a.layers) == len(b.layers)
    same = same and all(
        (x.k_type, x.k_row, x.v_type, x.v_elem, x.v_embd)
        == (y.k_type, y.k_row, y.v_type, y.v_elem, y.v_embd)
        for x, y in zip(a.layers, b.layers, strict=True)
    )
    if not same:
        raise KVLayoutError(f"cache section {index} differs in shape between the chain's blocks")


def assemble(
    parts: Sequence[SeqState],
    targets: Sequence[Ranges],
    buffer_for: Callable[[int], ctypes.Array[ctypes.c_uint8]],
) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
    """Write the state whose section i holds exactly the positions `targets[i]` (in order),
    taking every cell from the first part that has it. Returns (buffer, bytes written).

    Cutting a child block is assemble([full], [new positions]); splicing a chain is
    assemble(chain, head layout). Raises KVLayoutError when a cell is missing."""
    picks, templates = _pick_cells(parts, targets)
    total = 8
    for index, wanted_ranges in enumerate(targets):
        n = int(sum(b - a for a, b in wanted_ranges))
        template = templates[index]
        total += _section_size(template, n) if template is not None else 8
    buffer = buffer_for(total)
    writer = _Writer(_as_uint8(buffer, total))
    writer.put(struct.pack("<Ii", STATE_MAGIC, 0))
    for chosen, template in zip(picks, templates, strict=True):
        writer.section(chosen, template)
    if writer.at != total:
        raise KVLayoutError(f"assembled {writer.at} bytes where {total} were computed")
    return buffer, total


Picks = list[tuple["Section", np.ndarray]]


def _pick_cells(
    parts: Sequence[SeqState], targets: Sequence[Ranges]
) -> tuple[list[Picks], list[Section | None]]:
    """For each section, which cells of which part make up its wanted positions (the first
    part that has a cell gives it), and the section whose layout the output takes."""
    n_sections = len(targets)
    for part in parts:
        if len(part.sections) != n_sections:
            raise KVLayoutError(
                f"a block has {len(part.sections)} cache sections where {n_sections} are expected"
            )
    picks: list[Picks] = []
    templates: list[Section | None] = []
    for index, wanted_ranges in enumerate(targets):
        wanted = from_ranges(wanted_ranges)
        if np.any(np.diff(wanted) <= 0):
            raise KVLayoutError(f"cache section {index} is asked for positions out of order")
        chosen: list[tuple[Section, np.ndarray]] = []
        found = np.zeros(0, dtype=np.int64)
        template: Section | None = None
        for part in parts:
            section = part.sections[index]
            if section.n_cells == 0:
                continue
            if template is None:
                template = section
            else:
                _check_compatible(template, section, index)
            mask = np.isin(section.pos, wanted)
            if found.size:
                mask &= ~np.isin(section.pos, found)
            cells = np.flatnonzero(mask)
            if cells.size:
                chosen.append((section, cells))
                found = np.concatenate((found, section.pos[cells].astype(np.int64)))
        if found.size != wanted.size or not np.array_equal(np.sort(found), wanted):
            missing = wanted.size - np.intersect1d(found, wanted).size
            raise KVLayoutError(f"cache section {index} is missing {missing} cells in the chain")
        # Cells must come out in position order, as llama.cpp wrote the unsplit state.
        if found.size and np.any(np.diff(found) <= 0):
            raise KVLayoutError(f"cache section {index}: the chain's blocks overlap or interleave")
        picks.append(chosen)
        templates.append(template)

    return picks, templates


class _Writer:
    """Writes a state's bytes into one buffer, in llama.cpp's order."""

    def __init__(self, out: np.ndarray) -> None:
        self.out = out
        self.at = 0

    def put(self, raw: bytes) -> None:
        self.out[self.at : self.at + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.at += len(raw)

    def section(self, chosen: Picks, template: Section | None) -> None:
        out, put = self.out, self.put
        n = sum(len(cells) for _section, cells in chosen)
        put(struct.pack("<II", 1, n))
        if n == 0 or template is None:
            return
        meta = out[self.at : self.at + n * _CELL_META.itemsize].view(_CELL_META)
        _gather_rows(meta, [(s.meta, c) for s, c in chosen])
        self.at += n * _CELL_META.itemsize
        put(struct.pack("<II", template.v_trans, len(template.layers)))
        for il, layer in enumerate(template.layers):
            put(struct.pack("<iQ", layer.k_type, layer.k_row))
            k_out = out[self.at : self.at + n * layer.k_row].reshape(n, layer.k_row)
            _gather_rows(k_out, [(s.layers[il].k, c) for s, c in chosen])
            self.at += n * layer.k_row
        for il, layer in enumerate(template.layers):
            if template.v_trans:
                put(struct.pack("<iII", layer.v_type, layer.v_elem, layer.v_embd))
                count = layer.v_embd * n * layer.v_elem
                v_out = out[self.at : self.at + count].reshape(layer.v_embd, n, layer.v_elem)
                col = 0
                for section, cells in chosen:
                    source = section.layers[il].v
                    if _is_run(cells):
                        v_out[:, col : col + len(cells)] = source[:, cells[0] : cells[-1] + 1]
                    else:
                        v_out[:, col : col + len(cells)] = source[:, cells]
                    col += len(cells)
                self.at += count
            else:
                put(struct.pack("<iQ", layer.v_type, layer.v_elem))
                v_rows = out[self.at : self.at + n * layer.v_elem].reshape(n, layer.v_elem)
                _gather_rows(v_rows, [(s.layers[il].v, c) for s, c in chosen])
                self.at += n * layer.v_elem


def write(
    state: SeqState, buffer_for: Callable[[int], ctypes.Array[ctypes.c_uint8]] | None = None
) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
    """Serialize `state` as it is, cells in their cache order (a sliding window kept as a
    ring buffer is not in position order): the inverse of parse. Returns (buffer, bytes)."""
    sizes = [_section_size(section, section.n_cells) for section in state.sections]
    total = 8 + sum(sizes)
    buffer = (buffer_for or bytes_buffer)(total)
    out = _as_uint8(buffer, total)
    at = 0

    def put(raw: bytes | np.ndarray) -> None:
        nonlocal at
        data = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, bytes) else raw.reshape(-1)
        out[at : at + data.size] = data
        at += data.size

    put(struct.pack("<Ii", STATE_MAGIC, 0))
    for section in state.sections:
        put(struct.pack("<II", 1, section.n_cells))
        if section.n_cells == 0:
            continue
        put(np.ascontiguousarray(section.meta).view(np.uint8))
        put(struct.pack("<II", section.v_trans, len(section.layers)))
        for layer in section.layers:
            put(struct.pack("<iQ", layer.k_type, layer.k_row))
            put(np.ascontiguousarray(layer.k))
        for layer in section.layers:
            if section.v_trans:
                put(struct.pack("<iII", layer.v_type, layer.v_elem, layer.v_embd))
            else:
                put(struct.pack("<iQ", layer.v_type, layer.v_elem))
            put(np.ascontiguousarray(layer.v))
    if at != total:
        raise KVLayoutError(f"wrote {at} bytes where {total} were computed")
    return buffer, total


def _is_run(cells: np.ndarray) -> bool:
    return bool(cells[-1] - cells[0] + 1 == len(cells))


def _gather_rows(out: np.ndarray, sources: list[tuple[np.ndarray, np.ndarray]]) -> None:
    row = 0
    for source, cells in sources:
        if _is_run(cells):
            out[row : row + len(cells)] = source[cells[0] : cells[-1] + 1]
        else:
            out[row : row + len(cells)] = source[cells]
        row += len(cells)


def chains_supported() -> bool:
    """Only the llama.cpp this parser was written and tested against may be spliced."""
    import llama_cpp

    return str(getattr(llama_cpp, "__version__", "")) == KNOWN_LLAMA_CPP_PYTHON


def bytes_buffer(size: int) -> ctypes.Array[ctypes.c_uint8]:
    return (ctypes.c_uint8 * size)()


def cut(
    full: SeqState,
    start: int,
    buffer_for: Callable[[int], ctypes.Array[ctypes.c_uint8]] = bytes_buffer,
) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
    """The cells at positions >= start of every section: what a child block stores."""
    targets = [[(max(a, start), b) for a, b in ranges if b > start] for ranges in full.layout()]
    return assemble([full], targets, buffer_for)


def splice(
    buffers: Sequence[tuple[object, int]],
    layout: object,
    buffer_for: Callable[[int], ctypes.Array[ctypes.c_uint8]],
) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
    """Splice a chain's states (root first) into the state whose sections hold `layout`'s
    positions: what the head block was captured from, byte for byte."""
    try:
        targets = [[(int(a), int(b)) for a, b in ranges] for ranges in layout]  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise KVLayoutError("the block's cell layout is not readable") from None
    parsed = [parse(buffer, size) for buffer, size in buffers]
    return assemble(parsed, targets, buffer_for)
