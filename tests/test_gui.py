"""The desktop window with the real engine and the real OS keyring: offscreen, and again under
a real X server (scripts/test.sh runs this file with QT_QPA_PLATFORM=xcb under Xvfb and a
window manager, so focus, drag and drop and dialogs behave as on a desktop)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QMenu

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import TurnResult
from galahad_desktop.settings import Settings
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.worker import CoreBridge, default_core_factory
from galahad_dev import import_samples as import_fixtures
from tests.helpers import photo, story, when_a_modal_opens, window_opener

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
    Settings(data).update({"n_ctx": 4096, "max_tokens": 12, "temperature": 0.0})
    return data


class ScriptedPrompts:
    """The window's modal questions, answered by the test (no dialog opens)."""

    def __init__(self) -> None:
        self.context = "stop"  # stop | summary | recent
        self.drop = "Add to this conversation"
        self.confirmed = True
        self.save_to: Path | None = None
        self.warnings: list[str] = []
        self.informed: list[str] = []

    def warn(self, title: str, message: str) -> None:
        self.warnings.append(message)

    def inform(self, title: str, message: str) -> None:
        self.informed.append(message)

    def confirm(self, title: str, text: str) -> bool:
        return self.confirmed

    def choose(self, title: str, text: str, buttons: list[str]) -> str:
        assert self.drop in buttons
        return self.drop

    def context_full(self, full: Any) -> str:
        return self.context

    def save_path(self, title: str, suggested: Path, filters: str) -> tuple[Path | None, str]:
        return self.save_to, ""

    def show(self, dialog: Any) -> None:
        pass


@pytest.fixture()
def open_window(qtbot, data_dir: Path) -> Iterator[Callable[..., MainWindow]]:  # type: ignore[no-untyped-def]
    with window_opener(qtbot, ScriptedPrompts(), WAIT_MS) as open_on:

        def factory(model: Path | None = None) -> MainWindow:
            window: MainWindow = open_on(
                CoreBridge(default_core_factory(data_dir, model)), data_dir
            )
            return window

        yield factory


def _send(qtbot, window: MainWindow, text: str) -> TurnResult:  # type: ignore[no-untyped-def]
    window.chat.input.setPlainText(text)
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as blocker:
        qtbot.mouseClick(window.chat.send_button, Qt.MouseButton.LeftButton)
    result: TurnResult = blocker.args[0]
    return result


def _items(window: MainWindow) -> list[Any]:
    lst = window.sidebar.conversation_list
    return [lst.item(i) for i in range(lst.count()) if lst.item(i).data(Qt.ItemDataRole.UserRole)]


