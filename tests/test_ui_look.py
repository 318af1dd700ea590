"""The window's look and its accessibility, on real Qt widgets over the fake engine (fast tier):
both themes' contrast, every control named for assistive technology, the settings dialog's
sections and checks, turns as cards, the sidebar's memory states and pins, the Memory panel
and the proof in plain words. The keyboard walkthrough with the real model is in test_gui.py.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QMimeData, Qt, QUrl
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QTextBrowser,
    QWidget,
)

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import TurnResult
from galahad_desktop.settings import GROUPS, SETTINGS
from galahad_desktop.sizes import human_size
from galahad_desktop.ui import theme
from galahad_desktop.ui.format import proof_words
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.render import message_html
from galahad_desktop.ui.settings_dialog import SettingsDialog
from galahad_desktop.ui.worker import CoreBridge
from tests.helpers import show_window, when_a_modal_opens

pytestmark = pytest.mark.gui
UI = Path(__file__).resolve().parent.parent / "galahad_desktop" / "ui"
WAIT_MS = 30_000
INTERACTIVE = (
    QAbstractButton,
    QLineEdit,
    QPlainTextEdit,
    QComboBox,
    QAbstractSpinBox,
    QListWidget,
    QTextBrowser,
)


class Answers:
    """The window's modal questions, answered by the test."""

    def __init__(self) -> None:
        self.informed: list[tuple[str, str]] = []
        self.warnings: list[str] = []

    def warn(self, title: str, message: str) -> None:
        self.warnings.append(message)

    def inform(self, title: str, message: str) -> None:
        self.informed.append((title, message))

    def confirm(self, title: str, text: str) -> bool:
        return True

    def show(self, dialog: QWidget) -> None:
        dialog.show()


@pytest.fixture()
def window(qtbot, make_fake_core: Callable[..., Galahad], tmp_path: Path) -> Iterator[MainWindow]:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    bridge = CoreBridge(lambda: make_fake_core(data=data, max_tokens=24))
    yield show_window(qtbot, bridge, data, Answers(), WAIT_MS)
    bridge.stop()


def _send(qtbot, win: MainWindow, text: str) -> TurnResult:  # type: ignore[no-untyped-def]
    win.chat.input.setPlainText(text)
    with qtbot.waitSignal(win.turn_finished, timeout=WAIT_MS) as blocker:
        win.send()
    qtbot.waitUntil(lambda: win.bridge.pending() == 0, timeout=WAIT_MS)
    result: TurnResult = blocker.args[0]
    return result


def _unnamed(root: QWidget) -> list[str]:
    """Visible controls a screen reader could not name, or that explain nothing on hover."""
    missing = []
    for widget in root.findChildren(QWidget):
        if not isinstance(widget, INTERACTIVE) or not widget.isVisibleTo(root):
            continue
        if widget.parent() is not None and type(widget.parent()).__name__ in (
            "QAbstractSpinBox",
            "QDoubleSpinBox",
            "QSpinBox",
            "QComboBox",
            "QTabBar",
            "QScrollBar",
            "QDialogButtonBox",
            "QToolBar",  # the toolbar's own extension arrow
            "QDockWidget",  # the dock's close button (named by Qt)
        ):
            continue
        if type(widget).__name__ in ("QToolBarExtension", "QDockWidgetTitleButton"):
            continue
        described = widget.toolTip() or isinstance(widget, QListWidget | QTextBrowser)
        if not widget.accessibleName() or not described:
            text = widget.text() if isinstance(widget, QAbstractButton) else ""
            missing.append(f"{type(widget).__name__} {widget.objectName()!r} {text}")
    return missing


# -- the palettes --------------------------------------------------------------------------
@pytest.mark.parametrize("palette", [theme.LIGHT, theme.DARK], ids=["light", "dark"])
def test_both_palettes_meet_wcag_aa(palette: theme.Palette) -> None:
    for foreground, background in theme.READ_PAIRS:
        ratio = theme.contrast(getattr(palette, foreground), getattr(palette, background))
        assert ratio >= 4.5, f"{palette.name}: {foreground} on {background} is {ratio:.2f}:1"


