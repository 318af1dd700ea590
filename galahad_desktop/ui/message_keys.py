"""Typing goes to the message box, as in every chat app: a printable key pressed while no
text field has the focus (a sidebar row, a toolbar button, the chat after a menu closed
with Esc) moves the focus to the message box and types there, so nothing typed is lost.
Space and Enter keep their meaning for the focused control (press a button, open a row),
and shortcuts (Ctrl or Alt held) are left alone."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QWidget,
)

# Modifiers that still make a character, not a shortcut.
_TYPING_MODIFIERS = Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.KeypadModifier


def takes_text(widget: QWidget | None) -> bool:
    """Whether the widget edits text itself (the keys are its own)."""
    if isinstance(widget, QTextEdit | QPlainTextEdit):
        return not widget.isReadOnly()
    if isinstance(widget, QComboBox):
        return widget.isEditable()
    return isinstance(widget, QLineEdit | QAbstractSpinBox)


class TypingToMessageBox(QObject):
    """An application event filter for one window and its message box."""

    def __init__(self, window: QWidget, *boxes: QPlainTextEdit | QTextEdit) -> None:
        super().__init__(window)
        self.window = window
        self.boxes = boxes  # the first one shown takes the typing (the chat's, the welcome's)

    @property
    def box(self) -> QPlainTextEdit | QTextEdit:
        shown = [b for b in self.boxes if b.isVisibleTo(self.window)]
        return shown[0] if shown else self.boxes[0]

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.KeyPress or not isinstance(event, QKeyEvent):
            return False
        focused = self.window.focusWidget()  # the window's, even while another is active
        if (
            watched is not focused
            or not isinstance(focused, QWidget)
            or takes_text(focused)
            or not self.box.isVisibleTo(self.window)  # e.g. a dialog's page is shown
            or not self.box.isEnabled()
        ):
            return False
        text = event.text()
        if (
            not text
            or not text.isprintable()
            or text.isspace()
            or event.modifiers() & ~_TYPING_MODIFIERS
        ):
            return False
        self.box.setFocus(Qt.FocusReason.OtherFocusReason)
        QApplication.sendEvent(
            self.box,
            QKeyEvent(QEvent.Type.KeyPress, event.key(), event.modifiers(), text),
        )
        return True