def _drop(window: MainWindow, path: Path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    window.dropEvent(
        QDropEvent(
            QPointF(10, 10),
            Qt.DropAction.CopyAction,
            mime,
            Qt.MouseButton.LeftButton,
            Qt.KeyboardModifier.NoModifier,
        )
    )


def test_the_window_runs_on_the_platform_asked_for(qapp) -> None:  # type: ignore[no-untyped-def]
    """offscreen in the first pass; xcb (a real X server) in the second."""
    assert QGuiApplication.platformName() == os.environ["QT_QPA_PLATFORM"]


def test_first_screen_explains_itself(qtbot, open_window, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GALAHAD_FAKE_MEMORY_GIB", "12")
    monkeypatch.setenv("GALAHAD_FAKE_SPEED", "1600,80")  # a desktop where E4B is quick
    window = open_window()
    assert window.pages.currentWidget() is window.welcome
    text = window.welcome.model_label.text()
    assert "Gemma 3 270M" in text or "gemma" in text.lower()
    assert "does not follow instructions" in text  # the embedded demo model says what it is
    # No embedding model set: the router says so, one hover away (plain words first).
    assert "matched by words alone" in window.welcome.model_label.toolTip()
    assert "BM25" not in text and "turn format" not in text
    qtbot.waitUntil(lambda: window.welcome.offer.isVisible(), timeout=WAIT_MS)
    offer = window.welcome.offer_label.text()
    assert "Recommended for this computer: Gemma 4 E4B" in offer and "KiB" in offer
    assert "drop" in window.welcome.drop_zone.text().lower()
    labels = [window.model_switcher.itemText(i) for i in range(window.model_switcher.count())]
    assert any("embedded demo" in label for label in labels)
    assert any("Gemma 4 E2B — download" in label for label in labels)


def test_chat_streams_and_resumes_exactly_in_a_new_window(qtbot, open_window) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    pieces: list[str] = []
    window.bridge.worker.streamed.connect(lambda _rid, piece: pieces.append(piece))
    result = _send(qtbot, window, "Tell me about Camelot.")
    assert len(pieces) >= 3 and "".join(pieces) == result.reply
    assert result.reply.strip()[:10] in window.chat.transcript.toPlainText()
    qtbot.waitUntil(lambda: len(_items(window)) == 1, timeout=WAIT_MS)
    assert window.sidebar.conversation_list.item(0).text() == "Today"  # grouped by date
    assert window.context_meter.value() == result.context_tokens
    conversation = result.conversation_id
    window.close()
    window.bridge.stop()

    again = open_window()  # a new window, a new worker, a new engine, same data directory
    qtbot.waitUntil(lambda: len(_items(again)) == 1, timeout=WAIT_MS)
    item = _items(again)[0]
    assert item.data(Qt.ItemDataRole.UserRole) == conversation
    with qtbot.waitSignal(again.conversation_opened, timeout=WAIT_MS) as blocker:
        again.sidebar.conversation_list.itemClicked.emit(item)
    graft = blocker.args[0].graft
    assert graft.proof.verdict == "exact" and graft.recomputed_tokens == 0
    assert graft.restored_tokens > 0
    assert "byte-exact ✓" in again.graft_label.text()
    assert "Tell me about Camelot." in again.chat.transcript.toPlainText()
    follow_up = _send(qtbot, again, "And then?")
    assert follow_up.counters.recomputed_tokens == 0 and follow_up.counters.restored_tokens == 0


def test_the_window_s_local_server_refuses_a_hostile_schema_and_goes_on(  # type: ignore[no-untyped-def]
    qtbot, open_window
) -> None:
    """Issue #60 item 3: a program's JSON schema with maxItems 20,000 crashed llama.cpp's
    grammar parser (signal 11) and, through the window's local server, the window with it."""
    window = open_window()
    panel = window.open_server_panel()
    qtbot.waitUntil(lambda: bool(panel.key.text()), timeout=WAIT_MS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        panel.port.setValue(int(probe.getsockname()[1]))
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.toggle, Qt.MouseButton.LeftButton)
    client = openai.OpenAI(
        base_url=panel.address.text(), api_key=panel.key.text(), timeout=60, max_retries=0
    )
    said: list[Any] = []

    def held_to(schema: dict[str, Any], max_tokens: int) -> Any:
        return client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Numbers."}],
            max_tokens=max_tokens,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        )

    def program() -> None:
        for count in (20_000, 100_000):
            try:
                held_to({"type": "array", "items": {"type": "integer"}, "maxItems": count}, 4)
            except openai.BadRequestError as refused:
                said.append(refused.body)
        small = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        said.append(held_to(small, 12))

    caller = threading.Thread(target=program)
    caller.start()
    qtbot.waitUntil(lambda: not caller.is_alive(), timeout=WAIT_MS)
    assert len(said) == 3, said
    for body in said[:2]:  # each refused in OpenAI's shape, naming the schema's part
        assert "maxItems" in body["message"] and body["param"].startswith("response_format")
    assert said[2].choices[0].message.content.startswith("{")  # held to the small schema
    result = _send(qtbot, window, "Still there?")  # the window goes on
    assert result.reply.strip()
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.toggle, Qt.MouseButton.LeftButton)


def test_rename_search_copy_and_keyboard(qtbot, open_window) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    first = _send(qtbot, window, "Tell me about the lake.")
    window.new_chat()
    _send(qtbot, window, "Where is the bakery? ```print('hi')```")
    qtbot.waitUntil(lambda: len(_items(window)) == 2, timeout=WAIT_MS)
    item = window.sidebar.item_of(first.conversation_id)
    assert item is not None
    with qtbot.waitSignal(window.lists_refreshed, timeout=WAIT_MS):
        item.setText("Lake notes")  # what an inline edit does
    assert window.sidebar.item_of(first.conversation_id).text() == "Lake notes"
    window.sidebar.search.setText("bakery")  # message text, not a title
    qtbot.waitUntil(lambda: len(_items(window)) == 1, timeout=WAIT_MS)
    assert _items(window)[0].text() != "Lake notes"
    window.sidebar.search.setText("")
    qtbot.waitUntil(lambda: len(_items(window)) == 2, timeout=WAIT_MS)
    copied: list[str] = []
    window.chat.copied.connect(copied.append)
    window.chat._anchor(QUrl("galahad:copy/1"))
    assert copied[-1] == window.chat.messages[1].text
    assert QGuiApplication.clipboard().text() == copied[-1]
    window.chat.messages.append(window.chat.messages[-1].__class__("model", "x\n```py\nx = 1\n```"))
    window.chat._anchor(QUrl(f"galahad:copy-code/{len(window.chat.messages) - 1}/0"))
    assert copied[-1] == "x = 1\n"
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS) as opened:
        window.step_conversation(1)  # Alt+Down: the next conversation in the list
    assert opened.args[0].summary.id in {first.conversation_id, window.sidebar.ids()[-1]}


