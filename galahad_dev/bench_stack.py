"""`python -m galahad_dev bench stack`: stored documents stacked into a chat against a full
read of the same text, side by side in one run (#57).

For each model, document count and size: the documents are deposited (each read once, alone),
then put into a new, empty chat: read in full on top of each other (the reference), and
stacked from their blocks with the first k tokens of each recomputed for each k asked (k = 0:
keys moved, nothing read but each block's last token; the block's own <bos> and turn opening
are never stitched in, the chat already holds an opening). The contexts hold
the very same tokens (checked). Measured for each: the time until the context is ready and
until the first token of a question, the tokens recomputed, the KL divergence of the
next-token distributions along a 64-token greedy continuation (mean, 99th percentile, argmax
agreement), and greedy completions of "<name>'s access code is" for needle records in the
documents after the first, stacked against the full read (agreement, and correct codes).

The Gemma 4 test model and the real-size shapes have random weights: their KL and answers say
how the moved keys behave, not how well a real model answers; the shapes give the block bytes
and the time the moves take at 26B-A4B and 31B sizes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from galahad_desktop.memory.documents.stacked import distributions, quality
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import StackQuality
from galahad_dev.bench import Bench, Run, context_for, machine, ms_since
from galahad_dev.blend_ceiling import blended
from galahad_dev.corpus import Corpus, Needle
from galahad_dev.needles import CODE

CONTINUATION = 64
QUESTIONS = 40
ANSWER_TOKENS = 6
PROBE = "Summarise these documents, one line each."
Log = Callable[[str], None]


def _documents(
    core: Galahad, corpus: Corpus, n_docs: int, doc_tokens: int, needles: int
) -> list[tuple[str, str, list[Needle]]]:
    """n_docs generated ledgers of about doc_tokens tokens each: filler with needle records
    (names drawn once, so each is in one document only) and two decoys."""
    out = []
    for index in range(n_docs):
        planted = [Needle(corpus.name(), f"{corpus.rng.randint(1000, 9999)}", index)]
        planted += [
            Needle(corpus.name(), f"{corpus.rng.randint(1000, 9999)}", index)
            for _ in range(needles + 1)
        ]
        records = [f"{n.name}'s access code is {n.code}." for n in planted]
        name = f"ledger-{index + 1}.txt"
        words = int(doc_tokens * 0.55)
        while True:
            lines = corpus.filler(words)
            for record in records:
                lines.insert(corpus.rng.randint(0, len(lines)), record)
            text = "\n".join(lines)
            if len(core.documents.document_tokens(name, text)) <= doc_tokens or words < 50:
                break
            words = int(words * 0.93)
        out.append((name, text, planted[:needles]))  # the last two are decoys
    return out


def _question_ttft(core: Galahad, snapshot: Any, text: str) -> float:
    """From a ready context: the question read and its first token chosen (ms)."""
    engine = core.engine
    engine.resume(snapshot)
    start = time.perf_counter()
    engine.evaluate(engine.turns.question(text))
    int(np.argmax(engine.last_logits()))
    return ms_since(start)


def _answers(core: Galahad, snapshot: Any, asked: list[tuple[str, str]]) -> list[str]:
    """Greedy completions of "<name>'s access code is" (the embedded 270M is a base model:
    it completes a record it has read, where it echoes a question), 6 tokens: Gemma writes
    one digit a token."""
    engine = core.engine
    replies = []
    for name, _code in asked:
        engine.resume(snapshot)
        engine.evaluate(engine.encode_text(f"From the ledgers: {name}'s access code is"))
        taken = []
        for _ in range(ANSWER_TOKENS):
            token = int(np.argmax(engine.last_logits()))
            taken.append(token)
            engine.evaluate([token])
        replies.append(engine.detokenize(taken))
    return replies


def _correct(asked: list[tuple[str, str]], answers: list[str]) -> int:
    """How many answers hold their needle's code (none asked: 0)."""
    if not answers:
        return 0
    return sum(code in CODE.findall(a) for (_, code), a in zip(asked, answers, strict=True))


def _continuation(
    core: Galahad, snapshot: Any, forced: list[int] | None
) -> tuple[np.ndarray, list[int]]:
    engine = core.engine
    engine.resume(snapshot)
    engine.evaluate(engine.turns.question(PROBE))
    return distributions(engine, CONTINUATION, forced)


