"""The model reranker (memory/retrieval/rerank.py), fast tier: the gate on the model's
evidence, which candidates are checked, and the whole path on the fake engine (its copy model
makes a part that holds the question's words explain it, as a language model does)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from galahad_desktop.engine.scoring import log_softmax_at
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.retrieval.rerank import (
    PartScore,
    Reranking,
    candidates_to_check,
    decide_reranked,
)
from galahad_desktop.memory.retrieval.router import Candidate, RouteDecision

CoreFactory = Callable[..., Galahad]


def _candidate(part: str, document: str, no: int = 1) -> Candidate:
    return Candidate(part, document, no, 3, 1.0, 0.5)


def _decision(*candidates: Candidate) -> RouteDecision:
    return RouteDecision(["x"], list(candidates), 1.0, 1.0, False, "unsure", method="lexical")


def _reranking(*scores: tuple[str, str, float]) -> Reranking:
    ranked = [PartScore(p, d, 1, 3, pmi, pmi - 50.0, i) for i, (p, d, pmi) in enumerate(scores, 1)]
    ranked.sort(key=lambda s: -s.pmi)
    return Reranking(ranked, -50.0, 12, 180.0)


def test_log_softmax_matches_a_direct_computation() -> None:
    rows = np.random.default_rng(3).standard_normal((4, 5000)).astype(np.float32) * 8
    tokens = [0, 17, 4999, 2500]
    direct = [
        float(rows[i, t].astype(np.float64) - np.log(np.exp(rows[i].astype(np.float64)).sum()))
        for i, t in enumerate(tokens)
    ]
    assert np.allclose(log_softmax_at(rows, tokens), direct, atol=1e-6)
    assert (log_softmax_at(rows, tokens) < 0).all()


def test_the_gate_answers_a_clear_lead_and_names_what_it_checked() -> None:
    a, b, c = _candidate("p1", "d1"), _candidate("p2", "d2"), _candidate("p3", "d3")
    scores = _reranking(("p1", "d1", 1.0), ("p2", "d2", 6.0), ("p3", "d3", 2.5))
    decision = decide_reranked(_decision(a, b, c), scores, 2.0, 1.0, 5.0)
    assert decision.confident and decision.best == b  # the model's order, not retrieval's
    assert decision.margin == pytest.approx(3.5) and decision.best_score == 6.0
    assert decision.method == "lexical+rerank" and decision.checked == "checked 3 parts in 180 ms"
    assert decision.pmi_of("p3") == 2.5 and decision.pmi_of("nope") is None
    assert decision.explain().startswith("Answered from part 1 of 3")
    assert "clearly better than any other" in decision.explain()
    assert "checked 3 parts" in decision.explain() and "nats" not in decision.explain()
    assert decision.as_dict()["rerank"]["scores"][0]["part_id"] == "p2"
    # Overruling retrieval's first part (p1) needs more evidence than agreeing with it.
    overruled = decide_reranked(_decision(a, b, c), scores, 2.0, 1.0, 7.0)
    assert not overruled.confident and "not sure enough to overrule" in overruled.reason
    agreed = decide_reranked(_decision(b, a, c), scores, 2.0, 1.0, 7.0)
    assert agreed.confident and agreed.best == b


def test_asking_one_document_its_parts_are_the_alternatives() -> None:
    a, b = _candidate("p1", "d1", 1), _candidate("p2", "d1", 2)
    scoped = replace(_decision(a, b), scope="d1")
    scores = _reranking(("p1", "d1", 5.0), ("p2", "d1", 4.5))
    alike = decide_reranked(scoped, scores, 2.0, 1.0, 100.0)
    assert not alike.confident and "two parts explain" in alike.reason
    apart = _reranking(("p1", "d1", 5.0), ("p2", "d1", 1.0))
    clear = decide_reranked(scoped, apart, 2.0, 1.0, 100.0)
    assert clear.confident and clear.cited == [a] and clear.margin == pytest.approx(4.0)
    # A library of one document: the same (its parts are all there is to compare).
    library = decide_reranked(_decision(a, b), scores, 2.0, 1.0, 100.0, one_document=True)
    assert not library.confident and "two parts explain" in library.reason
    assert decide_reranked(_decision(a, b), scores, 2.0, 1.0, 100.0).confident  # neighbours


def test_the_gate_refuses_weak_evidence_and_two_documents_alike() -> None:
    a, b = _candidate("p1", "d1"), _candidate("p2", "d2")
    weak = decide_reranked(
        _decision(a, b), _reranking(("p1", "d1", 1.5), ("p2", "d2", -1)), 2.0, 1.0, 100.0
    )
    assert not weak.confident and "falls short of the bar" in weak.reason
    assert weak.as_dict()["rerank"]["scores"][0]["pmi"] == 1.5  # the figures stay in --json
    alike = decide_reranked(
        _decision(a, b), _reranking(("p1", "d1", 5.0), ("p2", "d2", 4.5)), 2.0, 1.0, 100.0
    )
    assert not alike.confident and "two documents" in alike.reason
    assert alike.explain().startswith("Not answered") and "checked 2 parts" in alike.explain()
    nothing = decide_reranked(_decision(a, b), Reranking([], 0.0, 3, 5.0), 2.0, 1.0, 100.0)
    assert not nothing.confident and "could be checked" in nothing.reason


def test_neighbours_are_not_a_doubt_and_are_cited() -> None:
    a, b = _candidate("p1", "d1", 1), _candidate("p2", "d1", 2)
    other = _candidate("p3", "d2")
    decision = decide_reranked(
        _decision(a, b, other),
        _reranking(("p1", "d1", 5.0), ("p2", "d1", 4.8), ("p3", "d2", 1.0)),
        2.0,
        1.0,
        100.0,
    )
    assert decision.confident and decision.cited == [a, b]
    assert "cited too" in decision.explain()


def test_which_candidates_the_model_checks() -> None:
    retrieved = [_candidate(f"p{i}", "d") for i in range(8)]
    assert candidates_to_check(retrieved, [], 5) == retrieved[:5]
    scope = [_candidate(f"s{i}", "d") for i in range(3)]
    assert candidates_to_check(retrieved[:1], scope, 5) == retrieved[:1] + scope
    # A scope larger than the limit adds nothing: retrieval's best alone.
    assert candidates_to_check([], scope, 2) == []


def _library(core: Galahad) -> dict[str, str]:
    ids = {}
    for name, topic in (
        ("harbour.txt", "The harbour master counts the herring boats at dawn every day. "),
        ("orchard.txt", "The orchard keeper prunes the old pear trees before the frost. "),
        ("forge.txt", "The smith tempers the plough blades in the forge by the river. "),
    ):
        ids[name] = core.deposit_text(name, topic * 6).document_id
    return ids


def test_the_model_checks_an_unsure_question_and_answers_from_the_part_it_scored(
    make_fake_core: CoreFactory,
) -> None:
    # Words alone are never sure here (all of the question is needed, and "gladly" is
    # nowhere), so the model decides.
    core = make_fake_core(route_min_strength=1.0, route_min_pmi=60.0, route_pmi_margin=20.0)
    ids = _library(core)
    engine = core.engine
    before = engine.decoded_tokens
    answer = core.ask(
        "Who gladly prunes the old pear trees before the frost?", params=core.sampling(max_tokens=3)
    )
    assert answer.answered and answer.document_id == ids["orchard.txt"]
    decision = answer.decision
    assert decision.method == "lexical+rerank" and decision.checked.startswith("checked 3 parts")
    scores = decision.extra["rerank"]["scores"]
    assert scores[0]["part_id"] == answer.part_id and scores[0]["pmi"] > scores[1]["pmi"] + 3
    counters = answer.counters
    assert counters is not None and counters.recomputed_tokens == 0
    assert answer.graft is not None and answer.graft.proof.verdict == "exact"
    # Nothing was read twice: the baseline, then each candidate's probe and the question,
    # then the answer's tokens — the answer started from the scored context.
    question = engine.turns.question("Who gladly prunes the old pear trees before the frost?")
    text = engine.encode_text("Who gladly prunes the old pear trees before the frost?")
    opening = engine.bos() + engine.turns.user_open
    expected = len(opening) + len(text) + 3 * (len(engine.probe_tokens) + len(question))
    assert engine.decoded_tokens - before == expected + counters.generated_tokens
    entry = core.routing_log(1)[0]
    raw = core.vault.records.log_entries("routing_log")[0][2]
    assert entry.decision == "answered" and raw["method"] == "lexical+rerank"
    assert entry.method == "lexical+rerank" and entry.rerank is not None
    assert entry.rerank[0][0] == answer.part_id and (entry.rerank_ms or 0) > 0
    assert raw["rerank"][0][0] == answer.part_id
    assert "pear" not in repr(raw)  # the log holds scores, never the question


def test_the_model_refuses_what_no_part_explains_and_can_be_turned_off(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core(route_min_strength=1.0, route_min_pmi=60.0, route_pmi_margin=20.0)
    _library(core)
    refused = core.ask("Where are the blue kites flown on windy beaches?")
    assert not refused.answered and refused.why.startswith("Not answered")
    assert refused.decision.method == "lexical+rerank"
    assert refused.candidates_cited  # the user can still choose
    core.update_settings({"rerank": False})
    plain = core.ask("Who gladly prunes the old pear trees before the frost?")
    assert not plain.answered and plain.decision.method == "lexical"
    assert "rerank" not in plain.decision.extra


def test_retrieval_that_is_sure_costs_the_model_nothing(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    _library(core)
    answer = core.ask("Who gladly prunes the old pear trees before the frost?")
    assert answer.answered and answer.decision.method == "lexical"
    assert answer.decision.checked == ""


def test_a_snapshot_resumes_the_context_exactly(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    engine = core.engine
    engine.reset()
    engine.evaluate(engine.bos() + engine.encode_text("a context to come back to"))
    snapshot = engine.snapshot()
    tokens, logits = list(engine.tokens), engine.last_logits()
    engine.evaluate(engine.encode_text(" and then something else"))
    engine.resume(snapshot)
    assert engine.tokens == tokens and np.array_equal(engine.last_logits(), logits)
    snapshot.wipe()
    assert not any(bytes(snapshot.state)) and not snapshot.logits.any()


def test_parts_stored_under_other_settings_are_not_re_read_to_be_checked(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core(route_min_strength=1.0, route_min_pmi=60.0, route_pmi_margin=20.0)
    _library(core)
    blocks = sorted(b["id"] for b in core.vault.records.blocks())
    core.update_settings({"n_batch": 256})  # a runtime setting: another fingerprint
    before = core.engine.decoded_tokens
    refused = core.ask("Who gladly prunes the old pear trees before the frost?")
    assert not refused.answered
    assert "3 stored under other settings or another model" in refused.why
    assert sorted(b["id"] for b in core.vault.records.blocks()) == blocks  # nothing re-read
    assert core.engine.decoded_tokens - before < 100  # the question, never a part
