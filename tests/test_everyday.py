"""Everyday chat on the fake core (fast tier): the reply loop's stop rules, fresh seeds,
Regenerate's versions (each restored from its own block), a first turn that makes its
conversation, and sampling flags checked like settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from galahad_desktop.engine.decoding import StopRules, decode_reply
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.errors import InputError, IntegrityError
from galahad_desktop.jobs import Job
from galahad_desktop.memory.galahad import Galahad

CoreFactory = Callable[..., Galahad]


class ScriptedModel:
    """Logits that always favour the next scripted token (the loop samples it)."""

    def __init__(self, script: list[int], vocab: int = 300) -> None:
        self.script = list(script)
        self.vocab = vocab
        self.accepted: list[int] = []

    def last_logits(self) -> np.ndarray:
        logits = np.zeros(self.vocab, dtype=np.float32)
        logits[self.script[len(self.accepted)] if len(self.accepted) < len(self.script) else 0] = 9
        return logits

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b"<markup>"

    def room(self) -> int:
        return 1000


RULES = StopRules(
    end_of_generation=lambda t: t == 257,
    turn_markers=frozenset({258, 259}),  # <start_of_turn>, <end_of_turn>
    hidden=frozenset({257, 258, 259, 260}),  # 260: an image marker
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, seed=1)


def test_a_reply_stops_where_the_model_opens_a_new_turn() -> None:
    model = ScriptedModel([*b"Hello", 258, *b"model\nmore"])
    generation = decode_reply(model, RULES, GREEDY, Job())
    assert generation.text == "Hello" and generation.stop_reason == "end"
    assert model.accepted == list(b"Hello")  # the marker is not evaluated


def test_markup_is_never_shown_as_reply_text() -> None:
    streamed: list[str] = []
    model = ScriptedModel([*b"a", 260, *b"b", 257])
    generation = decode_reply(model, RULES, GREEDY, Job(on_text=streamed.append))
    assert generation.text == "ab" and "<markup>" not in "".join(streamed)
    assert 260 in generation.answer_tokens and generation.thought_tokens == 0


def test_a_length_stop_is_reported_and_the_pace_streams() -> None:
    paces: list[tuple[int, float]] = []
    model = ScriptedModel(list(b"x" * 50))
    generation = decode_reply(
        model,
        RULES,
        SamplingParams(temperature=0.0, max_tokens=5),
        Job(on_pace=lambda n, r: paces.append((n, r))),
    )
    assert generation.stop_reason == "length" and [n for n, _r in paces] == [1, 2, 3, 4, 5]


def test_each_generation_gets_its_own_seed_unless_one_is_fixed() -> None:
    seeds = {
        decode_reply(ScriptedModel(list(b"abc")), RULES, SamplingParams(max_tokens=2), Job()).seed
        for _ in range(5)
    }
    assert len(seeds) >= 4
    fixed = decode_reply(ScriptedModel(list(b"abc")), RULES, GREEDY, Job())
    assert fixed.seed == 1


def test_fake_engine_runs_the_real_loop_and_stops_at_a_turn_marker(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    engine = core.engine
    engine.script = [*b"Hi", engine.ids["<start_of_turn>"], *b"user\nforged"]  # type: ignore[attr-defined]
    turn = core.send(None, "Hello", params=core.sampling(max_tokens=30))
    assert turn.reply == "Hi" and turn.stop_reason == "end"
    assert "<start_of_turn>" not in core.messages(turn.conversation_id)[-1].text


def test_three_regenerations_give_different_replies_kept_as_versions(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core(temperature=1.0)
    first = core.send(None, "Tell me a story.", params=core.sampling(max_tokens=12))
    conversation = first.conversation_id
    replies = [first.reply]
    for _ in range(3):
        again = core.regenerate(conversation, params=core.sampling(max_tokens=12))
        replies.append(again.reply)
        assert again.seed is not None and again.counters.recomputed_tokens == 0
    assert len(set(replies)) >= 2 and again.versions == 4
    versions = core.reply_versions(conversation, 1)
    assert [v.text for v in versions] == replies and versions[-1].current
    assert all(v.restorable for v in versions)
    shown = core.messages(conversation)[-1]
    assert (shown.version, shown.versions) == (4, 4)
    # Back to the first version: its own block is grafted, nothing re-read, proved.
    core.reload_engine()
    opened = core.choose_version(conversation, 1)
    assert opened.graft.recomputed_tokens == 0 and opened.graft.proof.verdict == "exact"
    assert opened.messages[-1].text == replies[0] and opened.messages[-1].version == 1
    next_turn = core.send(conversation, "Go on.", params=core.sampling(max_tokens=6))
    assert next_turn.counters.recomputed_tokens == 0
    # Earlier versions keep their text once the conversation has moved on, not their blocks.
    kept = core.reply_versions(conversation, 1)
    assert [v.text for v in kept] == replies and not any(v.restorable for v in kept[1:])
    assert core.audit().problems == []
    core.forget(conversation)
    assert core.vault.catalog.count("reply_versions") == 0


def test_a_replys_versions_keep_blocks_by_bytes_too(make_fake_core: CoreFactory) -> None:
    """On a large model each version's block is big (a long 31B reply: 0.8 GB): the newest
    versions keep theirs while they fit what kept checkpoints may take (a sixteenth of the
    disk budget here); older ones keep their words and say to regenerate."""
    core = make_fake_core(temperature=1.0)
    first = core.send(None, "Tell me a story.", params=core.sampling(max_tokens=12))
    conversation = first.conversation_id
    head = core.vault.catalog.select("blocks", id=core.head_block(conversation))[0]
    one = int(head["file_bytes"])  # a reply's link: each version keeps one like it
    core.update_settings({"disk_budget": 16 * (5 * one // 2)})  # room for two versions' links
    for _ in range(4):
        core.regenerate(conversation, params=core.sampling(max_tokens=12))
    versions = core.reply_versions(conversation, 1)
    assert [v.restorable for v in versions] == [False, False, True, True, True]
    blocks = core.vault.catalog.select("blocks", owner_id=conversation)
    assert len(blocks) == 3  # the current reply's block and the two versions that fit
    with pytest.raises(InputError, match="regenerate instead"):
        core.choose_version(conversation, 1)
    opened = core.choose_version(conversation, 3)  # a kept one still comes back exact
    assert opened.graft.recomputed_tokens == 0 and opened.graft.proof.verdict == "exact"
    assert core.audit().problems == []


def test_a_seed_reproduces_a_reply(make_fake_core: CoreFactory) -> None:
    core = make_fake_core(temperature=1.0)
    first = core.send(None, "Pick a word.", params=core.sampling(max_tokens=10))
    assert first.seed is not None
    assert core.messages(first.conversation_id)[-1].seed == first.seed
    again = core.send(None, "Pick a word.", params=core.sampling(max_tokens=10, seed=first.seed))
    assert again.reply == first.reply


def test_a_first_turn_that_fails_leaves_no_conversation(make_fake_core: CoreFactory) -> None:
    core = make_fake_core()
    with pytest.raises(InputError):
        core.send(None, "   ")
    with pytest.raises(InputError, match=r"encoding|surrogate|character"):
        core.send(None, "bad\udcffbyte")
    job = Job.cancellable()

    def boom(_piece: str) -> None:
        raise RuntimeError("the window went away")

    with pytest.raises(RuntimeError):
        core.send(None, "Hello", Job(on_text=boom, cancel=job.cancel))
    assert core.list_conversations() == []
    assert core.vault.catalog.count("blocks") == 0


def test_a_stray_byte_in_a_stored_chat_is_named_before_the_context_check(
    make_fake_core: CoreFactory,
) -> None:
    # The command checks the room a message needs before the turn: that check tokenizes,
    # and llama.cpp's tokenizer cannot take an unpaired surrogate (exit 70, found by the
    # hostile-input harness).
    core = make_fake_core()
    done = core.send(None, "Hello", max_tokens=2)
    with pytest.raises(InputError, match="surrogate at character 3"):
        core.context_check(done.conversation_id, "bad\udcffbyte")
    assert len(core.messages(done.conversation_id)) == 2


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"seed": -1}, "seed"),
        ({"temperature": float("nan")}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_sampling_flags_are_checked_like_settings(
    make_fake_core: CoreFactory, change: dict[str, float], named: str
) -> None:
    core = make_fake_core()
    with pytest.raises(InputError, match=named):
        core.sampling(**change)


@pytest.mark.parametrize("expression", ["0**-1", "0^-1", "0.0**-1", "(1-1)**-2", "(2-2)^-3"])
def test_the_verifiers_arithmetic_is_total(expression: str) -> None:
    from galahad_desktop.memory.verified.verifiers import ArithmeticVerifier

    verdict = ArithmeticVerifier().check(f"What is {expression}?", "It is 0.")
    assert not verdict.ok  # cannot verify: said, never raised


def test_a_turn_with_arithmetic_that_divides_by_zero_is_answered(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    turn = core.send(None, "What is 0**-1?", params=core.sampling(max_tokens=4))
    assert turn.conversation_id and len(core.messages(turn.conversation_id)) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["--data-dir", "~nosuchuser/x", "list"],
        ["backup", "~nosuchuser/b"],
        ["restore", "~nosuchuser/b"],
        ["keys", "import", "~nosuchuser/k.json"],
        ["settings", "model_path=~nosuchuser/m.gguf"],
        ["settings", "embedding_model=~nosuchuser/m.gguf"],
    ],
)
def test_a_home_that_does_not_exist_is_a_clear_error(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], keystore: Any
) -> None:
    from galahad_desktop import cli

    full = argv if argv[0] == "--data-dir" else ["--data-dir", str(tmp_path / "d"), *argv]
    with mock.patch("galahad_desktop.vault.keys.KeyringKeyStore", lambda *a, **k: keystore):
        assert cli.main(["--data-dir", str(tmp_path / "d"), "list"]) == 0  # a catalog exists
        code = cli.main(full)
    err = capsys.readouterr().err
    assert code == 4 and "~nosuchuser" in err and "Traceback" not in err


def test_a_reading_command_says_at_once_that_the_window_holds_the_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keystore: Any
) -> None:
    """Issue #59 item 6: `galahad storage` waited 10.6 s while the window was open, then
    said only "Another Galahad process is using …"."""
    import subprocess
    import sys
    import time

    from galahad_desktop import cli
    from galahad_desktop.system.lock import LOCK_NAME

    data = ["--data-dir", str(tmp_path / "d")]
    with mock.patch("galahad_desktop.vault.keys.KeyringKeyStore", lambda *a, **k: keystore):
        assert cli.main([*data, "list"]) == 0
        holder = subprocess.Popen(  # the window, as far as the lock is concerned
            [
                sys.executable,
                "-c",
                "import filelock, sys, time; held = filelock.FileLock(sys.argv[1]); "
                "held.acquire(); print('held', flush=True); time.sleep(60)",
                str(tmp_path / "d" / LOCK_NAME),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            for command in (["storage"], ["audit"]):
                capsys.readouterr()
                started = time.monotonic()
                code = cli.main([*data, *command])
                err = capsys.readouterr().err
                assert code == 8 and time.monotonic() - started < 5, (command, err)
                assert f"`galahad {command[0]}` reads it only when nothing else does" in err
                assert "Memory panel" in err and "Traceback" not in err
        finally:
            holder.kill()
            holder.wait()


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_settings_file_that_is_not_a_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    import os
    import threading

    from galahad_desktop.settings import Settings

    path = tmp_path / "settings.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    loaded: list[Settings] = []
    reader = threading.Thread(target=lambda: loaded.append(Settings(tmp_path)), daemon=True)
    reader.start()
    reader.join(5)
    assert loaded, "reading the settings hung"
    assert loaded[0].get("checkpoints") == 8 and "unreadable" in loaded[0].problems[0]


def test_the_recovery_kit_never_goes_inside_the_data_directory(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    core = make_fake_core()
    for place in (core.data_dir / "kit.json", core.data_dir / "blocks" / "kit.json"):
        with pytest.raises(InputError, match="inside Galahad's data directory"):
            core.export_recovery_kit("a recovery phrase 42 horse", place)
        assert not place.exists()
    assert core.audit().problems == []


def test_audit_repair_moves_a_file_it_did_not_write_instead_of_deleting_it(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    stranger = core.vault.blocks_dir / "kit.json"
    stranger.write_text('{"format": "someone else\'s"}')
    repaired = core.audit(repair=True)
    moved = core.data_dir / "quarantine" / "kit.json"
    assert not stranger.exists() and moved.read_text().startswith('{"format"')
    assert any("not deleted" in line and str(moved) in line for line in repaired.repaired)


def test_a_conversation_keeps_its_own_creativity_reply_limit_and_system_prompt(
    make_fake_core: CoreFactory,
) -> None:
    core = make_fake_core()
    first = core.send(
        None, "Hello", system_prompt="Answer like a pirate-9183.", temperature=0.0, max_tokens=3
    )
    conversation = first.conversation_id
    assert first.counters.generated_tokens <= 3
    assert core.conversation_sampling(conversation) == {"temperature": 0.0, "max_tokens": 3}
    assert core.conversation_system_prompt(conversation) == "Answer like a pirate-9183."
    assert b"pirate-9183" not in (core.data_dir / "catalog.sqlite").read_bytes()
    core.set_conversation_sampling(conversation, None, 5)
    assert core.sampling(conversation).max_tokens == 5
    # Elsewhere the model's own longest reply (Settings leave it empty by default).
    assert core.sampling().max_tokens == core.engine.sampling_defaults().max_tokens != 5
    with pytest.raises(InputError, match="temperature"):
        core.set_conversation_sampling(conversation, float("nan"), None)
    assert core.audit().problems == []
    # Its own words are sealed with it: removed from the record, it is refused by name.
    with core.vault.transaction():
        core.vault.catalog.update("conversations", conversation, {"system_enc": None})
    with pytest.raises(IntegrityError, match=conversation):
        core.messages(conversation)


def test_newlines_and_spaces_are_text_even_when_a_tokenizer_keeps_them_whole() -> None:
    from galahad_desktop.engine.decoding import is_tag

    assert is_tag("<|channel>") and is_tag("<start_of_image>") and is_tag("<unused12>")
    assert not any(is_tag(t) for t in ("\n", "\n\n", "    ", "<", "a<b>", "<>"))


def test_a_system_prompt_shared_by_conversations_is_read_once_and_grafted(
    make_fake_core: CoreFactory,
) -> None:
    # Gemma 4's own system turn (Gemma 3 folds a system prompt into the first user turn).
    core = make_fake_core("gemma4")
    words = "You are the harbour master's assistant. Answer in one short sentence. " * 2
    first = core.send(None, "Hello", system_prompt=words, max_tokens=4)
    assert first.graft is None and first.counters.new_tokens > len(words)  # read once here
    assert core.vault.catalog.count("prompts") == 1
    second = core.send(None, "Hi again", system_prompt=words, max_tokens=4)
    graft = second.graft
    assert graft is not None and graft.recomputed_tokens == 0 and graft.restored_tokens > 100
    assert graft.proof.verdict == "exact"
    assert core.vault.catalog.count("prompts") == 1  # shared, not stored twice
    # Each conversation's own first block holds the prompt too: it resumes on its own.
    core.reload_engine()
    assert core.resume(second.conversation_id).proof.verdict == "exact"
    assert core.audit().problems == []
    assert b"harbour master" not in (core.data_dir / "catalog.sqlite").read_bytes()
    core.forget(first.conversation_id)
    assert core.vault.catalog.count("prompts") == 1  # still used by the second
    core.forget(second.conversation_id)
    assert core.vault.catalog.count("prompts") == 0 and core.vault.catalog.count("blocks") == 0
    assert list(core.vault.blocks_dir.iterdir()) == []


def test_an_export_from_a_newer_galahad_is_refused_by_version(
    make_fake_core: CoreFactory, tmp_path: Path
) -> None:
    import json

    core = make_fake_core()
    export = tmp_path / "future.json"
    export.write_text(
        json.dumps({"format": "galahad-conversation", "version": 99, "title": "x", "messages": []})
    )
    with pytest.raises(InputError, match="version 99"):
        core.import_conversations(export)
    assert core.list_conversations() == []


@pytest.mark.model  # slow for the fast tier: it starts processes (runs in the full suite)
def test_an_import_that_brings_nothing_in_is_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keystore: Any
) -> None:
    import json

    from galahad_desktop import cli

    export = tmp_path / "empty.json"
    export.write_text(
        json.dumps(
            {
                "format": "galahad-conversations",
                "version": 1,
                "conversations": [{"title": "nothing said", "messages": []}],
            }
        )
    )
    data = ["--data-dir", str(tmp_path / "d")]
    with mock.patch("galahad_desktop.vault.keys.KeyringKeyStore", lambda *a, **k: keystore):
        code = cli.main([*data, "import", str(export)])
    captured = capsys.readouterr()
    assert code == 4 and "Nothing was imported" in captured.err, captured


def test_the_longest_reply_is_the_model_s_until_settings_say(make_fake_core: Any) -> None:
    """A small model gets 256 tokens (the embedded 270M wandered on for 20 s at 1,024),
    a billion parameters and more 1,024; a value in Settings wins over both."""
    import dataclasses

    core = make_fake_core()
    engine = core.engine
    assert engine.model.facts.n_params < 10**9 and core.sampling().max_tokens == 256
    engine.model.facts = dataclasses.replace(engine.model.facts, n_params=4 * 10**9)
    assert core.sampling().max_tokens == 1024
    core.update_settings({"max_tokens": 600})
    assert core.sampling().max_tokens == 600
