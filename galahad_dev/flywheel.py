"""`python -m galahad_dev eval flywheel`: solve once with a larger budget, verify, store;
then ask again
(recurrence, paraphrased), ask variants (transfer) and near misses (the gate).

Problems are generated locally from a seed: arithmetic and unit conversions, all checkable.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from galahad_desktop.memory.verified.verifiers import verifier_for
from galahad_dev.bench import Run, machine

UNIT_TEMPLATES = (("km", "m"), ("kg", "g"), ("h", "min"), ("m", "cm"), ("l", "ml"))


def problem(rng: random.Random) -> tuple[str, str, str, str]:
    """(question, paraphrase with the same numbers, variant, near miss)."""
    if rng.random() < 0.6:
        a, b, c = rng.randint(2, 40), rng.randint(2, 20), rng.randint(1, 99)
        a2 = a + rng.randint(1, 9)
        return (
            f"What is {a} * {b} + {c}?",
            f"Compute {a}*{b} + {c}.",
            f"What is {a2} * {b} + {c}?",
            f"What is {a} * {b} + {c + 1}?",
        )
    source, target = rng.choice(UNIT_TEMPLATES)
    value = rng.randint(2, 90)
    return (
        f"Convert {value} {source} to {target}.",
        f"How many {target} are in {value} {source}?",
        f"Convert {value + rng.randint(1, 9)} {source} to {target}.",
        f"Convert {value + 1} {source} to {target}.",
    )


def _summary(mode: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """<mode>_decode_tokens, _ms_median, _correct and _hits for one phase of asks."""
    return {
        f"{mode}_decode_tokens": sum(r["decode_tokens"] for r in rows),
        f"{mode}_ms_median": statistics.median([r["ms"] for r in rows]) if rows else None,
        f"{mode}_correct": sum(r["correct"] for r in rows),
        f"{mode}_hits": sum(r["mode"] == mode for r in rows),
    }


def oracle_answer(question: str) -> str:
    """The verifier's own value, phrased as an answer: what a tool-assisted solve stores."""
    found = verifier_for(question)
    assert found is not None
    return f"The answer is {found[0].check(question, '').expected}."


def eval_flywheel(
    problems: int,
    attempts: int,
    seed: int,
    run: Run,
    budget: int = 48,
    oracle: bool = False,
) -> dict[str, Any]:
    """With `oracle`, a problem the model fails is solved by the verifier itself (like a
    calculator tool), so recurrence, transfer and the gate can be measured on a model too
    weak to solve anything; the report says how many the model solved."""
    log, bench = run.log, run.bench(n_ctx=2048)
    rng = random.Random(seed)
    try:
        core = bench.core
        library = core.library
        cases = [problem(rng) for _ in range(problems)]
        solved, first_tokens, first_ms = [], 0, 0.0
        solved_by_model = 0
        for index, (question, _p, _v, _n) in enumerate(cases):
            verifier, _key = verifier_for(question) or (None, None)
            assert verifier is not None
            for attempt in range(attempts):  # best-of-N with a larger budget
                conversation = core.new_conversation()
                library.set_enabled(conversation, False)
                start = time.perf_counter()
                result = core.send(
                    conversation,
                    question,
                    params=core.sampling(
                        max_tokens=budget,
                        temperature=0.0 if attempt == 0 else 0.8,
                        seed=seed * 1000 + index * 10 + attempt,
                    ),
                )
                first_ms += (time.perf_counter() - start) * 1e3
                first_tokens += result.counters.generated_tokens
                core.forget(conversation)
                if verifier.check(question, result.reply).ok:
                    library.add(question, result.reply)
                    solved.append(index)
                    solved_by_model += 1
                    break
            else:
                if oracle:
                    library.add(question, oracle_answer(question))
                    solved.append(index)
            log(
                f"flywheel: problem {index + 1}/{problems}: "
                f"{'verified and stored' if solved and solved[-1] == index else 'unsolved'}"
            )

        def ask_all(kind: int) -> list[dict[str, Any]]:
            rows = []
            for index in solved:
                question = cases[index][kind]
                conversation = core.new_conversation()
                start = time.perf_counter()
                result = core.send(
                    conversation, question, params=core.sampling(max_tokens=budget, temperature=0.0)
                )
                elapsed = (time.perf_counter() - start) * 1e3
                found = verifier_for(question)
                assert found is not None
                rows.append(
                    {
                        "question": question,
                        "mode": result.library.mode if result.library else None,
                        "decode_tokens": result.counters.generated_tokens,
                        "ms": elapsed,
                        "correct": found[0].check(question, result.reply).ok,
                        "stored_answer_returned": bool(
                            result.library and result.library.mode == "recurrence"
                        ),
                        "recomputed": result.counters.recomputed_tokens,
                        "proof": result.proof.verdict,
                    }
                )
                core.forget(conversation)
            return rows

        recurrence = ask_all(1)  # paraphrase, same numbers
        transfer = ask_all(2)  # variant: other numbers
        near = ask_all(3)  # same template, one number changed
        # A stored answer returned for a near miss is wrong by construction (other numbers).
        gate_wrong = sum(1 for r in near if r["stored_answer_returned"] and not r["correct"])
        return {
            "command": "eval flywheel",
            "problems": problems,
            "solved_and_stored": len(solved),
            "solved_by_model": solved_by_model,
            "solved_by_oracle": len(solved) - solved_by_model,
            "attempts_per_problem": attempts,
            "first_decode_tokens": first_tokens,
            "first_ms": first_ms,
            **_summary("recurrence", recurrence),
            **_summary("transfer", transfer),
            "near_misses": len(near),
            "near_miss_stored_answers": sum(r["stored_answer_returned"] for r in near),
            "gate_wrong_answers": gate_wrong,
            "seed": seed,
            "results": {"recurrence": recurrence, "transfer": transfer, "near_misses": near},
            "fingerprint": core.engine.fingerprint,
            "machine": machine(),
        }
    finally:
        bench.close()
