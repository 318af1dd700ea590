"""The window in everyday use, on real Qt widgets over the fake core (fast tier): work in
lanes that show what runs and what waits, a turn sent once, Stop wherever a turn is, an Ask
that stops when its dialog closes, Settings filled while the model is busy, Regenerate's
versions paged on the card, replies cut at a turn marker, a download beside a chat, and
Enter to send, the Local server switched on and off. The same window with the real
models is in test_gui.py."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers import window_opener

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QAction, QGuiApplication

from galahad_desktop.jobs import NO_JOB, Job, Progress
from galahad_desktop.memory.galahad import Galahad, ModelDownloads
from galahad_desktop.memory.results import GiveBackResult
from galahad_desktop.models.hub import Downloaded
from galahad_desktop.ui.dialogs import AskDialog
from galahad_desktop.ui.format import memory_line
from galahad_desktop.ui.main_window import MainWindow, first_size
from galahad_desktop.ui.server_panel import ServerPanel
from galahad_desktop.ui.settings_dialog import SettingsDialog
from galahad_desktop.ui.sidebar import API_GROUP
from galahad_desktop.ui.window_documents import READ_ANYWAY
from galahad_desktop.ui.worker import CoreBridge
from tests.test_ui_look import Answers

pytestmark = pytest.mark.gui
WAIT_MS = 20_000


class GatedDownloads(ModelDownloads):
    """The real downloads lane's object with only the network replaced: it reports
    progress and waits for the test to let it finish."""

    gate = threading.Event()
    started = threading.Event()

    def get_gemma4(self, size: str | None = None, job: Job = NO_JOB) -> Downloaded:
        self.started.set()
        for done in range(0, 101, 10):
            job.progress(Progress(done, 100, 0.1))
            if self.gate.wait(0.05):
                break
        self.gate.wait(WAIT_MS / 1000)
        path = self.models_dir / "gemma-4-test.gguf"
        return Downloaded(path, "0" * 64, 100, 0)


@pytest.fixture()
def make_window(
    qtbot: Any, make_fake_core: Callable[..., Galahad], tmp_path: Path
) -> Iterator[Callable[..., MainWindow]]:
    with window_opener(qtbot, Answers(), WAIT_MS) as open_on:

        def factory(downloads: bool = False, **overrides: Any) -> MainWindow:
            data = tmp_path / "data"
            data.mkdir(mode=0o700, exist_ok=True)
            bridge = CoreBridge(
                lambda: make_fake_core(data=data, **{"max_tokens": 24, **overrides}),
                (lambda: GatedDownloads(data)) if downloads else None,
            )
            win: MainWindow = open_on(bridge, data)
            return win

        yield factory


def _block(win: MainWindow, label: str = "Asking the library") -> threading.Event:
    """An operation that holds the model lane until the test releases it."""
    gate = threading.Event()
    started = threading.Event()

    def hold(_core: Galahad, job: Job) -> None:
        started.set()
        while not gate.wait(0.02) and not job.cancelled:
            pass

    win.bridge.run(hold, label=label)
    assert started.wait(10)
    return gate


def _stored_messages(win: MainWindow) -> list[str]:
    done: list[Any] = []

    def read(core: Galahad, _job: Job) -> list[str]:
        return [m.text for c in core.list_conversations() for m in core.messages(c.id)]

    win.bridge.run(read, on_done=done.append)
    return done  # filled once the lane answers


def _wait_stored(qtbot: Any, win: MainWindow) -> list[str]:
    done = _stored_messages(win)
    qtbot.waitUntil(lambda: bool(done) or done == [[]], timeout=WAIT_MS)
    qtbot.waitUntil(lambda: len(done) == 1, timeout=WAIT_MS)
    return list(done[0])


def test_double_send_stores_the_question_once(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    win.chat.input.setPlainText("Hello there")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.send()
        win.chat.input.setPlainText("Hello there")  # typed again, sent again at once
        win.send()
        win.chat.send_button.click()
    qtbot.waitUntil(lambda: win.bridge.pending() == 0, timeout=WAIT_MS)
    stored = _wait_stored(qtbot, win)
    assert stored.count("Hello there") == 1 and len(stored) == 2
    assert [m.role for m in win.chat.messages] == ["user", "model"]


def test_send_while_the_lane_is_busy_waits_visibly(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    gate = _block(win)
    qtbot.waitUntil(lambda: "Asking the library" in win.lane_label.text(), timeout=WAIT_MS)
    win.chat.input.setPlainText("Are you there?")
    win.send()
    qtbot.waitUntil(lambda: "waiting: Writing a reply" in win.lane_label.text(), timeout=WAIT_MS)
    assert win.lane_stop.isVisible() and win.chat.messages[-2].text == "Are you there?"
    assert win.sidebar.conversations[0].title == "Are you there?"  # listed at once
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        gate.set()
    qtbot.waitUntil(lambda: not win.lane_label.isVisible(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: win.sidebar.conversations[0].id != "pending", timeout=WAIT_MS)
    assert win.sidebar.conversations[0].preview and len(win.sidebar.conversations) == 1


def test_stop_on_a_waiting_turn_gives_the_message_back(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    gate = _block(win)
    win.chat.input.setPlainText("Never mind")
    win.send()
    win.chat.stop_button.click()
    gate.set()
    qtbot.waitUntil(lambda: win.bridge.pending() == 0, timeout=WAIT_MS)
    assert win.chat.input.toPlainText() == "Never mind" and win.chat.messages == []
    assert _wait_stored(qtbot, win) == []  # no conversation, no empty reply


def _slow_long_reply(qtbot: Any, win: MainWindow) -> None:
    """The fake model's next reply: long, a token every 5 ms (time to press Stop)."""
    done: list[Any] = []

    def slow_and_long(core: Galahad, _job: Job) -> None:
        engine: Any = core.engine
        engine.script = list(b"story " * 300)
        accept = engine.accept
        engine.accept = lambda token: (time.sleep(0.005), accept(token))

    win.bridge.run(slow_and_long, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)


