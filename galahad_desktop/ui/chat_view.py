"""The conversation: the transcript (copy buttons on every reply and code block, a collapsed
"Thinking…" section), the message box and the turn buttons."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.ui.render import code_blocks, message_html


@dataclass
class ShownMessage:
    role: str
    text: str
    thoughts: str = ""
    expanded: bool = False


class ChatView(QWidget):
    copied = Signal(str)  # what was put on the clipboard (for the status line and tests)

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[ShownMessage] = []
        self.model_name = "Gemma"
        self.focus_index = -1
        self.transcript = QTextBrowser()
        self.transcript.setOpenLinks(False)
        self.transcript.setOpenExternalLinks(False)
        self.transcript.anchorClicked.connect(self._anchor)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message the model (Ctrl+Enter to send)")
        self.input.setFixedHeight(90)
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.regenerate_button = QPushButton("Regenerate")
        self.edit_button = QPushButton("Edit a message…")
        self.verify_button = QPushButton("Mark verified")
        self.verify_button.setToolTip(
            "Store the last answer in the verified library (checkable answers must pass)"
        )
        self.thinking_box = QCheckBox("Think first")
        self.thinking_box.setToolTip(
            "Let the model think before answering (Gemma 4). Set when a conversation starts; "
            "the thoughts are shown, never kept."
        )
        buttons = QHBoxLayout()
        for button in (self.regenerate_button, self.edit_button, self.verify_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.thinking_box)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.input)
        layout.addLayout(buttons)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(60)
        self._render_timer.timeout.connect(self.redraw)
        for keys, slot in (
            ("Ctrl+Up", lambda: self.move_focus(-1)),
            ("Ctrl+Down", lambda: self.move_focus(1)),
            ("Ctrl+Shift+C", self.copy_focused),
        ):
            QShortcut(QKeySequence(keys), self, slot)

    def dark(self) -> bool:
        # The application's palette: a widget's own follows it only after an event round.
        return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128

    def set_busy(self, busy: bool) -> None:
        self.stop_button.setEnabled(busy)
        for widget in (
            self.send_button,
            self.regenerate_button,
            self.edit_button,
            self.verify_button,
        ):
            widget.setEnabled(not busy)

    # -- the transcript ------------------------------------------------------------------
    def set_messages(self, messages: list[ShownMessage]) -> None:
        self.messages = messages
        self.focus_index = len(messages) - 1
        self.redraw()

    def append(self, role: str, text: str = "") -> None:
        self.messages.append(ShownMessage(role, text))
        self.redraw()

    def stream(self, piece: str, thought: bool = False) -> None:
        if not self.messages:
            return
        if thought:
            self.messages[-1].thoughts += piece
        else:
            self.messages[-1].text += piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def redraw(self) -> None:
        dark = self.dark()
        body = "".join(
            message_html(m.role, m.text, dark, i, m.thoughts, m.expanded, self.model_name)
            for i, m in enumerate(self.messages)
        )
        self.transcript.setHtml(body)
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _anchor(self, url: QUrl) -> None:
        if url.scheme() != "galahad":
            return
        parts = url.path().split("/")
        action, numbers = parts[0], [int(p) for p in parts[1:] if p.isdigit()]
        if not numbers or numbers[0] >= len(self.messages):
            return
        message = self.messages[numbers[0]]
        if action == "copy":
            self.copy(message.text)
        elif action == "copy-code" and len(numbers) == 2:
            blocks = code_blocks(message.text)
            if numbers[1] < len(blocks):
                self.copy(blocks[numbers[1]])
        elif action == "toggle-thoughts":
            message.expanded = not message.expanded
            position = self.transcript.verticalScrollBar().value()
            self.redraw()
            self.transcript.verticalScrollBar().setValue(position)

    def copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)

    # -- keyboard ------------------------------------------------------------------------
    def move_focus(self, delta: int) -> None:
        """Ctrl+Up / Ctrl+Down: step through the messages (Ctrl+Shift+C copies one)."""
        if not self.messages:
            return
        self.focus_index = max(0, min(len(self.messages) - 1, self.focus_index + delta))
        self.transcript.scrollToAnchor(f"m{self.focus_index}")

    def copy_focused(self) -> None:
        if 0 <= self.focus_index < len(self.messages):
            self.copy(self.messages[self.focus_index].text)
