"""`python -m galahad_dev eval needles`: the long-term-memory protocol, scaled to this machine.

Seeded documents of generated filler hold needle records ("<name>'s access code is NNNN")
and decoys. Each is deposited as its own block. One probe per needle grafts the block that
holds it (the probe knows where to look, as in the research) and asks for the code; negative
controls ask for names that appear nowhere. Counts come from the engine's counters.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from galahad_dev.bench import Run, context_for, machine
from galahad_dev.corpus import Corpus

CODE = re.compile(r"(?<!\d)\d{4}(?!\d)")


def question(name: str) -> str:
    return f"What is {name}'s access code?"


def eval_needles(
    blocks: int,
    block_tokens: int,
    controls: int,
    seed: int,
    run: Run,
    max_tokens: int = 16,
) -> dict[str, Any]:
    log, bench = run.log, run.bench(n_ctx=context_for(block_tokens + 256))
    corpus = Corpus(seed)
    try:
        core = bench.core
        deposits = []
        for part in range(blocks):
            words = int(block_tokens * 0.55)
            while True:
                text, needles = corpus.document(words, part)
                if len(core.documents.document_tokens("x", text)) <= block_tokens or words < 50:
                    break
                words = int(words * 0.9)
            deposited = core.deposit_text(f"ledger-part-{part:03d}.txt", text)
            deposits.append((deposited, needles))
            log(f"needles: deposited part {part + 1}/{blocks} ({deposited.tokens:,} tokens)")
        probes: list[dict[str, Any]] = []
        for deposited, needles in deposits:
            for needle in needles:
                conversation = core.new_conversation(document_id=deposited.document_id)
                result = core.send(
                    conversation,
                    question(needle.name),
                    params=core.sampling(max_tokens=max_tokens, temperature=0.0),
                )
                c = result.counters
                probes.append(
                    {
                        "part": needle.part,
                        "tokens": deposited.tokens,
                        "restored_tokens": c.restored_tokens,
                        "recomputed_tokens": c.recomputed_tokens,
                        "restore_ms": c.restore_ms,
                        "proof": result.proof.verdict,
                        "expected": needle.code,
                        "reply": result.reply,
                        "exact": needle.code in CODE.findall(result.reply),
                    }
                )
                core.forget(conversation)
        control_rows = []
        for index in range(controls):
            deposited, _ = deposits[index % len(deposits)]
            name = corpus.absent_name()
            conversation = core.new_conversation(document_id=deposited.document_id)
            result = core.send(
                conversation,
                question(name),
                params=core.sampling(max_tokens=max_tokens, temperature=0.0),
            )
            control_rows.append(
                {
                    "name_absent": True,
                    "part": index % len(deposits),
                    "reply": result.reply,
                    "fabricated": bool(CODE.findall(result.reply)),
                }
            )
            core.forget(conversation)
        prefill_ms = statistics.mean(d.prefill_ms for d, _ in deposits)
        restore_ms = statistics.mean(float(p["restore_ms"]) for p in probes)
        zero = sum(
            1 for p in probes if p["recomputed_tokens"] == 0 and p["restored_tokens"] == p["tokens"]
        )
        return {
            "command": "eval needles",
            "probes": len(probes),
            "zero_recompute": zero,
            "exact": sum(1 for p in probes if p["exact"]),
            "controls": len(control_rows),
            "fabricated": sum(1 for c in control_rows if c["fabricated"]),
            "proofs_exact": sum(1 for p in probes if p["proof"] == "exact"),
            "blocks": blocks,
            "tokens_stored": sum(d.tokens for d, _ in deposits),
            "mean_prefill_ms": prefill_ms,
            "mean_restore_ms": restore_ms,
            "restore_vs_prefill": prefill_ms / restore_ms if restore_ms else None,
            "seed": seed,
            "results": probes + control_rows,
            "fingerprint": core.engine.fingerprint,
            "fingerprint_details": core.engine.fingerprint_details.as_dict(),
            "machine": machine(),
        }
    finally:
        bench.close()