def test_contrast_arithmetic_matches_wcag() -> None:
    assert theme.contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert theme.contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    assert theme.contrast("#ffffff", "#ffffff") == pytest.approx(1.0)
    weak = theme.Palette(**{**theme.LIGHT.__dict__, "muted": "#aaaaaa"})
    assert theme.weakest_pair(weak)[0] == "muted" and theme.weakest_pair(weak)[2] < 4.5


def test_no_colour_or_style_sheet_outside_the_theme() -> None:
    """One palette, one style sheet: every other UI module takes its colours from theme."""
    offenders = []
    for path in UI.glob("*.py"):
        if path.name == "theme.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "setStyleSheet":
                offenders.append(f"{path.name}:{node.lineno} setStyleSheet")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.search(r"#[0-9a-fA-F]{6}\b", node.value)
            ):
                offenders.append(f"{path.name}:{node.lineno} {node.value[:30]!r}")
    assert offenders == []


# -- turns as cards ------------------------------------------------------------------------
def test_a_reply_is_a_card_with_its_heading_scaled_and_code_labelled() -> None:
    text = "# Big title\n\nSome words.\n\n```python\nprint('hi')\n```\n"
    html = message_html("model", text, theme.LIGHT, 3, actions=("copy", "regenerate"))
    assert "<h1" not in html  # a reply's heading stays inside the reply
    assert "font-size:large" in html and "Big title" in html
    assert f'bgcolor="{theme.LIGHT.model_card}"' in html
    assert ">python<" in html and 'href="galahad:copy-code/3/0"' in html
    assert 'href="galahad:copy/3"' in html and 'href="galahad:regenerate/3"' in html
    user = message_html("user", "<b>not html</b>", theme.DARK, 0, actions=("copy", "edit"))
    assert f'bgcolor="{theme.DARK.user_card}"' in user and "&lt;b&gt;" in user
    stamped = message_html("user", "hi", theme.LIGHT, 0, when=1_700_000_000.0)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", stamped)


def test_turn_actions_copy_regenerate_edit_and_branch(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    first = _send(qtbot, window, "Tell me about the lake.")
    _send(qtbot, window, "And the castle?")
    chat = window.chat
    assert chat.actions_of(0) == ("copy", "edit")
    assert chat.actions_of(1) == ("copy", "branch")
    assert chat.actions_of(3) == ("copy", "regenerate")
    html = chat.transcript.toHtml()
    assert "galahad:branch/1" in html and "galahad:regenerate/3" in html
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS) as regenerated:
        chat._anchor(QUrl("galahad:regenerate/3"))
    assert regenerated.args[0].conversation_id == first.conversation_id
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    # Edit is done in the message box (a modal dialog was): Escape gives the draft back,
    # Enter continues from the edited message in a new branch.
    chat.input.setPlainText("a draft")
    chat._anchor(QUrl("galahad:edit/2"))
    assert chat.input.toPlainText() == chat.messages[2].text and "Editing" in chat.input_note.text()
    qtbot.keyClick(chat.input, Qt.Key.Key_Escape)
    assert chat.input.toPlainText() == "a draft" and chat.editing is None
    assert len(chat.messages) == 4  # nothing changed
    chat._anchor(QUrl("galahad:edit/2"))
    chat.input.setPlainText("Tell me about the river.")
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS):
        qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    assert [m.text for m in chat.messages[:3]][2] == "Tell me about the river."
    assert len(chat.messages) == 4
    assert chat.input.toPlainText() == "a draft"  # what was being written is back
    with qtbot.waitSignal(window.turn_finished, timeout=WAIT_MS):
        chat._anchor(QUrl("galahad:branch/1"))  # the first question, asked again
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    assert [m.role for m in chat.messages] == ["user", "model"]
    assert chat.messages[0].text == "Tell me about the lake."
    window.times_action.trigger()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", chat.transcript.toPlainText())