@dataclass
class Reference:
    """The full read a stack is measured against."""

    snapshot: Any
    tokens: list[int]
    read_ms: float
    ttft_ms: float
    asked: list[tuple[str, str]]
    answers: list[str]
    with_answers: bool
    document_tokens: int
    blend: list[float] = field(default_factory=list)  # CacheBlend ceiling shares (blend_ceiling)


def _against(core: Galahad, snapshot: Any, ref: Reference) -> tuple[StackQuality, list[str]]:
    """A context's continuation measured against the full read's, and its needle answers."""
    got, taken = _continuation(core, snapshot, None)
    reference, _ = _continuation(core, ref.snapshot, taken)
    answers = _answers(core, snapshot, ref.asked) if ref.with_answers else []
    return quality(reference, got, taken, ref.read_ms), answers


def _stacked(
    core: Galahad, ids: list[str], k: int, ref: Reference, as_stored: bool
) -> dict[str, Any]:
    """One stack of the stored documents (k recomputed, or the naive stitch: each block as
    it was stored), measured against the full read."""
    engine = core.engine
    chat = core.new_conversation()
    turn = core.documents.add_stored_to_conversation(chat, ids, recompute=k, as_stored=as_stored)
    stack = turn.stack
    assert stack is not None
    if not as_stored and engine.tokens != ref.tokens:
        raise RuntimeError("the stacked context does not hold the full read's tokens")
    ready_ms = stack.stack_ms + turn.counters.prefill_ms  # the moves, recompute, openings
    stacked = engine.snapshot()
    ttft = ready_ms + _question_ttft(core, stacked, PROBE)
    q, answers = _against(core, stacked, ref)
    blends = [] if as_stored else [_blend(core, stacked, ref, s, ttft) for s in ref.blend]
    core.forget(chat)
    return {
        **({"blend": blends} if blends else {}),
        "k": 0 if as_stored else k,
        "ready_ms": round(ready_ms, 1),
        "ttft_ms": round(ttft, 1),
        "ttft_ratio": round(ref.ttft_ms / ttft, 1),
        "recomputed": stack.recomputed_tokens,
        "recomputed_pct": round(100 * stack.recomputed_tokens / ref.document_tokens, 2),
        "kl_mean": q.kl_mean,
        "kl_p99": q.kl_p99,
        "argmax_agree": q.argmax_agree,
        "continuation": q.probe_tokens,
        "answers_agree": sum(a == b for a, b in zip(answers, ref.answers, strict=True)),
        "correct": _correct(ref.asked, answers),
    }


def _blend(
    core: Galahad, stacked: Any, ref: Reference, share: float, ttft: float
) -> dict[str, Any]:
    """The stack with its `share` most-changed cells given the full read's (blend_ceiling):
    the quality a CacheBlend-style selection could reach at best, and its time floor (the
    stack's time plus that share of a full read)."""
    snapshot, cells = blended(stacked, ref.snapshot, share)
    q, answers = _against(core, snapshot, ref)
    floor = ttft + share * ref.read_ms
    return {
        "share": share,
        "cells": cells,
        "ttft_floor_ms": round(floor, 1),
        "ttft_ratio_ceiling": round(ref.ttft_ms / floor, 1),
        "kl_mean": q.kl_mean,
        "kl_p99": q.kl_p99,
        "argmax_agree": q.argmax_agree,
        "answers_agree": sum(a == b for a, b in zip(answers, ref.answers, strict=True)),
        "correct": _correct(ref.asked, answers),
    }


