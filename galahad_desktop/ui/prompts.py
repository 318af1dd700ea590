"""Every modal question the window asks, in one place.

The window holds a `Prompts` and asks it; nothing else in the window opens a modal dialog.
Tests replace the window's `prompts` with their own answers (monkeypatching), so the shipped
code carries no test switches.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QDialog, QFileDialog, QInputDialog, QMessageBox, QWidget

from galahad_desktop.memory.results import ContextFull


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

    def edit_text(self, title: str, label: str, text: str) -> str:
        """A text to change: the new text, or "" (cancelled or emptied)."""
        edited, ok = QInputDialog.getMultiLineText(self.parent, title, label, text)
        return edited.strip() if ok else ""

    def context_full(self, full: ContextFull) -> str:
        """stop | summary | recent."""
        from galahad_desktop.ui.dialogs import ContextFullDialog

        dialog = ContextFullDialog(full, self.parent)
        return dialog.choice if dialog.exec() else "stop"

    def save_path(self, title: str, suggested: Path, filters: str) -> tuple[Path | None, str]:
        """Where to save (None: cancelled) and the filter chosen."""
        path, chosen = QFileDialog.getSaveFileName(self.parent, title, str(suggested), filters)
        return (Path(path) if path else None), chosen

    def show(self, dialog: QDialog) -> None:
        """A non-modal dialog (Ask the library): shown beside the window."""
        dialog.show()
