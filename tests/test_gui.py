"""The desktop window, offscreen, with the real engine and the real OS keyring."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from galahad_desktop.settings import Settings
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.worker import CoreBridge, default_tasks_factory
from tests.conftest import story

pytestmark = [
    pytest.mark.gui,
    pytest.mark.model,
    pytest.mark.keyring,
    pytest.mark.usefixtures("real_keyring"),
]
WAIT_MS = 120_000


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    Settings(data).update({"n_ctx": 4096, "max_tokens": 12})
    return data


@pytest.fixture()
def open_window(qtbot, data_dir: Path) -> Iterator[Callable[[], MainWindow]]:  # type: ignore[no-untyped-def]
    bridges: list[CoreBridge] = []

    def factory() -> MainWindow:
        bridge = CoreBridge(default_tasks_factory(data_dir, None))
        bridges.append(bridge)
        with qtbot.waitSignal(
            bridge.busy_changed, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
        ):
            window = MainWindow(bridge, data_dir, show_dialogs=False)
            qtbot.addWidget(window)
            window.show()
        qtbot.waitUntil(lambda: bridge.pending() == 0, timeout=WAIT_MS)
        return window

    yield factory
    for bridge in bridges:
        bridge.stop()


def _send(qtbot, window: MainWindow, text: str) -> dict:  # type: ignore[no-untyped-def]
    window.input.setPlainText(text)
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as blocker:
        qtbot.mouseClick(window.send_button, Qt.MouseButton.LeftButton)
    return blocker.args[0]


def test_chat_streams_and_resumes_exactly_in_a_new_window(qtbot, open_window) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    pieces: list[str] = []
    window.bridge.worker.streamed.connect(lambda _rid, piece: pieces.append(piece))
    result = _send(qtbot, window, "Tell me about Camelot.")
    assert len(pieces) >= 3 and "".join(pieces) == result["reply"]
    assert result["reply"].strip()[:10] in window.transcript.toPlainText()
    qtbot.waitUntil(lambda: window.conversation_list.count() == 1, timeout=WAIT_MS)
    assert window.context_meter.value() == result["context_tokens"]
    conversation = result["conversation_id"]
    window.close()
    window.bridge.stop()

    again = open_window()  # a new window, a new worker, a new engine, same data directory
    item = again.conversation_list.item(0)
    assert item.data(Qt.ItemDataRole.UserRole) == conversation
    with qtbot.waitSignal(again.conversation_opened, timeout=WAIT_MS) as blocker:
        again.conversation_list.itemClicked.emit(item)
    graft = blocker.args[0]["graft"]
    assert graft["proof"] == "exact" and graft["recomputed_tokens"] == 0
    assert graft["restored_tokens"] > 0
    assert "byte-exact ✓" in again.graft_label.text()
    assert "Tell me about Camelot." in again.transcript.toPlainText()
    follow_up = _send(qtbot, again, "And then?")
    assert follow_up["recomputed_tokens"] == 0 and follow_up["restored_tokens"] == 0


def test_drop_a_document_and_chat_with_it(qtbot, open_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    doc = tmp_path / "knights.txt"
    doc.write_text(story(60))
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(doc))])
    event = QDropEvent(
        QPointF(10, 10),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    progress: list[int] = []
    window.bridge.worker.progressed.connect(lambda _r, done, *_: progress.append(done))
    with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS) as blocker:
        window.dropEvent(event)
        assert window.deposit_bar.isVisible()
    deposited = blocker.args[0]
    assert progress and progress[-1] == deposited["tokens"]
    qtbot.waitUntil(lambda: window.document_list.count() == 1, timeout=WAIT_MS)
    assert "knights.txt" in window.document_list.item(0).text()
    window.document_list.item(0).setSelected(True)
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.chat_with_document()
    answer = _send(qtbot, window, "What is Arthur's access code?")
    assert answer["recomputed_tokens"] == 0 and answer["new_tokens"] < 40

    bad = tmp_path / "photo.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n")
    with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as error:
        window.deposit(bad)
    assert "not supported" in error.args[0]
    window.refresh_lists()
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    assert window.document_list.count() == 1


def test_stop_regenerate_and_forget(qtbot, open_window, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    Settings(data_dir).update({"max_tokens": 200})
    window = open_window()
    first = _send(qtbot, window, "Say hello.")
    window.bridge.worker.streamed.connect(lambda *_: window.stop_button.click())
    stopped = _send(qtbot, window, "Now tell a very long story about a dragon.")
    assert stopped["stop_reason"] == "cancelled" and stopped["generated_tokens"] < 200
    assert "Stopped" in window.graft_label.text()
    window.bridge.worker.streamed.disconnect()

    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as blocker:
        window.regenerate_button.click()
    regenerated = blocker.args[0]
    assert regenerated["proof"] == "exact" and regenerated["recomputed_tokens"] == 0
    assert regenerated["restored_tokens"] == first["context_tokens"] - 3
    assert len(window.messages) == 4

    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    blocks = data_dir / "blocks"
    assert any(blocks.iterdir())
    with qtbot.waitSignal(window.lists_refreshed, timeout=WAIT_MS):
        window.forget_conversation()
    assert window.conversation_list.count() == 0 and window.messages == []
    assert list(blocks.iterdir()) == []


def test_settings_warn_on_runtime_change_and_download_a_model(  # type: ignore[no-untyped-def]
    qtbot, open_window, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from galahad_desktop.ui.dialogs import SettingsDialog
    from tests.fakehub import FakeHub

    window = open_window()
    dialog = SettingsDialog(window)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: "n_batch" in dialog.editors, timeout=WAIT_MS)
    assert dialog.warning.text() == ""
    dialog.editors["temperature"].setValue(0.7)
    assert dialog.warning.text() == ""  # sampling does not change the bits
    dialog.editors["n_batch"].setValue(256)
    assert "stored blocks will be re-read" in dialog.warning.text()

    content = b"GGUF" + bytes(range(256)) * 4096
    with FakeHub("google/gemma-test-GGUF", "gemma-test.gguf", content) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        dialog.start_download(hub.repo, hub.filename)
        qtbot.waitUntil(
            lambda: dialog.model_path.text().endswith("gemma-test.gguf"), timeout=WAIT_MS
        )
    downloaded = Path(dialog.model_path.text())
    assert downloaded.read_bytes() == content and downloaded.parent == data_dir / "models"
    assert "model_path" in dialog.warning.text()
    dialog.reject()


def test_leak_audit_after_a_scripted_session(  # type: ignore[no-untyped-def]
    qtbot, open_window, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    import sqlite3
    import stat
    import sys
    import tempfile
    import time

    import keyring

    from galahad_desktop.ui import app as app_module
    from galahad_desktop.ui.tasks import CoreTasks

    canary = "OSPREY-CANARY-51d2"
    started = time.time()
    app_module.setup_logging(data_dir)

    def explode(self, **_kw):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"a bug that quotes private text: {canary}")

    monkeypatch.setattr(CoreTasks, "explode", explode, raising=False)
    window = open_window()
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    doc = inputs / f"{canary}-minutes.md"
    doc.write_text(story(12, secret=f"The vault word is {canary}."))
    with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS):
        window.deposit(doc)
    qtbot.waitUntil(lambda: window.document_list.count() == 1, timeout=WAIT_MS)
    window.document_list.item(0).setSelected(True)
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.chat_with_document()
    _send(qtbot, window, f"Please remember {canary} for me.")  # also becomes the title
    with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as crash:
        window.bridge.call("explode", on_error=window.show_error)
    assert "Details are in the log file" in crash.args[0] and canary not in crash.args[0]
    try:
        raise ValueError(f"uncaught, quoting {canary}")
    except ValueError:
        app_module.log_crash(*sys.exc_info()[:1], sys.exc_info()[2])
    window.close()
    window.bridge.stop()

    conn = sqlite3.connect(data_dir / "catalog.sqlite")
    vault_id = bytes(conn.execute("SELECT value FROM meta WHERE key='vault_id'").fetchone()[0])
    key_id = bytes(conn.execute("SELECT value FROM meta WHERE key='active_key_id'").fetchone()[0])
    conn.close()
    encoded = keyring.get_password(
        "galahad-desktop", f"master-key/{vault_id.decode()}/{key_id.decode()}"
    )
    assert encoded is not None
    needles = [
        canary.encode(),
        canary.encode("utf-16-le"),
        canary.lower().encode(),
        encoded.encode(),
        base64.b64decode(encoded),
    ]

    def recent_files(root: Path) -> list[Path]:
        out = []
        for path in root.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_mtime >= started:
                    out.append(path)
            except OSError:
                continue
        return out

    searched = recent_files(data_dir)
    temp_root = Path(tempfile.gettempdir())
    searched += [
        p for p in recent_files(temp_root) if inputs not in p.parents and data_dir not in p.parents
    ]
    config = Path.home() / ".config"
    if config.exists():
        searched += recent_files(config)
    assert any(p.name == "galahad.log" for p in searched) and any(
        p.name == "ui.ini" for p in searched
    )
    log_text = (data_dir / "logs" / "galahad.log").read_text()
    assert "RuntimeError" in log_text and "ValueError" in log_text  # crashes were reported
    hits = [str(p) for p in searched for n in needles if n in p.read_bytes()]
    assert hits == []
    for path in [data_dir, *data_dir.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def test_requests_during_a_deposit_are_serialized_safely(  # type: ignore[no-untyped-def]
    qtbot, open_window, tmp_path: Path
) -> None:
    window = open_window()
    first = _send(qtbot, window, "First conversation.")
    window.new_chat()
    second = _send(qtbot, window, "Second conversation.")
    doc = tmp_path / "long.txt"
    doc.write_text(story(150))
    results: dict[str, object] = {}
    window.deposit(doc)
    bridge = window.bridge
    bridge.call(
        "open_conversation",
        first["conversation_id"],
        on_done=lambda r: results.setdefault("opened", r),
    )
    bridge.call(
        "forget", second["conversation_id"], on_done=lambda r: results.setdefault("forgot", r)
    )
    bridge.call("rotate_key", on_done=lambda r: results.setdefault("rotated", r))
    bridge.call(
        "open_conversation",
        first["conversation_id"],
        on_done=lambda r: results.setdefault("reopened", r),
    )
    qtbot.waitUntil(lambda: bridge.pending() == 0, timeout=WAIT_MS)
    assert window.depositing is None and window.document_list.count() == 1
    assert results["opened"]["graft"]["proof"] == "exact"  # type: ignore[index]
    assert results["forgot"]["conversations"] == [second["conversation_id"]]  # type: ignore[index]
    assert results["rotated"]["blocks"] >= 2  # type: ignore[index]
    audit: dict[str, object] = {}
    bridge.call("audit", on_done=lambda r: audit.update(r))
    qtbot.waitUntil(lambda: bool(audit), timeout=WAIT_MS)
    assert audit["problems"] == [] and audit["ok"] == audit["blocks"]
    window.refresh_lists()
    qtbot.waitUntil(lambda: bridge.pending() == 0, timeout=WAIT_MS)
    assert window.conversation_list.count() == 1


def test_mark_verified_and_answer_from_memory(qtbot, open_window) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    _send(qtbot, window, "What is 123456 * 654321 + 17?")  # the 270M model will not know
    with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as refused:
        window.verify_button.click()
    assert "fails its arithmetic check" in refused.args[0]

    window.new_chat()
    first = _send(qtbot, window, "Say a greeting.")
    with qtbot.waitSignal(window.verified_added, timeout=WAIT_MS) as stored:
        window.verify_button.click()
    assert stored.args[0]["verifier"] == "user"
    window.new_chat()
    again = _send(qtbot, window, "Say a greeting.")
    assert again["library"]["mode"] == "recurrence"
    assert again["reply"] == first["reply"] and again["generated_tokens"] == 0
    assert "verified answer from memory" in window.graft_label.text()


def test_ask_a_long_document_and_choose_when_the_router_is_unsure(  # type: ignore[no-untyped-def]
    qtbot, open_window, tmp_path: Path
) -> None:
    from galahad_desktop.bench.corpus import Corpus

    corpus = Corpus(21)
    sections, needles = [], []
    for k in range(5):
        text, planted = corpus.document(700, k, needles=1, decoys=1)
        sections.append(text)
        needles += planted
    doc = tmp_path / "ledger.txt"
    doc.write_text("\n\n".join(sections))
    window = open_window()
    with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS) as blocker:
        window.deposit(doc)
    parts = blocker.args[0]["n_parts"]
    assert parts >= 2
    qtbot.waitUntil(lambda: window.document_list.count() == 1, timeout=WAIT_MS)
    assert f"{parts} parts" in window.document_list.item(0).text()
    window.document_list.item(0).setSelected(True)
    window.chat_with_document()  # a long document opens the routed Ask dialog
    dialog = window.ask_dialog
    dialog.question.setText(f"What is {needles[0].name}'s access code?")
    with qtbot.waitSignal(dialog.answered, timeout=WAIT_MS) as asked:
        qtbot.mouseClick(dialog.ask_button, Qt.MouseButton.LeftButton)
    result = asked.args[0]
    assert result["answered"] and f"of {parts}" in result["citation"]
    assert result["graft"]["recomputed_tokens"] == 0
    assert result["citation"] in dialog.source.text()
    dialog.question.setText(f"What is {corpus.absent_name()}'s access code?")
    with qtbot.waitSignal(dialog.answered, timeout=WAIT_MS) as asked:
        dialog.ask()
    assert not asked.args[0]["answered"]
    assert not dialog.candidates.isHidden() and dialog.candidates.count() >= 1
    assert asked.args[0]["routing"]["reason"] in dialog.answer.toPlainText()  # escaped, whole
    dialog.candidates.setCurrentRow(0)
    with qtbot.waitSignal(dialog.answered, timeout=WAIT_MS) as asked:
        qtbot.mouseClick(dialog.choose_button, Qt.MouseButton.LeftButton)
    chosen = asked.args[0]
    assert chosen["answered"] and chosen["part_id"] == dialog.candidates.item(0).data(
        Qt.ItemDataRole.UserRole
    )


def test_add_a_document_to_an_open_conversation(qtbot, open_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    first = _send(qtbot, window, "Hello there.")
    doc = tmp_path / "orders.txt"
    doc.write_text(story(30, secret="Gareth guards the north gate."))
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as blocker:
        window.add_to_conversation(doc)
    added = blocker.args[0]
    counters = added  # a turn result: counters flattened
    assert counters["recomputed_tokens"] == 0
    assert counters["new_tokens"] > 0
    assert added["context_tokens"] > first["context_tokens"] + counters["new_tokens"] - 8
    assert "orders.txt" in window.transcript.toPlainText()
    assert "Added 'orders.txt'" in window.graft_label.text()
    follow = _send(qtbot, window, "Who guards the north gate?")
    assert follow["recomputed_tokens"] == 0
