"""Development benchmarks beside `bench resume|deposit`: per-turn persist as chain links
against whole states, llama-cpp-python's save_state + pickle as a peer baseline for resume,
and the README's plots (matplotlib, the `bench` extra).

Run from a checkout: `python -m galahad_dev bench persist|pickle|plot`.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from galahad_desktop.engine.engine import Engine
from galahad_dev.bench import Bench, Log, context_for, llama_engine, median, ms_since


def bench_pickle(
    sizes: list[int], reps: int, model_path: Path | None, overrides: dict[str, Any], log: Log
) -> dict[str, Any]:
    """What LlamaDiskCache stores: what Llama.save_state() keeps (llama_state_get_data, the
    token ids and the logits rows), pickled, saved and loaded, against a Galahad restore of
    the same document, side by side."""
    bench = Bench(model_path, {**overrides, "n_ctx": context_for(max(sizes))}, log)
    rows: list[dict[str, Any]] = []
    try:
        core = bench.core
        for size in sizes:
            deposited = core.deposit_text("bench.txt", bench.text_of_tokens(size))
            owners = {deposited.document_id}
            save, load, restore = [], [], []
            size_bytes = 0
            for _ in range(reps):
                bench.fresh_engine()
                restore_ms, _n, _proof = core.live.restore_and_prove(deposited.block_id, owners)
                restore.append(restore_ms)
                engine = core.engine
                engine.reset()
                stored = core.vault.read_block(deposited.block_id)
                engine.restore(stored.payload, stored.tokens, stored.size)
                path = bench.tmp / "state.pkl"
                start = time.perf_counter()
                state = llama_state(llama_engine(core))
                with open(path, "wb") as handle:
                    pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)
                save.append(ms_since(start))
                del state
                size_bytes = path.stat().st_size
                bench.fresh_engine()
                start = time.perf_counter()
                with open(path, "rb") as handle:
                    state = pickle.load(handle)
                llama_engine(core).context.set_whole_state(state["llama_state"])
                load.append(ms_since(start))
                del state
                path.unlink()
            log(f"pickle: {deposited.tokens:,} tokens")
            rows.append(
                {
                    "tokens": deposited.tokens,
                    "restore_ms": median(restore),
                    "pickle_state_ms": median(load),
                    "pickle_state_save_ms": median(save),
                    "pickle_state_bytes": size_bytes,
                    "block_bytes": core.vault.block_row(deposited.block_id)["file_bytes"],
                }
            )
        return bench.report("bench pickle", rows)
    finally:
        bench.close()


def bench_persist(
    sizes: list[int], turns: int, model_path: Path | None, overrides: dict[str, Any], log: Log
) -> dict[str, Any]:
    """Per-turn save of a conversation of each size, as a chain link (only the new tokens)
    and as a whole state, side by side in one process."""
    bench = Bench(model_path, {**overrides, "n_ctx": context_for(max(sizes) + 200 * turns)}, log)
    rows: list[dict[str, Any]] = []
    try:
        core = bench.core
        for size in sizes:
            for mode in ("chain", "whole"):
                core.settings.override({"chain_blocks": mode == "chain"})
                conversation = core.new_conversation()
                first = core.send(
                    conversation,
                    bench.text_of_tokens(size - 30),
                    params=core.sampling(max_tokens=4, temperature=0.0),
                )
                log(f"persist ({mode}): conversation of {first.context_tokens:,} tokens")
                for turn in range(turns):
                    result = core.send(
                        conversation,
                        f"Add one line about item {turn}.",
                        params=core.sampling(max_tokens=16, temperature=0.0),
                    )
                    block = core.vault.block_row(core.head_block(conversation))
                    rows.append(
                        {
                            "mode": mode,
                            "conversation_tokens": block["pos_end"],
                            "new_tokens": block["pos_end"] - (block["pos_start"] or 0)
                            if mode == "chain"
                            else result.counters.new_tokens + result.counters.generated_tokens,
                            "persist_ms": result.counters.persist_ms,
                            "capture_ms": block["capture_ms"],
                            "block_bytes": block["file_bytes"],
                        }
                    )
                resumes = [core.resume(conversation) for _ in range(3)]
                rows[-1]["resume_ms"] = median([g.restore_ms for g in resumes])
                rows[-1]["resume_proof"] = resumes[-1].proof.verdict
                rows[-1]["links"] = core.chain_links(conversation)
                core.forget(conversation)
        summary = []
        for size in sizes:
            chain = [
                r
                for r in rows
                if r["mode"] == "chain" and abs(r["conversation_tokens"] - size) < size * 0.2 + 300
            ]
            whole = [
                r
                for r in rows
                if r["mode"] == "whole" and abs(r["conversation_tokens"] - size) < size * 0.2 + 300
            ]
            if chain and whole:
                c_ms = median([r["persist_ms"] for r in chain])
                w_ms = median([r["persist_ms"] for r in whole])
                summary.append(
                    {
                        "size": size,
                        "chain_persist_ms": c_ms,
                        "whole_persist_ms": w_ms,
                        "whole_over_chain": w_ms / c_ms if c_ms else None,
                        "chain_block_bytes": median([r["block_bytes"] for r in chain]),
                        "whole_block_bytes": median([r["block_bytes"] for r in whole]),
                        "chain_resume_ms": chain[-1]["resume_ms"],
                        "whole_resume_ms": whole[-1]["resume_ms"],
                        "chain_links": chain[-1]["links"],
                        "resume_proofs": [chain[-1]["resume_proof"], whole[-1]["resume_proof"]],
                    }
                )
        report = bench.report("bench persist", rows)
        report["summary"] = summary
        return report
    finally:
        bench.close()


PLOTS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "bench resume": (
        "Resume time against tokens",
        (
            ("prefill_ms", "re-prefill (cold)"),
            ("pickle_state_ms", "save_state + pickle"),
            ("seq_file_ms", "llama.cpp seq file (plain)"),
            ("restore_ms", "Galahad restore"),
            ("floor_ms", "floor: read + decrypt"),
        ),
    ),
    "bench deposit": (
        "Reading a document against tokens",
        (
            ("raw_prefill_default_ms", "llama.cpp, previous defaults (flash off, full SWA)"),
            ("raw_prefill_best_ms", "llama.cpp, fastest (flash on, ring-buffer SWA)"),
            ("deposit_ms", "Galahad deposit (prefill + capture + encrypt + store)"),
        ),
    ),
}


def plot_resume(result: dict[str, Any], path: Path) -> bool:
    """Write the PNG plot of a `bench resume` or `bench deposit` result; False when
    matplotlib (the `bench` extra) is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, series = PLOTS.get(str(result.get("command")), PLOTS["bench resume"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    kv_types = sorted({str(r.get("kv_type", "f16")) for r in result["results"]})
    for kv_type in kv_types:  # f16 and q8_0 side by side: solid and dashed
        rows = [r for r in result["results"] if str(r.get("kv_type", "f16")) == kv_type]
        tokens = [r["tokens"] for r in rows]
        style = "-" if kv_type == "f16" else "--"
        for key, label in series:
            if all(key in r for r in rows):
                shown = f"{label}, {kv_type}" if len(kv_types) > 1 else label
                ax.plot(tokens, [r[key] for r in rows], style, marker="o", label=shown)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("ms (median)")
    ax.set_title(f"{title} ({result.get('model', 'Gemma 3 270M')}, CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def llama_state(engine: Engine) -> dict[str, Any]:
    """What llama-cpp-python's LlamaState holds for this context: the whole llama.cpp state,
    its token-id array (n_ctx long) and its logits rows (one per token up to n_batch, since
    logits_all is off), so the pickle's size and time are the peer's own."""
    rows = min(len(engine.tokens), engine.config.n_batch)
    input_ids = np.zeros(engine.n_ctx, dtype=np.intc)
    input_ids[: len(engine.tokens)] = engine.tokens
    return {
        "llama_state": engine.context.whole_state(),
        "input_ids": input_ids,
        "scores": np.zeros((rows, engine.n_vocab), dtype=np.single),
        "n_tokens": len(engine.tokens),
    }
