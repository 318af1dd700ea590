"""Questions that need more than one part (#57 item 5): the router joins the parts that hold
what the best one lacks (or another document about as strong), they are read together —
the first grafted and proved, the others stacked — and the answer cites each. The gate
still refuses when the parts together hold too little. Pure decisions first, then the
fake engine (real vault, catalog, proofs), then the real model and the command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.retrieval.across import across
from galahad_desktop.memory.retrieval.router import PartIndex, RouteDecision, decide
from tests.helpers import cli_json, run_cli, story

CoreFactory = Callable[..., Galahad]

FALCON = (
    "The peregrine falcon hunts pigeons over the cliffs. Its nest holds four eggs.\n" * 3
    + "The falcon's ring number is 5521.\n"
)
HERON = (
    "The grey heron wades in the marsh at dawn. It eats frogs and small fish.\n" * 3
    + "The heron's ring number is 7340.\n"
)
OTTER = "The otter swims in the river and sleeps in a holt under the willow roots.\n" * 4


def _index(*texts: tuple[str, str]) -> PartIndex:
    index = PartIndex()
    for i, (name, text) in enumerate(texts):
        index.add([(f"p{i}", f"d{i}", 1, 1, text)], title=name)
    return index


def _decide(index: PartIndex, question: str) -> tuple[RouteDecision, RouteDecision | None]:
    terms, candidates = index.search(question)
    decision = decide(terms, candidates, 0.5, 1.5, "library")
    joined = across(decision, lambda ids: index.coverage(question, ids, None), 0.5, 1.5)
    return decision, joined


def test_the_parts_together_hold_what_each_holds_alone_counted_once() -> None:
    index = _index(("falcon.md", FALCON), ("heron.md", HERON), ("otter.md", OTTER))
    question = "What are the falcon's and the heron's ring numbers?"
    alone = [index.coverage(question, [p], None) for p in ("p0", "p1")]
    together = index.coverage(question, ["p0", "p1"], None)
    assert 0 < alone[0] < together and 0 < alone[1] < together
    assert together < alone[0] + alone[1]  # "ring number" counted once, not twice
    assert index.coverage(question, ["p2"], None) == 0.0
    assert index.coverage(question, [], None) == 0.0


def test_a_question_on_two_documents_is_answered_from_both() -> None:
    index = _index(("falcon.md", FALCON), ("heron.md", HERON), ("otter.md", OTTER))
    single, joined = _decide(index, "What are the falcon's and the heron's ring numbers?")
    assert not single.confident  # one part alone: refused (or, elsewhere, half an answer)
    assert joined is not None and joined.confident
    assert {c.document_id for c in joined.cited} == {"d0", "d1"}
    info = joined.extra["across"]
    assert info["together"] > max(info["each"]) + 0.2
    why = joined.explain()
    assert why.startswith("Answered from 2 parts of 2 documents read together")
    assert "no one of them holds it all" in why
    assert joined.as_dict()["across"]["together"] == info["together"]


def test_a_question_one_part_answers_is_not_joined() -> None:
    index = _index(("falcon.md", FALCON), ("heron.md", HERON), ("otter.md", OTTER))
    single, joined = _decide(index, "Where does the peregrine falcon hunt pigeons?")
    assert single.confident and single.best is not None and single.best.document_id == "d0"
    assert joined is None


def test_the_gate_still_refuses_when_the_parts_together_hold_too_little() -> None:
    index = _index(("falcon.md", FALCON), ("heron.md", HERON), ("otter.md", OTTER))
    # Two of the question's many words, in two documents: together still under half of it.
    question = "Which volcano erupted near the lighthouse while the falcon and heron slept?"
    single, joined = _decide(index, question)
    assert not single.confident and joined is None


def test_two_documents_about_as_strong_are_both_read() -> None:
    index = _index(("north.md", FALCON), ("south.md", FALCON.replace("5521", "8810")))
    single, joined = _decide(index, "What is the falcon's ring number?")
    assert not single.confident and "about as well" in single.reason
    assert joined is not None and len(joined.cited) == 2
    assert "they match about as well" in joined.explain()


def test_no_more_than_three_parts_are_joined() -> None:
    birds = ["falcon", "heron", "otter", "badger", "osprey"]
    index = _index(
        *[(f"{b}.md", f"The {b} ring number is {i}.\n" * 3) for i, b in enumerate(birds)]
    )
    _single, joined = _decide(index, "Ring numbers of the falcon, heron, otter, badger, osprey?")
    assert joined is None or len(joined.cited) <= 3


def _library(core: Galahad) -> tuple[str, str]:
    falcon = core.deposit_text("falcon.txt", story(10, "The falcon's ring number is 5521."))
    heron = core.deposit_text("heron.txt", story(10, "The heron's ring number is 7340."))
    return falcon.document_id, heron.document_id


QUESTION = "What are the falcon's and the heron's ring numbers?"


def test_the_answer_reads_both_parts_and_cites_each(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    falcon, heron = _library(core)
    answer = core.ask(QUESTION, params=core.sampling(max_tokens=4))
    assert answer.answered and answer.across
    assert answer.citations == ["falcon.txt, part 1 of 1", "heron.txt, part 1 of 1"]
    assert answer.citation == "falcon.txt, part 1 of 1 and heron.txt, part 1 of 1"
    assert answer.document_id == falcon
    counters = answer.counters
    assert counters is not None and counters.stacked_tokens > 100
    # The second part's first tokens and its last, not the part: it was not read again.
    assert 0 < counters.recomputed_tokens <= 17 < counters.stacked_tokens
    assert answer.graft is not None and answer.graft.proof.verdict == "exact"
    assert answer.as_dict()["citations"] == answer.citations
    assert "(falcon.txt, part 1 of 1 holds " in answer.why  # each part by its name
    core.give_back(heron)  # a part whose memory was given back is read once, kept again
    again = core.ask(QUESTION, params=core.sampling(max_tokens=4))
    assert again.counters is not None and again.counters.recomputed_tokens > 100
    assert {i.id: i.state for i in core.storage().items}[heron] == "stored"
    third = core.ask(QUESTION, params=core.sampling(max_tokens=4))
    assert third.counters is not None and third.counters.recomputed_tokens <= 17
    core.update_settings({"route_across": False})
    one = core.ask(QUESTION, params=core.sampling(max_tokens=4))
    assert not one.across and one.citations == []
    assert core.audit().ok


def test_parts_that_do_not_fit_together_are_left_out(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()  # 2,048 tokens: each fits, the two together do not
    core.deposit_text("falcon.txt", story(22, "The falcon's ring number is 5521."))
    core.deposit_text("heron.txt", story(22, "The heron's ring number is 7340."))
    assert all(d.n_parts == 1 and d.n_tokens > 1050 for d in core.list_documents())
    answer = core.ask(QUESTION, params=core.sampling(max_tokens=4))
    assert not answer.across  # the two do not fit one context: one part, or the gate


@pytest.mark.model
@pytest.mark.keyring
@pytest.mark.usefixtures("real_keyring")
def test_the_command_answers_from_two_documents_and_cites_both(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name, code in (("falcon", "5521"), ("heron", "7340")):
        path = tmp_path / f"{name}.txt"
        path.write_text(story(10, f"The {name}'s ring number is {code}."))
        cli_json("deposit", str(path), data_dir=data)
    out = cli_json("ask", QUESTION, "--max-tokens", "16", data_dir=data)
    assert out["answered"] and out["answer"].strip()
    assert out["citations"] == ["falcon.txt, part 1 of 1", "heron.txt, part 1 of 1"]
    assert out["routing"]["across"]["together"] > 0.5
    assert out["counters"]["stacked_tokens"] > 100 and out["graft"]["proof"] == "exact"
    shown = run_cli("ask", QUESTION, "--max-tokens", "4", data_dir=data)
    assert "[falcon.txt, part 1 of 1 and heron.txt, part 1 of 1 · restored" in shown.stdout
    assert "the others stacked: close, not byte-exact" in shown.stdout
    assert "Answered from 2 parts of 2 documents read together" in shown.stdout
