"""Print the README's Performance tables from benchmarks/results/*.json (Markdown)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(name: str) -> dict | None:  # type: ignore[type-arg]
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main() -> int:
    resume = load("bench-resume")
    if resume:
        print(
            "| tokens | re-prefill | **restore** (first) | proof | floor | restore ÷ floor | "
            "llama.cpp seq file | save_state + pickle | block | seq file | pickle | "
            "**× faster than re-prefill** |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in resume["results"]:
            print(
                f"| {r['tokens']:,} | {r['prefill_ms']:,.0f} ms | **{r['restore_ms']:.1f} ms** "
                f"({r.get('restore_first_ms', r['restore_ms']):.1f}) | {r['proof_ms']:.0f} ms "
                f"{r['proof']} | {r['floor_ms']:.1f} ms | {r['ratio_to_floor']:.2f}× | "
                f"{r['seq_file_ms']:.1f} ms | {r['pickle_state_ms']:,.0f} ms | "
                f"{r['block_bytes'] / 1e6:.1f} MB | {r['seq_file_bytes'] / 1e6:.1f} MB | "
                f"{r['pickle_state_bytes'] / 1e6:.0f} MB | **{r['speedup_vs_prefill']:,.0f}×** |"
            )
        print()
    persist = load("bench-persist")
    if persist and persist.get("summary"):
        print(
            "Per-turn save (capture + re-graft + probe + encrypt + write + commit), a chain link "
            "against a whole state, side by side in one run, `galahad bench persist --sizes "
            "1000,4000,16000 --turns 3` (medians of the 3 turns):\n"
        )
        print(
            "| conversation tokens | save as **link** | link on disk | save as whole state | "
            "whole state on disk | whole ÷ link | resume, chain (links) | resume, whole |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in persist["summary"]:
            print(
                f"| {r['size']:,} | **{r['chain_persist_ms']:.0f} ms** | "
                f"{r['chain_block_bytes'] / 1e6:.2f} MB | {r['whole_persist_ms']:.0f} ms | "
                f"{r['whole_block_bytes'] / 1e6:.1f} MB | {r['whole_over_chain']:.1f}× | "
                f"{r['chain_resume_ms']:.1f} ms ({r['chain_links']}) | "
                f"{r['whole_resume_ms']:.1f} ms |"
            )
        print()
    deposit = load("bench-deposit")
    if deposit:
        print(
            "Deposit against raw llama.cpp prefill of the same tokens, `galahad bench deposit "
            "--sizes 1000,4000,16000 --reps 2`:\n"
        )
        print("| tokens | raw prefill | deposit (prefill + capture + encrypt + store) | overhead |")
        print("|---|---|---|---|")
        for r in deposit["results"]:
            print(
                f"| {r['tokens']:,} | {r['raw_prefill_ms']:,.0f} ms | {r['deposit_ms']:,.0f} ms"
                f" | {r['overhead_percent']:+.1f}% |"
            )
        print()
    memory = load("eval-memory")
    if memory:
        m = memory
        print(
            "| tokens stored | documents / parts | probes | routed right | answered | zero "
            "recompute | proofs exact | exact answers | gate refusals | controls | controls "
            "gated | fabricated | RSS start → end |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        print(
            f"| {m['tokens']:,} | {m['documents']} / {m['parts']} | {m['probes']} | "
            f"{m['routed_right']}/{m['probes']} | {m['answered']} | {m['zero_recompute']} | "
            f"{m['proofs_exact']} | {m['exact']} | {m['gate_refusals']} | {m['controls']} | "
            f"{m['controls_gated']} | {m['fabricated']} | {m['rss_start_mb']:.0f} → "
            f"{m['rss_end_mb']:.0f} MB |"
        )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