@contextlib.contextmanager
def _while_a_long_reply_writes(qtbot: Any, win: MainWindow) -> Iterator[Any]:
    """Inside: a long, slow reply is streaming (its first words are on the card); the
    block ends when the turn has finished (the test stops it)."""
    _slow_long_reply(qtbot, win)
    win.chat.input.setPlainText("Write a long story")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS) as finished:
        win.send()
        qtbot.waitUntil(lambda: bool(win.chat.messages[-1].text), timeout=WAIT_MS)
        yield finished


def test_stop_ends_a_streaming_reply_and_marks_it(qtbot: Any, make_window: Any) -> None:
    win = make_window(max_tokens=2000)
    with _while_a_long_reply_writes(qtbot, win) as finished:
        win.stop()
    result = finished.args[0]
    assert result.stop_reason == "cancelled" and win.chat.messages[-1].note == "stopped"
    assert "regenerate" in win.chat.actions_of(len(win.chat.messages) - 1)


def test_closing_the_ask_dialog_stops_its_question_on_a_busy_lane(
    qtbot: Any, make_window: Any
) -> None:
    win = make_window()
    gate = _block(win, "Reading report.pdf")
    dialog = AskDialog(win, win)
    dialog.question.setText("Who keeps the ledger?")
    dialog.ask()
    assert "Waiting for the model" in dialog.answer.toPlainText()
    assert dialog.stop_button.isEnabled()
    request = dialog.request
    dialog.reject()  # closing it
    gate.set()
    qtbot.waitUntil(lambda: win.bridge.pending() == 0, timeout=WAIT_MS)
    assert request is not None and request.cancel.is_set()
    log: list[Any] = []
    win.bridge.run(lambda core, _job: core.routing_log(), on_done=log.append)
    qtbot.waitUntil(lambda: bool(log), timeout=WAIT_MS)
    assert log[0] == []  # the question never ran


def test_the_ask_dialog_answers_from_two_documents_and_says_so(
    qtbot: Any, make_window: Any
) -> None:
    from tests.helpers import story

    win = make_window()
    done: list[Any] = []
    for bird, code in (("falcon", 5521), ("heron", 7340)):
        text = story(10, f"The {bird}'s ring number is {code}.")
        win.bridge.run(
            lambda core, _job, b=bird, t=text: core.deposit_text(f"{b}.txt", t), on_done=done.append
        )
    qtbot.waitUntil(lambda: len(done) == 2, timeout=WAIT_MS)
    dialog = AskDialog(win, win)
    dialog.question.setText("What are the falcon's and the heron's ring numbers?")
    with qtbot.waitSignal(dialog.answered, timeout=WAIT_MS) as asked:
        qtbot.mouseClick(dialog.ask_button, Qt.MouseButton.LeftButton)
    assert asked.args[0].across
    source = dialog.source.text()
    assert "From falcon.txt, part 1 of 1 and heron.txt, part 1 of 1" in source
    assert "first part byte-exact ✓, the others stacked: close, not byte-exact" in source
    assert "Answered from 2 parts of 2 documents read together" in source
    dialog.deleteLater()


def test_settings_open_filled_while_the_model_is_busy(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    gate = _block(win, "Writing a reply")
    dialog = SettingsDialog(win, win)
    assert "max_tokens" in dialog.editors and "enter_sends" in dialog.editors
    # Words a person uses: the default GPU offload is not "-1 layers".
    assert dialog.editors["n_gpu_layers"].text().startswith("all that fits")
    dialog.editors["n_ctx"].setValue(dialog.editors["n_ctx"].value() + 512)
    assert "fingerprint" not in dialog.warning.text() and "read again once" in dialog.warning.text()
    dialog.deleteLater()
    gate.set()


def _wheel(widget: Any, notches: int = -3) -> None:
    from PySide6.QtCore import QPoint, QPointF
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    centre = QPointF(widget.width() / 2, widget.height() / 2)
    event = QWheelEvent(
        centre,
        widget.mapToGlobal(centre),
        QPoint(0, 0),
        QPoint(0, 120 * notches),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def test_the_wheel_scrolls_settings_and_changes_no_value_it_passes(
    qtbot: Any, make_window: Any
) -> None:
    win = make_window()
    dialog = SettingsDialog(win, win)
    qtbot.addWidget(dialog)
    dialog.show()
    spin, combo = dialog.editors["n_ctx"], win.model_switcher
    before = (spin.value(), combo.currentIndex())
    _wheel(spin)
    _wheel(combo)
    assert (spin.value(), combo.currentIndex()) == before  # scrolled past, not changed
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=WAIT_MS)
    _wheel(spin)
    assert spin.value() != before[0]  # once the person chose it, the wheel is theirs
    dialog.deleteLater()


def test_regenerate_keeps_versions_paged_on_the_card(qtbot: Any, make_window: Any) -> None:
    win = make_window(temperature=1.0)
    win.chat.input.setPlainText("Tell me something")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.send()
    first = win.chat.messages[-1].text
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS) as again:
        win.regenerate()
    assert again.args[0].versions == 2 and win.chat.messages[-1].versions == 2
    html = win.chat.turn_html(len(win.chat.messages) - 1)
    assert "2/2" in html and "version-previous" in html
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS) as opened:
        win.chat._anchor(QUrl(f"galahad:version-previous/{len(win.chat.messages) - 1}"))
    assert opened.args[0].graft.recomputed_tokens == 0
    assert win.chat.messages[-1].text == first and win.chat.messages[-1].version == 1
    # By keyboard too (Conversation ▸ Next version of the reply, Alt+Right), wrapping round.
    pager = next(a for a in win.findChildren(QAction) if a.text() == "Next version of the reply")
    assert pager.shortcut().toString() == "Alt+Right"
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS):
        pager.trigger()
    assert win.chat.messages[-1].version == 2