def test_streaming_renders_only_the_last_turn(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    from galahad_desktop.ui.chat_view import ShownMessage

    chat = window.chat
    chat.set_messages(
        [ShownMessage("user" if i % 2 == 0 else "model", f"m {i}") for i in range(40)]
    )
    kept = {i: chat._html[i][1] for i in range(39)}
    chat.append("model")
    chat.stream("new words")
    chat.redraw()
    assert all(chat._html[i][1] is kept[i] for i in range(39))  # not rendered again
    assert "new words" in chat.transcript.toPlainText()


# -- themes --------------------------------------------------------------------------------
def test_both_themes_apply_everywhere(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    _send(qtbot, window, "Hello there.")
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    for name, palette in (("dark", theme.DARK), ("light", theme.LIGHT), ("dark", theme.DARK)):
        window.set_theme(name)
        assert theme.current() is palette
        assert app.palette().color(QPalette.ColorRole.Window).name() == palette.window
        assert palette.accent in app.styleSheet()
        assert palette.user_card in window.chat.turn_html(0)
        assert window.chat.dark() == (name == "dark")
    window.toggle_theme()
    assert theme.current() is theme.LIGHT and window.ui_settings.value("theme") == "light"


# -- accessibility -------------------------------------------------------------------------
def test_every_visible_control_has_an_accessible_name(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    _send(qtbot, window, "Hello there.")
    window.memory_dock.setVisible(True)
    assert _unnamed(window) == []
    dialog = SettingsDialog(window, window)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: "n_batch" in dialog.editors, timeout=WAIT_MS)
    for index, section in enumerate(dialog.sections.values()):
        dialog.tabs.setCurrentIndex(index)
        section.advanced_button.setChecked(True)
        assert _unnamed(dialog) == [], section.name
    dialog.reject()
    from galahad_desktop.ui.dialogs import MemoryDialog, SecurityDialog

    for other in (SecurityDialog(window, window), MemoryDialog(window, window)):
        qtbot.addWidget(other)
        other.show()
        qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
        assert _unnamed(other) == [], type(other).__name__
        other.reject()
    window.open_ask()
    assert window.ask_dialog is not None
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    assert _unnamed(window.ask_dialog) == []
    window.ask_dialog.close()


def test_tab_order_runs_from_the_sidebar_to_the_send_button(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    window.new_chat()
    order = []
    widget: QWidget | None = window.sidebar.search
    for _ in range(40):
        assert widget is not None
        order.append(widget)
        widget = widget.nextInFocusChain()
        while widget is not None and not (
            widget.focusPolicy() & Qt.FocusPolicy.TabFocus and widget.isVisibleTo(window)
        ):
            widget = widget.nextInFocusChain()
    wanted = [
        window.sidebar.search,
        window.sidebar.new_button,
        window.sidebar.conversation_list,
        window.chat.input,
        window.chat.send_button,
    ]
    positions = [order.index(w) for w in wanted]
    assert positions == sorted(positions), [type(w).__name__ for w in order]


# -- settings in plain words ---------------------------------------------------------------
def test_settings_are_grouped_explained_and_checked_as_typed(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    assert {s.group for s in SETTINGS} <= set(GROUPS)
    assert all(s.label and s.label != s.key for s in SETTINGS)
    dialog = SettingsDialog(window, window)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitUntil(lambda: "n_batch" in dialog.editors, timeout=WAIT_MS)
    assert [dialog.tabs.tabText(i) for i in range(dialog.tabs.count())] == [*GROUPS, "Tools"]
    performance = dialog.sections["Performance"]
    assert dialog.editors["n_gpu_layers"].isVisibleTo(dialog) is False  # another tab
    dialog.tabs.setCurrentIndex(list(GROUPS).index("Performance"))
    assert dialog.editors["n_gpu_layers"].isVisible()
    assert not dialog.editors["n_ubatch"].isVisible()  # advanced: folded
    performance.advanced_button.click()
    assert dialog.editors["n_ubatch"].isVisible()
    assert dialog.editors["n_ubatch"].suffix() == " tokens"  # type: ignore[attr-defined]
    labels = [w.text() for w in performance.findChildren(type(dialog.warning))]
    assert "GPU offload" in labels and not any(t == "n_gpu_layers" for t in labels)
    # Checked as typed, with the setting's plain name in the message; Save waits.
    temperature = dialog.editors["temperature"]
    assert isinstance(temperature, QLineEdit)
    temperature.setText("warm")
    assert "temperature" in dialog.problems.text() and not dialog.save_button.isEnabled()
    assert temperature.property("invalid") is True
    temperature.setText("9")  # above the declared maximum
    assert "temperature" in dialog.problems.text() and not dialog.save_button.isEnabled()
    temperature.setText("0.4")
    assert dialog.problems.text() == "" and dialog.save_button.isEnabled()
    assert dialog.warning.text() == ""
    dialog.editors["n_batch"].setValue(256)  # type: ignore[attr-defined]
    assert (
        "Tokens read at once" in dialog.warning.text()
        and "read again once" in dialog.warning.text()
    )
    privacy = dialog.sections["Privacy"]
    assert any("keyring" in w.text() for w in privacy.findChildren(type(dialog.warning)))
    dialog.reject()


# -- memory made visible -------------------------------------------------------------------
def test_sidebar_shows_previews_memory_states_and_pins(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    from galahad_desktop.ui.sidebar import PREVIEW_ROLE, STATE_ROLE

    first = _send(qtbot, window, "Tell me about the lake.")
    window.new_chat()
    second = _send(qtbot, window, "Where is the bakery?")
    qtbot.waitUntil(lambda: len(window.sidebar.ids()) == 2, timeout=WAIT_MS)
    item = window.sidebar.item_of(first.conversation_id)
    assert item is not None
    assert item.data(PREVIEW_ROLE) == " ".join(first.reply.split())[:120]
    assert item.data(STATE_ROLE)[0].startswith("Stored ·")
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS):
        window.open_conversation(first.conversation_id)
    item = window.sidebar.item_of(first.conversation_id)
    assert item is not None
    state, colour = item.data(STATE_ROLE)
    assert re.fullmatch(r"Resumed in \d+ ms · verified ✓", state) and colour == "success"
    # Pinned conversations come first, under their own heading, and stay pinned.
    window.toggle_pin(second.conversation_id)
    assert window.sidebar.conversation_list.item(0).text() == "Pinned"
    assert window.sidebar.ids()[0] == second.conversation_id
    assert window.ui_settings.value("pinned") in ([second.conversation_id], second.conversation_id)
    window.toggle_pin(second.conversation_id)
    assert window.sidebar.conversation_list.item(0).text() == "Today"
    # A conversation made under other runtime settings says it will be re-read.
    window.bridge.run(lambda core, _job: core.update_settings({"n_batch": 256}))
    qtbot.waitUntil(lambda: window.bridge.pending() == 0, timeout=WAIT_MS)
    with qtbot.waitSignal(window.lists_refreshed, timeout=WAIT_MS):
        window.refresh_lists()
    states = {c.id: c.memory for c in window.sidebar.conversations}
    assert set(states.values()) == {"needs re-reading"}


def test_memory_panel_and_the_proof_in_plain_words(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    assert "No conversation has been restored yet" in proof_words(None)
    first = _send(qtbot, window, "Tell me about the lake.")
    window.new_chat()
    with qtbot.waitSignal(window.conversation_opened, timeout=WAIT_MS) as opened:
        window.open_conversation(first.conversation_id)
    graft = opened.args[0].graft
    assert graft.proof.verdict == "exact"
    qtbot.keyClick(window, Qt.Key.Key_M, Qt.KeyboardModifier.ControlModifier)
    if not window.memory_dock.isVisible():  # offscreen windows are not always active
        window.memory_action.trigger()
    assert window.memory_dock.isVisible()
    panel = window.memory_panel
    qtbot.waitUntil(lambda: "tokens kept" in panel.conversation_label.text(), timeout=WAIT_MS)
    assert f"{first.context_tokens:,}" in panel.conversation_label.text() or "tokens kept" in (
        panel.conversation_label.text()
    )
    assert "byte-exact ✓" in panel.restore_label.text()
    assert re.search(r"<b>\d+</b> blocks? on disk", panel.totals_label.text())
    # One unit with `galahad storage` (#59 item 3: the window divided by 1024, the command by
    # 1000, so a 70 MB budget read 66.8 MB here).
    stored: list[Any] = []
    window.bridge.run(
        lambda core, _job: core.list_conversations(), on_done=stored.append, label="list"
    )
    qtbot.waitUntil(lambda: bool(stored), timeout=WAIT_MS)
    summary = next(c for c in stored[0] if c.id == first.conversation_id)
    assert summary.block_bytes >= 1000  # where the two units part
    assert f"{human_size(summary.block_bytes)} on disk" in panel.conversation_label.text()
    panel.proof_button.click()
    title, words = window.prompts.informed[-1]  # type: ignore[attr-defined]
    assert "proof" in title.lower() and "identical, bit for bit" in words
    assert f"{graft.restored_tokens:,} tokens" in words


def test_a_settings_dialog_opens_from_the_keyboard(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    """Ctrl+, opens the settings; Escape closes them (a modal dialog, found while open)."""
    seen = when_a_modal_opens(lambda dialog: dialog.close())
    shortcut = next(
        a for a in window.findChildren(type(window.times_action)) if a.text() == "Settings…"
    )
    assert shortcut.shortcut().toString() == "Ctrl+,"
    shortcut.trigger()
    assert seen == ["Settings"]


def test_pasting_text_and_a_picture_into_the_message_box(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    text = QMimeData()
    text.setText("hello")
    window.chat.input.insertFromMimeData(text)
    assert window.chat.input.toPlainText() == "hello"
    _send(qtbot, window, "A first message.")
    image = QImage(32, 24, QImage.Format.Format_RGB32)
    image.fill(QColor("steelblue"))
    picture = QMimeData()
    picture.setImageData(image)
    assert window.chat.input.canInsertFromMimeData(picture)
    window.chat.input.setPlainText("kept")
    with qtbot.waitSignal(window.error_shown, timeout=WAIT_MS) as refused:
        window.chat.input.insertFromMimeData(picture)
    assert "reads no pictures" in refused.args[0]  # the fake engine has no projector
    # The window's way to the fix, never a terminal command.
    assert "Settings" in refused.args[0] and "galahad " not in refused.args[0]
    assert window.chat.input.toPlainText() == "kept"  # a picture never becomes text
    assert [m.role for m in window.chat.messages] == ["user", "model"]  # no card left behind


def test_a_memo_card_plays_its_sound_from_memory_and_stops(  # type: ignore[no-untyped-def]
    qtbot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A voice memo's card shows its length and Play; Play pipes the memo's samples into the
    desktop's sound player (here a stand-in `paplay` that keeps what it is given: only the
    spawned process is replaced), never a file of ours; the card shows Stop while it plays
    and Play once it ended; a missing player is said on the status line."""
    import io
    import wave

    from galahad_desktop.engine.picture import Sound
    from galahad_desktop.ui.chat_view import ShownMessage

    pcm = bytes(range(256)) * 250  # 64,000 bytes: 2 s of 16 kHz 16-bit samples
    wav = Sound.from_pcm(pcm).wav
    heard, said = tmp_path / "heard.raw", tmp_path / "args.txt"
    player = tmp_path / "bin" / "paplay"
    player.parent.mkdir()
    player.write_text(f'#!/bin/sh\necho "$@" > {said}\nsleep 0.3\ncat > {heard}\n')
    player.chmod(0o755)
    monkeypatch.setenv("PATH", f"{player.parent}:{os.environ['PATH']}")
    chat = window.chat
    chat.set_messages([ShownMessage("document", "orchard.m4a", sound=wav)])
    html = chat.transcript.toHtml()
    assert "orchard.m4a" in html and "0:02" in html and "galahad:play/0" in html
    chat._anchor(QUrl("galahad:play/0"))
    assert chat.player.playing == 0 and "galahad:stop/0" in chat.transcript.toHtml()
    qtbot.waitUntil(lambda: chat.player.playing is None, timeout=WAIT_MS)
    assert heard.read_bytes() == pcm  # every sample, through the pipe
    assert "--raw" in said.read_text() and "--rate=16000" in said.read_text()
    assert "galahad:play/0" in chat.transcript.toHtml()
    # Stop while it plays: the player goes, the card says Play again.
    chat._anchor(QUrl("galahad:play/0"))
    chat._anchor(QUrl("galahad:stop/0"))
    assert chat.player.playing is None and "galahad:play/0" in chat.transcript.toHtml()
    # No player on this computer: said plainly, nothing plays.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with qtbot.waitSignal(chat.play_failed, timeout=WAIT_MS) as failed:
        chat._anchor(QUrl("galahad:play/0"))
    assert "no sound player" in failed.args[0] and chat.player.playing is None
    with wave.open(io.BytesIO(wav)) as reader:
        assert reader.getframerate() == 16_000


def test_every_character_the_window_writes_is_in_its_font(qapp: Any) -> None:
    """No missing-glyph boxes: every non-ASCII character in the window's strings is one
    DejaVu Sans (Debian's default font, installed by setup.sh) draws."""
    import ast

    from PySide6.QtGui import QFont, QFontDatabase, QFontMetrics

    assert "DejaVu Sans" in QFontDatabase.families(), "install fonts-dejavu-core"
    metrics = QFontMetrics(QFont("DejaVu Sans"))
    ui = Path(__file__).resolve().parents[1] / "galahad_desktop" / "ui"
    used: dict[str, str] = {}
    for source in sorted(ui.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for char in node.value:
                    if ord(char) > 127:
                        used.setdefault(char, source.name)
    assert "✓" in used and "…" in used  # the scan sees the window's strings
    missing = {c: f for c, f in used.items() if not metrics.inFontUcs4(ord(c))}
    assert missing == {}


def test_the_memory_chart_is_wide_enough_for_its_legend(qapp: Any) -> None:
    from galahad_desktop.ui.dialogs import CHART_LEGEND, TokenChart

    chart = TokenChart()
    legend = chart.fontMetrics().horizontalAdvance(CHART_LEGEND)
    assert chart.minimumWidth() >= 40 + legend  # drawn from the plot's left edge, 40 px in


def test_settings_and_menus_speak_plainly() -> None:
    """Issue #59 item 9: engine words a person should not need ("Logical batch size for
    prompt evaluation", "ring buffer", "Read in f16, keep in q8_0", "Store turns as a
    chain", "Merge a chain after 24 links … the newest `checkpoints` turns")."""
    from galahad_desktop.engine.values import Counters
    from galahad_desktop.settings import SETTINGS
    from galahad_desktop.ui.format import reuse_words

    jargon = ("batch size", "ring buffer", "f16,", "in f16", "chain", "links", "`", "micro-batch")
    for setting in SETTINGS:
        words = f"{setting.label} {setting.description} {setting.unit or ''}"
        found = [j for j in jargon if j in words]
        assert not found, (setting.key, found)
    assert reuse_words(Counters()) == ""  # nothing restored or read again: nothing said
    assert reuse_words(Counters(restored_tokens=300, recomputed_tokens=2)) == (
        " · 300 tokens restored from memory · 2 read again"
    )


def test_delete_is_called_delete(window: MainWindow) -> None:
    labels = [a.text() for menu in window.menuBar().actions() for a in menu.menu().actions()]
    assert "Delete conversation…" in labels and not [t for t in labels if "Forget" in t]


def test_the_model_line_says_in_words_what_a_missing_chat_template_means() -> None:
    from galahad_desktop.engine.modelinfo import ModelInfo
    from galahad_desktop.ui.settings_dialog import describe_model

    base = dict(path="m.gguf", name="Gemma 3 270m", architecture="gemma3", description="")
    info = ModelInfo(
        **base, n_params=268_000_000, size_bytes=1, n_ctx_train=32768, n_layers=18,
        has_chat_template=False, quantization="Q4_K_M", kind="chat", label="built in",
    )  # fmt: skip
    line = describe_model(info)
    assert "chat template: no" not in line and "Gemma's is used" in line
    with_template = describe_model(dataclasses.replace(info, has_chat_template=True))
    assert "chat format" not in with_template and "chat template" not in with_template
