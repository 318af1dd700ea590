"""Light and dark, following the system unless the user chooses; the font size."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

THEMES = ("system", "light", "dark")


def system_is_dark() -> bool:
    hints = QGuiApplication.styleHints()
    scheme = getattr(hints, "colorScheme", None)
    return bool(scheme is not None and scheme() == Qt.ColorScheme.Dark)


def dark_palette() -> QPalette:
    palette = QPalette()
    colors = {
        QPalette.ColorRole.Window: "#202124",
        QPalette.ColorRole.WindowText: "#e8eaed",
        QPalette.ColorRole.Base: "#17181a",
        QPalette.ColorRole.AlternateBase: "#2a2b2e",
        QPalette.ColorRole.Text: "#e8eaed",
        QPalette.ColorRole.Button: "#303134",
        QPalette.ColorRole.ButtonText: "#e8eaed",
        QPalette.ColorRole.Highlight: "#8ab4f8",
        QPalette.ColorRole.HighlightedText: "#202124",
        QPalette.ColorRole.ToolTipBase: "#303134",
        QPalette.ColorRole.ToolTipText: "#e8eaed",
        QPalette.ColorRole.Link: "#8ab4f8",
        QPalette.ColorRole.PlaceholderText: "#9aa0a6",
    }
    for role, color in colors.items():
        palette.setColor(role, QColor(color))
    return palette


def apply(app: QApplication, theme: str, font_size: int) -> bool:
    """Apply a theme ("system" follows the desktop) and a font size; True when dark."""
    dark = theme == "dark" or (theme == "system" and system_is_dark())
    app.setStyle("Fusion")
    app.setPalette(dark_palette() if dark else app.style().standardPalette())
    font = app.font()
    if font_size > 0:
        font.setPointSize(font_size)
        app.setFont(font)
    return dark