def test_drop_a_document_and_chat_with_it(qtbot, open_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    doc = tmp_path / "knights.txt"
    doc.write_text(story(60))
    progress: list[int] = []
    window.bridge.worker.progressed.connect(lambda _r, done, *_: progress.append(done))
    with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS) as blocker:
        _drop(window, doc)
        assert window.sidebar.deposit_bar.isVisible()
    deposited = blocker.args[0]
    assert progress and progress[-1] == deposited.tokens
    qtbot.waitUntil(lambda: window.sidebar.document_list.count() == 1, timeout=WAIT_MS)
    assert "knights.txt" in window.sidebar.document_list.item(0).text()
    window.sidebar.document_list.item(0).setSelected(True)
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.chat_with_document()
    answer = _send(qtbot, window, "What is Arthur's access code?")
    assert answer.counters.recomputed_tokens == 0 and answer.counters.new_tokens < 40
    # Dropped onto the open conversation: the window asks, and adds it as a chain link.
    second = tmp_path / "orders.txt"
    second.write_text(story(30, secret="Gareth guards the north gate."))
    window.prompts.drop = "Add to this conversation"
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as added:
        _drop(window, second)
    assert added.args[0].counters.recomputed_tokens == 0
    assert "Added 'orders.txt'" in window.graft_label.text()

    bad = tmp_path / "photo.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n")
    window.new_chat()
    with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as error:
        window.deposit(bad)
    assert "reads no pictures" in error.args[0]  # Gemma 3 270M has no vision projector


def test_library_documents_stack_into_a_chat_and_files_go_into_a_new_one(  # type: ignore[no-untyped-def]
    qtbot, open_window, tmp_path: Path
) -> None:
    window = open_window()
    for name, code in (("north", "4417"), ("south", "9031"), ("east", "2268")):
        path = tmp_path / f"{name}.txt"
        path.write_text(story(20, f"The {name} gate code is {code}."))
        with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS):
            window.deposit(path)
    listed = window.sidebar.document_list
    qtbot.waitUntil(lambda: listed.count() == 3, timeout=WAIT_MS)
    rows = {listed.item(i).text().split("\n")[0]: i for i in range(listed.count())}
    for name in ("north.txt", "south.txt"):
        row = next(i for text, i in rows.items() if name in text)
        listed.item(row).setSelected(True)
    assert window.sidebar.chat_document_button.text() == "Chat with these 2 documents"
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.chat_with_document()
    qtbot.waitUntil(lambda: window.graft_label.text().startswith("Stacked"), timeout=WAIT_MS)
    assert "recomputed" in window.graft_label.text()
    assert "not byte-exact" in window.graft_label.text()
    assert sorted(window.chat.documents) == ["north.txt", "south.txt"]
    answer = _send(qtbot, window, "What is the south gate code?")
    assert answer.counters.recomputed_tokens == 0  # the stack is stored: nothing re-done
    # The attach menu stacks the third on the open chat; the two it holds are greyed out.
    menu = QMenu()
    window.fill_attach_menu(menu)
    actions = {a.text(): a for a in menu.actions()}
    assert not actions["north.txt"].isEnabled() and actions["east.txt"].isEnabled()
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as added:
        actions["east.txt"].trigger()
    stack = added.args[0].stack
    assert stack is not None and stack.documents == ("east.txt",) and stack.reread_tokens == 0
    assert window.graft_label.text().startswith("Stacked 'east.txt'")
    assert "east.txt" in window.chat.documents
    # A new, empty chat: files attached go into it (read once, kept, the second stacked).
    window.new_chat()
    assert window.conversation_id is None
    first, second = tmp_path / "west.txt", tmp_path / "harbour.txt"
    first.write_text(story(15, "The west gate code is 7710."))
    second.write_text(story(15, "The harbour gate code is 3381."))
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS) as opened:
        window.start_chat_on_files([first, second])
    assert opened.args[0].summary.id == window.conversation_id
    qtbot.waitUntil(lambda: "Stacked 'harbour.txt'" in window.graft_label.text(), timeout=WAIT_MS)
    assert sorted(window.chat.documents) == ["harbour.txt", "west.txt"]
    qtbot.waitUntil(lambda: listed.count() == 5, timeout=WAIT_MS)


