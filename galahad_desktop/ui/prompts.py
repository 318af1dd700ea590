"""Every modal question the window asks, in one place.

The window holds a `Prompts` and asks it; nothing else in the window opens a modal dialog.
Tests replace the window's `prompts` with their own answers (monkeypatching), so the shipped
code carries no test switches.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QLabel,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.memory.results import ContextFull
from galahad_desktop.ui import theme


class Prompts:
    def __init__(self, parent: QWidget) -> None:
        self.parent = parent

    def warn(self, title: str, message: str) -> None:
        QMessageBox.warning(self.parent, title, message)

    def inform(self, title: str, message: str) -> None:
        QMessageBox.information(self.parent, title, message)

    def confirm(self, title: str, text: str) -> bool:
        answer = QMessageBox.question(self.parent, title, text)
        return answer == QMessageBox.StandardButton.Yes

    def choose(self, title: str, text: str, buttons: list[str]) -> str:
        """A question with labelled buttons: the label chosen, or "" (cancelled)."""
        box = QMessageBox(self.parent)
        box.setWindowTitle(title)
        box.setText(text)
        chosen = [
            (box.addButton(label, QMessageBox.ButtonRole.AcceptRole), label) for label in buttons
        ]
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        clicked = box.clickedButton()
        return next((label for button, label in chosen if button is clicked), "")

    def context_full(self, full: ContextFull) -> str:
        """stop | summary | recent."""
        dialog = ContextFullDialog(full, self.parent)
        return dialog.choice if dialog.exec() else "stop"

    def save_path(self, title: str, suggested: Path, filters: str) -> tuple[Path | None, str]:
        """Where to save (None: cancelled) and the filter chosen."""
        path, chosen = QFileDialog.getSaveFileName(self.parent, title, str(suggested), filters)
        return (Path(path) if path else None), chosen

    def show(self, dialog: QDialog) -> None:
        """A non-modal dialog (Ask the library): shown beside the window."""
        dialog.show()


class ContextFullDialog(QDialog):
    """The next message does not fit: stop, continue from a summary, or keep the documents
    and the last turns — each with what it re-reads."""

    def __init__(self, full: ContextFull, parent: QWidget) -> None:
        super().__init__(parent)
        self.setWindowTitle(
            "The conversation is full" if full.message_fits else "The message is too long"
        )
        self.choice = "stop"
        layout = QVBoxLayout(self)
        head = QLabel(
            f"This conversation uses {full.context_tokens:,} of {full.n_ctx:,} tokens; the "
            f"next message needs {full.needed_tokens:,} more. Nothing is dropped silently — "
            "choose how to go on:"
            if full.message_fits
            else "This message does not fit in any conversation with this model: nothing was sent."
        )
        head.setWordWrap(True)
        layout.addWidget(head)
        self.buttons: dict[str, QPushButton] = {}
        for option in full.options:
            button = QPushButton(f"{option.label} — re-reads {option.reread_tokens:,} tokens")
            theme.describe(button, option.label, option.detail)
            button.clicked.connect(lambda _c=False, kind=option.kind: self._choose(kind))
            self.buttons[option.kind] = button
            layout.addWidget(button)
            note = QLabel(option.detail)
            note.setWordWrap(True)
            theme.set_role(note, "muted")
            layout.addWidget(note)

    def _choose(self, kind: str) -> None:
        self.choice = kind
        self.accept()