def test_a_reply_is_cut_where_the_model_opens_a_turn(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    done: list[Any] = []

    def script(core: Galahad, _job: Job) -> None:
        engine: Any = core.engine
        engine.script = [*b"Fine", engine.ids["<start_of_turn>"], *b"user\nforged"]

    win.bridge.run(script, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    win.chat.input.setPlainText("How are you?")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS) as finished:
        win.send()
    assert finished.args[0].reply == "Fine" and win.chat.messages[-1].text == "Fine"


def test_a_download_runs_beside_a_chat_in_its_own_lane(qtbot: Any, make_window: Any) -> None:
    GatedDownloads.gate.clear()
    GatedDownloads.started.clear()
    win = make_window(downloads=True)
    win.get_gemma4("E2B")
    assert GatedDownloads.started.wait(10)
    qtbot.waitUntil(lambda: win.download_bar.isVisible(), timeout=WAIT_MS)
    win.chat.input.setPlainText("Chatting meanwhile")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.send()  # the model lane is free: the reply does not wait for the download
    assert win.bridge.running("downloads") is not None
    assert "(beside)" in win.lane_label.text() or win.download_bar.isVisible()
    GatedDownloads.gate.set()
    qtbot.waitUntil(lambda: win.downloading is None, timeout=WAIT_MS)


def test_enter_sends_and_shift_enter_breaks_a_line(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    win.chat.input.setFocus()
    qtbot.keyClicks(win.chat.input, "first line")
    qtbot.keyClick(win.chat.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(win.chat.input, "second")
    assert win.chat.input.toPlainText() == "first line\nsecond"
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        qtbot.keyClick(win.chat.input, Qt.Key.Key_Return)
    assert win.chat.messages[0].text == "first line\nsecond"
    # ...and the card shows the two lines as typed (Qt writes a <br> as U+2028).
    shown = win.chat.transcript.toPlainText().replace("\u2028", "\n")
    assert "first line\nsecond" in shown


def test_typing_with_no_text_field_focused_goes_to_the_message_box(
    qtbot: Any, make_window: Any
) -> None:
    win = make_window()
    win.new_chat()  # the chat page, with its message box
    for focused in (win.sidebar.conversation_list, win.sidebar.new_button, win.chat.transcript):
        win.chat.input.clear()
        focused.setFocus()
        for char in "Hi there":  # each key to whichever widget has the focus, as typed
            qtbot.keyClick(win.focusWidget(), char)
        assert win.chat.input.toPlainText() == "Hi there", focused
        assert win.chat.input.hasFocus()
    # A text field keeps its keys; a shortcut and a space (which presses a button) are left
    # to the focused control.
    win.chat.input.clear()
    win.sidebar.search.setFocus()
    qtbot.keyClicks(win.sidebar.search, "owls")
    assert win.sidebar.search.text() == "owls" and win.chat.input.toPlainText() == ""
    win.sidebar.new_button.setFocus()
    qtbot.keyClick(win.sidebar.new_button, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(win.sidebar.new_button, Qt.Key.Key_Space)
    assert win.chat.input.toPlainText() == ""


def test_the_first_screen_opens_with_a_message_box_ready(qtbot: Any, make_window: Any) -> None:
    """Issue #59 item 5: the focus started in the search box ("No conversation matches."
    for a greeting) and there was no message box until Start a chat."""
    win = make_window()
    assert win.pages.currentWidget() is win.welcome
    assert win.focusWidget() is win.welcome.message
    win.welcome.drop_zone.setFocus()  # typed anywhere on the first screen: into the box
    for char in "Hello":
        qtbot.keyClick(win.focusWidget(), char)
    assert win.welcome.message.toPlainText() == "Hello" and not win.sidebar.search.text()
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        qtbot.keyClick(win.welcome.message, Qt.Key.Key_Return)
    assert win.pages.currentWidget() is win.chat and win.chat.input.hasFocus()
    assert "Hello" in win.chat.transcript.toPlainText()
    assert not win.welcome.message.toPlainText()
    assert len(_wait_stored(qtbot, win)) == 2  # a new chat: the message and its reply


def test_a_new_chat_shows_nothing_of_the_conversation_left(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    win.new_chat()
    win.chat.input.setPlainText("Tell me about owls")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.send()
    qtbot.waitUntil(lambda: bool(win.sidebar.conversation_list.selectedItems()), timeout=WAIT_MS)
    win.memory_dock.setVisible(True)
    win.refresh_memory()
    qtbot.waitUntil(
        lambda: "tokens kept" in win.memory_panel.conversation_label.text(), timeout=WAIT_MS
    )
    assert win.speed_label.text().endswith("tok/s")
    win.new_chat()
    assert win.speed_label.text() == ""  # the last chat's pace is not this one's
    assert win.context_meter.text() == f"context 0 / {win.n_ctx:,}"
    assert win.sidebar.conversation_list.selectedItems() == []
    assert win.sidebar.conversation_list.currentItem() is None
    assert win.memory_panel.conversation_label.text() == "No conversation open."
    assert win.graft_label.text().startswith("New conversation")


def test_the_first_window_fits_the_screen() -> None:
    from PySide6.QtCore import QSize

    assert first_size(QSize(1600, 1000)) == (1280, 850)
    width, height = first_size(QSize(1024, 700))
    assert width <= 1024 and height <= 700


def test_tables_and_quotes_are_drawn_from_the_theme() -> None:
    from galahad_desktop.ui import theme
    from galahad_desktop.ui.render import markdown_html

    palette = theme.current()
    html = markdown_html("| a | b |\n|---|---|\n| 1 | 2 |\n\n> quoted words", palette)
    assert 'border="1"' in html and f"border:1px solid {palette.border}" in html
    assert f'bgcolor="{palette.accent}"' in html and "quoted words" in html
    assert "<blockquote>" not in html


def test_a_document_in_a_chat_is_a_chip_and_its_acknowledgement_a_note(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    win = make_window()
    win.chat.input.setPlainText("Hello")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.send()
    notes = tmp_path / "notes.txt"
    notes.write_text("The harbour ledger lists boats and nets.")
    win.add_to_conversation(notes)
    qtbot.waitUntil(lambda: win.bridge.pending() == 0, timeout=WAIT_MS)
    assert win.chat.messages[-1].role == "note" and "notes.txt" in win.chat.documents
    assert win.chat.documents_label.isVisible() or not win.isVisible()
    said = win.graft_label.text()  # what happened, only (#59 item 9: "restored 0, re-read 0")
    assert said.startswith("Added 'notes.txt': read ") and " 0" not in said.split(" · ")[0][-2:]
    assert "restored 0" not in said and "re-read" not in said
    conversation = win.conversation_id
    win.new_chat()
    assert not win.chat.documents
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS):
        win.open_conversation(str(conversation))
    roles = [m.role for m in win.chat.messages]
    assert roles[-2:] == ["document", "note"] and win.chat.documents == ["notes.txt"]
    bar = win.chat.transcript.verticalScrollBar()
    assert bar.value() == bar.maximum()  # opened at the newest message


def test_a_new_chat_takes_its_own_settings_from_the_first_message(
    qtbot: Any, make_window: Any
) -> None:
    win = make_window()

    class Chosen:
        def __init__(self, *_args: Any) -> None:
            pass

        def exec(self) -> bool:
            return True

        def values(self) -> tuple[str, float | None, int | None]:
            return ("Speak as a lighthouse keeper.", 0.0, 2)

    win._conversation_dialog(Chosen, None, "", {}, False, {})
    win.chat.input.setPlainText("Hello")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS) as finished:
        win.send()
    assert finished.args[0].counters.generated_tokens <= 2
    got: list[Any] = []
    conversation = finished.args[0].conversation_id
    win.bridge.run(
        lambda core, _job: (
            core.conversation_system_prompt(conversation),
            core.conversation_sampling(conversation),
        ),
        on_done=got.append,
    )
    qtbot.waitUntil(lambda: bool(got), timeout=WAIT_MS)
    assert got[0] == ("Speak as a lighthouse keeper.", {"temperature": 0.0, "max_tokens": 2})


def test_the_window_serves_the_api_and_lists_what_it_made(qtbot: Any, make_window: Any) -> None:
    win: MainWindow = make_window()
    panel = win.open_server_panel()
    qtbot.waitUntil(lambda: bool(panel.key.text()), timeout=WAIT_MS)
    assert panel.key.echoMode() == panel.key.EchoMode.Password  # hidden until asked
    panel.port.setValue(_free_port())
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.toggle, qtbot_left())
    assert panel.toggle.isChecked() and panel.address.text().startswith("http://127.0.0.1:")
    client = openai.OpenAI(base_url=panel.address.text(), api_key=panel.key.text(), timeout=20)
    answers: list[Any] = []

    def ask() -> None:
        answers.append(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "From a script"}], max_tokens=8
            )
        )

    caller = threading.Thread(target=ask)
    caller.start()
    qtbot.waitUntil(lambda: not caller.is_alive(), timeout=WAIT_MS)
    assert answers and answers[0].choices[0].message.content
    qtbot.waitUntil(lambda: _api_items(win) == 1, timeout=WAIT_MS)
    old_key = panel.key.text()
    qtbot.mouseClick(panel.new_key, qtbot_left())
    qtbot.waitUntil(lambda: panel.key.text() != old_key, timeout=WAIT_MS)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.toggle, qtbot_left())
    assert win.server_host.server is None and not panel.address.text()
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(
            base_url=client.base_url, api_key=panel.key.text(), max_retries=0, timeout=2
        ).models.list()


