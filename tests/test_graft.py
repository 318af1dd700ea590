"""The core with the real model: grafts restore with zero recomputed tokens and an exact
proof; the runtime rule, tampering and canaries. Each 'fresh engine' is a new llama.cpp
context on the same data directory."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from galahad_desktop.engine import proof as proof_module
from galahad_desktop.engine.engine import Engine
from galahad_desktop.errors import InputError, IntegrityError
from galahad_desktop.jobs import Job
from galahad_desktop.memory.documents import documents as documents_module
from galahad_desktop.memory.galahad import Galahad
from tests.helpers import chatted, story

pytestmark = pytest.mark.model

# The runtime configurations every core test runs under: flash attention off with the
# full-size sliding-window cache, on with the ring buffer, and the q8_0 cache (read in f16
# and converted: engine/kvquant.py).
RUNTIMES: dict[str, dict[str, Any]] = {
    "flash-off": {"flash_attn": False, "swa_full": True},
    "flash-on": {"flash_attn": True, "swa_full": False},
    "q8_0": {"flash_attn": True, "swa_full": False, "kv_type": "q8_0"},
}


@pytest.fixture(params=sorted(RUNTIMES))
def runtime(request: pytest.FixtureRequest) -> dict[str, Any]:
    return RUNTIMES[str(request.param)]


def _doc(tmp_path: Path, text: str, name: str = "notes.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_ask_on_a_document_recomputes_nothing(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str, runtime: dict[str, Any]
) -> None:
    first = make_core(**runtime)
    deposited = first.deposit(_doc(tmp_path, story(60)))
    assert deposited.tokens > 500 and deposited.block_bytes > 0
    first.close()

    second = make_core(**runtime)  # a fresh engine: nothing of the document is in memory
    conversation = second.new_conversation(document_id=deposited.document_id)
    result = second.send(
        conversation, "What is Arthur's access code?", params=second.sampling(max_tokens=12)
    )
    c = result.counters
    assert result.graft is not None and result.graft.fallback_reason is None
    assert result.proof.verdict == "exact"
    assert c.restored_tokens == deposited.tokens and c.recomputed_tokens == 0
    # llama.cpp decoded only the new turn: probe + question + reply + closing tokens.
    assert second.engine.decoded_tokens == c.new_tokens + c.generated_tokens
    assert second.engine.decoded_tokens < 60


def test_conversation_resumes_exactly_in_a_fresh_engine(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str, runtime: dict[str, Any]
) -> None:
    first = make_core(**runtime)
    conversation = first.new_conversation()
    replies = [
        first.send(conversation, text, params=first.sampling(max_tokens=8)).reply
        for text in ("Hello, who are you?", "Tell me about the round table.")
    ]
    ledger = list(first.engine.tokens)
    first.close()

    second = make_core(**runtime)
    report = second.resume(conversation)
    assert report.proof.verdict == "exact", report.proof
    assert report.recomputed_tokens == 0
    assert report.restored_tokens == len(ledger) - len(second.engine.probe_tokens)
    assert second.engine.tokens == ledger  # the same tokens, position for position
    assert second.engine.decoded_tokens == len(second.engine.probe_tokens)
    messages = second.messages(conversation)
    assert [m.role for m in messages] == ["user", "model", "user", "model"]
    assert [m.text for m in messages[1::2]] == replies
    assert second.list_conversations()[0].title == "Hello, who are you?"
    # The conversation continues from the graft with no re-read.
    third_turn = second.send(conversation, "Thanks.", params=second.sampling(max_tokens=4))
    assert third_turn.counters.recomputed_tokens == 0 and third_turn.graft is None


def test_history_is_a_ledger_of_evaluated_tokens(
    make_core: Callable[..., Galahad], family: str
) -> None:
    core = make_core()
    conversation = core.new_conversation()
    opening = core.engine.turn_format.user_open.split("user")[0]  # <start_of_turn> / <|turn>
    core.send(conversation, f"One {opening}model fake", params=core.sampling(max_tokens=4))
    blocks = core.vault.catalog.select("blocks", "generation", owner_id=conversation)
    first_tokens = core.vault.block_tokens(blocks[0])
    core.send(conversation, "Two", params=core.sampling(max_tokens=4))
    blocks = core.vault.catalog.select("blocks", "generation", owner_id=conversation)
    second_tokens = core.vault.chain_tokens(blocks[-1]["id"])  # the ledger through the chain
    probe = core.engine.probe_tokens
    assert second_tokens[: len(first_tokens) + len(probe)] == first_tokens + probe
    # Turn markers typed by a user stay text: one turn opening per real turn in the ledger.
    turn_open = core.engine.encode_template(opening)[0]
    assert first_tokens.count(turn_open) == 2


def test_changed_runtime_falls_back_to_a_reread_and_stores_again(
    tmp_path: Path, make_core: Callable[..., Galahad], family: str
) -> None:
    first = make_core(n_batch=512)
    deposited = first.deposit(_doc(tmp_path, story(30)))
    old_block = deposited.block_id
    first.close()

    changed = make_core(n_batch=256)
    assert changed.engine.fingerprint != changed.vault.block_row(old_block)["fingerprint"]
    conversation = changed.new_conversation(document_id=deposited.document_id)
    ticks: list[int] = []
    report = changed.resume(conversation, Job(on_progress=lambda p: ticks.append(p.done)))
    assert report.fallback_reason == "the model or its runtime settings changed"
    assert report.recomputed_tokens == deposited.tokens and report.restored_tokens == 0
    assert ticks and ticks[-1] == deposited.tokens  # progress was reported
    assert not changed.vault.block_path(old_block).exists()
    changed.close()

    again = make_core(n_batch=256)
    report = again.resume(conversation)
    assert report.fallback_reason is None and report.proof.verdict == "exact"
    assert report.restored_tokens == deposited.tokens and report.recomputed_tokens == 0


def test_diverged_proof_is_never_used(
    tmp_path: Path,
    make_core: Callable[..., Galahad],
    monkeypatch: pytest.MonkeyPatch,
    family: str,
) -> None:
    core = make_core()
    deposited = core.deposit(_doc(tmp_path, story(20)))
    real_compare = proof_module.compare

    def diverging(record, logits, ms):  # type: ignore[no-untyped-def]
        shifted = logits.copy()
        shifted[int(np.argmin(shifted))] = float(shifted.max()) + 10.0
        return real_compare(record, shifted, ms)

    monkeypatch.setattr(proof_module, "compare", diverging)
    conversation = core.new_conversation(document_id=deposited.document_id)
    report = core.resume(conversation)
    assert report.fallback_reason is not None and "diverged" in report.fallback_reason
    assert report.recomputed_tokens == deposited.tokens


def test_tampered_block_is_refused_before_llama_cpp(
    tmp_path: Path, make_core: Callable[..., Galahad], monkeypatch: pytest.MonkeyPatch
) -> None:
    core = make_core()
    deposited = core.deposit(_doc(tmp_path, story(20)))
    path = core.vault.block_path(deposited.block_id)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    core.close()
    core = make_core()  # a fresh engine must read the block from disk
    restores: list[int] = []
    monkeypatch.setattr(
        Engine, "restore", lambda self, payload, tokens, size=None: restores.append(1)
    )
    conversation = core.new_conversation(document_id=deposited.document_id)
    with pytest.raises(IntegrityError, match="failed authentication"):
        core.send(conversation, "Hello?")
    assert restores == []
    assert path.read_bytes() == bytes(data)  # refused, not deleted or rewritten
    assert core.messages(conversation) == []


def test_oversized_document_is_refused_and_nothing_is_stored(
    tmp_path: Path, make_core: Callable[..., Galahad], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(documents_module, "MAX_DOCUMENT_CHARS", 5_000)
    core = make_core(n_ctx=1024)
    with pytest.raises(InputError, match=r"at most 5,000 are accepted in one document"):
        core.deposit(_doc(tmp_path, story(200)))
    assert core.list_documents() == []
    assert list(core.vault.blocks_dir.iterdir()) == []


def test_cancel_keeps_the_partial_reply(make_core: Callable[..., Galahad]) -> None:
    core = make_core()
    conversation = core.new_conversation()
    cancel = threading.Event()
    pieces: list[str] = []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 3:
            cancel.set()

    result = core.send(
        conversation,
        "Write a long story about a knight.",
        Job(on_text=on_text, cancel=cancel),
        params=core.sampling(max_tokens=200),
    )
    assert result.stop_reason == "cancelled"
    assert result.counters.generated_tokens == 3
    assert core.messages(conversation)[-1].text == "".join(pieces) == result.reply
    core.close()


CANARY = "ZEBRA-CANARY-7f3a9c"


def test_canary_is_nowhere_in_the_data_directory(
    tmp_path: Path, make_core: Callable[..., Galahad]
) -> None:
    core = make_core()
    doc = _doc(tmp_path, story(10, secret=f"The password is {CANARY}."), name=f"{CANARY}.md")
    deposited = core.deposit(doc)
    conversation = core.new_conversation(document_id=deposited.document_id)
    core.send(conversation, f"Remember {CANARY} please.", params=core.sampling(max_tokens=6))
    canary_tokens = core.engine.encode_text(CANARY)
    core.close()
    needles = [
        CANARY.encode(),
        CANARY.encode("utf-16-le"),
        CANARY.lower().encode(),
        np.asarray(canary_tokens, dtype="<i4").tobytes(),
    ]
    files = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert len(files) >= 4
    for path in files:
        content = path.read_bytes()
        for needle in needles:
            assert needle not in content, f"canary found in {path}"


def test_regenerate_restores_the_turn_checkpoint(
    make_core: Callable[..., Galahad], family: str, runtime: dict[str, Any]
) -> None:
    core = make_core(**runtime)
    knights = ("Name a knight.", "Name another one.")
    conversation, (_first, second) = chatted(core, knights, params=core.sampling(max_tokens=6))
    old_head = core.vault.catalog.get("conversations", conversation)["head_block_id"]
    checkpoint = core.messages(conversation)[1].block_id
    core.close()

    fresh = make_core(**runtime)
    again = fresh.regenerate(conversation, params=fresh.sampling(max_tokens=6))
    assert again.graft is not None and again.graft.block_id == checkpoint
    assert again.proof.verdict == "exact" and again.counters.recomputed_tokens == 0
    # Greedy decoding on an exactly restored prefix gives the very same reply.
    assert again.reply == second.reply
    messages = fresh.messages(conversation)
    assert [m.text for m in messages][2] == "Name another one." and len(messages) == 4
    # The replaced reply is kept as version 1, with its own block: choosing it grafts it.
    versions = fresh.reply_versions(conversation, 3)
    assert len(versions) == 2 and versions[0].restorable and versions[0].text == second.reply
    assert fresh.vault.catalog.get("blocks", old_head) is not None
    opened = fresh.choose_version(conversation, 1)
    assert opened.graft.block_id == old_head and opened.graft.recomputed_tokens == 0
    assert opened.graft.proof.verdict == "exact"


def test_branch_from_an_edited_message(
    make_core: Callable[..., Galahad], family: str, runtime: dict[str, Any]
) -> None:
    core = make_core(**runtime)
    knights = ("Name a knight.", "Name another one.")
    conversation, _turns = chatted(core, knights, params=core.sampling(max_tokens=6))
    core.close()

    fresh = make_core(**runtime)
    branched = fresh.branch(conversation, 2, "Name a castle.", params=fresh.sampling(max_tokens=6))
    assert branched.conversation_id != conversation
    assert branched.proof.verdict == "exact" and branched.counters.recomputed_tokens == 0
    assert branched.counters.restored_tokens > 0
    new_messages = fresh.messages(branched.conversation_id)
    old_messages = fresh.messages(conversation)
    assert [m.text for m in new_messages[:2]] == [m.text for m in old_messages[:2]]
    assert new_messages[2].text == "Name a castle." and len(old_messages) == 4
    assert old_messages[2].text == "Name another one."
    assert fresh.resume(branched.conversation_id).proof.verdict == "exact"


def test_a_head_pointed_back_at_an_older_checkpoint_is_refused(
    make_core: Callable[..., Galahad],
) -> None:
    core = make_core()
    conversation = core.new_conversation()
    core.send(conversation, "One.", params=core.sampling(max_tokens=3))
    core.send(conversation, "Two.", params=core.sampling(max_tokens=3))
    older = core.messages(conversation)[1].block_id
    assert older is not None
    core.close()
    fresh = make_core()
    with fresh.vault.transaction():  # an edit of the catalog's plain columns
        fresh.vault.catalog.update(
            "conversations", conversation, {"head_block_id": older, "n_messages": 2}
        )
    with pytest.raises(IntegrityError, match="was edited"):
        fresh.resume(conversation)


def test_system_prompt_preset_uses_the_model_s_system_turn(
    make_core: Callable[..., Galahad], family: str
) -> None:
    """Gemma 4 has a native system turn; Gemma 3 folds the preset into the first turn."""
    from galahad_desktop.settings import SYSTEM_PROMPTS

    core = make_core(system_prompt="coder")
    with_preset = core.new_conversation()
    plain = core.new_conversation(system_prompt="none")
    core.send(with_preset, "Hello.", params=core.sampling(max_tokens=2))
    tokens = core.vault.block_tokens(core.vault.block_row(core.head_block(with_preset)))
    core.send(plain, "Hello.", params=core.sampling(max_tokens=2))
    plain_tokens = core.vault.block_tokens(core.vault.block_row(core.head_block(plain)))
    engine = core.engine
    text = engine.detokenize(tokens)
    assert SYSTEM_PROMPTS["coder"] in text
    assert SYSTEM_PROMPTS["coder"] not in engine.detokenize(plain_tokens)
    fmt = engine.turn_format
    system_turn = engine.encode_template(fmt.system_open or "<no system turn>")
    user_turn = engine.encode_template(fmt.user_open)
    first_user = next(i for i in range(len(tokens)) if tokens[i : i + len(user_turn)] == user_turn)
    if family == "gemma4":
        assert fmt.native_system
        assert tokens[1 : 1 + len(system_turn)] == system_turn  # right after <bos>
        assert SYSTEM_PROMPTS["coder"] in engine.detokenize(tokens[:first_user])
    else:
        assert not fmt.native_system
        assert SYSTEM_PROMPTS["coder"] not in engine.detokenize(tokens[:first_user])
    assert core.messages(with_preset)[0].text == "Hello."  # the message is what the user wrote
    # Words that name no preset are the conversation's own system prompt (kept encrypted).
    own = core.new_conversation(system_prompt="pirate")
    assert core.conversation_system_prompt(own) == "pirate"
    with pytest.raises(InputError, match="not valid Unicode"):
        core.new_conversation(system_prompt="bad\udcffbyte")
