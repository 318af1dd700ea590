"""`python -m galahad_dev eval memory`: the router at scale, on this machine.

Generated documents (filler prose, code-like lines and tables, with needle and decoy records
"<name>'s access code is NNNN") are deposited until the store holds at least `tokens`
tokens; every document is longer than the context, so each is cut into parts. Then `probes`
questions ("What is <name>'s access code?") go through the router over the whole library,
which must choose the part that holds the record itself (the research's probes knew where
to look; ours do not), and `controls` ask about names stored nowhere. Resident memory is read
before the first and after the last deposit: the store grows on disk, not in RAM.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

from galahad_dev.bench import Run, machine, rss_mb
from galahad_dev.corpus import Corpus, Needle
from galahad_dev.needles import question

CODE = re.compile(r"(?<!\d)\d{4}(?!\d)")


def eval_memory(
    tokens: int,
    probes: int,
    controls: int,
    doc_tokens: int,
    seed: int,
    run: Run,
    max_tokens: int = 12,
) -> dict[str, Any]:
    log, bench = run.log, run.bench()
    corpus = Corpus(seed)
    try:
        core = bench.core
        engine = core.engine
        rss_loaded = rss_mb()
        # Warm up with one part-sized prefill and capture on throwaway text: the KV cache's
        # pages are only touched as positions fill, so without this the first document's
        # reading would count the cache itself as growth of the store.
        warm = Corpus(seed + 1).filler(core.documents.part_budget())
        engine.evaluate(
            (engine.bos() + engine.encode_text("\n".join(warm)))[: core.documents.part_budget()]
        )
        engine.capture()
        engine.reset()
        rss_start = rss_mb()
        rss_series = [rss_start]
        documents: list[tuple[str, list[Needle]]] = []
        stored = 0
        deposit_s = 0.0
        index = 0
        while stored < tokens:
            # A document of ~doc_tokens: several generated sections with records in each.
            sections, planted = [], []
            for section in range(max(1, doc_tokens // 1500)):
                text, needles = corpus.document(800, index, needles=1, decoys=1)
                sections.append(f"Section {section + 1}\n\n{text}")
                planted += needles
            start = time.perf_counter()
            result = core.deposit_text(f"ledger-{index:03d}.txt", "\n\n".join(sections))
            deposit_s += time.perf_counter() - start
            stored += result.tokens
            documents.append((result.document_id, planted))
            rss_series.append(rss_mb())
            log(
                f"memory: deposited document {index + 1} ({result.tokens:,} tokens in "
                f"{result.n_parts} parts; {stored:,} stored; RSS {rss_series[-1]:.0f} MB)"
            )
            index += 1
        rss_end = rss_mb()
        # Where each record really is: the part whose own text holds it.
        where: dict[str, str] = {}
        for document_id, needles in documents:
            for part in core.documents.part_rows(document_id):
                text = core.documents.part_text(part)
                for needle in needles:
                    if f"{needle.name}'s access code is {needle.code}" in text:
                        where.setdefault(needle.name, part["id"])
        everyone = [n for _doc, needles in documents for n in needles]
        step = max(1, len(everyone) // probes)
        chosen = everyone[::step][:probes]
        rows: list[dict[str, Any]] = []
        params = core.sampling(max_tokens=max_tokens, temperature=0.0)
        for needle in chosen:
            answer = core.ask(question(needle.name), params=params)
            graft = answer.graft
            rows.append(
                {
                    "name": needle.name,
                    "expected_part": where.get(needle.name),
                    "chosen_part": answer.decision.best.part_id if answer.decision.best else None,
                    "answered": answer.answered,
                    "citation": answer.citation,
                    "best_score": answer.decision.best_score,
                    "margin": answer.decision.margin,
                    "reason": answer.decision.reason,
                    "restored_tokens": graft.restored_tokens if graft else 0,
                    "recomputed_tokens": graft.recomputed_tokens if graft else 0,
                    "restore_ms": graft.restore_ms if graft else 0.0,
                    "proof": graft.proof.verdict if graft else "",
                    "expected": needle.code,
                    "reply": answer.text,
                    "exact": answer.answered and needle.code in CODE.findall(answer.text),
                }
            )
        control_rows = []
        for _ in range(controls):
            name = corpus.absent_name()
            answer = core.ask(question(name), params=params)
            control_rows.append(
                {
                    "name": name,
                    "answered": answer.answered,
                    "reason": answer.decision.reason,
                    "best_score": answer.decision.best_score,
                    "margin": answer.decision.margin,
                    "reply": answer.text,
                    "fabricated": answer.answered and bool(CODE.findall(answer.text)),
                }
            )
        answered = [r for r in rows if r["answered"]]
        routed_right = sum(1 for r in rows if r["chosen_part"] == r["expected_part"])
        n_parts = core.vault.catalog.count("parts")
        restores = [float(r["restore_ms"]) for r in answered if r["restore_ms"]]
        return {
            "command": "eval memory",
            "tokens": stored,
            "documents": len(documents),
            "parts": n_parts,
            "probes": len(rows),
            "routed_right": routed_right,
            "answered": len(answered),
            "answered_right_part": sum(
                1 for r in answered if r["chosen_part"] == r["expected_part"]
            ),
            "zero_recompute": sum(
                1 for r in answered if r["recomputed_tokens"] == 0 and r["restored_tokens"] > 0
            ),
            "proofs_exact": sum(1 for r in answered if r["proof"] == "exact"),
            "exact": sum(1 for r in rows if r["exact"]),
            "gate_refusals": len(rows) - len(answered),
            "controls": len(control_rows),
            "controls_gated": sum(1 for c in control_rows if not c["answered"]),
            "fabricated": sum(1 for c in control_rows if c["fabricated"]),
            "rss_model_loaded_mb": round(rss_loaded, 1),
            "rss_start_mb": round(rss_start, 1),
            "rss_end_mb": round(rss_end, 1),
            "rss_series_mb": [round(x, 1) for x in rss_series],
            "deposit_s": deposit_s,
            "deposit_tokens_per_s": stored / deposit_s if deposit_s else 0.0,
            "median_restore_ms": statistics.median(restores) if restores else None,
            "store_bytes": sum(r["file_bytes"] for r in core.vault.catalog.select("blocks")),
            "gate": {
                "min_strength": core.settings.get("route_min_strength"),
                "min_margin": core.settings.get("route_min_margin"),
            },
            "routing_log_entries": len(core.routing_log(10_000)),
            "seed": seed,
            "results": rows + control_rows,
            "fingerprint": core.engine.fingerprint,
            "machine": machine(),
        }
    finally:
        bench.close()