def test_a_picture_through_the_window(  # type: ignore[no-untyped-def]
    qtbot, open_window, vision_model: Path, tmp_path: Path
) -> None:
    window = open_window(vision_model)
    with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS) as blocker:
        _drop(window, photo(tmp_path / "garden.png"))
    deposited = blocker.args[0]
    assert deposited.pictures == 1 and deposited.image_tokens >= 70
    status = window.graft_label.text()
    assert f"Read picture 'garden.png' ({deposited.image_tokens} tokens)" in status
    assert "stored" in status
    qtbot.waitUntil(lambda: deposited.document_id in window.sidebar.picture_icons, timeout=WAIT_MS)
    assert not window.sidebar.document_list.item(0).icon().isNull()  # its thumbnail
    window.sidebar.document_list.item(0).setSelected(True)
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.chat_with_document()
    opened = window.last_graft  # the picture's block, grafted when the chat opened
    assert opened is not None and opened.proof.verdict == "exact"
    assert opened.recomputed_tokens == 0 and opened.restored_tokens == deposited.tokens
    answer = _send(qtbot, window, "What grows in the garden?")
    assert answer.counters.recomputed_tokens == 0
    # A second picture dropped on the open conversation: a chain link holding its tokens.
    window.prompts.drop = "Add to this conversation"
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as added:
        _drop(window, photo(tmp_path / "pond.png", seed=5))
    assert added.args[0].image_tokens >= 70 and added.args[0].counters.recomputed_tokens == 0
    assert "Read picture 'pond.png'" in window.graft_label.text()
    qtbot.waitUntil(lambda: any(m.picture for m in window.chat.messages), timeout=WAIT_MS)
    html = window.chat.transcript.toHtml()
    assert "galahad-picture:" in html
    shown = next(m.picture for m in window.chat.messages if m.picture)
    key = window.chat.thumbnails.key(shown)
    thumbnail = window.chat.transcript.loadResource(2, QUrl(f"galahad-picture:{key}"))
    assert thumbnail is not None and max(thumbnail.width(), thumbnail.height()) <= 220
    # A picture pasted into the message box: read into the conversation, never a file.
    pasted = QMimeData()
    pasted.setImageData(QImage(str(photo(tmp_path / "clip.png", seed=8))))
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as added:
        window.chat.input.insertFromMimeData(pasted)
    assert added.args[0].image_tokens >= 70 and added.args[0].counters.recomputed_tokens == 0
    assert "Read picture 'pasted-" in window.graft_label.text()
    assert sum(1 for m in window.chat.messages if m.picture) == 2  # pond.png and the paste
    # No other picture is ever loaded into the transcript (a reply cannot fetch a file).
    assert (
        window.chat.transcript.loadResource(2, QUrl.fromLocalFile(str(tmp_path / "pond.png")))
        is None
    )


