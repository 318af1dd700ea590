"""`python -m galahad_dev eval routing`: the router on real documents and real questions.

The documents under `benchmarks/routing/documents` are real, freely licensed texts (a dpkg
specification, the libpng and man-db manuals, the GPL, the libtasn1 manual as its PDF, a part
of the Python language reference; `benchmarks/routing/SOURCES.md`). They are read with the
app's own extraction and cut into parts exactly as a deposit cuts them (the model's tokenizer
and context), but nothing is prefilled: routing depends on the parts' text alone. The
questions in `benchmarks/routing/questions.json` were written as a reader would ask them,
paraphrased rather than copied; each names a phrase of the text that holds its answer, which
says which part is right, and some ask about things no document holds.

Questions are split into two halves by a hash of their text. The gate's two thresholds are
chosen on the calibration half (most questions routed right, with at most 3% routed wrong
and at least 95% of absent things refused) and reported on the held-out half.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

from galahad_desktop.bench import Bench, Log, machine
from galahad_desktop.memory.extraction import extract_text
from galahad_desktop.memory.router import PartIndex, decide

ROOT = Path(__file__).resolve().parents[1] / "benchmarks" / "routing"
MAX_WRONG = 0.03
MIN_ABSENT_REFUSED = 0.95
STRENGTHS = [round(0.05 * i, 2) for i in range(1, 19)]
MARGINS = [1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0]
_SPACE = re.compile(r"\s+")


def _flat(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def half_of(question: str) -> str:
    """A fixed split that does not depend on the file's order."""
    return "calibration" if hashlib.sha256(question.encode()).digest()[0] % 2 == 0 else "held_out"


