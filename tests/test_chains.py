"""Chains of blocks: the per-sequence state parser against the pinned llama.cpp, byte-exact
splicing, conversations stored as links, stacked documents, compaction. Real model."""

from __future__ import annotations

import ctypes
import hashlib
import struct
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import pytest

from galahad_desktop.engine import kvstate
from galahad_desktop.engine.engine import Engine
from galahad_desktop.errors import InputError, IntegrityError
from galahad_desktop.memory.galahad import Galahad
from tests.helpers import chatted, story
from tests.test_graft import RUNTIMES

pytestmark = pytest.mark.model


@pytest.fixture(params=sorted(RUNTIMES))
def runtime(request: pytest.FixtureRequest) -> dict[str, bool]:
    return RUNTIMES[str(request.param)]


def _bytes(buffer: ctypes.Array[ctypes.c_uint8], size: int) -> bytes:
    return bytes(memoryview(buffer).cast("B")[:size])


def _digest(core: Galahad, conversation: str, block: str | None = None) -> str:
    head = block or core.head_block(conversation)
    stored = core.live.read_state(head, core.conversations.chain_owners(conversation))
    return hashlib.sha256(stored.state).hexdigest()


@pytest.fixture()
def two_states(
    make_core: Callable[..., Galahad], family: str, runtime: dict[str, bool]
) -> tuple[Engine, bytes, int, bytes]:
    """A 1,500-token state, then the same context 300 tokens later (past the window)."""
    engine = make_core(**runtime).engine
    first = (engine.bos() + engine.encode_text(story(300)))[:1500]
    engine.evaluate(first)
    buffer, size, _ms = engine.capture()
    early = _bytes(buffer, size)
    engine.restore(buffer, first, size)
    engine.evaluate(engine.encode_text(story(60, secret="Later, Kay sang."))[:300])
    buffer, size, _ms = engine.capture()
    return engine, early, len(first), _bytes(buffer, size)


def test_the_parser_is_pinned_to_this_llama_cpp() -> None:
    # The layout was read from llama.cpp as vendored by this version; another one must be
    # re-read (and this test updated) before chains are spliced again.
    assert llama_cpp.__version__ == kvstate.KNOWN_LLAMA_CPP_PYTHON
    assert kvstate.chains_supported()


def _cut_at(
    state: bytes, position: int
) -> tuple[kvstate.SeqState, ctypes.Array[ctypes.c_uint8], int]:
    """A state parsed, and the child cut from it at `position` (the cells after it)."""
    parsed = kvstate.parse(state)
    child, child_size = kvstate.cut(parsed, position)
    return parsed, child, child_size


# One state pair per model and runtime serves the three checks (each pair costs ~5 s to
# evaluate on 2 cores): parse and reassemble, cut and splice, a missing parent.
def test_a_state_parses_cuts_and_splices_back_byte_identical(
    two_states: tuple[Engine, bytes, int, bytes],
) -> None:
    engine, early, n_early, late = two_states
    state = kvstate.parse(late)
    assert len(state.sections) == 2  # iSWA: full-attention cache, then sliding window
    full, swa = state.layout()
    assert full == [(0, 1800)]
    window = 512 if "gemma3" in str(engine.config.model_path) else 128
    assert swa[-1][1] == 1800 and sum(b - a for a, b in swa) <= window
    # Gemma 4: the sections differ in layer count and row size (KV-shared layers own none).
    full_layers, swa_layers = state.sections[0].layers, state.sections[1].layers
    if "gemma4" in str(engine.config.model_path):
        assert len(full_layers) == 1 and len(swa_layers) == 3
        assert {layer.k_row for layer in swa_layers} != {full_layers[0].k_row}
    buffer, size = kvstate.assemble([state], state.layout(), kvstate.bytes_buffer)
    assert _bytes(buffer, size) == late

    # A child cut at the earlier state's end, spliced onto it, is the later state.
    late_state, child, child_size = _cut_at(late, n_early)
    child_state = kvstate.parse(child, child_size)
    assert child_state.layout()[0] == [(n_early, 1800)]
    assert child_size < len(late) / 2
    with pytest.raises(kvstate.KVLayoutError, match="missing"):  # never without its parent
        kvstate.assemble([child_state], late_state.layout(), kvstate.bytes_buffer)
    spliced, size = kvstate.assemble(
        [kvstate.parse(early), child_state], late_state.layout(), kvstate.bytes_buffer
    )
    assert _bytes(spliced, size) == late
    engine.restore(spliced, list(range(1800)), size)  # and llama.cpp takes it


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: struct.pack("<I", 0x12345678) + b[4:], "header is unknown"),
        (lambda b: b[:8] + struct.pack("<I", 2) + b[12:], "2 streams"),
        (lambda b: b[:-100], "ends inside"),
        (lambda b: b[:20] + struct.pack("<I", 2) + b[24:], "shared by several sequences"),
        (lambda b: b + b"\0" * 4, "0 streams"),
    ],
)
def test_an_unknown_layout_is_refused(
    real_state: bytes, mutate: Callable[[bytes], bytes], message: str
) -> None:
    with pytest.raises(kvstate.KVLayoutError, match=message):
        kvstate.parse(mutate(real_state))


