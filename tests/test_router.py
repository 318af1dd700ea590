"""Long documents in parts, the FTS5 router and its confidence gate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from galahad_desktop.errors import InputError
from galahad_desktop.memory.documents.extraction import overlap_tail, split_for_parts
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.retrieval.router import PartIndex, decide, query_terms
from galahad_dev.corpus import Corpus
from tests.helpers import cli_json, on_the_real_keyring, run_cli


def _words(text: str) -> int:
    return len(text.split())


def test_split_prefers_paragraphs_and_keeps_every_word() -> None:
    paragraphs = [" ".join(f"p{i}w{j}." for j in range(40)) for i in range(10)]
    text = "\n\n".join(paragraphs)
    parts = split_for_parts(text, 100, _words)
    assert all(_words(p) <= 100 for p in parts)
    assert parts[0] == "\n\n".join(paragraphs[:2])  # whole paragraphs while they fit
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())


def test_split_cuts_what_has_no_breaks() -> None:
    text = "x" * 1000  # one word, no sentence: cut by characters
    parts = split_for_parts(text, 40, lambda s: len(s) // 4 + 1)
    assert "".join(parts) == text and all(len(p) // 4 + 1 <= 40 for p in parts)
    with pytest.raises(InputError, match="at least 16 tokens"):
        split_for_parts(text, 8, _words)


def test_overlap_is_the_end_of_the_previous_part() -> None:
    assert overlap_tail("one two three four five six", 2, _words) == "five six"
    assert overlap_tail("one two three four five six", 5, _words) == "two three four five six"
    assert overlap_tail("anything", 0, _words) == ""
    cjk = "東京は日本の首都です。" * 20  # no spaces: cut by characters, never taken whole
    tail = overlap_tail(cjk, 30, len)
    assert cjk.endswith(tail) and 0 < len(tail) <= 30
    minified = '{"a":1,"b":[1,2,3]}' * 500
    assert 0 < len(overlap_tail(minified, 64, lambda t: len(t) // 3 + 1)) <= 192


def _index(corpus: Corpus, parts: int) -> tuple[PartIndex, list[tuple[str, str]]]:
    index = PartIndex()
    needles = []
    for k in range(parts):
        text, planted = corpus.document(1500, k, needles=2, decoys=1)
        index.add([(f"p{k}", "d", k + 1, parts, text)])
        needles += [(n.name, f"p{k}") for n in planted]
    return index, needles


@pytest.mark.parametrize("parts", [2, 12])
def test_router_finds_the_part_and_the_gate_refuses_absent_names(parts: int) -> None:
    corpus = Corpus(11)
    index, needles = _index(corpus, parts)
    for name, part in needles:
        terms, candidates = index.search(f"What is {name}'s access code?")
        decision = decide(terms, candidates, 0.5, 1.5, "library")
        assert decision.confident, decision.reason
        assert decision.best is not None and decision.best.part_id == part
    for _ in range(10):
        terms, candidates = index.search(f"What is {corpus.absent_name()}'s access code?")
        decision = decide(terms, candidates, 0.5, 1.5, "library")
        assert not decision.confident and decision.reason


def test_gate_refuses_a_tie_between_documents_not_between_neighbours() -> None:
    index = PartIndex()
    index.add([("a", "d", 1, 2, "the lighthouse keeper"), ("b", "d", 2, 2, "lighthouse keeper")])
    index.add([("c", "e", 1, 1, "a lighthouse keeper's log"), ("x", "e", 2, 2, "the harbour")])
    terms, candidates = index.search("Who was the lighthouse keeper?")
    decision = decide(terms, candidates, 0.5, 1.5, "library")
    assert not decision.confident and "two documents match about as well" in decision.reason
    assert {c.part_id for c in decision.candidates} == {"a", "b", "c"}
    # Within one document two parts holding the words are neighbours, not a doubt: the
    # answer comes from the stronger, and the other is cited with it.
    terms, candidates = index.search("Who was the lighthouse keeper?", document_id="d")
    decision = decide(terms, candidates, 0.5, 1.5, "d")
    assert decision.confident, decision.reason
    assert [c.part_id for c in decision.cited] == [candidates[0].part_id, candidates[1].part_id]
    assert "cited too" in decision.explain()
    assert query_terms("What is it?") == []
    with pytest.raises(InputError, match="no words"):
        index.search("What is it?")


def test_words_are_matched_by_their_stems() -> None:
    index = PartIndex()
    index.add([("a", "d", 1, 1, "Libpng is thread safe when each thread has its own struct.")])
    index.add([("b", "e", 1, 1, "Packages are refused when their triggers are pending.")])
    _terms, candidates = index.search("Can several threads use the library?")
    assert candidates[0].part_id == "a"
    _terms, candidates = index.search("Why was the package refusing a trigger?")
    assert candidates[0].part_id == "b" and candidates[0].coverage > 0.5
    # A document's name is indexed with its parts: a question that names it finds it.
    index.add([("c", "f", 1, 1, "It holds the default priority of rules.")], title="mime-spec")
    _terms, candidates = index.search("What is the default priority in the mime spec?")
    assert candidates[0].part_id == "c"


def _long_document(corpus: Corpus, sections: int) -> tuple[str, list[tuple[str, str]]]:
    texts, needles = [], []
    for k in range(sections):
        text, planted = corpus.document(350, k, needles=1, decoys=1)
        texts.append(text)
        needles += [(n.name, n.code) for n in planted]
    return "\n\n".join(texts), needles


@pytest.mark.model
def test_a_long_document_is_stored_in_parts_and_routed(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str
) -> None:
    core = make_core(n_ctx=2048, max_tokens=8)
    corpus = Corpus(5)
    text, needles = _long_document(corpus, 6)
    docs = core.documents
    assert len(docs.document_tokens("ledger.txt", text)) > core.document_limit()
    deposited = core.deposit_text("ledger.txt", text)
    parts = core.parts(deposited.document_id)
    assert deposited.n_parts == len(parts) >= 3
    assert all(p.n_tokens <= docs.part_budget() for p in parts)
    own = [docs.part_text(docs.part_row(p.id)) for p in parts]
    assert " ".join(" ".join(own).split()) == " ".join(text.split())  # nothing lost
    second = core.engine.detokenize(core.vault.chain_tokens(parts[1].block_id))
    assert f"part 2 of {len(parts)}" in second
    assert own[0].split()[-1] in second  # the overlap with part 1
    for name, code in needles[:3]:
        answer = core.ask(f"What is {name}'s access code?")
        assert answer.answered, answer.decision.reason
        holder = next(p for p, t in zip(parts, own, strict=True) if name in t)
        assert answer.part_id == holder.id
        assert answer.citation == f"ledger.txt, part {holder.part_no} of {len(parts)}"
        assert answer.graft is not None and answer.graft.recomputed_tokens == 0
        assert answer.graft.proof.verdict == "exact"
        assert code  # the base model's reply is weak; the eval counts exact codes
    refused = core.ask(f"What is {corpus.absent_name()}'s access code?")
    assert not refused.answered and refused.text == "" and refused.decision.reason
    chosen = core.ask(refused.question, part_id=parts[0].id)  # the user's choice
    assert chosen.answered and chosen.part_id == parts[0].id
    log = core.routing_log()
    # One line per question: the user's choice, the refusal, the last record answered.
    assert [e.decision for e in log[:3]] == ["chosen", "gated", "answered"]
    assert all(name not in json.dumps(e.__dict__) for e in log for name, _ in needles)
    core.forget(deposited.document_id)
    assert core.vault.catalog.count("parts") == 0 and len(core.routing.index()) == 0
    assert [e for e in core.routing_log() if e.candidates] == []  # its routing lines went too


@pytest.mark.model
def test_parts_text_and_index_are_never_on_disk_in_plain(
    tmp_path: Path, make_core: Callable[..., Galahad]
) -> None:
    core = make_core(n_ctx=2048, max_tokens=4)
    corpus = Corpus(9)
    text, needles = _long_document(corpus, 5)
    core.deposit_text("ledger.txt", text)
    assert core.ask(f"What is {needles[0][0]}'s access code?").answered
    core.lock()
    core.close()
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            for name, _code in needles:
                assert name.encode() not in content, f"{name} in {path}"


@on_the_real_keyring
def test_cli_lists_candidates_when_unsure_and_answers_a_chosen_part(tmp_path: Path) -> None:
    data = tmp_path / "data"
    corpus = Corpus(3)
    text, needles = _long_document(corpus, 5)
    doc = tmp_path / "ledger.txt"
    doc.write_text(text)
    deposited = cli_json("--set", "n_ctx=2048", "deposit", str(doc), data_dir=data)
    assert deposited["n_parts"] >= 2
    proc = run_cli(
        "ask", f"What is {corpus.absent_name()}'s access code?", data_dir=data, check=False
    )
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert "Candidates" in proc.stdout and "part 1 of" in proc.stdout
    answer = cli_json(
        "--set",
        "n_ctx=2048",
        "ask",
        deposited["document_id"],
        f"What is {needles[0][0]}'s access code?",
        "--max-tokens",
        "4",
        data_dir=data,
    )
    assert answer["answered"] and "ledger.txt, part" in answer["citation"]
    assert answer["graft"]["recomputed_tokens"] == 0
    log = cli_json("routing-log", data_dir=data)
    assert [e["decision"] for e in log["entries"]] == ["answered", "gated"]
