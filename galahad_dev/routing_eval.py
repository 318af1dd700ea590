"""`python -m galahad_dev eval routing`: the router on real documents and real questions.

The documents under `benchmarks/routing/documents` are real, freely licensed texts (a dpkg
specification, the libpng and man-db manuals, the GPL, the libtasn1 manual as its PDF, a part
of the Python language reference; `benchmarks/routing/SOURCES.md`). They are read with the
app's own extraction and cut into parts exactly as a deposit cuts them (the model's tokenizer
and context), but nothing is prefilled: routing depends on the parts' text alone. The
questions in `benchmarks/routing/questions.json` were written as a reader would ask them,
paraphrased rather than copied; each names a phrase of the text that holds its answer, which
says which part is right, and some ask about things no document holds.

Two retrieval methods are measured side by side on the same parts and questions: words alone
(FTS5/BM25, the router without an embedding model) and the hybrid (BM25 and an embedding
model's similarity over ~120-word passages, fused by score). Questions are split into two
halves by a hash of their text. Each method's gate thresholds are chosen on the calibration
half (most questions routed right, with at most 3% routed wrong and at least 95% of absent
things refused), keeping generated ledgers like `eval memory`'s perfect, and reported on
the held-out half.

With the model reranker (the default; `--no-rerank` leaves it out), every document is also
deposited for real (read by the chat model and stored as encrypted blocks), and each
retrieval method's best candidates are checked by the model on their grafted blocks
(memory/retrieval/rerank.py): two more methods, "words + model" and "hybrid + model", with
their own gate calibrated the same way, and their cost per question (retrieval, checking the
candidates, resuming the best to answer).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from galahad_desktop.engine.embedder import Embedder
from galahad_desktop.engine.values import Counters
from galahad_desktop.memory.documents.extraction import extract_text
from galahad_desktop.memory.retrieval.hybrid import HybridIndex, decide_hybrid
from galahad_desktop.memory.retrieval.rerank import Reranking, decide_reranked
from galahad_desktop.memory.retrieval.router import PartIndex, RouteDecision, decide
from galahad_dev.bench import Bench, Log, Run, machine
from galahad_dev.vector_cache import VectorCache

ROOT = Path(__file__).resolve().parents[1] / "benchmarks" / "routing"
MAX_WRONG = 0.03
MIN_ABSENT_REFUSED = 0.95
# The gates' grids: lexical (strength, margin); hybrid (similarity, coverage, margin, strong
# coverage).
STRENGTHS = [round(0.05 * i, 2) for i in range(1, 19)]
MARGINS = [1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0]
SIMILARITIES = [0.25, 0.3, 0.35, 0.4, 0.45, 0.5]
COVERAGES = [0.0, 0.1, 0.15, 0.2, 0.25, 0.3]
HYBRID_MARGINS = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5]
STRONG_COVERAGES = [0.6, 0.7, 0.8, 0.9, 1.01]
# The model-checked gate: least PMI of the best part, least lead over another document's,
# least PMI to overrule retrieval's first part (100: never).
PMIS = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0]
PMI_MARGINS = [0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0]
PMI_ALONE = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 100.0]
RERANKED = "+rerank"
# The generated ledgers of `eval memory` (names and access codes), routed alongside as a
# second calibration set: exact lookups where meaning says little, which a gate tuned on
# paraphrases alone could stop answering. A gate is only eligible if it routes every
# ledger probe right and refuses every control.
LEDGER_DOCUMENTS = 4
LEDGER_SECTIONS = 8
LEDGER_CONTROLS = 20
_SPACE = re.compile(r"\s+")


def _flat(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


_JAPANESE = re.compile("[\u3040-\u30ff\u4e00-\u9fff]")


def language_of(question: str) -> str:
    return "ja" if _JAPANESE.search(question) else "en"


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
        # Answered with a same-document neighbour cited beside the best part: was the right
        # part the best one, or only the neighbour? (Answer from the better one, or offer the
        # choice: whichever is right more often.)
        "answered_with_neighbour": sum(1 for r in answerable if r["answered"] and r["cited"][1:]),
        "right_only_in_neighbour": sum(
            1
            for r in answerable
            if r["answered"] and not r["right"] and set(r["cited"][1:]) & set(r["expected"])
        ),
    }


Gate = tuple[float, ...]


def _decide(method: str, item: dict[str, Any], gate: Gate) -> RouteDecision:
    terms, candidates = item["terms"], item["candidates"]
    if method.endswith(RERANKED):
        # As the app does: retrieval's shipped gate first; the model checks what it refuses.
        retrieved: RouteDecision = item["retrieved"]
        if retrieved.confident or "reranking" not in item:
            return retrieved
        min_pmi, pmi_margin, alone = gate
        return decide_reranked(retrieved, item["reranking"], min_pmi, pmi_margin, alone)
    if method == "hybrid":
        similarity, coverage, margin, strong = gate
        return decide_hybrid(terms, candidates, similarity, coverage, margin, strong, "library")
    strength, margin = gate
    return decide(terms, candidates, strength, margin, "library")


def _decide_all(
    method: str, routed: list[dict[str, Any]], gate: Gate, explain: bool = True
) -> list[dict[str, Any]]:
    rows = []
    for item in routed:
        decision = _decide(method, item, gate)
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
                "similarity": None
                if best is None or best.similarity is None
                else round(best.similarity, 4),
                "coverage": None if best is None else round(best.coverage, 4),
                "margin": None if decision.margin == float("inf") else round(decision.margin, 3),
                "answered": decision.confident,
                "right": best is not None and best.part_id in item["expected"],
                "why": decision.explain() if explain else "",
                "language": language_of(item["question"]),
            }
        )
        if "reranking" in item:
            rows[-1]["pmi"] = decision.best_score if decision.best else None
            rows[-1]["scores"] = [[x.part_id, x.pmi] for x in item["reranking"].scores]
            rows[-1]["retrieved"] = [c.part_id for c in item["candidates"][:5]]
            rows[-1]["rerank_ms"] = item["reranking"].ms
            rows[-1]["answer_start_ms"] = item["answer_start_ms"]
            rows[-1]["checked"] = item["reranking"].checked
            rows[-1]["recomputed_tokens"] = item["recomputed_tokens"]
            rows[-1]["proof"] = item["proof"]
    return rows


def _grid(method: str) -> list[Gate]:
    if method.endswith(RERANKED):
        return list(itertools.product(PMIS, PMI_MARGINS, PMI_ALONE))
    if method == "hybrid":
        return list(itertools.product(SIMILARITIES, COVERAGES, HYBRID_MARGINS, STRONG_COVERAGES))
    return list(itertools.product(STRENGTHS, MARGINS))


def _ledger_perfect(totals: dict[str, Any]) -> bool:
    return bool(
        totals["routed_right"] == totals["answerable"]
        and totals["absent_refused"] == totals["absent"]
    )


def calibrate(
    method: str, routed: list[dict[str, Any]], ledger: list[dict[str, Any]] | None = None
) -> tuple[Gate, bool]:
    """The thresholds that route the most calibration questions right within the limits on
    wrong routes and refused absent questions, and that keep the generated ledgers perfect
    (ties go to the stricter gate); and whether any setting met the limits at all."""
    best: tuple[tuple[float, ...], Gate] | None = None
    grid = _grid(method)
    for gate in grid:
        totals = score(_decide_all(method, routed, gate, explain=False))
        if totals["wrong_rate"] > MAX_WRONG:
            continue
        if totals["absent_refused_rate"] < MIN_ABSENT_REFUSED:
            continue
        if ledger and not _ledger_perfect(score(_decide_all(method, ledger, gate, False))):
            continue
        key = (totals["right_rate"], *gate)
        if best is None or key > best[0]:
            best = (key, gate)
    if best is None:  # nothing meets the limits: the strictest gate
        return grid[-1], False
    return best[1], True


def ledger_library(
    bench: Bench, n_documents: int = LEDGER_DOCUMENTS
) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """Generated ledger documents (as `eval memory` writes them) and their questions: one
    probe per record, and controls that name people recorded nowhere."""
    from galahad_dev.corpus import Corpus
    from galahad_dev.needles import question

    corpus = Corpus(0)
    documents: list[tuple[str, str]] = []
    planted: dict[str, list[Any]] = {}
    for index in range(n_documents):
        sections = []
        name = f"ledger-{index:03d}.txt"
        for section in range(LEDGER_SECTIONS):
            text, needles = corpus.document(800, index, needles=1, decoys=1)
            sections.append(f"Section {section + 1}\n\n{text}")
            planted.setdefault(name, []).extend(needles)
        documents.append((name, "\n\n".join(sections)))
    items: list[dict[str, Any]] = []
    for name, text in documents:
        plan = bench.core.documents.plan_parts(name, text)
        for needle in planted[name]:
            record = f"{needle.name}'s access code is {needle.code}"
            expected = [f"{name}#{i + 1}" for i, p in enumerate(plan) if record in p.text]
            items.append(
                {"question": question(needle.name), "absent": False, "expected": expected[:1]}
            )
    for _ in range(LEDGER_CONTROLS):
        items.append({"question": question(corpus.absent_name()), "absent": True, "expected": []})
    return documents, items


def _expected(item: dict[str, Any], parts: dict[str, str]) -> list[str]:
    evidence = _flat(item["evidence"])
    expected = [
        pid
        for pid, text in parts.items()
        if pid.startswith(item["document"] + "#") and evidence in text
    ]
    if not expected:
        raise ValueError(
            f"routing eval: the evidence for {item['question']!r} is in no part of "
            f"{item['document']}"
        )
    return expected


def test_embedding_model() -> Path | None:
    """The suite's embedding model (all-MiniLM-L6-v2 from PyPI, written as a GGUF), or None
    when its package is not installed."""
    from galahad_dev import minilm_model

    try:
        return minilm_model.build()
    except RuntimeError:
        return None


def _method_report(
    method: str,
    routed: list[dict[str, Any]],
    ledger: list[dict[str, Any]],
    default_gate: Gate,
    index_s: float,
    tokens: int,
    query_ms: list[float],
) -> dict[str, Any]:
    calibration = [r for r in routed if r["half"] == "calibration"]
    chosen_gate, feasible = calibrate(method, calibration, ledger)
    report: dict[str, Any] = {
        "index_ms_per_10k_tokens": index_s * 1000 * 10_000 / max(1, tokens),
        "median_query_ms": sorted(query_ms)[len(query_ms) // 2],
        "calibration_feasible": feasible,
    }
    for name, gate in (("default_gate", default_gate), ("calibrated_gate", chosen_gate)):
        rows = _decide_all(method, routed, gate)
        held_out = [r for r in rows if r["half"] == "held_out"]
        report[name] = {
            "gate": list(gate),
            "calibration": score([r for r in rows if r["half"] == "calibration"]),
            "held_out": score(held_out),
            "held_out_by_language": {
                lang: score([r for r in held_out if r["language"] == lang]) for lang in ("en", "ja")
            },
            "all": score(rows),
            "ledgers": score(_decide_all(method, ledger, gate, explain=False)),
        }
    report["results"] = _decide_all(method, routed, chosen_gate)
    if method.endswith(RERANKED):
        checked = [r for r in [*routed, *ledger] if "reranking" in r] or [
            {"reranking": Reranking([], 0.0, 0, 0.0), "answer_start_ms": 0.0}
            | {"recomputed_tokens": 0, "proof": "none"}
        ]
        report["median_rerank_ms"] = statistics.median(r["reranking"].ms for r in checked)
        report["median_answer_start_ms"] = statistics.median(r["answer_start_ms"] for r in checked)
        report["median_question_ms"] = statistics.median(
            q + (r["reranking"].ms + r["answer_start_ms"] if "reranking" in r else 0.0)
            for q, r in zip(query_ms, routed, strict=True)
        )
        report["questions_checked"] = sum(1 for r in routed if "reranking" in r)
        report["mean_candidates_checked"] = statistics.mean(r["reranking"].checked for r in checked)
        report["recomputed_tokens"] = sum(r["recomputed_tokens"] for r in checked)
        report["proofs"] = {
            v: sum(1 for r in checked if r["proof"] == v) for v in {r["proof"] for r in checked}
        }
    return report


def _index_all(
    indexes: dict[str, PartIndex | HybridIndex],
    rows: list[tuple[str, str, int, int, str]],
    title: str,
) -> dict[str, float]:
    spent = {}
    for method, index in indexes.items():
        start = time.perf_counter()
        index.add(rows, title=title)
        spent[method] = time.perf_counter() - start
    return spent


def _search_all(
    indexes: dict[str, PartIndex | HybridIndex], item: dict[str, Any], half: str
) -> dict[str, tuple[dict[str, Any], float]]:
    out = {}
    for method, index in indexes.items():
        start = time.perf_counter()
        terms, candidates = index.search(item["question"])
        elapsed = (time.perf_counter() - start) * 1000
        out[method] = ({**item, "half": half, "terms": terms, "candidates": candidates}, elapsed)
    return out


def _deposit(bench: Bench, documents: list[tuple[str, str]], log: Log) -> dict[str, str]:
    """Read and store each document for real; the eval's part ids ("name#n") -> the store's."""
    core = bench.core
    ids: dict[str, str] = {}
    for name, text in documents:
        result = core.deposit_text(name, text)
        for row in core.documents.part_rows(result.document_id):
            ids[f"{name}#{row['part_no']}"] = row["id"]
        log(f"routing: read {name} ({result.tokens:,} tokens, {result.n_parts} parts)")
    return ids


def _rerank(
    bench: Bench,
    items: list[dict[str, Any]],
    ids: dict[str, str],
    method: str,
    default_gate: Gate,
) -> list[dict[str, Any]]:
    """As the app does it: the questions retrieval's shipped gate refuses are checked by the
    model on their candidates' grafted blocks, and the best one resumed, as an answer would
    start (nothing generated)."""
    routing = bench.core.routing
    limit = int(bench.core.settings.get("rerank_candidates"))
    back = {real: ours for ours, real in ids.items()}
    out = []
    for item in items:
        retrieved = _decide(method, item, default_gate)
        if retrieved.confident or not item["candidates"]:
            out.append({**item, "retrieved": retrieved})
            continue
        candidates = [replace(c, part_id=ids[c.part_id]) for c in item["candidates"][:limit]]
        counters = Counters()
        scored = routing.reranker.rerank(item["question"], candidates, counters)
        start = time.perf_counter()
        routing.reranker.continue_from_best(scored)
        answer_start_ms = (time.perf_counter() - start) * 1e3
        reranking: Reranking = scored.reranking
        reranking.scores = [replace(x, part_id=back[x.part_id]) for x in reranking.scores]
        graft = scored.graft
        out.append(
            {
                **item,
                "reranking": reranking,
                "answer_start_ms": answer_start_ms,
                "recomputed_tokens": counters.recomputed_tokens,
                "proof": graft.proof.verdict if graft is not None else "none",
                "retrieved": retrieved,
            }
        )
    return out


def eval_routing(
    run: Run,
    root: Path = ROOT,
    embedding_model: Path | None = None,
    rerank: bool = True,
    only: list[str] | None = None,
    ledgers: int = LEDGER_DOCUMENTS,
    vector_cache: bool = False,
    rerank_only: str | None = None,
) -> dict[str, Any]:
    """Every method on the real documents (the hybrid when an embedding model is given or
    the suite's test embedding model is installed; the model reranker on both unless
    `rerank` is off), and on generated ledgers. `only`: a subset of the documents.
    `vector_cache`: passage vectors from the checked cache beside the documents
    (vector_cache.py; the index time reported is then the cache's, not the model's).
    `rerank_only`: the model checks that method's candidates alone."""
    model_path, overrides, log = run.model_path, run.overrides, run.log
    questions = load_questions(root)
    paths = sorted((root / "documents").iterdir())
    if only:
        missing = set(only) - {p.name for p in paths}
        if missing:
            raise ValueError(f"routing eval: no document named {', '.join(sorted(missing))}")
        paths = [p for p in paths if p.name in only]
        questions = [q for q in questions if q.get("absent") or q["document"] in only]
    embedding_model = embedding_model or test_embedding_model()
    bench = Bench(model_path, overrides, log)
    embedder = Embedder(embedding_model) if embedding_model is not None else None
    cache = (
        VectorCache(
            root / f"vectors-{embedder.identity[:12]}.npz", embedder.identity, embedder.passages
        )
        if embedder is not None and vector_cache
        else None
    )

    def new_indexes() -> dict[str, PartIndex | HybridIndex]:
        indexes: dict[str, PartIndex | HybridIndex] = {"lexical": PartIndex()}
        if embedder is not None:
            embed = cache.passages if cache is not None else embedder.passages
            indexes["hybrid"] = HybridIndex(embed, embedder.query)
        return indexes

    opened: list[PartIndex | HybridIndex] = []
    try:
        documents = bench.core.documents
        indexes = new_indexes()
        opened += indexes.values()
        index_s = dict.fromkeys(indexes, 0.0)
        parts: dict[str, str] = {}  # part id -> its text, flattened
        doc_rows = []
        texts: list[tuple[str, str]] = []
        plan_s = 0.0
        tokens = 0
        for path in paths:
            text = extract_text(path)
            texts.append((path.name, text))
            start = time.perf_counter()
            plan = documents.plan_parts(path.name, text)
            plan_s += time.perf_counter() - start
            part_rows = [
                (f"{path.name}#{i + 1}", path.name, i + 1, len(plan), part.text)
                for i, part in enumerate(plan)
            ]
            for method, spent in _index_all(indexes, part_rows, path.name).items():
                index_s[method] += spent
            tokens += sum(p.tokens for p in plan)
            parts.update({r[0]: _flat(r[4]) for r in part_rows})
            doc_rows.append(
                {"document": path.name, "parts": len(plan), "tokens": sum(p.tokens for p in plan)}
            )
            log(f"routing: {path.name}: {len(plan)} parts")
        routed: dict[str, list[dict[str, Any]]] = {m: [] for m in indexes}
        query_ms: dict[str, list[float]] = {m: [] for m in indexes}
        for item in questions:
            absent = bool(item.get("absent"))
            expected = [] if absent else _expected(item, parts)
            question = {"question": item["question"], "absent": absent, "expected": expected}
            for method, (row, ms) in _search_all(
                indexes, question, half_of(item["question"])
            ).items():
                routed[method].append(row)
                query_ms[method].append(ms)
        passages = next(
            (i.passage_count for i in indexes.values() if isinstance(i, HybridIndex)), None
        )
        # The generated ledgers: a library of their own.
        ledger_indexes = new_indexes()
        opened += ledger_indexes.values()
        ledger_documents, ledger_items = ledger_library(bench, ledgers)
        for name, text in ledger_documents:
            plan = documents.plan_parts(name, text)
            _index_all(
                ledger_indexes,
                [(f"{name}#{i + 1}", name, i + 1, len(plan), p.text) for i, p in enumerate(plan)],
                name,
            )
        log(f"routing: {len(ledger_documents)} generated ledgers")
        ledger: dict[str, list[dict[str, Any]]] = {m: [] for m in ledger_indexes}
        for item in ledger_items:
            for method, (row, _ms) in _search_all(ledger_indexes, item, "ledger").items():
                ledger[method].append(row)
        settings = bench.core.settings
        defaults: dict[str, Gate] = {
            "lexical": (settings.get("route_min_strength"), settings.get("route_min_margin")),
            "hybrid": (
                settings.get("route_min_similarity"),
                settings.get("route_min_coverage"),
                settings.get("route_hybrid_margin"),
                settings.get("route_strong_coverage"),
            ),
        }
        read_s = 0.0
        if rerank:
            start = time.perf_counter()
            ids = _deposit(bench, texts + ledger_documents, log)
            read_s = time.perf_counter() - start
            for method in [m for m in indexes if rerank_only in (None, m)]:
                log(f"routing: the model checks {method}'s candidates")
                gate = defaults[method]
                routed[method + RERANKED] = _rerank(bench, routed[method], ids, method, gate)
                ledger[method + RERANKED] = _rerank(bench, ledger[method], ids, method, gate)
                query_ms[method + RERANKED] = query_ms[method]
                index_s[method + RERANKED] = index_s[method]
                defaults[method + RERANKED] = (
                    settings.get("route_min_pmi"),
                    settings.get("route_pmi_margin"),
                    settings.get("route_pmi_alone"),
                )
        methods = {
            m: _method_report(m, routed[m], ledger[m], defaults[m], index_s[m], tokens, query_ms[m])
            for m in routed
        }
        main = next(
            m
            for m in ("hybrid" + RERANKED, "lexical" + RERANKED, "hybrid", "lexical")
            if m in methods
        )
        chosen = methods[main]
        return {
            "command": "eval routing",
            "retrieval": main,
            "embedding_model": embedder.label if embedder is not None else None,
            "documents": doc_rows,
            "tokens": tokens,
            "parts": len(parts),
            "passages": passages,
            "questions": len(questions),
            "ledger_questions": len(ledger_items),
            "plan_s": plan_s,
            "read_s": read_s,
            "methods": {
                m: {k: v for k, v in r.items() if k != "results"} for m, r in methods.items()
            },
            "held_out_right_rate": chosen["calibrated_gate"]["held_out"]["right_rate"],
            "held_out_wrong_rate": chosen["calibrated_gate"]["held_out"]["wrong_rate"],
            "held_out_absent_refused_rate": chosen["calibrated_gate"]["held_out"][
                "absent_refused_rate"
            ],
            "results": chosen["results"],
            "vector_cache": None
            if cache is None
            else {"hits": cache.hits, "computed": cache.computed, "void": cache.void},
            "fingerprint": bench.core.engine.fingerprint,
            "machine": machine(),
        }
    finally:
        if cache is not None:
            cache.save()
        for index in opened:
            index.close()
        if embedder is not None:
            embedder.close()
        bench.close()
