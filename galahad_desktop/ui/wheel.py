"""Values change only when the person means it: a spin box or combo box takes the mouse
wheel only once it has focus (clicked or tabbed to); until then the wheel scrolls what holds
it. Qt's default turned a scroll of the Settings page into "Part overlap 64 → 52 → 37"."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QWidget


class _WheelGuard(QObject):
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (
            event.type() == QEvent.Type.Wheel
            and isinstance(watched, QWidget)
            and not watched.hasFocus()
        ):
            # Not for this widget: ignored, so Qt hands it to the parent (the scroll area).
            event.ignore()
            return True
        return False


_GUARD = _WheelGuard()


def guard_wheel(*widgets: QAbstractSpinBox | QComboBox) -> None:
    """The wheel changes these only once they have focus (a wheel never gives it)."""
    for widget in widgets:
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        widget.installEventFilter(_GUARD)