def test_a_voice_memo_through_the_window(  # type: ignore[no-untyped-def]
    qtbot, open_window, hearing_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_memos import long_memo, spoken

    heard = tmp_path / "heard.raw"  # a stand-in sound player keeps what it is given
    player = tmp_path / "bin" / "paplay"
    player.parent.mkdir()
    player.write_text(f"#!/bin/sh\nsleep 0.5\ncat > {heard}\n")
    player.chmod(0o755)
    monkeypatch.setenv("PATH", f"{player.parent}:{os.environ['PATH']}")
    window = open_window(hearing_model)
    with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS) as blocker:
        _drop(window, spoken(tmp_path, "Water the pear trees on Friday.", "orchard.wav"))
    deposited = blocker.args[0]
    assert deposited.sounds == 1 and deposited.audio_tokens >= 25
    status = window.graft_label.text()
    assert "Heard voice memo 'orchard.wav'" in status and "stored" in status
    qtbot.waitUntil(lambda: window.sidebar.document_list.count() == 1, timeout=WAIT_MS)
    assert "voice memo" in window.sidebar.document_list.item(0).text()
    play = window.sidebar.play_document_button
    assert not play.isVisibleTo(window)
    window.sidebar.document_list.item(0).setSelected(True)
    assert play.isVisibleTo(window)  # a memo is selected: it can be played
    play.click()
    qtbot.waitUntil(lambda: "Stop" in play.text(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: "Play" in play.text(), timeout=WAIT_MS)
    # Every sample of the memo (its length is reported to the millisecond: 16 samples).
    assert abs(len(heard.read_bytes()) / 2 - deposited.audio_seconds * 16_000) <= 16
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.chat_with_document()
    opened = window.last_graft  # the memo's block, grafted when the chat opened
    assert opened is not None and opened.proof.verdict == "exact"
    assert opened.recomputed_tokens == 0 and opened.restored_tokens == deposited.tokens
    # A longer memo dropped on the open conversation: one turn, heard in its two parts.
    window.prompts.drop = "Add to this conversation"
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as added:
        _drop(window, long_memo(tmp_path, 40))
    assert added.args[0].audio_tokens >= 30 * 25 and added.args[0].counters.recomputed_tokens == 0
    assert "Heard voice memo 'long-40.wav'" in window.graft_label.text()
    qtbot.waitUntil(lambda: any(m.sound for m in window.chat.messages), timeout=WAIT_MS)
    index = next(i for i, m in enumerate(window.chat.messages) if m.sound)
    html = window.chat.transcript.toHtml()
    assert f"galahad:play/{index}" in html and "long-40.wav" in html
    answer = _send(qtbot, window, "What did I record?")
    assert answer.counters.recomputed_tokens == 0


def test_stop_regenerate_and_forget(qtbot, open_window, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    Settings(data_dir).update({"max_tokens": 200})
    window = open_window()
    first = _send(qtbot, window, "Say hello.")
    window.bridge.worker.streamed.connect(lambda *_: window.chat.stop_button.click())
    stopped = _send(qtbot, window, "Now tell a very long story about a dragon.")
    assert stopped.stop_reason == "cancelled" and stopped.counters.generated_tokens < 200
    assert "Stopped" in window.graft_label.text()
    window.bridge.worker.streamed.disconnect()
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as blocker:
        window.chat.regenerate_button.click()
    regenerated = blocker.args[0]
    assert regenerated.proof.verdict == "exact" and regenerated.counters.recomputed_tokens == 0
    assert regenerated.counters.restored_tokens == first.context_tokens - 3
    assert len(window.chat.messages) == 4
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    blocks = data_dir / "blocks"
    assert any(blocks.iterdir())
    with qtbot.waitSignal(window.lists_refreshed, timeout=WAIT_MS):
        window.forget_conversation()
    assert _items(window) == [] and window.chat.messages == []
    assert list(blocks.iterdir()) == []


def test_a_full_context_offers_choices_and_continues(qtbot, open_window, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    Settings(data_dir).update({"n_ctx": 512, "max_tokens": 8})
    window = open_window()
    for turn in range(10):
        _send(qtbot, window, f"Turn {turn}: tell me about the castle walls and the towers.")
    full_seen: list[Any] = []
    window.context_full.connect(full_seen.append)
    errors: list[str] = []
    window.error_shown.connect(errors.append)
    window.prompts.context = "recent"
    window.chat.input.setPlainText("One more question about the towers " * 40)
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as blocker:
        qtbot.mouseClick(window.chat.send_button, Qt.MouseButton.LeftButton)
    assert errors == []
    assert full_seen and [o.kind for o in full_seen[0].options][:2] == ["stop", "summary"]
    continued = blocker.args[0]
    assert continued.counters.recomputed_tokens == 0
    qtbot.waitUntil(
        lambda: any("(continued)" in c.title for c in window.sidebar.conversations),
        timeout=WAIT_MS,
    )


def test_settings_model_switch_and_download(  # type: ignore[no-untyped-def]
    qtbot, open_window, data_dir: Path, gemma4_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from galahad_desktop.models import catalog
    from galahad_desktop.ui.settings_dialog import SettingsDialog
    from tests.fakehub import FakeHub

    window = open_window()
    dialog = SettingsDialog(window, window)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: "n_batch" in dialog.editors, timeout=WAIT_MS)
    assert dialog.warning.text() == ""
    dialog.editors["temperature"].setText("0.7")
    assert dialog.warning.text() == ""  # sampling does not change the bits
    dialog.editors["n_batch"].setValue(256)
    assert "read again once when next used" in dialog.warning.text()
    dialog.reject()
    conversation = _send(qtbot, window, "Hello from Gemma 3.").conversation_id
    # The first-run offer: the recommended Gemma 4, downloaded (verified) and switched to.
    e2b = catalog.model_for("E2B")
    with FakeHub(e2b.repo, e2b.file, gemma4_path.read_bytes()) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("GALAHAD_FAKE_MEMORY_GIB", "5")  # E2B fits, E4B does not
        monkeypatch.setenv("GALAHAD_FAKE_SPEED", "700,45")  # and E2B is quick
        with qtbot.waitSignal(window.opened, timeout=WAIT_MS) as switched:
            window.get_gemma4("")
    info = switched.args[0]
    assert info.model.architecture == "gemma4" and info.turn_format.user_open == "<|turn>user\n"
    assert (data_dir / "models" / e2b.file).exists()
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS) as opened:
        window.open_conversation(conversation)
    assert opened.args[0].other_model and "another model" in window.graft_label.text()
    follow = _send(qtbot, window, "And now under Gemma 4?")
    assert follow.counters.recomputed_tokens == 0


def test_import_through_the_window(qtbot, open_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    export = import_fixtures.chatgpt_export(tmp_path / "conversations.json")
    with qtbot.waitSignal(window.import_finished, timeout=WAIT_MS) as blocker:
        window.import_conversations(export)
    result = blocker.args[0]
    assert len(result.conversations) == 2 and [s.title for s in result.skipped] == ["Empty chat"]
    qtbot.waitUntil(lambda: len(_items(window)) == 2, timeout=WAIT_MS)
    assert "Imported 2 conversation(s)" in window.graft_label.text()


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

    canary = "OSPREY-CANARY-51d2"
    started = time.time()
    app_module.setup_logging(data_dir)

    def explode(self: Galahad) -> None:
        raise RuntimeError(f"a bug that quotes private text: {canary}")

    monkeypatch.setattr(Galahad, "explode", explode, raising=False)
    window = open_window()
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    doc = inputs / f"{canary}-minutes.md"
    doc.write_text(story(12, secret=f"The vault word is {canary}."))
    with qtbot.waitSignal(window.deposit_finished, timeout=WAIT_MS):
        window.deposit(doc)
    qtbot.waitUntil(lambda: window.sidebar.document_list.count() == 1, timeout=WAIT_MS)
    window.sidebar.document_list.item(0).setSelected(True)
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.chat_with_document()
    _send(qtbot, window, f"Please remember {canary} for me.")  # also becomes the title
    window.sidebar.search.setText(canary)  # the search never writes an index
    qtbot.waitUntil(lambda: len(_items(window)) == 1, timeout=WAIT_MS)

    def explode(core: Any, job: Any) -> None:
        raise RuntimeError(f"a bug, quoting {canary}")

    with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as crash:
        window.bridge.run(explode, on_error=window.show_error)
    assert "details are in the log file" in crash.args[0] and canary not in crash.args[0]
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
    results: dict[str, Any] = {}
    window.deposit(doc)
    bridge = window.bridge
    bridge.run(
        lambda core, job: core.open_conversation(first.conversation_id, job),
        on_done=lambda r: results.setdefault("opened", r),
    )
    bridge.run(
        lambda core, _job: core.forget(second.conversation_id),
        on_done=lambda r: results.setdefault("forgot", r),
    )
    bridge.run(
        lambda core, _job: core.rotate_key(), on_done=lambda r: results.setdefault("rotated", r)
    )
    bridge.run(
        lambda core, job: core.open_conversation(first.conversation_id, job),
        on_done=lambda r: results.setdefault("reopened", r),
    )
    qtbot.waitUntil(lambda: bridge.pending() == 0, timeout=WAIT_MS)
    assert window.working is None and window.sidebar.document_list.count() == 1
    assert results["opened"].graft.proof.verdict == "exact"
    assert results["forgot"].conversations == [second.conversation_id]
    assert results["rotated"].blocks_rewrapped >= 2
    audit: list[Any] = []
    bridge.run(lambda core, _job: core.audit(), on_done=audit.append)
    qtbot.waitUntil(lambda: bool(audit), timeout=WAIT_MS)
    assert audit[0].problems == [] and audit[0].ok == audit[0].blocks


def test_mark_verified_and_answer_from_memory(qtbot, open_window) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    _send(qtbot, window, "What is 123456 * 654321 + 17?")  # the 270M model will not know
    with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as refused:
        window.chat.verify_button.click()
    assert "fails its arithmetic check" in refused.args[0]
    window.new_chat()
    first = _send(qtbot, window, "Say a greeting.")
    with qtbot.waitSignal(window.verified_added, timeout=WAIT_MS) as stored:
        window.chat.verify_button.click()
    assert stored.args[0].verifier == "user"
    window.new_chat()
    again = _send(qtbot, window, "Say a greeting.")
    assert again.library is not None and again.library.mode == "recurrence"
    assert again.reply == first.reply and again.counters.generated_tokens == 0
    assert "verified answer from memory" in window.graft_label.text()


def test_ask_a_long_document_and_choose_when_the_router_is_unsure(  # type: ignore[no-untyped-def]
    qtbot, open_window, tmp_path: Path
) -> None:
    from galahad_dev.corpus import Corpus

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
    parts = blocker.args[0].n_parts
    assert parts >= 2
    qtbot.waitUntil(lambda: window.sidebar.document_list.count() == 1, timeout=WAIT_MS)
    assert f"{parts} parts" in window.sidebar.document_list.item(0).text()
    window.sidebar.document_list.item(0).setSelected(True)
    window.chat_with_document()  # a long document opens the routed Ask dialog
    dialog = window.ask_dialog
    dialog.question.setText(f"What is {needles[0].name}'s access code?")
    with qtbot.waitSignal(dialog.answered, timeout=WAIT_MS) as asked:
        qtbot.mouseClick(dialog.ask_button, Qt.MouseButton.LeftButton)
    result = asked.args[0]
    assert result.answered and f"of {parts}" in result.citation
    assert result.graft is not None and result.graft.recomputed_tokens == 0
    assert result.citation in dialog.source.text()
    dialog.question.setText(f"What is {corpus.absent_name()}'s access code?")
    with qtbot.waitSignal(dialog.answered, timeout=WAIT_MS) as asked:
        dialog.ask()
    assert not asked.args[0].answered
    assert "the model checked" in asked.args[0].why  # the words were unsure: the model read it
    # Each candidate in words; the model's score in its tooltip.
    assert "The model's score" in dialog.candidates.item(0).toolTip()
    assert not dialog.candidates.isHidden() and dialog.candidates.count() >= 1
    assert asked.args[0].why in dialog.answer.toPlainText()  # escaped, whole
    dialog.candidates.setCurrentRow(0)
    with qtbot.waitSignal(dialog.answered, timeout=WAIT_MS) as asked:
        qtbot.mouseClick(dialog.choose_button, Qt.MouseButton.LeftButton)
    chosen = asked.args[0]
    assert chosen.answered and chosen.part_id == dialog.candidates.item(0).data(
        Qt.ItemDataRole.UserRole
    )
    assert "Answered from the part you chose" in dialog.source.text()  # not "Not answered"


def test_the_window_remembers_its_size_splitter_theme_and_font(qtbot, open_window) -> None:  # type: ignore[no-untyped-def]
    window = open_window()
    window.resize(900, 640)
    window.splitter.setSizes([220, 680])
    window.set_theme("dark")
    assert window.chat.dark()
    window.change_font(2)
    size = int(window.ui_settings.value("font_size"))
    sizes = window.splitter.sizes()
    window.close()
    window.bridge.stop()
    again = open_window()
    assert again.size().width() < 1000  # restored, not the default 1180
    assert abs(again.splitter.sizes()[0] - sizes[0]) < 40  # restored, not the default 300
    assert again.chat.dark() and int(again.ui_settings.value("font_size")) == size
    again.set_theme("light")
    assert not again.chat.dark()


def test_backup_recovery_kit_and_rotation_from_the_security_dialog(  # type: ignore[no-untyped-def]
    qtbot, open_window, tmp_path: Path
) -> None:
    from galahad_desktop.ui.dialogs import SecurityDialog

    window = open_window()
    _send(qtbot, window, "Hello.")
    dialog = SecurityDialog(window, window)
    qtbot.addWidget(dialog)
    dialog.run_backup(tmp_path / "backup")
    qtbot.waitUntil(lambda: "Backed up" in dialog.output.toPlainText(), timeout=WAIT_MS)
    assert (tmp_path / "backup" / "catalog.sqlite").is_file()
    dialog.run_export_kit(tmp_path / "kit.json", "a recovery phrase 42")
    qtbot.waitUntil(
        lambda: "Wrote the recovery kit" in dialog.output.toPlainText(), timeout=WAIT_MS
    )
    assert "a recovery phrase" not in (tmp_path / "kit.json").read_text()
    dialog.rotate()
    qtbot.waitUntil(lambda: "need the old key" in dialog.output.toPlainText(), timeout=WAIT_MS)
    assert str((tmp_path / "backup").resolve()) in dialog.output.toPlainText()
    qtbot.waitUntil(lambda: "Retired keys" in dialog.summary.text(), timeout=WAIT_MS)


def test_keyboard_only_walkthrough(qtbot, open_window, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """New chat, send, stop, regenerate, settings and the theme, with keys alone."""
    from PySide6.QtWidgets import QApplication

    from galahad_desktop.ui import theme

    Settings(data_dir).update({"max_tokens": 600})  # long enough to be stopped
    window = open_window()
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=WAIT_MS)
    ctrl = Qt.KeyboardModifier.ControlModifier
    qtbot.keyClick(window, Qt.Key.Key_N, ctrl)  # new chat
    assert window.pages.currentWidget() is window.chat
    qtbot.waitUntil(lambda: window.chat.input.hasFocus(), timeout=WAIT_MS)
    qtbot.keyClicks(window.chat.input, "Tell me a long story about Camelot.")
    pieces: list[str] = []
    window.bridge.worker.streamed.connect(lambda _rid, piece: pieces.append(piece))
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as stopped:
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Return, ctrl)  # send
        qtbot.waitUntil(lambda: len(pieces) >= 2, timeout=WAIT_MS)
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Escape)  # stop
    assert stopped.args[0].stop_reason == "cancelled"
    assert window.chat.messages[0].text == "Tell me a long story about Camelot."
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    pieces.clear()
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as regenerated:
        qtbot.keyClick(window.chat.input, Qt.Key.Key_R, ctrl)  # regenerate
        qtbot.waitUntil(lambda: len(pieces) >= 2, timeout=WAIT_MS)
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Escape)
    assert regenerated.args[0].counters.recomputed_tokens == 0
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    # Tab leaves the message box for the buttons (the box does not swallow it).
    window.chat.input.setFocus()
    qtbot.keyClick(window.chat.input, Qt.Key.Key_Tab)
    assert not window.chat.input.hasFocus()
    # Ctrl+, opens the settings (modal): Escape closes them.
    seen = when_a_modal_opens(lambda dialog: qtbot.keyClick(dialog, Qt.Key.Key_Escape))
    qtbot.keyClick(window, Qt.Key.Key_Comma, ctrl)
    assert seen == ["Settings"]
    window.activateWindow()  # what the window manager does when a modal dialog closes
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=WAIT_MS)
    before = theme.current().name
    qtbot.keyClick(window, Qt.Key.Key_T, ctrl | Qt.KeyboardModifier.ShiftModifier)
    assert theme.current().name != before and window.chat.dark() == (before == "light")