def test_quitting_with_the_server_on_asks_and_copy_says_it_copied(
    qtbot: Any, make_window: Any
) -> None:
    """Issue #59 item 7: quitting gave programs no warning; Copy gave no sign it worked."""
    win: MainWindow = make_window()
    panel = _serving(qtbot, win)
    qtbot.mouseClick(panel.copy_key, qtbot_left())
    assert QGuiApplication.clipboard().text() == panel.key.text()
    assert "copied" in panel.status.text()
    asked: list[str] = []
    answer = False

    def confirm(title: str, text: str) -> bool:
        asked.append(text)
        return answer

    win.prompts.confirm = confirm  # type: ignore[method-assign]
    win.close()
    assert asked and panel.address.text() in asked[0] and "programs using it" in asked[0]
    assert win.isVisible() and win.server_host.server is not None  # kept on: it was asked
    answer = True
    win.close()
    assert not win.isVisible() and win.server_host.server is None


def test_the_window_s_server_answers_a_refusal_as_the_server_does(
    qtbot: Any, make_window: Any
) -> None:
    """Issue #59 item 7: through the window's lane a refusal came back as a 500
    (`server_error`/`GalahadError`): tools on Gemma 3, a schema past its bounds."""
    win: MainWindow = make_window()
    panel = _serving(qtbot, win)
    client = openai.OpenAI(
        base_url=panel.address.text(), api_key=panel.key.text(), timeout=20, max_retries=0
    )
    asked = [{"role": "user", "content": "Hi"}]
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 20_000}
    requests: list[dict[str, Any]] = [
        {"tools": [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": schema},
            }
        },
    ]
    refused: list[Any] = []

    def program() -> None:
        for extra in requests:
            try:
                client.chat.completions.create(model="m", messages=asked, max_tokens=4, **extra)
            except openai.APIStatusError as error:
                refused.append(error)

    caller = threading.Thread(target=program)
    caller.start()
    qtbot.waitUntil(lambda: not caller.is_alive(), timeout=WAIT_MS)
    assert [e.status_code for e in refused] == [400, 400], [e.message for e in refused]
    assert refused[0].body["param"] == "tools" and "tool syntax" in refused[0].body["message"]
    assert refused[1].body["param"].startswith("response_format")
    assert "maxItems" in refused[1].body["message"]
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.toggle, qtbot_left())


def _chat_about(qtbot: Any, win: MainWindow, text: str) -> str:
    win.new_chat()
    win.chat.input.setPlainText(text)
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS) as sent:
        qtbot.mouseClick(win.chat.send_button, qtbot_left())
    return str(sent.args[0].conversation_id)