def load_questions(root: Path = ROOT) -> list[dict[str, Any]]:
    questions: list[dict[str, Any]] = json.loads((root / "questions.json").read_text())
    return questions


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals of one half (or all): answerable questions routed right or wrong, absent ones
    refused."""
    answerable = [r for r in rows if not r["absent"]]
    absent = [r for r in rows if r["absent"]]
    right = sum(1 for r in answerable if r["answered"] and r["right"])
    wrong = sum(1 for r in answerable if r["answered"] and not r["right"])
    refused = sum(1 for r in absent if not r["answered"])
    n = max(1, len(answerable))
    return {
        "answerable": len(answerable),
        "routed_right": right,
        "routed_wrong": wrong,
        "gated": len(answerable) - right - wrong,
        "absent": len(absent),
        "absent_refused": refused,
        "right_rate": right / n,
        "wrong_rate": wrong / n,
        "absent_refused_rate": refused / max(1, len(absent)),
        "top1_right": sum(1 for r in answerable if r["right"]),
    }


def _decide_all(
    routed: list[dict[str, Any]], min_strength: float, min_margin: float
) -> list[dict[str, Any]]:
    rows = []
    for item in routed:
        decision = decide(item["terms"], item["candidates"], min_strength, min_margin, "library")
        best = decision.best
        rows.append(
            {
                "question": item["question"],
                "half": item["half"],
                "absent": item["absent"],
                "expected": item["expected"],
                "chosen": best.part_id if best else None,
                "cited": [c.part_id for c in decision.cited],
                "strength": round(decision.strength, 4),
                "margin": None if decision.margin == float("inf") else round(decision.margin, 3),
                "answered": decision.confident,
                "right": best is not None and best.part_id in item["expected"],
                "why": decision.explain(),
            }
        )
    return rows


def calibrate(routed: list[dict[str, Any]]) -> tuple[tuple[float, float], bool]:
    """The thresholds that route the most calibration questions right within the limits on
    wrong routes and refused absent questions (ties go to the stricter gate), and whether any
    setting met the limits at all."""
    best: tuple[tuple[float, float, float], tuple[float, float]] | None = None
    for strength, margin in itertools.product(STRENGTHS, MARGINS):
        totals = score(_decide_all(routed, strength, margin))
        if totals["wrong_rate"] > MAX_WRONG:
            continue
        if totals["absent_refused_rate"] < MIN_ABSENT_REFUSED:
            continue
        key = (totals["right_rate"], strength, margin)
        if best is None or key > best[0]:
            best = (key, (strength, margin))
    if best is None:  # nothing meets the limits: the strictest gate
        return (STRENGTHS[-1], MARGINS[-1]), False
    return best[1], True


def eval_routing(
    model_path: Path | None,
    overrides: dict[str, Any],
    log: Log,
    root: Path = ROOT,
) -> dict[str, Any]:
    questions = load_questions(root)
    bench = Bench(model_path, overrides, log)
    try:
        documents = bench.core.documents
        index = PartIndex()
        parts: dict[str, str] = {}  # part id -> its text, flattened
        doc_rows = []
        plan_s = index_s = 0.0
        tokens = 0
        for path in sorted((root / "documents").iterdir()):
            text = extract_text(path)
            start = time.perf_counter()
            plan = documents.plan_parts(path.name, text)
            plan_s += time.perf_counter() - start
            part_rows = [
                (f"{path.name}#{i + 1}", path.name, i + 1, len(plan), part.text)
                for i, part in enumerate(plan)
            ]
            start = time.perf_counter()
            index.add(part_rows, title=path.name)
            index_s += time.perf_counter() - start
            tokens += sum(p.tokens for p in plan)
            parts.update({r[0]: _flat(r[4]) for r in part_rows})
            doc_rows.append(
                {"document": path.name, "parts": len(plan), "tokens": sum(p.tokens for p in plan)}
            )
            log(f"routing: {path.name}: {len(plan)} parts")
        routed = []
        query_ms = []
        for item in questions:
            absent = bool(item.get("absent"))
            expected: list[str] = []
            if not absent:
                evidence = _flat(item["evidence"])
                expected = [
                    pid
                    for pid, text in parts.items()
                    if pid.startswith(item["document"] + "#") and evidence in text
                ]
                if not expected:
                    raise ValueError(
                        f"routing eval: the evidence for {item['question']!r} is in no part "
                        f"of {item['document']}"
                    )
            start = time.perf_counter()
            terms, candidates = index.search(item["question"])
            query_ms.append((time.perf_counter() - start) * 1000)
            routed.append(
                {
                    "question": item["question"],
                    "half": half_of(item["question"]),
                    "absent": absent,
                    "expected": expected,
                    "terms": terms,
                    "candidates": candidates,
                }
            )
        settings = bench.core.settings
        default_gate = (settings.get("route_min_strength"), settings.get("route_min_margin"))
        calibration = [r for r in routed if r["half"] == "calibration"]
        chosen_gate, feasible = calibrate(calibration)
        results: dict[str, Any] = {}
        for name, gate in (("default_gate", default_gate), ("calibrated_gate", chosen_gate)):
            rows = _decide_all(routed, *gate)
            results[name] = {
                "min_strength": gate[0],
                "min_margin": gate[1],
                "calibration": score([r for r in rows if r["half"] == "calibration"]),
                "held_out": score([r for r in rows if r["half"] == "held_out"]),
                "all": score(rows),
            }
        final = _decide_all(routed, *chosen_gate)
        index.close()
        return {
            "command": "eval routing",
            "retrieval": "bm25 (FTS5 word and word-pair matches, stemmed)",
            "documents": doc_rows,
            "tokens": tokens,
            "parts": len(parts),
            "questions": len(questions),
            "index_ms_per_10k_tokens": index_s * 1000 * 10_000 / max(1, tokens),
            "plan_s": plan_s,
            "median_query_ms": sorted(query_ms)[len(query_ms) // 2],
            **results,
            "held_out_right_rate": results["calibrated_gate"]["held_out"]["right_rate"],
            "held_out_wrong_rate": results["calibrated_gate"]["held_out"]["wrong_rate"],
            "held_out_absent_refused_rate": results["calibrated_gate"]["held_out"][
                "absent_refused_rate"
            ],
            "calibration_feasible": feasible,
            "results": final,
            "fingerprint": bench.core.engine.fingerprint,
            "machine": machine(),
        }
    finally:
        bench.close()
