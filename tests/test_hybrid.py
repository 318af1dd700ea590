"""Hybrid routing (words and meaning fused by rank): the logic with a stand-in embedder (fast),
then the real llama.cpp embedding path with all-MiniLM-L6-v2 written as a GGUF."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from galahad_desktop.errors import ModelError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.retrieval.hybrid import (
    PASSAGE_WORDS,
    HybridIndex,
    decide_hybrid,
    passages,
)
from galahad_desktop.memory.retrieval.router import Candidate, PartIndex
from tests.helpers import on_the_real_keyring

# A stand-in embedding: each concept is one axis, and words map to the concept they mean,
# so "automobile" and "car" are the same direction without sharing a letter.
CONCEPTS = {
    **dict.fromkeys(("car", "automobile", "vehicle"), 0),
    **dict.fromkeys(("fix", "repair", "mend"), 1),
    **dict.fromkeys(("bread", "loaf", "bake", "baked", "baking"), 2),
    **dict.fromkeys(("tax", "taxes", "levy"), 3),
}


def stand_in(text: str) -> np.ndarray:
    vector = np.zeros(8, dtype=np.float32)
    vector[7] = 0.1  # an axis every text shares a little of
    for word in re.findall(r"\w+", text.lower()):
        if word in CONCEPTS:
            vector[CONCEPTS[word]] += 1.0
    result: np.ndarray = vector / np.linalg.norm(vector)
    return result


def index_of(documents: dict[str, list[str]]) -> HybridIndex:
    index = HybridIndex(lambda texts: np.stack([stand_in(t) for t in texts]), stand_in)
    for name, parts in documents.items():
        index.add(
            [(f"{name}#{i + 1}", name, i + 1, len(parts), t) for i, t in enumerate(parts)],
            title=name,
        )
    return index


GARAGE = [
    "Opening hours of the workshop are nine to five on weekdays. " * 5,
    "To repair an automobile, first read the manual and check the engine oil. " * 5,
]
KITCHEN = ["Knead the dough, let it rise, then bake the loaf for forty minutes. " * 5]


def test_passages_overlap_and_cut_text_without_spaces() -> None:
    words = [f"w{i}" for i in range(300)]
    cut = passages(" ".join(words))
    assert len(cut) == 3 and all(len(p.split()) <= PASSAGE_WORDS for p in cut)
    assert cut[1].split()[0] == "w100" and cut[0].split()[-1] == "w119"  # 20 words shared
    assert set(" ".join(cut).split()) == set(words)  # nothing lost
    japanese = "日本語の文章には単語の間に空白がありません。" * 40
    assert len(passages(japanese)) > 1  # not one 880-character "word"
    assert passages("") == [] and passages("one two") == ["one two"]


def test_meaning_finds_the_part_that_words_alone_miss() -> None:
    index = index_of({"garage.txt": GARAGE, "kitchen.txt": KITCHEN})
    question = "How do I fix a car?"
    terms, candidates = index.search(question)
    assert candidates[0].part_id == "garage.txt#2"  # "fix a car" means "repair an automobile"
    assert candidates[0].similarity is not None and candidates[0].similarity > 0.6
    lexical = PartIndex()
    for name, parts in {"garage.txt": GARAGE, "kitchen.txt": KITCHEN}.items():
        lexical.add([(f"{name}#{i + 1}", name, i + 1, len(parts), t) for i, t in enumerate(parts)])
    assert lexical.search(question)[1] == []  # no part holds "fix" or "car"
    # With a word of the text as well, both halves agree and fusion keeps the right part.
    _t, both = index.search("How do I fix a car's engine?")
    assert both[0].part_id == "garage.txt#2" and both[0].coverage > 0
    decision = decide_hybrid(terms, candidates, 0.35, 0.0, 1.1, 0.9, "library")
    assert decision.confident and decision.method == "hybrid"
    assert decision.best is not None and decision.best.part_id == "garage.txt#2"
    assert decision.explain().startswith("Answered from part 2 of 2")
    assert "means" in decision.explain() and decision.as_dict()["method"] == "hybrid"


def test_a_name_found_word_for_word_wins_over_meaning() -> None:
    # Ledgers: every passage means the same ("X's access code is N"), one holds the name.
    # Rank fusion let the meaning ranking's noise outvote it; score fusion keeps the gap.
    ledger = [
        " ".join(f"{n}'s access code is {1000 + i}." for i, n in enumerate(names))
        for names in (["Ana Ruiz", "Bo Lind"] * 30, ["Cy Moss", "Di Hart"] * 30)
    ]
    same = np.array([1.0, 0.0], dtype=np.float32)  # every passage means the same
    query = np.array([1.0, 3.0], dtype=np.float32) / np.sqrt(10.0)  # and little to a question
    index = HybridIndex(lambda texts: np.stack([same] * len(texts)), lambda _q: query)
    for name, text in (("ledger-a.txt", ledger[0]), ("ledger-b.txt", ledger[1])):
        index.add([(f"{name}#1", name, 1, 1, text)], title=name)
    terms, candidates = index.search("What is Di Hart's access code?")
    assert candidates[0].document_id == "ledger-b.txt" and candidates[0].coverage > 0.9
    assert (candidates[0].similarity or 0.0) < 0.35  # meaning says nothing here
    found = decide_hybrid(terms, candidates, 0.35, 0.1, 1.1, 0.9, "library")
    assert found.confident and "word for word" in found.explain()
    assert not decide_hybrid(terms, candidates, 0.35, 0.1, 1.1, 1.01, "library").confident
    terms, candidates = index.search("What is Ed Ward's access code?")  # recorded nowhere
    assert not decide_hybrid(terms, candidates, 0.35, 0.1, 1.1, 0.9, "library").confident


def test_gate_refuses_what_is_far_in_meaning_or_holds_none_of_the_words() -> None:
    index = index_of({"garage.txt": GARAGE, "kitchen.txt": KITCHEN})
    terms, candidates = index.search("What is the levy on imported goods?")
    far = decide_hybrid(terms, candidates, 0.35, 0.0, 1.1, 0.9, "library")
    assert not far.confident and "close in meaning" in far.reason
    assert far.explain().startswith("Not answered")
    terms, candidates = index.search("When should dough be baked?")  # "dough" is in the text
    assert candidates[0].document_id == "kitchen.txt"
    assert decide_hybrid(terms, candidates, 0.35, 0.1, 1.1, 0.9, "library").confident
    terms, candidates = index.search("Can bread be mended?")  # near, but none of its words
    assert candidates[0].coverage == 0.0
    unsure = decide_hybrid(terms, candidates, 0.35, 0.1, 1.0, 0.9, "library")
    assert not unsure.confident and "words" in unsure.reason


def test_two_documents_as_close_are_refused_but_neighbours_are_cited() -> None:
    def part(pid: str, document: str, score: float) -> Candidate:
        return Candidate(pid, document, int(pid[-1]), 3, score, 0.5, 0.6)

    tie = [part("a#1", "a", 0.62), part("b#1", "b", 0.60)]
    refused = decide_hybrid(["x"], tie, 0.35, 0.1, 1.2, 0.9, "library")
    assert not refused.confident and "two documents" in refused.reason
    neighbours = [part("a#1", "a", 0.62), part("a#2", "a", 0.60), part("b#1", "b", 0.30)]
    answered = decide_hybrid(["x"], neighbours, 0.35, 0.1, 1.2, 0.9, "library")
    assert answered.confident and [c.part_id for c in answered.cited] == ["a#1", "a#2"]
    assert "cited too" in answered.explain()


def test_forgetting_a_document_drops_its_vectors() -> None:
    index = index_of({"garage.txt": GARAGE, "kitchen.txt": KITCHEN})
    assert len(index) == 3 and index.passage_count >= 3
    index.remove_document("garage.txt")
    assert len(index) == 1 and index.count("garage.txt") == 0
    _terms, candidates = index.search("How do I repair my automobile?")
    assert {c.document_id for c in candidates} == {"kitchen.txt"}


# -- the real embedding path -----------------------------------------------------------------
@pytest.fixture(scope="session")
def minilm_path() -> Path:
    from galahad_dev import minilm_model

    return minilm_model.build()


@pytest.mark.model
def test_minilm_gguf_embeds_meaning_through_llama_cpp(minilm_path: Path) -> None:
    from galahad_desktop.engine.embedder import Embedder

    embedder = Embedder(minilm_path)
    try:
        assert embedder.dimensions == 384 and embedder.architecture == "bert"
        meal, food, weather = embedder.passages(
            ["Someone is having a meal.", "A man is eating food.", "It will rain tomorrow."]
        )
        assert abs(float(np.linalg.norm(meal)) - 1.0) < 1e-4
        assert float(meal @ food) > 0.5 > float(meal @ weather) + 0.2
    finally:
        embedder.close()


@pytest.mark.model
def test_a_chat_model_is_refused_as_an_embedding_model(gemma3_path: Path) -> None:
    from galahad_desktop.engine.embedder import Embedder

    with pytest.raises(ModelError, match="not an embedding model"):
        Embedder(gemma3_path)


@pytest.mark.model
def test_library_answers_a_paraphrase_with_the_embedding_model(
    make_core: Callable[..., Galahad], minilm_path: Path, family: str
) -> None:
    # Routing reads text only, but the answer is grafted and generated by the chat model:
    # both families (the embedded Gemma 3, the Gemma 4 test model).
    core = make_core(n_ctx=2048, max_tokens=4, embedding_model=str(minilm_path))
    core.deposit_text("garden.txt", "Tomatoes need full sun and regular watering. " * 20)
    core.deposit_text(
        "bicycle.txt",
        "To mend a punctured inner tube, find the hole, roughen the rubber, apply a patch "
        "and let the glue dry before inflating. " * 8,
    )
    answer = core.ask("How do I patch a punctured inner tube on my bike?")
    assert answer.answered, answer.why
    assert answer.decision.method == "hybrid" and answer.document_id is not None
    assert core.documents.name(core.documents.row(answer.document_id)) == "bicycle.txt"
    assert "means" in answer.why
    # The Gemma 4 test model has random weights: its reply may be blank, but it was generated.
    assert answer.counters is not None and answer.counters.generated_tokens > 0
    refused = core.ask("Who won the chess world championship in 1972?")
    assert not refused.answered and refused.why.startswith("Not answered")
    core.lock()  # vectors, like the word index, leave memory on lock
    assert core.routing.method == "lexical" and core.routing._index is None


@on_the_real_keyring
def test_get_the_embedding_model_from_the_catalog_and_ask_with_it(
    tmp_path: Path, minilm_path: Path
) -> None:
    from galahad_desktop.models import catalog
    from tests.helpers import cli_json, get_from_fake_hub, run_cli

    data = tmp_path / "data"
    words_only = cli_json("info", data_dir=data)
    assert words_only["routing"].startswith("words alone")
    listed = cli_json("models", "list", data_dir=data)
    assert listed["embedding"]["file"] == catalog.EMBEDDING_GEMMA.file
    embedding = catalog.EMBEDDING_GEMMA
    # The stand-in hub serves the suite's MiniLM GGUF under EmbeddingGemma's name.
    got = get_from_fake_hub(
        embedding.repo, embedding.file, minilm_path.read_bytes(), "embeddinggemma", data, {}
    )
    assert got["in_use"] and Path(got["path"]).name == embedding.file
    info = cli_json("info", data_dir=data)
    assert info["routing"].startswith("words and meaning") and embedding.file in info["routing"]
    notes = tmp_path / "bicycle.txt"
    notes.write_text(
        "To mend a punctured inner tube, find the hole, roughen the rubber, apply a patch "
        "and let the glue dry before inflating. " * 8
    )
    garden = tmp_path / "garden.txt"
    garden.write_text("Tomatoes need full sun and regular watering. " * 20)
    for path in (notes, garden):
        cli_json("deposit", str(path), data_dir=data)
    question = "How do I patch a punctured inner tube on my bike?"
    answer = cli_json("ask", question, "--max-tokens", "4", data_dir=data)
    assert answer["answered"] and answer["routing"]["method"] == "hybrid"
    assert answer["citation"].startswith("bicycle.txt") and "means" in answer["why"]
    refused = run_cli(
        "ask", "Who won the chess world championship in 1972?", data_dir=data, check=False
    )
    assert refused.returncode == 9 and "meaning" in refused.stdout + refused.stderr
    bad = run_cli("settings", "embedding_model=/nonexistent.gguf", data_dir=data, check=False)
    assert bad.returncode != 0 and "does not exist" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.model
def test_vectors_are_kept_encrypted_reused_and_recomputed_when_damaged(
    make_core: Callable[..., Galahad], minilm_path: Path
) -> None:
    import sqlite3

    settings = {"n_ctx": 2048, "max_tokens": 4, "embedding_model": str(minilm_path)}
    core = make_core(**settings)
    bike = core.deposit_text(
        "bicycle.txt", "To mend a punctured inner tube, find the hole and apply a patch. " * 60
    )
    core.deposit_text("garden.txt", "Tomatoes need full sun and regular watering. " * 60)
    question = "How do I patch a punctured inner tube?"
    assert core.ask(question).answered
    index = core.routing._index
    assert isinstance(index, HybridIndex) and index.embedded_passages == index.passage_count
    rows = core.vault.catalog.select("part_vectors")
    assert len(rows) == len(index) and all(r["n_passages"] >= 1 for r in rows)
    first = next(iter(index._parts.values())).vectors[0].astype("<f2").tobytes()
    data = core.data_dir
    core.close()
    on_disk = b"".join(f.read_bytes() for f in data.glob("catalog.sqlite*"))
    assert first[:32] not in on_disk  # the vectors are not on disk in the clear

    again = make_core(data=data, **settings)  # a new session: nothing read through the model
    assert again.ask(question).answered
    reused = again.routing._index
    assert isinstance(reused, HybridIndex) and reused.embedded_passages == 0
    again.close()

    victim = rows[0]
    conn = sqlite3.connect(data / "catalog.sqlite")
    with conn:
        blob = bytearray(victim["vectors_enc"])
        blob[-1] ^= 0x01
        conn.execute(
            "UPDATE part_vectors SET vectors_enc = ? WHERE id = ?", (bytes(blob), victim["id"])
        )
    conn.close()
    damaged = make_core(data=data, **settings)
    problems = damaged.audit().problems
    assert any("passage vectors" in p and victim["id"] in p for p in problems)
    assert damaged.ask(question).answered  # routed on vectors computed again, never the bad ones
    redone = damaged.routing._index
    assert isinstance(redone, HybridIndex)
    assert redone.embedded_passages == victim["n_passages"]
    assert damaged.audit().problems == []  # the damaged row was replaced
    catalog = damaged.vault.catalog
    bike_parts = {r["id"] for r in catalog.select("parts", document_id=bike.document_id)}
    assert bike_parts & {r["part_id"] for r in catalog.select("part_vectors")}
    damaged.forget(bike.document_id)
    left = {r["part_id"] for r in catalog.select("part_vectors")}
    assert left and not left & bike_parts  # forgotten with its document
    assert damaged.audit().problems == []