def test_the_turn_s_buttons_act_only_where_they_can(qtbot: Any, make_window: Any) -> None:
    """Issue #59 items 8 and 9: icon buttons were enabled on an empty chat; a chat with
    tools had no Regenerate or Edit and did not say why."""
    win: MainWindow = make_window()
    win.new_chat()
    buttons = (win.chat.regenerate_button, win.chat.edit_button, win.chat.verify_button)
    assert not any(b.isEnabled() for b in buttons)  # nothing to write again, edit or verify
    _chat_about(qtbot, win, "Tell me about owls")
    assert all(b.isEnabled() for b in buttons)
    win.chat.tools_on = True
    assert not win.chat.regenerate_button.isEnabled() and not win.chat.edit_button.isEnabled()
    assert "Not in a chat with tools" in win.chat.regenerate_button.toolTip()
    win.chat.tools_on = False
    assert win.chat.regenerate_button.toolTip().startswith("Write the last reply again")


def test_a_chat_being_read_again_shows_itself_never_the_last_one(
    qtbot: Any, make_window: Any
) -> None:
    """Issue #59 item 4: opening a chat whose memory was given back showed the previous
    chat for about 5 s while it was read again."""
    win: MainWindow = make_window()
    owls = _chat_about(qtbot, win, "Tell me about owls")
    _chat_about(qtbot, win, "Tell me about lakes")
    win.storage_action(owls, "give back")
    qtbot.waitUntil(lambda: win.graft_label.text().startswith("Gave back"), timeout=WAIT_MS)
    reading = threading.Event()
    let_go = threading.Event()
    core: Any = win.bridge.worker.core
    opened_for_real = core.open_conversation

    def slow_open(conversation_id: str, job: Job) -> Any:  # the re-read, held by the test
        reading.set()
        let_go.wait(WAIT_MS / 1000)
        return opened_for_real(conversation_id, job)

    core.open_conversation = slow_open
    win.open_conversation(owls)
    assert "lakes" not in win.chat.transcript.toPlainText()  # the chat left is gone at once
    qtbot.waitUntil(reading.is_set, timeout=WAIT_MS)
    # Its own words, while it is read (they arrive through the main thread's queue).
    qtbot.waitUntil(lambda: "owls" in win.chat.transcript.toPlainText(), timeout=WAIT_MS)
    assert "lakes" not in win.chat.transcript.toPlainText() and not let_go.is_set()
    assert not win.chat.input.isEnabled()  # nothing is sent to a chat not open yet
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS):
        let_go.set()
    assert win.conversation_id == owls and win.chat.input.isEnabled()
    assert "owls" in win.chat.transcript.toPlainText()


def test_memory_given_back_is_said_as_given_back_and_named_whole(
    qtbot: Any, make_window: Any
) -> None:
    """Issue #59 item 3: a chat that had given its memory back was still 'kept in 10.0 MB',
    and the status line naming what gave memory back was cut mid-title."""
    win: MainWindow = make_window()
    conversation = _chat_about(qtbot, win, "Tell me about owls")
    win.new_chat()
    win.storage_action(conversation, "give back")
    qtbot.waitUntil(lambda: win.graft_label.text().startswith("Gave back"), timeout=WAIT_MS)
    listed: list[Any] = []
    win.bridge.run(lambda core, _job: core.list_conversations(), on_done=listed.append)
    qtbot.waitUntil(lambda: bool(listed), timeout=WAIT_MS)
    summary = next(c for c in listed[0] if c.id == conversation)
    win.memory_panel.show_conversation(summary, None)
    shown = win.memory_panel.conversation_label.text()
    assert "none of their memory is kept on disk now" in shown and "kept in" not in shown
    assert memory_line(summary)[0] == "Needs re-reading once (memory given back)"
    long = "The quarterly planning notes for the northern harbour project, second draft"
    win.given_back([GiveBackResult(f"c{i}", "conversation", 1, 10**7, long) for i in range(4)])
    said = win.graft_label.text()
    assert "'The quarterly planning notes…'" in said and "and 2 more" in said
    assert long not in said and "30.0 MB" not in said and "40.0 MB" in said


def _serving(qtbot: Any, win: MainWindow) -> ServerPanel:
    """File ▸ Local server…, switched on at a free port."""
    panel = win.open_server_panel()
    qtbot.waitUntil(lambda: bool(panel.key.text()), timeout=WAIT_MS)
    panel.port.setValue(_free_port())
    with qtbot.waitSignal(panel.changed, timeout=WAIT_MS):
        qtbot.mouseClick(panel.toggle, qtbot_left())
    return panel


def qtbot_left() -> Any:
    return Qt.MouseButton.LeftButton


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api_items(win: MainWindow) -> int:
    """Rows under the section for conversations programs made (they come last)."""
    listing = win.sidebar.conversation_list
    texts = [listing.item(i).text() for i in range(listing.count())]
    if API_GROUP not in texts:
        return 0
    return len(texts) - texts.index(API_GROUP) - 1


def test_the_context_meter_says_the_real_count_through_a_full_context(
    qtbot: Any, make_window: Any
) -> None:
    win = make_window(n_ctx=512, max_tokens=8)
    assert win.context_meter.text().startswith("context 0 / 512")
    seen: list[tuple[int, str]] = []

    def full_dialog(full: Any) -> str:
        seen.append((full.context_tokens, win.context_meter.text()))
        return "summary"

    win.prompts.context_full = full_dialog
    for turn in range(40):
        win.chat.input.setPlainText(f"Turn {turn}: tell me about the castle walls and towers.")
        with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
            win.send()
        qtbot.waitUntil(lambda: win.generating is None, timeout=WAIT_MS)
        if seen:
            break
        assert win.context_meter.text() == f"context {win.context_used:,} / 512"
    used, shown = seen[0]
    assert shown.startswith(f"context {used:,} / 512")  # the dialog's count, not a stale one
    # The continuation's reply streams on top of what the new conversation holds (the
    # summary), never from 0, and the turn's own count is shown once it ends.
    qtbot.waitUntil(
        lambda: any("(continued)" in c.title for c in win.sidebar.conversations), timeout=WAIT_MS
    )
    assert 50 < win.context_used < used
    assert win.context_meter.text() == f"context {win.context_used:,} / 512"


