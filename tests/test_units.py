"""Fast unit tests: settings, turn format from a chat template, document extraction, proof."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from galahad_desktop.engine import proof
from galahad_desktop.engine.chat_format import (
    GEMMA3_TURNS,
    TemplateNotUnderstood,
    derive_turn_format,
)
from galahad_desktop.errors import AUDIT, InputError
from galahad_desktop.memory.documents.extraction import extract_text
from galahad_desktop.settings import Settings
from galahad_dev.hardening import minimal_pdf

# The shape of Gemma's instruction-tuned template (system text folded into the first turn).
GEMMA_IT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def test_turn_format_is_learned_from_a_template() -> None:
    derived = derive_turn_format(GEMMA_IT_TEMPLATE, "<bos>", "<eos>")
    assert (derived.user_open, derived.user_close_model_open, derived.model_close) == (
        GEMMA3_TURNS.user_open,
        GEMMA3_TURNS.user_close_model_open,
        GEMMA3_TURNS.model_close,
    )
    assert derived.source == "the model's chat template"
    assert not derived.supports_thinking


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ raise_exception('no') }}", "rendering failed"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "no markers"),
        ("{% for m in messages %", "does not parse"),
    ],
)
def test_a_template_that_does_not_fit_says_why(template: str, reason: str) -> None:
    with pytest.raises(TemplateNotUnderstood, match=reason):
        derive_turn_format(template, "<bos>", "")


def test_a_fix_that_is_a_command_is_given_in_each_front_ends_words() -> None:
    from galahad_desktop.engine.vision import cannot_hear
    from galahad_desktop.errors import as_user_error
    from galahad_desktop.vault.crypto import DecryptionFailed, damaged

    refused = cannot_hear()
    assert str(refused).endswith("Run: galahad models get --size E4B --vision")
    assert "galahad" not in refused.in_window() and "Settings" in refused.in_window()
    broken = DecryptionFailed(damaged("messages", "text_enc", "m-1"), **AUDIT)
    assert "Run: galahad audit" in str(broken) and "Run audit" in broken.in_window()
    assert "galahad" not in broken.in_window()
    import sqlite3

    catalog = as_user_error(sqlite3.DatabaseError("file is not a database"))
    assert catalog is not None and "galahad" not in catalog.in_window()
    plain = InputError("Nothing to fix by command.")
    assert str(plain) == plain.in_window() == "Nothing to fix by command."


def test_settings_are_checked_and_saved(tmp_path: Path) -> None:
    settings = Settings(tmp_path)
    assert settings.get("temperature") is None  # the model's recommendation
    assert settings.update({"n_ctx": "4096"}) is True
    assert settings.update({"temperature": 0.7}) is False
    assert Settings(tmp_path).get("n_ctx") == 4096
    with pytest.raises(InputError, match="Unknown setting 'n_cxt'"):
        settings.update({"n_cxt": 1})
    with pytest.raises(InputError, match="'n_ctx' must be at least 512"):
        settings.update({"n_ctx": 10})
    with pytest.raises(InputError, match="'kv_type' must be one of"):
        settings.update({"kv_type": "q2"})
    assert Settings(tmp_path).get("n_ctx") == 4096  # a refused change stored nothing


def test_documents_of_each_kind_are_read(tmp_path: Path) -> None:
    import docx

    (tmp_path / "a.md").write_text("# Title\n\nSome *markdown*.")
    (tmp_path / "a.py").write_text("def f():\n    return 42\n")
    (tmp_path / "a.pdf").write_bytes(minimal_pdf("Hello from a PDF"))
    document = docx.Document()
    document.add_paragraph("Hello from a DOCX")
    document.save(str(tmp_path / "a.docx"))
    assert extract_text(tmp_path / "a.md").startswith("# Title")
    assert "return 42" in extract_text(tmp_path / "a.py")
    assert "Hello from a PDF" in extract_text(tmp_path / "a.pdf")
    assert "Hello from a DOCX" in extract_text(tmp_path / "a.docx")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", b"", "is empty"),
        ("bin.txt", b"\x00\x01\x02binary", "binary"),
        ("latin.txt", "café".encode("latin-1"), "not valid UTF-8"),
        ("broken.pdf", b"%PDF-1.4 garbage", "not a readable PDF"),
        ("broken.docx", b"PK not really a zip", "not a readable .docx"),
        ("image.png", b"\x89PNG....", "not supported"),
        ("blank.txt", b"   \n\n  ", "contains no text"),
    ],
)
def test_bad_documents_get_clear_errors(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        extract_text(path)


@pytest.mark.model  # slow for the fast tier: it starts processes (runs in the full suite)
def test_zip_bomb_docx_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "bomb.docx"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", b"\0" * (300 * 1024 * 1024))
    assert path.stat().st_size < 2 * 1024 * 1024
    with pytest.raises(InputError, match="zip bomb"):
        extract_text(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        extract_text(tmp_path / "nope.txt")


def test_proof_verdicts() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=5000).astype(np.float32)
    record = proof.make_record([1, 2], logits)
    assert proof.compare(record, logits.copy(), 1.0).verdict == "exact"
    nudged = logits.copy()
    nudged[int(np.argmin(logits))] += 1e-3  # tiny change far from the top: close
    close = proof.compare(record, nudged, 1.0)
    assert close.verdict == "close" and close.argmax_agree
    flipped = logits.copy()
    flipped[int(np.argmin(logits))] = logits.max() + 5  # a new winner: diverged
    diverged = proof.compare(record, flipped, 1.0)
    assert diverged.verdict == "diverged" and not diverged.argmax_agree


def test_the_device_is_named_from_where_llama_cpp_put_the_model() -> None:
    import dataclasses

    from galahad_desktop.engine.values import Placement
    from galahad_desktop.memory.results import EngineInfo

    info = EngineInfo(*([None] * 13))  # type: ignore[arg-type]

    def placed(device: str, layers: int, total: int, kv: list[str], variant: str) -> Placement:
        buffers = {name: 1.0 for name in kv}
        return Placement(device, "", layers, total, {}, buffers, variant, {}, "")

    on_cpu = placed("CPU", 0, 19, ["CPU"], "haswell")
    assert dataclasses.replace(info, placement=on_cpu).device_note() == "CPU (haswell kernels)"
    on_gpu = placed("Vulkan0: Radeon 780M", 43, 43, ["Vulkan0"], "zen4")
    assert (
        dataclasses.replace(info, placement=on_gpu).device_note()
        == "Vulkan0: Radeon 780M (43/43 layers, KV cache there)"
    )
    partial = placed("Vulkan0: Radeon 780M", 20, 43, ["CPU", "Vulkan0"], "zen4")
    assert "20/43 layers" in dataclasses.replace(info, placement=partial).device_note()


def test_corpus_names_never_run_out_and_absent_names_are_absent() -> None:
    from galahad_dev.corpus import Corpus

    corpus = Corpus(3)
    texts, needles = [], []
    for part in range(80):
        text, planted = corpus.document(1500, part)
        texts.append(text)
        needles += planted
    absent = [corpus.absent_name() for _ in range(20)]
    everything = "\n".join(texts)
    assert all(
        n.name in everything and f"{n.name}'s access code is {n.code}" in everything
        for n in needles
    )
    assert not any(name in everything for name in absent)
    assert len({n.name for n in needles}) == len(needles)


def test_every_setting_has_one_typed_field_of_its_type() -> None:
    """settings.values is the schema's typed view: the same keys in the same order, each
    field's type the setting's own (optional ones may be None, choices are a Literal)."""
    import dataclasses
    import types
    import typing

    from galahad_desktop.setting_values import SettingValues
    from galahad_desktop.settings import SETTINGS

    hints = typing.get_type_hints(SettingValues)
    assert [f.name for f in dataclasses.fields(SettingValues)] == [s.key for s in SETTINGS]
    for setting in SETTINGS:
        hint = hints[setting.key]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        assert (type(None) in members) == setting.optional, setting.key
        (base,) = [m for m in members if m is not type(None)]
        if setting.choices is not None:
            assert typing.get_origin(base) is typing.Literal, setting.key
            assert typing.get_args(base) == setting.choices, setting.key
        else:
            assert base is setting.type, setting.key


def test_a_renamed_setting_is_taken_up_under_its_new_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from galahad_desktop import settings as settings_module

    (tmp_path / "settings.json").write_text(json.dumps({"context_tokens": 4096}))
    assert Settings(tmp_path).values.n_ctx == 8192  # an unknown key: ignored
    monkeypatch.setitem(settings_module.RENAMED, "context_tokens", "n_ctx")
    migrated = Settings(tmp_path)
    assert migrated.values.n_ctx == 4096 and migrated.problems == []
    migrated.update({"n_batch": 256})
    saved = json.loads((tmp_path / "settings.json").read_text())
    assert saved["n_ctx"] == 4096 and "context_tokens" not in saved


@pytest.mark.parametrize(
    "argv",
    [["serve", "--port", "abc"], ["list", "--bogus"], ["no-such-command"]],
)
def test_a_command_line_that_cannot_be_read_is_bad_input(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from galahad_desktop.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == InputError.exit_code  # 4, as any bad input; argparse says 2
    said = capsys.readouterr().err
    assert "usage: galahad" in said and "Traceback" not in said


def test_show_prints_a_reply_that_called_tools_as_its_calls() -> None:
    from galahad_desktop.cli.chat import shown_text
    from galahad_desktop.memory.results import Message, ToolCall

    call = ToolCall("call-1", "add", {"a": 2, "b": 3})
    called = Message("m1", "model", "", 0.0, 0, 0, None, calls=(call,))
    assert shown_text(called) == '[called add({"a": 2, "b": 3})]'
    said = Message("m2", "model", "Adding.", 0.0, 0, 0, None, calls=(call, call))
    assert shown_text(said).startswith("Adding. [called add(") and "); add(" in shown_text(said)
    plain = Message("m3", "user", "Hello", 0.0, 0, 0, None)
    assert shown_text(plain) == "Hello"


@pytest.mark.parametrize(("blocks", "said"), [(1, "1</b> block on disk"), (3, "3</b> blocks on")])
def test_the_memory_totals_count_blocks_in_words(blocks: int, said: str) -> None:
    from galahad_desktop.memory.results import MemoryStats
    from galahad_desktop.ui.format import memory_summary

    stats = MemoryStats(blocks, 13_600_000, 1_840, 0, 0, [], 0, 0, 0, 13_700_000, 70_000_000)
    text = memory_summary(stats)
    assert said in text and "13.7 MB of the 70.0 MB disk budget" in text
