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
    if persist:
        print(
            "Per-turn persist (capture + probe + encrypt + write + commit) against conversation "
            "length, `galahad bench persist --sizes 1000,4000,16000 --turns 3`:\n"
        )
        print("| conversation tokens | persist | capture | block |")
        print("|---|---|---|---|")
        for r in persist["results"]:
            print(
                f"| {r['conversation_tokens']:,} | {r['persist_ms']:.0f} ms | "
                f"{r['capture_ms']:.0f} ms | {r['block_bytes'] / 1e6:.1f} MB |"
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
