"""`python -m galahad_dev eval across`: questions whose answer is in two documents (#57).

Generated ledgers (as `eval memory` writes them: filler, code-like lines, needle and decoy
records "<name>'s access code is NNNN"), one part each, are deposited. Then three kinds of
question go to Ask over the whole library, with the router answering from several parts
read together (`route_across`, the default) and from one part (today's router), side by
side in one run:

- pairs: "What are A's and B's access codes?" with A and B in two different documents;
- singles: one recorded name (answering from several parts must not hurt these);
- absent: two names recorded nowhere (the gate must still refuse).

Per question: answered or refused, the documents cited (right when both needles' documents
are), the codes in the greedy answer, and Ask's time. For every pair answered across, the
same tokens are also read in full from scratch and answered the same way: how often the
stacked answer equals the full read's, and how often each holds both codes. The real
documents' questions (`eval routing`'s) are also routed on words alone, with and without
joining parts: how many single-part questions get joined, and whether the right part is
still cited.
"""

from __future__ import annotations

import functools
import os
import random
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from galahad_desktop.engine.decoding import Generation
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.documents.extraction import extract_text
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import AskResult
from galahad_desktop.memory.retrieval.across import across
from galahad_desktop.memory.retrieval.router import PartIndex, decide
from galahad_dev.bench import Run, machine
from galahad_dev.corpus import Corpus, Needle

CODE = re.compile(r"(?<!\d)\d{4}(?!\d)")


def pair_question(first: str, second: str) -> str:
    return f"What are {first}'s and {second}'s access codes?"


def single_question(name: str) -> str:
    return f"What is {name}'s access code?"


def _ledgers(core: Galahad, n: int, seed: int) -> tuple[list[tuple[str, Needle]], Corpus]:
    corpus = Corpus(seed)
    planted: list[tuple[str, Needle]] = []
    for index in range(n):
        text, needles = corpus.document(600, index, needles=2, decoys=1)
        core.deposit_text(f"ledger-{index:02d}.txt", text)
        planted += [(f"ledger-{index:02d}.txt", needle) for needle in needles]
    return planted, corpus


def _recorded(core: Galahad) -> list[tuple[list[int], np.ndarray]]:
    """Wrap the engine's generate to keep the tokens each reply was sampled after, and the
    first token's distribution there."""
    engine = core.engine
    seen: list[tuple[list[int], np.ndarray]] = []
    generate: Callable[[SamplingParams, Job], Generation] = engine.generate

    def recording(params: SamplingParams, job: Job = NO_JOB) -> Generation:
        seen.append((list(engine.tokens), _softmax(engine.last_logits())))
        return generate(params, job)

    engine.generate = recording  # type: ignore[method-assign]
    return seen


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits.astype(np.float64) - float(logits.max()))
    return np.asarray(z / z.sum())


def _full_read(
    core: Galahad, tokens: list[int], params: SamplingParams
) -> tuple[str, float, np.ndarray]:
    """The same tokens read from scratch, then the same greedy reply: (text, ms to read,
    the first token's distribution)."""
    engine = core.engine
    core.live.drop()
    engine.reset()
    start = time.perf_counter()
    engine.evaluate(tokens)
    read_ms = (time.perf_counter() - start) * 1e3
    first = _softmax(engine.last_logits())
    return engine.generate(params).text, read_ms, first


def _row(kind: str, answer: AskResult, wanted: list[str], ms: float) -> dict[str, Any]:
    codes = set(CODE.findall(answer.text))
    cited = sorted({c.split(",")[0] for c in answer.citations or [answer.citation] if c})
    return {
        "kind": kind,
        "answered": answer.answered,
        "across": answer.across,
        "cited": cited,
        "codes_found": sum(1 for code in wanted if code in codes),
        "codes_wanted": len(wanted),
        "ms": round(ms, 1),
    }


def _ask(core: Galahad, question: str, params: SamplingParams) -> tuple[AskResult, float]:
    start = time.perf_counter()
    answer = core.ask(question, params=params)
    return answer, (time.perf_counter() - start) * 1e3


def _summary(rows: list[dict[str, Any]], kind: str, wanted_docs: int) -> dict[str, Any]:
    picked = [r for r in rows if r["kind"] == kind]
    answered = [r for r in picked if r["answered"]]
    return {
        "questions": len(picked),
        "answered": len(answered),
        "refused": len(picked) - len(answered),
        "all_documents_cited": sum(1 for r in answered if r["right_docs"] == wanted_docs),
        "all_codes_found": sum(1 for r in picked if r["codes_found"] == r["codes_wanted"] > 0),
        "codes_found": sum(r["codes_found"] for r in picked),
        "codes_wanted": sum(r["codes_wanted"] for r in picked),
        "median_ms": round(statistics.median(r["ms"] for r in picked), 1) if picked else 0.0,
    }


