"""MCP tools from the window, as a person uses them (fake Gemma 4 engine, a real MCP server
written with the SDK in a subprocess; scripts/test.sh runs this file again on a real X
server): a server added in Settings → Tools, chosen in the Tools menu for a new chat, a call
asked in a real dialog before it runs, its card with the result folded, the answer; a tool
that hangs stopped with Stop; the conversation reopened exact with nothing re-read."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QMessageBox

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.prompts import Prompts
from galahad_desktop.ui.settings_dialog import SettingsDialog
from galahad_desktop.ui.tools_page import ToolsPage
from galahad_desktop.ui.worker import CoreBridge
from tests.helpers import when_a_modal_opens, window_opener
from tests.test_ui_look import Answers

pytestmark = [pytest.mark.gui, pytest.mark.model]  # seconds of work: MCP server processes
WAIT_MS = 60_000
SERVER = Path(__file__).with_name("mcp_tools_server.py")


@pytest.fixture()
def window(
    qtbot: Any, make_fake_core: Callable[..., Galahad], tmp_path: Path
) -> Iterator[tuple[MainWindow, Galahad]]:
    with window_opener(qtbot, Answers(), WAIT_MS) as open_on:
        data = tmp_path / "data"
        data.mkdir(mode=0o700)
        bridge = CoreBridge(lambda: make_fake_core("gemma4", data=data, max_tokens=40))
        win: MainWindow = open_on(bridge, data)
        win.prompts = Prompts(win)  # the real dialogs: the permission prompt is clicked
        cores: list[Galahad] = []
        win.bridge.run(lambda core, _job: core, on_done=cores.append)
        qtbot.waitUntil(lambda: bool(cores), timeout=WAIT_MS)
        yield win, cores[0]


def _script(core: Galahad, *pieces: bytes | str) -> None:
    """The fake model's next reply: bytes as text, names as special tokens."""
    engine: Any = core.live.engine
    engine.script = [
        t for p in pieces for t in ([engine.ids[p]] if isinstance(p, str) else list(p))
    ]


def _click(label: str) -> Callable[[Any], None]:
    def act(dialog: Any) -> None:
        assert isinstance(dialog, QMessageBox), dialog
        (button,) = [b for b in dialog.buttons() if b.text() == label]
        button.click()

    return act


def test_a_tool_runs_after_asking_is_stopped_and_the_chat_resumes_exact(
    qtbot: Any, window: tuple[MainWindow, Galahad]
) -> None:
    win, core = window
    # Settings → Tools: add the server.
    settings = SettingsDialog(win, win)
    qtbot.addWidget(settings)
    page = settings.findChild(ToolsPage)
    assert page is not None
    page.name.setText("calc")
    page.target.setText(f"{sys.executable} {SERVER}")
    qtbot.mouseClick(page.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.listing.count() == 1 and "calc" in page.listing.item(0).text())
    page.listing.setCurrentRow(0)
    qtbot.mouseClick(page.show_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "add — Add two" in page.tools.toPlainText(), timeout=WAIT_MS)
    settings.reject()
    # The Tools menu: the new chat offers the server's tools.
    win.new_chat()
    win.chat.tools_menu.aboutToShow.emit()
    qtbot.waitUntil(
        lambda: any(a.text() == "calc" for a in win.chat.tools_menu.actions()), timeout=WAIT_MS
    )
    (choice,) = [a for a in win.chat.tools_menu.actions() if a.text() == "calc"]
    choice.trigger()
    assert win.new_chat_tools == ["calc"] and win.chat.tools_button.text() == "Tools (1)"
    # A call, asked before it runs.
    _script(core, "<|tool_call>", b"call:add{a:20,b:22}", "<tool_call|>", "<|tool_response>")

    def allow(dialog: Any) -> None:
        assert "“add”" in dialog.text() and '"a": 20' in dialog.text()
        _script(core, b"It is 42.", "<turn|>")  # what the model says once it has the result
        _click("Allow once")(dialog)

    seen = when_a_modal_opens(allow)
    win.chat.input.setPlainText("What is 20 + 22?")
    with qtbot.waitSignals([win.turn_finished, win.turn_finished], timeout=WAIT_MS):
        qtbot.keyClick(win.chat.input, Qt.Key.Key_Return)
    assert seen == ["Run a tool?"]
    qtbot.waitUntil(lambda: win.turn_cancel is None, timeout=WAIT_MS)
    roles = [m.role for m in win.chat.messages]
    assert roles == ["user", "model", "tool", "model"], roles
    card = win.chat.messages[2]
    assert card.text.startswith("add(") and card.thoughts == "42" and "ran in" in card.note
    assert not card.expanded and "Result" in win.chat.turn_html(2)
    win.chat.transcript.anchorClicked.emit(QUrl("galahad:toggle-thoughts/2"))
    assert card.expanded  # the result unfolds
    assert "Called add(" in win.chat.messages[1].text
    assert win.chat.messages[3].text == "It is 42."
    assert not win.chat.regenerate_button.isEnabled()  # a chat with tools is not regenerated
    conversation_id = win.conversation_id
    # A tool that hangs: allowed always, then stopped with Stop.
    _script(core, "<|tool_call>", b"call:hang{seconds:60}", "<tool_call|>", "<|tool_response>")
    seen = when_a_modal_opens(_click("Always allow hang"))
    win.chat.input.setPlainText("Wait a minute")
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS):
        qtbot.keyClick(win.chat.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: "Running the tool hang" in win.lane_label.text(), timeout=WAIT_MS)
    qtbot.mouseClick(win.chat.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: win.turn_cancel is None, timeout=WAIT_MS)
    assert "stopped" in win.chat.messages[-1].note and "Stopped" in win.chat.messages[-1].thoughts
    assert "calls and what became of them are stored" in win.graft_label.text()
    stored: list[Any] = []
    win.bridge.run(
        lambda c, _job: (c.messages(conversation_id), c.tool_servers()), on_done=stored.append
    )
    qtbot.waitUntil(lambda: bool(stored), timeout=WAIT_MS)
    messages, servers = stored[0]
    assert [m.role for m in messages][-3:] == ["model", "tool", "model"]
    assert messages[-1].stop == "cancelled" and servers[0].always == ("hang",)
    # Reopened from its blocks: nothing re-read.
    with qtbot.waitSignal(win.conversation_opened, timeout=WAIT_MS) as opened:
        win.open_conversation(conversation_id or "")
    assert opened.args[0].graft.recomputed_tokens == 0
    assert opened.args[0].graft.proof.verdict == "exact"
    shown = [m.role for m in win.chat.messages]
    assert shown == ["user", "model", "tool", "model", "user", "model", "tool", "note"]
    reopened = win.chat.messages[2]  # the same card as when it ran: the call, its result
    assert reopened.text == 'add({"a": 20, "b": 22})' and reopened.thoughts == "42"
    assert "stopped" in win.chat.messages[-1].text
    # Its Tools button says what it offers (fixed when it started); a new chat, what it will.
    qtbot.waitUntil(lambda: win.chat.tools_button.text() == "Tools: 5", timeout=WAIT_MS)
    win.new_chat()
    assert win.chat.tools_button.text() == "Tools (1)" and not win.chat.tools_on
