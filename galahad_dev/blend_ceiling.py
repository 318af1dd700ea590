"""CacheBlend's ceiling for `bench stack --blend` (#57): would recomputing the most-changed
tokens of a stack be worth its cost?

CacheBlend (EuroSys 2025) recomputes the ~15% of a reused chunk's tokens whose KV deviates
most from a full read's. Recomputing tokens inside a stacked block is not possible with
llama.cpp's sequences (a decode must continue after a sequence's last position), so this
measures the best such a selection could do instead: the chosen share of the stacked
cells, those whose keys differ most from the full read's (summed over every layer), is given
the full read's own keys and values — exactly what a perfect selective recompute of those
tokens would produce, and more (a real one would attend to the other, still-stale cells).
Its cost is at least that share of a full read, which is counted as its time floor.
"""

from __future__ import annotations

import numpy as np

from galahad_desktop.engine import kvstate
from galahad_desktop.engine.scoring import Snapshot

GGML_TYPE_F16 = 1


def _keys(layer: kvstate.Layer, cells: np.ndarray) -> np.ndarray:
    if layer.k_type != GGML_TYPE_F16:
        raise ValueError("the blend ceiling is measured on an f16 cache")
    return np.ascontiguousarray(layer.k[cells]).view(np.float16).astype(np.float32)


def _matched(ref: kvstate.Section, got: kvstate.Section) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the cells both sections hold at the same positions (got's, ref's)."""
    where = {int(p): i for i, p in enumerate(ref.pos)}
    mine = np.array([i for i, p in enumerate(got.pos) if int(p) in where], dtype=np.int64)
    theirs = np.array([where[int(got.pos[i])] for i in mine], dtype=np.int64)
    return mine, theirs


def deviations(ref: kvstate.SeqState, got: kvstate.SeqState) -> dict[int, float]:
    """Per position: the squared distance of got's keys from ref's, over every layer."""
    out: dict[int, float] = {}
    for ref_section, got_section in zip(ref.sections, got.sections, strict=True):
        mine, theirs = _matched(ref_section, got_section)
        total = np.zeros(len(mine))
        for ref_layer, got_layer in zip(ref_section.layers, got_section.layers, strict=True):
            diff = _keys(got_layer, mine) - _keys(ref_layer, theirs)
            total += np.square(diff).sum(axis=1)
        for index, value in zip(mine, total, strict=True):
            position = int(got_section.pos[index])
            out[position] = out.get(position, 0.0) + float(value)
    return out


def blended(stacked: Snapshot, full: Snapshot, share: float) -> tuple[Snapshot, int]:
    """The stacked snapshot with its `share` most-changed cells taken from the full read's;
    and how many positions that was. Both must hold the same tokens."""
    if stacked.tokens != full.tokens:
        raise ValueError("the blend ceiling needs the stack and the full read to hold one text")
    ref = kvstate.parse(full.state, full.size)
    got = kvstate.parse(stacked.state, stacked.size)
    changed = deviations(ref, got)
    count = round(share * len(changed))
    chosen = set(sorted(changed, key=lambda p: -changed[p])[:count])
    for ref_section, got_section in zip(ref.sections, got.sections, strict=True):
        mine, theirs = _matched(ref_section, got_section)
        pick = np.array([int(got_section.pos[i]) in chosen for i in mine], dtype=bool)
        mine, theirs = mine[pick], theirs[pick]
        for ref_layer, got_layer in zip(ref_section.layers, got_section.layers, strict=True):
            got_layer.k[mine] = ref_layer.k[theirs]
            if got_section.v_trans:
                got_layer.v[:, mine] = ref_layer.v[:, theirs]
            else:
                got_layer.v[mine] = ref_layer.v[theirs]
    out, used = kvstate.write(got)
    return Snapshot(out, used, list(stacked.tokens), stacked.logits.copy()), count