def _real_documents(log: Callable[[str], None], core: Galahad) -> dict[str, Any]:
    """`eval routing`'s real documents and questions, on words alone: how often a question
    one part answers is joined with others, and whether the right part stays cited."""
    from galahad_dev.routing_eval import ROOT, _expected, _flat, load_questions

    index = PartIndex()
    parts: dict[str, str] = {}
    for path in sorted((ROOT / "documents").iterdir()):
        plan = core.documents.plan_parts(path.name, extract_text(path))
        rows = [
            (f"{path.name}#{i + 1}", path.name, i + 1, len(plan), p.text)
            for i, p in enumerate(plan)
        ]
        index.add(rows, title=path.name)
        parts.update({r[0]: _flat(r[4]) for r in rows})
    values = core.settings.values
    counts = {
        "questions": 0,
        "absent": 0,
        "joined": 0,
        "answered_one": 0,
        "answered_joined": 0,
        "right_one": 0,
        "right_joined": 0,
        "absent_answered_one": 0,
        "absent_answered_joined": 0,
    }
    for item in load_questions():
        question = item["question"]
        terms, candidates = index.search(question)
        single = decide(
            terms, candidates, values.route_min_strength, values.route_min_margin, "library"
        )
        joined = across(
            single,
            functools.partial(index.coverage, question, document_id=None),
            values.route_min_strength,
            values.route_min_margin,
        )
        final = joined or single
        if item.get("absent"):
            counts["absent"] += 1
            counts["absent_answered_one"] += int(single.confident)
            counts["absent_answered_joined"] += int(final.confident)
            continue
        counts["questions"] += 1
        expected = set(_expected(item, parts))
        counts["joined"] += int(joined is not None)
        counts["answered_one"] += int(single.confident)
        counts["answered_joined"] += int(final.confident)
        counts["right_one"] += int(
            single.confident and single.best is not None and single.best.part_id in expected
        )
        cited = {c.part_id for c in (final.cited or final.candidates[:1])}
        counts["right_joined"] += int(final.confident and bool(cited & expected))
    log(f"across: real documents {counts}")
    return counts


def eval_across(run: Run, ledgers: int = 8, pairs: int = 24, seed: int = 0) -> dict[str, Any]:
    log = run.log
    bench = run.bench(n_ctx=4096)
    core = bench.core
    try:
        planted, corpus = _ledgers(core, ledgers, seed)
        log(f"across: deposited {ledgers} ledgers, {len(planted)} records")
        rng = random.Random(seed)
        questions: list[tuple[str, str, list[tuple[str, Needle]]]] = []
        for _ in range(pairs):
            a, b = rng.sample(planted, 2)
            while a[0] == b[0]:
                a, b = rng.sample(planted, 2)
            questions.append(("pair", pair_question(a[1].name, b[1].name), [a, b]))
        for doc, needle in rng.sample(planted, min(len(planted), pairs // 2)):
            questions.append(("single", single_question(needle.name), [(doc, needle)]))
        for _ in range(max(4, pairs // 4)):
            questions.append(
                ("absent", pair_question(corpus.absent_name(), corpus.absent_name()), [])
            )
        params = core.sampling(max_tokens=24, temperature=0.0)
        seen = _recorded(core)
        rows: dict[str, list[dict[str, Any]]] = {"across": [], "one part": []}
        agreement: list[dict[str, Any]] = []
        for mode, on in (("one part", False), ("across", True)):
            core.update_settings({"route_across": on})
            for kind, question, wanted in questions:
                answer, ms = _ask(core, question, params)
                row = _row(kind, answer, [n.code for _d, n in wanted], ms)
                row["right_docs"] = len(set(row["cited"]) & {d for d, _n in wanted})
                rows[mode].append(row)
                if on and kind == "pair" and answer.across and seen:
                    held, stacked_first = seen[-1]
                    text, read_ms, full_first = _full_read(core, held, params)
                    codes = set(CODE.findall(text))
                    kl = float(
                        (
                            full_first
                            * (np.log(full_first + 1e-30) - np.log(stacked_first + 1e-30))
                        ).sum()
                    )
                    agreement.append(
                        {
                            "same_answer": text.strip() == answer.text.strip(),
                            "same_first_token": int(full_first.argmax())
                            == int(stacked_first.argmax()),
                            "first_token_kl": round(kl, 5),
                            "common_prefix_chars": len(os.path.commonprefix([text, answer.text])),  # noqa: RUF071
                            "full_answer": text[:80],
                            "stacked_answer": answer.text[:80],
                            "full_codes_found": sum(1 for _d, n in wanted if n.code in codes),
                            "stacked_codes_found": row["codes_found"],
                            "full_read_ms": round(read_ms, 1),
                            "stacked_ms": row["ms"],
                        }
                    )
            log(f"across: {mode} done")
        summary = {
            mode: {
                kind: _summary(r, kind, 2 if kind == "pair" else 1)
                for kind in ("pair", "single", "absent")
            }
            for mode, r in rows.items()
        }
        real = _real_documents(log, core)
        return {
            "command": f"eval across --ledgers {ledgers} --pairs {pairs} --seed {seed}",
            "summary": summary,
            "full_read": {
                "pairs_compared": len(agreement),
                "same_answer": sum(1 for a in agreement if a["same_answer"]),
                "same_first_token": sum(1 for a in agreement if a["same_first_token"]),
                "first_token_kl_mean": round(
                    statistics.fmean(a["first_token_kl"] for a in agreement), 5
                )
                if agreement
                else None,
                "full_both_codes": sum(1 for a in agreement if a["full_codes_found"] == 2),
                "stacked_both_codes": sum(1 for a in agreement if a["stacked_codes_found"] == 2),
                "median_full_read_ms": round(
                    statistics.median(a["full_read_ms"] for a in agreement), 1
                )
                if agreement
                else None,
            },
            "real_documents": real,
            "rows": rows,
            "agreement": agreement,
            "fingerprint": core.engine.fingerprint,
            "machine": machine(),
        }
    finally:
        bench.close()
