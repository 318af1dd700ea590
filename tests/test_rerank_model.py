"""The model reranker on the real llama.cpp engine: scoring is exactly what evaluating token
by token gives, a kept context resumes exactly, and a routed question the words are unsure of
is checked on real grafted blocks and answered from the scored context (Gemma 3 270M, and the
Gemma 4 test model's mechanics: its random weights score at random)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from galahad_desktop.engine.scoring import log_softmax_at
from galahad_desktop.memory.galahad import Galahad

pytestmark = pytest.mark.model

CoreFactory = Callable[..., Galahad]
DOCUMENTS = Path(__file__).resolve().parent.parent / "benchmarks" / "routing" / "documents"


def test_scores_are_what_evaluating_token_by_token_gives(make_core: CoreFactory) -> None:
    engine = make_core().engine
    engine.reset()
    engine.evaluate(engine.bos() + engine.turns.user_open)
    snapshot = engine.snapshot()
    question = engine.encode_text("Which package processes a dpkg trigger, and when?")
    scored, _ms = engine.score(question)
    after = engine.last_logits()
    assert engine.tokens[-len(question) :] == question
    # The same batch evaluated without scores ends in exactly the same logits.
    engine.resume(snapshot)
    engine.evaluate(question)
    assert np.array_equal(engine.last_logits(), after)
    # Token by token: each score is that token's log-probability after the ones before it
    # (a batch of one computes in another order: a few hundredths of a nat apart; a score
    # off by one position would be nats apart).
    engine.resume(snapshot)
    one_by_one = []
    for token in question:
        one_by_one.append(log_softmax_at(engine.last_logits()[None, :], [token])[0])
        engine.evaluate([token])
    gap = np.abs(scored - np.array(one_by_one))
    assert gap[0] < 1e-6 and gap.max() < 0.5 and gap.mean() < 0.15, gap
    shifted = np.abs(scored[1:] - np.array(one_by_one[:-1]))
    assert shifted.mean() > 1.0
    assert (scored < 0).all() and scored.sum() < -5


def test_a_kept_context_resumes_exactly(make_core: CoreFactory) -> None:
    core = make_core()
    engine = core.engine
    engine.reset()
    engine.evaluate(engine.bos() + engine.turns.user_open + engine.encode_text("Name a colour."))
    engine.evaluate(engine.turns.user_close + engine.turns.generation_prompt)
    snapshot = engine.snapshot()
    logits = engine.last_logits()
    first = engine.generate(core.sampling(max_tokens=12))
    engine.resume(snapshot)
    assert np.array_equal(engine.last_logits(), logits)
    again = engine.generate(core.sampling(max_tokens=12))
    assert again.tokens == first.tokens and len(first.tokens) > 0
    snapshot.wipe()


def test_an_unsure_question_is_checked_by_the_model_on_real_blocks(
    make_core: CoreFactory, family: str
) -> None:
    # Retrieval is made unsure of everything, so the model decides (and always answers: the
    # Gemma 4 test model's scores are random).
    core = make_core(
        route_min_strength=1.0, route_min_pmi=-100.0, route_pmi_margin=0.0, rerank_candidates=3
    )
    excerpts = {
        "dpkg-triggers.txt": (DOCUMENTS / "dpkg-triggers.txt").read_text()[:2500],
        "gpl-3.txt": (DOCUMENTS / "gpl-3.txt").read_text()[:2500],
        "emacs-tutorial-ja.txt": (DOCUMENTS / "emacs-tutorial-ja.txt").read_text()[:1500],
    }
    ids = {name: core.deposit_text(name, text).document_id for name, text in excerpts.items()}
    engine = core.engine
    question = "Briefly, what is a dpkg trigger, a facility that allows events to be recorded?"
    before = engine.decoded_tokens
    answer = core.ask(question, params=core.sampling(max_tokens=4))
    assert answer.answered and answer.decision.method == "lexical+rerank"
    rerank = answer.decision.extra["rerank"]
    assert rerank["checked"] == 3 and rerank["ms"] > 0
    assert answer.counters is not None and answer.counters.recomputed_tokens == 0
    assert answer.graft is not None and answer.graft.proof.verdict == "exact"
    # Nothing read twice: the answer started from the context the question was scored on.
    text = engine.encode_text(question)
    checked = 3 * (len(engine.probe_tokens) + len(engine.turns.question(question)))
    opening = len(engine.bos() + engine.turns.user_open)
    spent = engine.decoded_tokens - before
    assert spent == opening + len(text) + checked + answer.counters.generated_tokens
    if family == "gemma3":
        # The 270M model finds a near-quotation far likelier with its source.
        assert answer.document_id == ids["dpkg-triggers.txt"]
        assert rerank["scores"][0]["pmi"] > rerank["scores"][1]["pmi"] + 5
        # Japanese, with no embedding model: the words give pairs of characters, the
        # model reads the question itself.
        japanese = core.ask(
            "コントロールキーを押したまま文字キーを押す記法は？", params=core.sampling(max_tokens=4)
        )
        assert japanese.answered and japanese.document_id == ids["emacs-tutorial-ja.txt"]
