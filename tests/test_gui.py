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
