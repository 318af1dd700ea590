"""Everyday chat with the real models (Gemma 3 270M and the Gemma 4 test model): three
generations of one turn differ, no reply holds a turn or image marker, each version comes
back from its own block with 0 tokens re-read, a system prompt in the user's own words
works from the command (and is never on disk in plain text), and the terminal chat's
/commands leave nothing behind that the user did not send."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from galahad_desktop.memory.galahad import Galahad
from tests.helpers import cli_json, run_cli

pytestmark = pytest.mark.model
MARKERS = ("<start_of_turn>", "<end_of_turn>", "<|turn>", "<turn|>", "<start_of_image>", "<|image>")


def test_regenerate_gives_other_replies_each_restored_from_its_block(
    family: str, make_core: Callable[..., Galahad]
) -> None:
    core = make_core(temperature=1.0)
    first = core.send(None, "Name a colour and a fruit.", params=core.sampling(max_tokens=16))
    conversation = first.conversation_id
    turns = [first]
    for _ in range(2):
        turns.append(core.regenerate(conversation, params=core.sampling(max_tokens=16)))
    replies = [t.reply for t in turns]
    assert len({t.seed for t in turns}) == 3
    if family == "gemma3":
        assert len(set(replies)) >= 2, replies
    else:
        # The test model's random weights open a thought channel at once and stay in it
        # (thoughts are shown, never kept), so its versions differ only in their seeds;
        # the real Gemma 3 above shows the texts differ.
        assert all(t.thought_tokens == t.counters.generated_tokens for t in turns)
    assert not any(marker in reply for reply in replies for marker in MARKERS)
    core.reload_engine()
    opened = core.choose_version(conversation, 1)
    assert opened.graft.recomputed_tokens == 0 and opened.graft.proof.verdict == "exact"
    assert opened.messages[-1].text == replies[0]
    following = core.send(conversation, "And another?", params=core.sampling(max_tokens=8))
    assert following.counters.recomputed_tokens == 0
    assert core.audit().problems == []


def test_chat_takes_a_system_prompt_in_the_users_words(tmp_path: Path) -> None:
    data = tmp_path / "data"
    words = "You are Merlin-7741, a terse wizard."
    result = cli_json(
        "chat", "--system", words, "--message", "Who are you?", "--max-tokens", "8", data_dir=data
    )
    assert result["conversation_id"] and result["stop_reason"] in ("end", "length")
    catalog = (data / "catalog.sqlite").read_bytes()
    assert b"Merlin-7741" not in catalog  # encrypted like every private text
    listed = run_cli("list", data_dir=data).stdout
    assert "Who are you?" in listed


def test_the_terminal_chat_commands_and_no_empty_conversation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    quit_only = run_cli("chat", data_dir=data, stdin="/quit\n")
    assert "Type /help" in quit_only.stdout + quit_only.stderr
    assert "(untitled)" not in run_cli("list", data_dir=data).stdout  # nothing was stored
    session = run_cli(
        "chat",
        "--max-tokens",
        "4",
        data_dir=data,
        stdin="/help\nHello there\n/new\nSecond chat\n/list\n/resume 2\n/quit\n",
    )
    text = session.stdout + session.stderr
    assert "/resume N" in text and "Hello there" in text and "Second chat" in text
    assert "2  " in text  # /list numbered them
    assert "restored" in text or "exact" in text  # /resume 2 grafted the first chat


def _gemma4_core(gemma4_path: Path, tmp_path: Path) -> Galahad:
    from galahad_desktop.vault.keys import MemoryKeyStore
    from tests.helpers import TEST_OVERRIDES

    return Galahad(
        tmp_path / "data",
        model_path=gemma4_path,
        keystore=MemoryKeyStore(),
        overrides=dict(TEST_OVERRIDES),
    )


def test_a_shared_system_prompt_is_grafted_exactly_on_the_gemma4_test_model(
    gemma4_path: Path, tmp_path: Path
) -> None:
    core = _gemma4_core(gemma4_path, tmp_path)
    try:
        words = "You are the archivist of a small harbour town. " * 8
        first = core.send(None, "Hello", system_prompt=words, max_tokens=4)
        second = core.send(None, "Hello again", system_prompt=words, max_tokens=4)
        assert first.graft is None and second.graft is not None
        assert second.graft.recomputed_tokens == 0 and second.graft.proof.verdict == "exact"
        assert second.graft.restored_tokens > 64
        core.reload_engine()
        assert core.resume(second.conversation_id).proof.verdict == "exact"
    finally:
        core.close()


def test_a_pasted_document_is_shared_by_first_messages_on_the_gemma4_test_model(
    gemma4_path: Path, tmp_path: Path
) -> None:
    """Gemma 4 has its own system turn; a document pasted at the start of the first message
    is kept up to its last paragraph break and grafted into the next conversation."""
    from galahad_desktop.memory.results import ChatMessage

    core = _gemma4_core(gemma4_path, tmp_path)
    try:
        doc = "The harbour of Port Elling has three piers; ferries use the north pier. " * 25
        system = ChatMessage("system", "Be brief.")
        first = core.complete_chat([system, ChatMessage("user", doc + "\n\nHow many?")])
        again = core.complete_chat([system, ChatMessage("user", doc + "\n\nWhich pier?")])
        assert first.cached_tokens == 0 and again.conversation_id != first.conversation_id
        assert again.cached_tokens > 400 and again.read_tokens < 20
        assert again.turn.graft is not None and again.turn.graft.proof.verdict == "exact"
        assert all(v.proof == "exact" for v in core.verify())
    finally:
        core.close()