@pytest.fixture(scope="module")
def real_state(gemma4_path: Path) -> bytes:
    """One real state (Gemma 4 layout, 300 tokens) for the parser's refusals."""
    from galahad_desktop.engine.values import EngineConfig

    engine = Engine(EngineConfig(gemma4_path, n_ctx=1024))
    try:
        engine.evaluate((engine.bos() + engine.encode_text(story(40)))[:300])
        buffer, size, _ms = engine.capture()
        return _bytes(buffer, size)
    finally:
        engine.close()


def test_turns_are_stored_as_links_identical_to_whole_states(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str, runtime: dict[str, bool]
) -> None:
    """The same conversation with chains and with whole states: every turn's spliced chain
    is byte-identical to the whole state, while each link holds only the new positions."""
    chained = make_core(max_tokens=12, **runtime)
    whole = make_core(tmp_path / "whole", max_tokens=12, chain_blocks=False, **runtime)
    try:
        a, b = chained.new_conversation(), whole.new_conversation()
        for turn in range(4):
            text = f"Tell me about the river in town {turn}. " * (12 if turn == 1 else 1)
            ra, rb = chained.send(a, text), whole.send(b, text)
            assert ra.reply == rb.reply
            assert _digest(chained, a) == _digest(whole, b)
            link = chained.vault.block_row(chained.head_block(a))
            full = whole.vault.block_row(whole.head_block(b))
            assert link["pos_end"] == full["pos_end"]
            if turn:
                assert link["pos_start"] > 0 and link["file_bytes"] < full["file_bytes"]
        assert chained.chain_links(a) == 4
        # Whole states: only the newest `checkpoints` are kept; links are all needed.
        assert chained.vault.catalog.count("blocks") == 4
    finally:
        whole.close()


def test_resume_regenerate_and_branch_graft_links_exactly(
    make_core: Callable[..., Galahad], family: str, runtime: dict[str, bool]
) -> None:
    core = make_core(max_tokens=10, **runtime)
    conversation, _turns = chatted(core, [f"Name a colour for day {t}." for t in range(3)])
    core.close()
    fresh = make_core(max_tokens=10, **runtime)
    report = fresh.resume(conversation)
    assert report.recomputed_tokens == 0 and report.proof.verdict == "exact"
    before = fresh.messages(conversation)
    again = fresh.regenerate(conversation)
    assert again.graft is not None and again.graft.proof.verdict == "exact"
    assert again.graft.block_id == before[3].block_id  # the turn-2 link
    assert again.reply == before[-1].text  # greedy: the same reply from the same state
    assert fresh.chain_links(conversation) == 3
    branch = fresh.branch(conversation, 2, "Name a fruit instead.")
    assert branch.graft is not None and branch.graft.recomputed_tokens == 0
    fresh.forget(conversation)  # the branch does not continue the original's links
    assert fresh.resume(branch.conversation_id).proof.verdict == "exact"


