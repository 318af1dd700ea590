"""What holding a reply to a grammar costs per token: the same prompt, the same engine,
sampled free and held to a JSON grammar, alternated run by run (medians of ms per token).

Gemma 3 270M is a real model: most tokens it samples already fit the grammar, so the cost
is one check per token. The Gemma 4 test model has random weights: almost every token it
samples is refused, so nearly every token pays the check of the most likely 1,024 tokens and
often the whole 262,144-token vocabulary — the worst case, not a user's.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from galahad_desktop.engine.engine import Engine
from galahad_desktop.engine.grammar import json_grammar
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import EngineConfig

PROMPT = "Describe a city as a JSON object with its name, country, population and landmarks."
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
        "landmarks": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "country", "population", "landmarks"],
}


def _ms_per_token(engine: Engine, snapshot: Any, params: SamplingParams) -> tuple[float, int]:
    engine.resume(snapshot)
    start = time.perf_counter()
    generation = engine.generate(params)
    elapsed = (time.perf_counter() - start) * 1e3
    return elapsed / max(len(generation.tokens), 1), len(generation.tokens)


def bench_grammar(models: dict[str, Path], reps: int, max_tokens: int) -> dict[str, Any]:
    rows = []
    for label, path in models.items():
        engine = Engine(EngineConfig(path, n_ctx=2048))
        try:
            engine.evaluate(engine.turns.start("") + engine.turns.user_turn(PROMPT))
            snapshot = engine.snapshot()
            grammar = json_grammar(SCHEMA)
            free: list[float] = []
            held: list[float] = []
            free_n: list[int] = []
            held_n: list[int] = []
            for rep in range(reps + 1):  # the first pair warms up
                for kind in ("free", "held"):
                    params = SamplingParams(
                        temperature=0.7,
                        max_tokens=max_tokens,
                        seed=rep,
                        grammar=grammar if kind == "held" else "",
                    )
                    ms, n = _ms_per_token(engine, snapshot, params)
                    if rep:
                        (free if kind == "free" else held).append(ms)
                        (free_n if kind == "free" else held_n).append(n)
            row: dict[str, Any] = {
                "model": label,
                "free_ms_per_token": statistics.median(free),
                "held_ms_per_token": statistics.median(held),
                "free_tokens": statistics.median(free_n),
                "held_tokens": statistics.median(held_n),
            }
            row["ratio"] = row["held_ms_per_token"] / row["free_ms_per_token"]
            rows.append(row)
        finally:
            engine.close()
    return {"reps": reps, "max_tokens": max_tokens, "rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| model | free ms/token | JSON-schema grammar ms/token | held ÷ free |",
        "|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['free_ms_per_token']:.2f} | {r['held_ms_per_token']:.2f} "
            f"| {r['ratio']:.2f}× |"
        )
    return "\n".join(lines)
