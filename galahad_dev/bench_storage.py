"""`python -m galahad_dev bench storage`: what memory costs on disk and how fast it comes
back, at each Gemma 4 size's real attention shape (galahad_dev/real_shapes.py), in f16 and
q8_0, side by side in one run.

Per shape and KV type: bytes per token of the global and the window layers (measured in a
stored block, and as the catalog computes them), a document of `--doc` tokens (stored bytes,
reading, restore and proof against llama.cpp's own sequence-file load of the same state), a
conversation of `--turns` short turns (bytes per turn, save time per turn, bytes before and
after compaction against the floor: its tokens at the global layers' bytes, one window of
window-layer cells, and what each kept checkpoint needs), and, computed from the shapes, a
3k and a 16k document, a 900-token reply and a 128k conversation.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from galahad_desktop.engine import kvstate
from galahad_desktop.models.catalog import Gemma4Model, model_for
from galahad_dev.bench import Bench, Log, Run, bench_resume, context_for, machine, stamp
from galahad_dev.real_shapes import real_shape_model

FLASH = {"f16": "auto", "f32": "auto"}  # a quantized cache needs flash attention ("on")
TURN_TEXT = "Note {n}: the ferry leaves the harbour at dawn and the bell tower rings twice. "


def computed(model: Gemma4Model, kv_type: str) -> dict[str, int]:
    """What the shapes say a block costs (the catalog's arithmetic)."""
    per_token = model.kv_bytes_per_token_as(kv_type)
    window_per_token = model.window_bytes_as(kv_type) // model.window

    def document(tokens: int) -> int:
        return tokens * per_token + min(tokens, model.window) * window_per_token

    return {
        "global_bytes_per_token": per_token,
        "window_bytes_per_token": window_per_token,
        "window_bytes": model.window_bytes_as(kv_type),
        "link_bytes_per_new_token": per_token + window_per_token,
        "doc_3k_bytes": document(3000),
        "doc_16k_bytes": document(16000),
        "reply_900_bytes": 900 * (per_token + window_per_token),
        "conversation_128k_floor_bytes": document(131_072),
    }


def measured_per_token(core: Any, block_id: str) -> tuple[int, int]:
    """(global, window-layer) bytes per cell in a stored block."""
    stored = core.vault.read_block(block_id)
    state = kvstate.parse(stored.payload, stored.size)
    sizes = [section.cell_bytes for section in state.sections]
    del stored, state
    return sizes[0], sizes[-1]


def conversation(bench: Bench, model: Gemma4Model, turns: int, kv_type: str) -> dict[str, Any]:
    """`turns` short turns, then compaction: bytes against the floor, save time per turn."""
    core = bench.core
    chat = core.new_conversation()
    saves, sizes = [], []
    for n in range(turns):
        result = core.send(chat, TURN_TEXT.format(n=n) * 3, params=core.sampling(max_tokens=8))
        saves.append(result.counters.persist_ms)
        sizes.append(sum(i.bytes for i in core.storage().items if i.id == chat))
    before = sizes[-1]
    rows = core.vault.records.blocks(owner_id=chat)
    compacted = core.compact(chat)
    after = sum(i.bytes for i in core.storage().items if i.id == chat)
    tokens = core.conversation(chat).n_tokens
    kept = core.settings.values.checkpoints
    per_token = model.kv_bytes_per_token_as(kv_type)
    window_per_token = model.window_bytes_as(kv_type) // model.window
    head = core.vault.chain_rows(core.head_block(chat))
    kept_tokens = sum(r["n_tokens"] for r in head[1:])  # the links kept apart
    # The floor for what it keeps: every token at the global layers, one window of window-
    # layer cells for the merged block, and each kept link's own cells at both kinds.
    floor = (
        tokens * per_token
        + min(head[0]["pos_end"], model.window) * window_per_token
        + kept_tokens * window_per_token
    )
    return {
        "turns": turns,
        "tokens": tokens,
        "blocks_before": len(rows),
        "bytes_before": before,
        "bytes_per_turn": (sizes[-1] - sizes[0]) / max(1, turns - 1),
        "save_ms_per_turn": statistics.median(saves),
        "compaction": compacted.skipped or f"{compacted.merged} links merged",
        "bytes_after": after,
        "checkpoints_kept": kept,
        "floor_bytes": floor,
        "after_over_floor": after / floor if floor else 0.0,
    }


def bench_storage(
    sizes: list[str],
    doc_tokens: int,
    turns: int,
    reps: int,
    gemma3_path: Path,
    log: Log,
    kv_types: tuple[str, ...] = ("f16", "q8_0"),
) -> dict[str, Any]:
    results = []
    for size in sizes:
        model = model_for(size)
        path = real_shape_model(size, gemma3_path)
        log(f"storage: Gemma 4 {model.size} shape ({path.name})")
        run = Run(path, {"n_ctx": context_for(max(doc_tokens, turns * 80)), "n_threads": 2}, log)
        resumed = bench_resume([doc_tokens], reps, run, kv_types=kv_types)["results"]
        for kv_type, resume in zip(kv_types, resumed, strict=True):
            flash = FLASH.get(kv_type, "on")
            # Compaction is measured by hand after the last turn, not on the way.
            bench = run.bench(kv_type=kv_type, flash_attn=flash, compact_after=10_000)
            try:
                start = time.perf_counter()
                deposited = bench.core.deposit_text("probe.txt", TURN_TEXT.format(n=0) * 4)
                probe_ms = (time.perf_counter() - start) * 1e3
                global_cell, window_cell = measured_per_token(bench.core, deposited.block_id)
                bench.core.forget(deposited.document_id)
                chat = conversation(bench, model, turns, kv_type)
                placement = bench.core.engine.placement.as_dict()  # where the KV cache lived
            finally:
                bench.close()
            results.append(
                {
                    "size": model.size,
                    "kv_type": kv_type,
                    "measured_global_bytes_per_token": global_cell,
                    "measured_window_bytes_per_token": window_cell,
                    **computed(model, kv_type),
                    "document": {k: resume[k] for k in _RESUME_KEYS},
                    "conversation": chat,
                    "probe_deposit_ms": probe_ms,
                    "placement": placement,
                }
            )
            log(line(results[-1]))
    return {"command": "bench storage", "results": results, "machine": machine(), "stamp": stamp()}


_RESUME_KEYS = (
    "tokens",
    "block_bytes",
    "prefill_ms",
    "restore_ms",
    "proof_ms",
    "proof",
    "seq_file_ms",
    "ratio_to_seq_file",
    "speedup_vs_prefill",
    "floor_ms",
)


def line(r: dict[str, Any]) -> str:
    d, c = r["document"], r["conversation"]
    return (
        f"{r['size']:>8} {r['kv_type']:>5}  {r['measured_global_bytes_per_token'] / 1024:>6.1f} / "
        f"{r['measured_window_bytes_per_token'] / 1024:>6.1f} KB/token  doc {d['tokens']:,} tok "
        f"{d['block_bytes'] / 1e6:>7.1f} MB restore {d['restore_ms']:>6.1f} ms vs seq-file "
        f"{d['seq_file_ms']:>6.1f} ms ({d['ratio_to_seq_file']:.2f}x, {d['proof']}), re-read "
        f"{d['prefill_ms'] / 1e3:.1f} s  conversation {c['bytes_before'] / 1e6:.1f} -> "
        f"{c['bytes_after'] / 1e6:.1f} MB ({c['after_over_floor']:.2f}x floor), save "
        f"{c['save_ms_per_turn']:.0f} ms/turn"
    )


def table(result: dict[str, Any]) -> str:
    """The Markdown tables docs/performance.md shows."""
    mb = 1e6
    out = [
        "| shape | KV | global / window layers per token | 3k document | 16k document | "
        "900-token reply | 128k conversation (floor) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        out.append(
            f"| {r['size']} | {r['kv_type']} | {r['measured_global_bytes_per_token'] / 1024:.1f} / "
            f"{r['measured_window_bytes_per_token'] / 1024:.1f} KB | "
            f"{r['doc_3k_bytes'] / mb:,.0f} MB | {r['doc_16k_bytes'] / mb:,.0f} MB | "
            f"{r['reply_900_bytes'] / mb:,.0f} MB | "
            f"{r['conversation_128k_floor_bytes'] / 1e9:,.1f} GB |"
        )
    out += [
        "",
        "| shape | KV | document | stored | re-read | **restore** | proof | llama.cpp seq file "
        "| restore ÷ seq file | conversation: turns, tokens | per turn | save per turn | "
        "before → after compaction | ÷ floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        d, c = r["document"], r["conversation"]
        out.append(
            f"| {r['size']} | {r['kv_type']} | {d['tokens']:,} tokens | "
            f"{d['block_bytes'] / mb:,.1f} MB | {d['prefill_ms'] / 1e3:,.1f} s | "
            f"**{d['restore_ms']:,.1f} ms** | {d['proof']} | {d['seq_file_ms']:,.1f} ms | "
            f"{d['ratio_to_seq_file']:.2f}× | {c['turns']}, {c['tokens']:,} | "
            f"{c['bytes_per_turn'] / mb:,.1f} MB | {c['save_ms_per_turn']:,.0f} ms | "
            f"{c['bytes_before'] / mb:,.1f} → {c['bytes_after'] / mb:,.1f} MB | "
            f"{c['after_over_floor']:.2f}× |"
        )
    return "\n".join(out)