def test_compaction_keeps_every_byte_of_the_spliced_state(
    make_core: Callable[..., Galahad], family: str, runtime: dict[str, bool]
) -> None:
    core = make_core(max_tokens=8, **runtime)
    conversation, _turns = chatted(core, [f"Count to {t + 2}." for t in range(6)])
    digest = _digest(core, conversation)
    checkpoint = core.messages(conversation)[-3].block_id  # the turn before last
    kept_digest = _digest(core, conversation, checkpoint)
    result = core.compact(conversation, keep=2)
    assert result.merged == 4 and result.links_after == 3
    assert core.chain_links(conversation) == 3
    assert _digest(core, conversation) == digest
    assert _digest(core, conversation, checkpoint) == kept_digest
    assert core.vault.audit().problems == []
    assert len(list(core.vault.blocks_dir.iterdir())) == 3
    with pytest.raises(InputError, match="at least one"):
        core.compact(conversation, keep=0)
    core.close()
    fresh = make_core(max_tokens=8, **runtime)
    report = fresh.resume(conversation)
    assert report.recomputed_tokens == 0 and report.proof.verdict == "exact"
    # an old turn's link was merged away: editing there re-reads, and says so
    edited = fresh.branch(conversation, 2, "Count to nine.")
    assert edited.graft is not None and edited.graft.fallback_reason


def test_a_broken_chain_is_refused(make_core: Callable[..., Galahad]) -> None:
    core = make_core(max_tokens=6)
    conversation = core.new_conversation()
    core.send(conversation, "One.")
    core.send(conversation, "Two.")
    head = core.vault.block_row(core.head_block(conversation))
    parent = core.vault.block_row(head["parent_id"])
    with core.vault.transaction():
        core.vault.catalog.update("blocks", parent["id"], {"pos_end": parent["pos_end"] + 1})
    with pytest.raises(IntegrityError, match="starts at position"):
        core.vault.chain_rows(head["id"])


def test_a_link_pointed_at_another_parent_is_refused(make_core: Callable[..., Galahad]) -> None:
    core = make_core(max_tokens=6)
    conversation = core.new_conversation()
    for text in ("One.", "Two.", "Three."):
        core.send(conversation, text)
    links = core.vault.chain_rows(core.head_block(conversation))
    other = core.new_conversation()
    core.send(other, "Alpha.")
    core.send(other, "Beta.")
    stranger = core.vault.chain_rows(core.head_block(other))[0]
    # Point the head's parent at another conversation's block of the same length.
    with core.vault.transaction():
        core.vault.catalog.update(
            "blocks", stranger["id"], {"pos_end": links[1]["pos_end"], "parent_id": None}
        )
        core.vault.catalog.update("blocks", links[2]["id"], {"parent_id": stranger["id"]})
    with pytest.raises(IntegrityError):
        core.live.read_state(links[2]["id"], {conversation, other})
    with pytest.raises(IntegrityError, match="belongs to"):
        core.live.read_state(links[2]["id"], {conversation})


def test_a_second_document_prefills_only_itself(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str
) -> None:
    # The full sliding-window cache keeps every cell, so the second document can be a link
    # of its own (with the ring buffer, the default, it is a whole-state checkpoint).
    core = make_core(max_tokens=8, swa_full=True)
    first = core.deposit_text("first.txt", story(60, secret="Kay's horse is called Ember."))
    conversation = core.new_conversation(document_id=first.document_id)
    core.send(conversation, "What is Kay's horse called?")
    at = core.vault.block_row(core.head_block(conversation))["pos_end"]
    core.close()
    fresh = make_core(max_tokens=8, swa_full=True)
    added = fresh.add_document(
        conversation, "second.txt", story(40, secret="Bors keeps the key under the bell.")
    )
    c = added.counters
    assert c.recomputed_tokens == 0
    assert c.restored_tokens == at
    assert 0 < c.new_tokens < first.tokens
    head = fresh.vault.block_row(fresh.head_block(conversation))
    assert head["pos_start"] == at  # a link holding only the second document
    roles = [m.role for m in fresh.messages(conversation)]
    assert roles == ["user", "model", "document", "model"]
    with pytest.raises(InputError, match="added a document"):
        fresh.regenerate(conversation)
    reply = fresh.send(conversation, "Where is the key?")
    assert reply.counters.recomputed_tokens == 0
    fresh.close()
    assert make_core(swa_full=True).resume(conversation).proof.verdict == "exact"