def test_the_conversation_dialog_shows_the_values_that_apply(qtbot: Any) -> None:
    from PySide6.QtWidgets import QWidget

    from galahad_desktop.ui.dialogs import ConversationDialog

    parent = QWidget()
    qtbot.addWidget(parent)
    defaults = {"temperature": 0.8, "max_tokens": 1024}
    dialog = ConversationDialog(parent, "", {"max_tokens": 150}, False, defaults)
    # The app's creativity, shown and followed; this conversation's own longest reply.
    assert dialog.temperature.text() == "0.80" and not dialog.temperature.isEnabled()
    assert dialog.temperature_follows.isChecked() and "0.80" in dialog.temperature_follows.text()
    assert dialog.max_tokens.value() == 150 and not dialog.max_tokens_follows.isChecked()
    dialog.temperature_follows.setChecked(False)
    dialog.temperature.stepBy(1)  # the arrow starts from the value shown, not from 0
    assert dialog.values()[1:] == (0.9, 150)
    dialog.max_tokens_follows.setChecked(True)
    assert dialog.max_tokens.text().startswith("1024") and dialog.values()[2] is None
    dialog.preset.setCurrentIndex(1)
    dialog._preset_chosen(1)
    assert dialog.system.toPlainText() and dialog.preset.currentIndex() == 1
    dialog.system.setPlainText("My own words.")  # typed over the preset: no longer it
    assert dialog.preset.currentIndex() == 0 and dialog.values()[0] == "My own words."
    locked = ConversationDialog(parent, "Be brief.", {}, True, defaults)
    assert locked.system.isReadOnly() and not locked.preset.isEnabled()
    assert "Locked" in locked.system.toolTip()


def test_marking_an_answer_verified_asks_first(qtbot: Any, make_window: Any) -> None:
    win = make_window()
    win.chat.input.setPlainText("Say a greeting.")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.send()
    qtbot.waitUntil(lambda: win.generating is None, timeout=WAIT_MS)
    asked: list[str] = []
    win.prompts.confirm = lambda title, _text: asked.append(title) or False
    win.chat.verify_button.click()
    assert asked == ["Mark as verified"] and win.graft_label.text() == "Not marked as verified."
    entries: list[Any] = []
    win.bridge.run(lambda core, _job: core.verified_entries(), on_done=entries.append)
    qtbot.waitUntil(lambda: bool(entries), timeout=WAIT_MS)
    assert entries == [[]]  # nothing stored without a yes
    win.prompts.confirm = lambda _title, _text: True
    with qtbot.waitSignal(win.verified_added, timeout=WAIT_MS):
        win.chat.verify_button.click()


def test_the_window_reopens_the_last_conversation(
    qtbot: Any, make_window: Any, make_fake_core: Callable[..., Galahad], tmp_path: Path
) -> None:
    core = make_fake_core(data=tmp_path / "data")
    older, newer = core.new_conversation(), core.new_conversation()
    for conversation, text in ((newer, "About owls."), (older, "About bats.")):
        core.send(conversation, text, params=core.sampling(max_tokens=4))
    core.send(newer, "And their nests?", params=core.sampling(max_tokens=4))  # the last used
    core.close()
    win = make_window()
    qtbot.waitUntil(lambda: win.conversation_id == newer, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: len(win.chat.messages) == 4, timeout=WAIT_MS)
    assert win.chat.messages[2].text == "And their nests?"
    assert win.sidebar.current == newer and win.sidebar.conversation_list.selectedItems()
    assert win.focusWidget() is win.chat.input  # what is typed at start is the next message


