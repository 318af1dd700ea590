"""Verified answers: safe verifiers, the store, recurrence, transfer and the gate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from galahad_desktop.errors import InputError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.verified.library import similarity
from galahad_desktop.memory.verified.verifiers import (
    ArithmeticVerifier,
    UnitConversionVerifier,
    UnsafeExpression,
    safe_arithmetic,
    verifier_for,
)


@pytest.mark.parametrize(
    ("question", "answer", "ok"),
    [
        ("What is 37 * 12 + 5?", "449", True),
        ("What is 37 * 12 + 5?", "The result is 450.", False),
        ("Compute (8 + 4) × 3.", "So that gives 36", True),
        ("What is 7 / 2?", "3.5", True),
        ("What is 2^10 - 24?", "1000", True),
        ("Convert 5 km to m.", "5000 m", True),
        ("How many grams are in 2.5 kg?", "2,500 grams", True),
        ("Convert 100 C to F", "212 °F", True),
        ("Convert 3 miles to feet", "15840 feet", True),
        ("Convert 3 miles to feet", "15000 feet", False),
        # A rambling reply whose last number happens to be right is not an answer.
        ("What is 7 + 1?", "What is 3 + 5? This is 8", False),
        ("What is 37 * 12 + 5?", "449 (37 times 12 is 444, plus 5)", True),
    ],
)
def test_verifiers_check_answers(question: str, answer: str, ok: bool) -> None:
    found = verifier_for(question)
    assert found is not None
    assert found[0].check(question, answer).ok is ok


def test_paraphrases_meet_and_near_misses_do_not() -> None:
    keys = {
        q: verifier_for(q)[1]
        for q in (  # type: ignore[index]
            "What is 37 * 12 + 5?",
            "Compute 37*12 + 5.",
            "what is 37 *12+5",
            "What is 37 * 12 + 6?",
            "How many g are in 2 kg?",
            "Convert 2 kilograms to grams.",
            "Convert 3 kg to g.",
        )
    }
    assert keys["What is 37 * 12 + 5?"] == keys["Compute 37*12 + 5."] == keys["what is 37 *12+5"]
    assert keys["What is 37 * 12 + 5?"] != keys["What is 37 * 12 + 6?"]
    assert keys["How many g are in 2 kg?"] == keys["Convert 2 kilograms to grams."]
    assert keys["Convert 2 kilograms to grams."] != keys["Convert 3 kg to g."]
    assert similarity("What is 37 * 12 + 5?", "What is 38 * 12 + 5?") > 0.9


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('id')",
        "2 ** 100000",
        "-" * 60 + "1",
        "1 / 0",
        "a + 1",
        "9" * 250,
    ],
)
def test_arithmetic_is_never_evaluated_with_eval(expression: str) -> None:
    with pytest.raises(UnsafeExpression):
        safe_arithmetic(expression)
    assert ArithmeticVerifier().key(f"What is {expression}?") is None
    assert UnitConversionVerifier().key("Convert 5 km to kg") is None  # mixed dimensions
    assert ArithmeticVerifier().key("What is x * 3 + 1?") is None


@pytest.mark.model
def test_recurrence_transfer_and_gate(make_core: Callable[..., Galahad], family: str) -> None:
    core = make_core(n_ctx=2048)
    library = core.library
    with pytest.raises(InputError, match="fails its arithmetic check"):
        library.add("What is 37 * 12 + 5?", "It is 450.")
    with pytest.raises(InputError, match="mark it as verified yourself"):
        library.add("Who founded Camelot?", "Arthur")
    entry = library.add("What is 37 * 12 + 5?", "37 * 12 + 5 = 449.")
    library.add("Who founded Camelot?", "King Arthur founded Camelot.", user_verified=True)
    core.close()

    fresh = make_core(n_ctx=2048)
    library = fresh.library
    recurrence = fresh.send(fresh.new_conversation(), "Compute 37*12 + 5.")
    assert recurrence.library is not None and recurrence.library.mode == "recurrence"
    assert recurrence.reply == entry.answer
    assert recurrence.counters.generated_tokens == 0 and recurrence.counters.recomputed_tokens == 0
    assert recurrence.proof.verdict == "exact"
    assert "verified answer from memory" in recurrence.library.label
    # The conversation continues from the grafted state, and resumes exactly.
    follow = fresh.send(recurrence.conversation_id, "Thanks!", params=fresh.sampling(max_tokens=3))
    assert follow.counters.recomputed_tokens == 0
    assert fresh.resume(recurrence.conversation_id).proof.verdict == "exact"

    near = fresh.send(
        fresh.new_conversation(), "What is 37 * 12 + 6?", params=fresh.sampling(max_tokens=6)
    )
    assert near.library is not None and near.library.mode == "transfer"
    assert near.reply != entry.answer and near.counters.generated_tokens > 0
    assert near.proof.verdict == "exact"  # started from the verified block's graft

    off = fresh.new_conversation()
    fresh.set_library(off, False)
    plain = fresh.send(off, "What is 37 * 12 + 5?", params=fresh.sampling(max_tokens=4))
    assert plain.library is not None and plain.library.mode == "none"
    assert plain.counters.generated_tokens > 0
    library.remove(entry.id)
    assert [e.question for e in library.entries()] == ["Who founded Camelot?"]
    assert library.lookup("What is 37 * 12 + 5?") is None


@pytest.mark.model
def test_eval_flywheel_reports_the_figures(tmp_path: Path, family_model: Path | None) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "galahad_dev",
            "--json",
            "--out",
            str(tmp_path),
            *(["--model", str(family_model)] if family_model else []),
            "eval",
            "flywheel",
            "--problems",
            "4",
            "--attempts",
            "1",
            "--oracle",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in (
        "problems",
        "first_decode_tokens",
        "recurrence_decode_tokens",
        "transfer_decode_tokens",
        "recurrence_correct",
        "transfer_correct",
        "near_misses",
        "gate_wrong_answers",
    ):
        assert key in result
    assert result["problems"] == 4 and result["gate_wrong_answers"] == 0
    assert result["solved_and_stored"] == 4  # the oracle solves what the model cannot
    assert result["recurrence_hits"] == 4 and result["recurrence_correct"] == 4
    assert result["recurrence_decode_tokens"] == 0
    assert result["recurrence_correct"] == result["solved_and_stored"]
    assert result["near_miss_stored_answers"] == 0