def _one(
    bench: Bench,
    n_docs: int,
    doc_tokens: int,
    ks: list[int],
    seed: int,
    with_answers: bool,
    questions: int = QUESTIONS,
    blend: list[float] | None = None,
) -> dict[str, Any]:
    core = bench.core
    engine = core.engine
    corpus = Corpus(seed)
    per_doc = math.ceil(questions / max(1, n_docs - 1))
    docs = _documents(core, corpus, n_docs, doc_tokens, per_doc)
    ids, block_bytes, tokens = [], 0, 0
    for name, text, _ in docs:
        deposited = core.deposit_text(name, text)
        ids.append(deposited.document_id)
        block_bytes += deposited.block_bytes
        tokens += deposited.tokens
    asked = [(n.name, n.code) for _, _, planted in docs[1:] for n in planted][:questions]
    warm = core.new_conversation()  # the first stack of a session pays one-time costs
    core.documents.add_stored_to_conversation(warm, ids[:1], recompute=max(ks))
    core.forget(warm)
    # The reference: every document read in full, on top of the ones before it.
    full_chat = core.new_conversation()
    read_ms = 0.0
    for name, text, _ in docs:
        read_ms += core.add_document(full_chat, name, text).counters.prefill_ms
    reference_tokens = list(engine.tokens)
    full = engine.snapshot()
    full_ttft = read_ms + _question_ttft(core, full, PROBE)
    full_answers = _answers(core, full, asked) if with_answers else []
    ref = Reference(
        full,
        reference_tokens,
        read_ms,
        full_ttft,
        asked,
        full_answers,
        with_answers,
        tokens,
        blend or [],
    )
    naive = _stacked(core, ids, 0, ref, as_stored=True)
    stacked = [_stacked(core, ids, k, ref, as_stored=False) for k in ks]
    for entry in stacked:  # the done-when's figure: KL mean as a share of the naive stitch's
        entry["kl_vs_naive"] = round(entry["kl_mean"] / max(naive["kl_mean"], 1e-12), 3)
    core.forget(full_chat)
    for document_id in ids:
        core.forget(document_id)
    return {
        "documents": n_docs,
        "doc_tokens": doc_tokens,
        "tokens": tokens,
        "block_bytes": block_bytes,
        "read_ms": round(read_ms, 1),
        "full_ttft_ms": round(full_ttft, 1),
        "questions": len(asked) if with_answers else 0,
        "full_correct": _correct(asked, full_answers),
        "naive": naive,
        "stacked": stacked,
    }


def bench_stack(
    models: dict[str, Run],
    counts: list[int],
    sizes: list[int],
    ks: list[int],
    seed: int,
    log: Log,
    answers: dict[str, bool],
    questions: int = QUESTIONS,
    blend: list[float] | None = None,
) -> dict[str, Any]:
    """Every (model, count, size) configuration, each in its own throwaway core."""
    rows = []
    fingerprints = {}
    for label, run in models.items():
        for doc_tokens in sizes:
            bench = run.bench(n_ctx=context_for(max(counts) * doc_tokens + 512))
            try:
                fingerprints[label] = bench.core.engine.fingerprint
                for n_docs in counts:
                    log(f"bench stack: {label}, {n_docs} documents of ~{doc_tokens:,} tokens")
                    row = _one(
                        bench,
                        n_docs,
                        doc_tokens,
                        ks,
                        seed,
                        answers.get(label, True),
                        questions,
                        blend,
                    )
                    rows.append({"model": label, **row})
            finally:
                bench.close()
    return {
        "command": "bench stack",
        "ks": ks,
        "continuation": CONTINUATION,
        "results": rows,
        "fingerprints": fingerprints,
        "machine": machine(),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| model | docs × tokens | full read: TTFT ms | k | stacked: TTFT ms | TTFT ÷ | "
        "recomputed | KL mean | ÷ naive | KL p99 | argmax /64 | answers agree | correct (full) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        for s in [{**r["naive"], "k": "naive"}, *r["stacked"]]:
            answers = f"{s['answers_agree']}/{r['questions']}" if r["questions"] else "—"
            correct = f"{s['correct']} ({r['full_correct']})" if r["questions"] else "—"
            lines.append(
                f"| {r['model']} | {r['documents']} × {r['doc_tokens']:,} | "
                f"{r['full_ttft_ms']:,.0f} | {s['k']} | {s['ttft_ms']:,.0f} | "
                f"{s['ttft_ratio']}× | {s['recomputed']} ({s['recomputed_pct']}%) | "
                f"{s['kl_mean']:.4f} | {s.get('kl_vs_naive', 1.0):.2f} | {s['kl_p99']:.3f} | "
                f"{s['argmax_agree']} | {answers} | {correct} |"
            )
            for b in s.get("blend", []):
                agree = f"{b['answers_agree']}/{r['questions']}" if r["questions"] else "—"
                lines.append(
                    f"| {r['model']} | {r['documents']} × {r['doc_tokens']:,} | "
                    f"{r['full_ttft_ms']:,.0f} | {s['k']} + ceiling {b['share']:.0%} | "
                    f"≥ {b['ttft_floor_ms']:,.0f} | ≤ {b['ttft_ratio_ceiling']}× | "
                    f"{b['cells']} | {b['kl_mean']:.4f} | — | {b['kl_p99']:.3f} | "
                    f"{b['argmax_agree']} | {agree} | {b['correct']} |"
                )
    return "\n".join(lines)