def test_the_conversation_dialog_opens_on_the_app_s_effective_values(
    qtbot: Any, make_window: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from galahad_desktop.ui.dialogs import ConversationDialog

    win = make_window(temperature=None, max_tokens=77)  # creativity: the model's own
    shown: list[ConversationDialog] = []
    monkeypatch.setattr(ConversationDialog, "exec", lambda self: shown.append(self) or 0)
    win.chat.input.setPlainText("Hello")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.send()
    qtbot.waitUntil(lambda: win.generating is None, timeout=WAIT_MS)
    for _ in range(2):  # the open conversation, then a new chat
        win.open_conversation_settings()
        qtbot.waitUntil(lambda: len(shown) == 1, timeout=WAIT_MS)
        dialog = shown.pop()
        assert dialog.max_tokens.value() == 77 and dialog.temperature_follows.isChecked()
        assert f"{dialog.temperature.value():.2f}" in dialog.temperature_follows.text()
        win.new_chat()


def test_a_list_that_cannot_be_read_does_not_stay_loading(
    qtbot: Any, make_window: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from galahad_desktop.errors import StorageError

    def unreadable(_core: Galahad) -> list[Any]:
        raise StorageError("The catalog could not be read.")

    monkeypatch.setattr(Galahad, "list_conversations", unreadable)
    win = make_window()
    listing = win.sidebar.conversation_list
    qtbot.waitUntil(lambda: "could not be listed" in listing.placeholder, timeout=WAIT_MS)
    assert any("catalog could not be read" in w for w in win.prompts.warnings)


def test_a_document_without_room_for_its_memory_is_asked_about_before_it_is_read(
    qtbot: Any, make_window: Any, tmp_path: Path
) -> None:
    win = make_window(disk_budget=20_000)  # less than one document's memory
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text("The harbour ledger lists boats and nets. " * 20)
    big.write_text("The harbour ledger lists boats and nets. " * 80)
    with qtbot.waitSignal(win.deposit_finished, timeout=WAIT_MS):
        win.deposit(small)  # nothing of this model stored yet to measure it by: read
    asked: list[tuple[str, list[str]]] = []
    answer = ["Cancel"]

    def choose(title: str, text: str, buttons: list[str]) -> str:
        asked.append((text, buttons))
        return answer[0]

    win.prompts.choose = choose
    win.deposit(big)
    qtbot.waitUntil(lambda: bool(asked) and win.bridge.pending() == 0, timeout=WAIT_MS)
    assert "'big.txt'" in asked[0][0] and READ_ANYWAY in asked[0][1]
    assert [d.name for d in win.sidebar.documents] == ["small.txt"]  # nothing read
    assert not win.sidebar.deposit_bar.isVisible()
    answer[0] = READ_ANYWAY
    with qtbot.waitSignal(win.deposit_finished, timeout=WAIT_MS) as read:
        win.deposit(big)
    assert read.args[0].name == "big.txt" and len(asked) == 2


def test_the_system_prompt_is_changed_in_a_new_branch_that_says_what_it_re_reads(
    qtbot: Any, make_window: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from galahad_desktop.ui.dialogs import ConversationDialog

    win = make_window()
    for text in ("Hello", "Tell me more"):
        win.chat.input.setPlainText(text)
        with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
            win.send()
        qtbot.waitUntil(lambda: win.generating is None, timeout=WAIT_MS)
    original = win.conversation_id
    seen: list[ConversationDialog] = []

    def change_words(dialog: ConversationDialog) -> int:
        seen.append(dialog)
        assert dialog.system.isReadOnly() and dialog.branch_button.isVisibleTo(dialog)
        dialog.branch_button.click()  # said before: what it costs
        assert not dialog.system.isReadOnly() and "re-reads" in dialog.note.text()
        assert "locked" not in dialog.system_label.text()
        dialog.system.setPlainText("Answer like a pirate.")
        return 1

    monkeypatch.setattr(ConversationDialog, "exec", change_words)
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS):
        win.open_conversation_settings()
    qtbot.waitUntil(lambda: win.conversation_id not in (None, original), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: len(win.chat.messages) == 4, timeout=WAIT_MS)
    assert [m.text for m in win.chat.messages][::2] == ["Hello", "Tell me more"]
    assert int(seen[0].note.text().split()[3].replace(",", "")) > 0  # its tokens, counted
    got: list[str] = []
    win.bridge.run(
        lambda core, _job: core.conversation_system_prompt(str(win.conversation_id)),
        on_done=got.append,
    )
    qtbot.waitUntil(lambda: bool(got), timeout=WAIT_MS)
    assert got == ["Answer like a pirate."]


def test_a_continuation_is_listed_and_marked_even_when_its_message_then_fails(
    qtbot: Any, make_window: Any
) -> None:
    win = make_window(n_ctx=512, max_tokens=8)
    win.prompts.context_full = lambda _full: "summary"
    for turn in range(40):
        win.chat.input.setPlainText(f"Turn {turn}: tell me about the castle walls and towers.")
        with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
            win.send()
        qtbot.waitUntil(lambda: win.generating is None, timeout=WAIT_MS)
        if win.context_used > 300:
            break
    long_message = "The towers are tall. " * 23  # fits an empty context, not one with a summary
    win.chat.input.setPlainText(long_message.strip())
    win.send()
    qtbot.waitUntil(
        lambda: any("(continued)" in c.title for c in win.sidebar.conversations), timeout=WAIT_MS
    )
    qtbot.waitUntil(lambda: win.generating is None and win.bridge.pending() == 0, timeout=WAIT_MS)
    continued = next(c for c in win.sidebar.conversations if "(continued)" in c.title)
    assert win.conversation_id == continued.id and win.sidebar.current == continued.id
    assert win.chat.input.toPlainText() == long_message.strip()  # the message is kept


def test_how_a_reply_ended_stays_on_its_card_when_paged_and_reopened(
    qtbot: Any, make_window: Any
) -> None:
    win = make_window(max_tokens=2000)
    with _while_a_long_reply_writes(qtbot, win):
        win.stop()
    qtbot.waitUntil(lambda: win.generating is None, timeout=WAIT_MS)

    def short(core: Galahad, _job: Job) -> None:
        engine: Any = core.engine
        engine.script = [*b"The end.", engine.ids["<end_of_turn>"]]

    done: list[Any] = []
    win.bridge.run(short, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        win.regenerate()
    qtbot.waitUntil(lambda: win.generating is None, timeout=WAIT_MS)
    assert "stopped" not in win.chat.messages[-1].note  # the new version ended on its own
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS):
        win.page_version(-1)  # back to the stopped one: it still says so
    assert win.chat.messages[-1].version == 1 and win.chat.messages[-1].note == "stopped"
    conversation = str(win.conversation_id)
    win.new_chat()
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS):
        win.open_conversation(conversation)  # and when the conversation is opened again
    assert win.chat.messages[-1].note == "stopped"


# -- the third pass's smaller things (#59 item 10) -------------------------------------------
def _next_reply(qtbot: Any, win: MainWindow, words: bytes) -> None:
    """The fake model's next reply: `words`."""
    done: list[Any] = []

    def script(core: Galahad, _job: Job) -> None:
        engine: Any = core.engine
        engine.script = list(words)

    win.bridge.run(script, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)


def test_enter_while_a_reply_writes_says_the_message_waits_unsent(
    qtbot: Any, make_window: Any
) -> None:
    """Enter during a reply sent nothing and said so only in the status line, which the
    reply's own lines overwrote: the next text was joined to the waiting one unseen."""
    win = make_window(max_tokens=2000)
    with _while_a_long_reply_writes(qtbot, win):
        win.chat.input.setPlainText("And a second one")
        qtbot.keyClick(win.chat.input, Qt.Key.Key_Return)
        assert win.chat.input.toPlainText() == "And a second one"  # kept, not sent
        assert win.chat.input_note.isVisibleTo(win.chat)
        assert "Not sent yet" in win.chat.input_note.text()
        win.stop()
    assert "press Enter to send it" in win.chat.input_note.text()
    assert win.speed_label.text().startswith("last reply ")  # a past figure, said as one
    _next_reply(qtbot, win, b"ok")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        qtbot.keyClick(win.chat.input, Qt.Key.Key_Return)
    assert not win.chat.input_note.isVisibleTo(win.chat)
    assert [m.text for m in win.chat.messages if m.role == "user"][-1] == "And a second one"


def test_the_sidebar_previews_words_not_markdown_and_the_lists_share_the_height(
    qtbot: Any, make_window: Any
) -> None:
    from galahad_desktop.ui.render import plain_text
    from galahad_desktop.ui.sidebar import PREVIEW_ROLE

    assert plain_text("- - 1. Project **Falcon** uses `x=1`") == "Project Falcon uses x=1"
    assert plain_text("# Plan\n\n1. one\n2. two") == "Plan one two"
    win = make_window()
    _next_reply(qtbot, win, b"- - 1. Project **Falcon** is `on`")
    win.chat.input.setPlainText("Plans?")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS) as finished:
        win.send()
    conversation_id = finished.args[0].conversation_id
    qtbot.waitUntil(lambda: win.sidebar.item_of(conversation_id) is not None, timeout=WAIT_MS)
    qtbot.waitUntil(
        lambda: "Falcon" in (win.sidebar.item_of(conversation_id).data(PREVIEW_ROLE) or ""),
        timeout=WAIT_MS,
    )
    preview = win.sidebar.item_of(conversation_id).data(PREVIEW_ROLE)
    assert "**" not in preview and "`" not in preview and not preview.startswith("-")
    win.resize(1100, 800)
    qtbot.waitUntil(lambda: sum(win.sidebar.lists.sizes()) > 0, timeout=WAIT_MS)
    conversations, documents = win.sidebar.lists.sizes()
    assert documents >= 0.3 * (conversations + documents)  # not a three-row box