@pytest.mark.parametrize("family", ["gemma3", "gemma4"])
def test_everyday_walkthrough_on_both_families(  # type: ignore[no-untyped-def]
    qtbot, open_window, data_dir: Path, family: str, request: pytest.FixtureRequest
) -> None:
    """Enter sends once (a second Enter during the reply adds nothing), Stop keeps what was
    written, Regenerate makes a second version and the first comes back from its own block
    with 0 tokens re-read; no reply shows a turn or image marker."""
    Settings(data_dir).update({"max_tokens": 12, "temperature": 1.0})
    model = request.getfixturevalue("gemma4_path") if family == "gemma4" else None
    window = open_window(model)
    window.new_chat()
    window.chat.input.setFocus()
    qtbot.keyClicks(window.chat.input, "Tell me about the harbour")
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as first:
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Return)
        window.chat.input.setPlainText("Tell me about the harbour")
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Return)  # during the reply: refused
    assert [m.role for m in window.chat.messages] == ["user", "model"]
    assert window.chat.input.toPlainText() == "Tell me about the harbour"  # still here
    window.chat.input.clear()
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as again:
        window.regenerate()
    assert again.args[0].versions == 2
    for result in (first.args[0], again.args[0]):
        assert not any(
            m in result.reply for m in ("<start_of_turn>", "<|turn>", "<start_of_image>")
        )
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS) as opened:
        window.show_version(len(window.chat.messages) - 1, 1)
    assert opened.args[0].graft.recomputed_tokens == 0
    assert window.chat.messages[-1].text == first.args[0].reply
