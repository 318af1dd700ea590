"""Stored documents stacked into a conversation (#57): placed after what the chat holds
from their own blocks, their first tokens read on top, never read again in full; stored as
the chain's next links, so a resume restores them exactly. Fast tier on the fake engine
(real vault, catalog, chains and proofs), then the real models and the real command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from galahad_desktop.errors import InputError, IntegrityError, NotFoundError
from galahad_desktop.memory.documents.stacked import QUALITY_PROBE_TOKENS
from galahad_desktop.memory.galahad import Galahad
from tests.helpers import cli_json, resumed_in_a_new_engine, run_cli, story

CoreFactory = Callable[..., Galahad]


def _two_documents(core: Galahad, sentences: int = 12) -> tuple[str, str]:
    first = core.deposit_text("north.txt", story(sentences, "The north gate code is 4417."))
    second = core.deposit_text("south.txt", story(sentences, "The south gate code is 9031."))
    return first.document_id, second.document_id


def _decoded(core: Galahad) -> int:
    return int(core.engine.decoded_tokens)  # type: ignore[attr-defined]


def test_stored_documents_stack_without_being_read_again_and_resume_exactly(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    north, south = _two_documents(core)
    document_tokens = sum(d.n_tokens for d in core.list_documents())
    conversation = core.new_conversation()
    core.send(conversation, "Hello.", params=core.sampling(max_tokens=6))
    links = core.chain_links(conversation)
    before = _decoded(core)
    turn = core.add_stored_documents(conversation, [north, south])
    decoded = _decoded(core) - before
    stack = turn.stack
    assert stack is not None and stack.documents == ("north.txt", "south.txt")
    assert stack.verdict == "stacked" and stack.quality is None and stack.reread_tokens == 0
    # What was decoded: each block's recomputed first tokens and the turn openings, far
    # less than the documents themselves.
    opening = len(core.engine.probe_tokens)
    assert decoded == stack.recomputed_tokens + 2 * opening
    assert decoded < document_tokens / 2
    skipped = len(core.engine.bos()) + opening  # each block's opening, already held
    assert stack.stacked_tokens + stack.recomputed_tokens == document_tokens - 2 * skipped
    assert "close, not byte-exact" in stack.describe()
    assert turn.as_dict()["stack"]["documents"] == ["north.txt", "south.txt"]
    assert core.chain_links(conversation) == links + 2  # one link per document
    roles = [m.role for m in core.messages(conversation)]
    assert roles[-4:] == ["document", "model", "document", "model"]
    core.send(conversation, "Which codes?", params=core.sampling(max_tokens=6))
    resumed_in_a_new_engine(core, conversation, make_fake_core)


def test_a_conversation_on_one_document_takes_a_second_and_can_measure_it(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    north, south = _two_documents(core)
    conversation = core.new_conversation(document_id=north)
    turn = core.add_stored_documents(conversation, [south], verify=True)
    assert turn.stack is not None and turn.stack.quality is not None
    q = turn.stack.quality
    assert q.probe_tokens == QUALITY_PROBE_TOKENS and 0 <= q.argmax_agree <= q.probe_tokens
    assert q.kl_mean >= 0 and q.kl_p99 <= q.kl_max and q.full_read_ms > 0
    assert "against a full read: KL" in turn.stack.describe()
    held = list(core.engine.tokens)
    core.reload_engine()
    resumed = core.resume(conversation)
    assert resumed.proof.verdict == "exact" and core.engine.tokens == held


def test_a_file_the_library_holds_is_stacked_and_a_new_one_is_read(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    core = make_fake_core()
    held = tmp_path / "north.txt"
    held.write_text(story(12, "The north gate code is 4417."))
    core.deposit(held)
    conversation = core.new_conversation()
    stacked = core.add_document_file(conversation, held)
    assert stacked.stack is not None and stacked.stack.documents == ("north.txt",)
    edited = tmp_path / "edited.txt"
    edited.write_text(story(12, "The north gate code is 5555."))
    read = core.add_document_file(conversation, edited)
    assert read.stack is None and read.counters.new_tokens > 100


def test_bad_stacks_are_refused_by_name_and_change_nothing(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    core = make_fake_core(n_ctx=1024)
    north, south = _two_documents(core, sentences=12)
    big = core.deposit_text("big.txt", story(60)).document_id
    conversation = core.new_conversation()
    core.send(conversation, "Hello.", params=core.sampling(max_tokens=6))
    messages, links = core.messages(conversation), core.chain_links(conversation)
    with pytest.raises(InputError, match="named twice"):
        core.add_stored_documents(conversation, [north, north])
    with pytest.raises(InputError, match="at least one"):
        core.add_stored_documents(conversation, [])
    with pytest.raises(InputError, match=r"big\.txt"):
        core.add_stored_documents(conversation, [north, south, big])
    with pytest.raises(NotFoundError, match="no-such-document"):
        core.add_stored_documents(conversation, ["no-such-document"])
    assert core.messages(conversation) == messages and core.chain_links(conversation) == links


def test_a_stacked_document_whose_memory_was_given_back_is_read_once_and_kept_again(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    north, south = _two_documents(core)
    core.give_back(south)
    conversation = core.new_conversation(document_id=north)
    turn = core.add_stored_documents(conversation, [south])
    assert turn.stack is not None and turn.stack.reread_tokens > 100
    stored = {i.id: i.state for i in core.storage().items}
    assert stored[south] == "stored"  # read once, stored again
    again = core.add_stored_documents(core.new_conversation(document_id=north), [south])
    assert again.stack is not None and again.stack.reread_tokens == 0


def test_a_tampered_stored_block_is_refused_and_nothing_is_added(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    north, south = _two_documents(core)
    row = core.vault.records.block(core.documents.part_rows(south)[0]["block_id"])
    assert row is not None
    path = core.vault.blocks_dir / row["file_name"]
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x40
    path.write_bytes(bytes(data))
    conversation = core.new_conversation(document_id=north)
    with pytest.raises(IntegrityError):
        core.add_stored_documents(conversation, [south])
    assert core.messages(conversation) == [] and core.chain_links(conversation) == 0


@pytest.mark.model
@pytest.mark.keyring
@pytest.mark.usefixtures("real_keyring")
def test_the_command_stacks_documents_and_a_new_process_resumes_them_exactly(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    ids = []
    for name, code in (("north", "4417"), ("south", "9031"), ("east", "2268")):
        path = tmp_path / f"{name}.txt"
        path.write_text(story(25, f"The {name} gate code is {code}."))
        ids.append(cli_json("deposit", str(path), data_dir=data)["document_id"])
    started = cli_json(
        "chat",
        "--document",
        ids[0],
        "--document",
        ids[1],
        "--message",
        "What is the south gate code?",
        "--max-tokens",
        "12",
        data_dir=data,
    )
    conversation = started["conversation_id"]
    added = cli_json("add-document", conversation, ids[2], "--verify", data_dir=data)
    stack = added["stack"]
    assert stack["documents"] == ["east.txt"] and stack["verdict"] == "stacked"
    assert stack["reread_tokens"] == 0 and 0 < stack["recomputed_tokens"] <= 33
    assert stack["quality"]["probe_tokens"] == QUALITY_PROBE_TOKENS
    assert stack["quality"]["kl_mean"] < 0.5  # close; the bench prints the real figures
    unknown = run_cli("add-document", conversation, "nothing-here", data_dir=data, check=False)
    assert unknown.returncode != 0 and "neither a file nor a stored document" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    resumed = cli_json("resume", conversation, data_dir=data)
    assert resumed["proof"] == "exact" and resumed["recomputed_tokens"] == 0
    shown = cli_json("show", conversation, data_dir=data)
    assert [m["role"] for m in shown["messages"]].count("document") == 2


@pytest.mark.model
@pytest.mark.keyring
@pytest.mark.usefixtures("real_keyring")
def test_killed_while_stacking_loses_nothing(tmp_path: Path) -> None:
    import signal

    data = tmp_path / "data"
    ids = []
    for name in ("north", "south"):
        path = tmp_path / f"{name}.txt"
        path.write_text(story(20, f"The {name} gate code is 4417."))
        ids.append(cli_json("deposit", str(path), data_dir=data)["document_id"])
    chat = cli_json(
        "chat", "--document", ids[0], "--message", "Hi.", "--max-tokens", "4", data_dir=data
    )
    conversation = chat["conversation_id"]
    killed = run_cli(
        "add-document",
        conversation,
        ids[1],
        data_dir=data,
        check=False,
        env={"GALAHAD_CRASHPOINT": "stack-before-persist"},
    )
    assert killed.returncode == -signal.SIGKILL
    shown = cli_json("show", conversation, data_dir=data)["messages"]
    assert [m["role"] for m in shown] == ["user", "model"]  # the stack left nothing
    assert cli_json("audit", data_dir=data)["problems"] == []
    resumed = cli_json("resume", conversation, data_dir=data)
    assert resumed["proof"] == "exact" and resumed["recomputed_tokens"] == 0