def test_a_chat_given_back_to_make_room_for_a_document_is_listed_as_such(
    qtbot: Any, make_window: Any
) -> None:
    """Issue #59 item 3: a deposit (which changes the documents) made room by giving back
    a chat's memory; only the documents were listed again, so the chat's row still said
    "Stored · 825 tokens · 9.9 MB"."""
    from galahad_desktop.ui.sidebar import STATE_ROLE
    from galahad_desktop.ui.worker import DOCUMENTS

    win: MainWindow = make_window()
    conversation = _chat_about(qtbot, win, "Tell me about owls")
    win.new_chat()
    qtbot.waitUntil(lambda: win.sidebar.item_of(conversation) is not None, timeout=WAIT_MS)
    assert win.sidebar.item_of(conversation).data(STATE_ROLE)[0].startswith("Stored ·")
    done: list[Any] = []
    # What the disk budget does while a document is stored: behind the window's back.
    win.bridge.run(lambda core, _job: core.give_back(conversation), on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=WAIT_MS)
    with qtbot.waitSignal(win.lists_refreshed, timeout=WAIT_MS):
        win.given_back([done[0]], frozenset({DOCUMENTS}))
    state = win.sidebar.item_of(conversation).data(STATE_ROLE)[0]
    assert state == "Needs re-reading once (memory given back)"


def test_a_search_previews_where_it_found_the_words_and_marks_them(
    qtbot: Any, make_window: Any
) -> None:
    """Issue #59 item 10: a search showed which conversations matched, never where."""
    from galahad_desktop.ui.sidebar import MATCH_ROLE, PREVIEW_ROLE, _runs

    assert _runs("The Bakery opens", ["bakery"]) == [
        ("The ", False),
        ("Bakery", True),
        (" opens", False),
    ]
    win: MainWindow = make_window()
    first = _chat_about(qtbot, win, "Where is the bakery near the old harbour?")
    _chat_about(qtbot, win, "Tell me about owls")
    qtbot.waitUntil(lambda: len(win.sidebar.ids()) == 2, timeout=WAIT_MS)
    win.sidebar.search.setText("bakery")
    qtbot.waitUntil(lambda: win.sidebar.ids() == [first], timeout=WAIT_MS)
    item = win.sidebar.item_of(first)
    assert "bakery near the old harbour" in item.data(PREVIEW_ROLE)  # the question, found
    assert item.data(MATCH_ROLE) == ["bakery"]
    # By keyboard from the search box: Down goes into the list, Enter opens the first.
    win.sidebar.search.setFocus()
    qtbot.keyClick(win.sidebar.search, Qt.Key.Key_Down)
    qtbot.waitUntil(win.sidebar.conversation_list.hasFocus, timeout=WAIT_MS)
    assert win.sidebar.conversation_list.currentItem().data(PREVIEW_ROLE) == item.data(PREVIEW_ROLE)
    win.new_chat()
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS):
        qtbot.keyClick(win.sidebar.search, Qt.Key.Key_Return)
    assert win.conversation_id == first
    win.sidebar.search.setText("")
    qtbot.waitUntil(lambda: len(win.sidebar.ids()) == 2, timeout=WAIT_MS)
    assert win.sidebar.item_of(first).data(MATCH_ROLE) == []


def test_the_turn_s_buttons_say_their_names_where_there_is_room(
    qtbot: Any, make_window: Any
) -> None:
    """Issue #59 item 9: Regenerate, Edit and Verify were icons explained only by tooltips."""
    win: MainWindow = make_window()
    win.resize(1400, 900)
    win.memory_dock.setVisible(False)
    win.new_chat()  # the chat, not the first screen
    qtbot.waitUntil(lambda: win.chat.regenerate_button.text() == "Regenerate", timeout=WAIT_MS)
    assert [b.text() for b in (win.chat.edit_button, win.chat.verify_button)] == ["Edit", "Verify"]
    win.resize(700, 700)
    qtbot.waitUntil(lambda: win.chat.regenerate_button.text() == "", timeout=WAIT_MS)
    assert win.chat.regenerate_button.accessibleName() == "Regenerate"  # still named
