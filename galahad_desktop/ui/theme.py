"""The look, declared once: two palettes (light and dark), a spacing scale, the one style
sheet built from them, the icons of the main actions, and WCAG contrast arithmetic.

Every colour the window or the transcript uses comes from `current()`; nothing else in the UI
writes a colour or a style sheet of its own (tests/test_ui_look.py checks both the palettes'
contrast and that rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QGuiApplication,
    QIcon,
    QPainter,
    QPalette,
    QPixmap,
)
from PySide6.QtWidgets import QApplication, QStyle, QWidget

THEMES = ("system", "light", "dark")
SPACE = (2, 4, 8, 12, 16, 24)  # the spacing scale, in device-independent pixels
RADIUS = 8


@dataclass(frozen=True)
class Palette:
    name: str
    window: str  # the window's background
    surface: str  # the sidebar and panels
    base: str  # text fields and the transcript
    text: str
    muted: str  # secondary words: previews, times, explanations
    accent: str  # links, the primary button, focus
    on_accent: str  # text on the primary button
    border: str
    user_card: str  # a turn the user wrote
    model_card: str  # a turn the model wrote
    code_bg: str
    code_text: str
    success: str  # verified ✓, stored
    warning: str  # needs re-reading, settings that force it
    danger: str  # damaged, errors
    selection: str  # a selected row's background (text stays `text`)


LIGHT = Palette(
    name="light",
    window="#f7f7f8",
    surface="#eef0f3",
    base="#ffffff",
    text="#1f2328",
    muted="#57606a",
    accent="#0b57d0",
    on_accent="#ffffff",
    border="#d0d7de",
    user_card="#e8f0fe",
    model_card="#ffffff",
    code_bg="#f3f4f6",
    code_text="#1f2328",
    success="#116329",
    warning="#9a4d00",
    danger="#c5221f",
    selection="#d3e3fd",
)

DARK = Palette(
    name="dark",
    window="#1b1c1f",
    surface="#232428",
    base="#16171a",
    text="#e6e7ea",
    muted="#a4a9b1",
    accent="#8ab4f8",
    on_accent="#10131a",
    border="#3a3d44",
    user_card="#243349",
    model_card="#202226",
    code_bg="#111215",
    code_text="#e6e7ea",
    success="#6dd58c",
    warning="#f2b35b",
    danger="#f28b82",
    selection="#34496b",
)

# The pairs a reader must read: (foreground, background). WCAG AA asks 4.5:1 of body text.
READ_PAIRS = (
    ("text", "window"),
    ("text", "surface"),
    ("text", "base"),
    ("text", "user_card"),
    ("text", "model_card"),
    ("text", "selection"),
    ("muted", "base"),
    ("muted", "surface"),
    ("muted", "window"),
    ("muted", "user_card"),
    ("muted", "model_card"),
    ("accent", "base"),
    ("accent", "user_card"),
    ("accent", "model_card"),
    ("accent", "surface"),
    ("on_accent", "accent"),
    ("code_text", "code_bg"),
    ("success", "base"),
    ("success", "surface"),
    ("warning", "base"),
    ("warning", "surface"),
    ("danger", "base"),
    ("danger", "surface"),
)

_current = LIGHT


def _channel(value: int) -> float:
    c = value / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def luminance(color: str) -> float:
    """WCAG 2.x relative luminance of a #rrggbb colour."""
    q = QColor(color)
    return 0.2126 * _channel(q.red()) + 0.7152 * _channel(q.green()) + 0.0722 * _channel(q.blue())


def contrast(foreground: str, background: str) -> float:
    """WCAG contrast ratio, 1 to 21."""
    a, b = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def weakest_pair(palette: Palette) -> tuple[str, str, float]:
    ratios = [(f, b, contrast(getattr(palette, f), getattr(palette, b))) for f, b in READ_PAIRS]
    return min(ratios, key=lambda r: r[2])


def current() -> Palette:
    return _current


def system_is_dark() -> bool:
    hints = QGuiApplication.styleHints()
    scheme = getattr(hints, "colorScheme", None)
    return bool(scheme is not None and scheme() == Qt.ColorScheme.Dark)


def qt_palette(p: Palette) -> QPalette:
    palette = QPalette()
    roles = {
        QPalette.ColorRole.Window: p.window,
        QPalette.ColorRole.WindowText: p.text,
        QPalette.ColorRole.Base: p.base,
        QPalette.ColorRole.AlternateBase: p.surface,
        QPalette.ColorRole.Text: p.text,
        QPalette.ColorRole.Button: p.surface,
        QPalette.ColorRole.ButtonText: p.text,
        QPalette.ColorRole.Highlight: p.selection,
        QPalette.ColorRole.HighlightedText: p.text,
        QPalette.ColorRole.ToolTipBase: p.surface,
        QPalette.ColorRole.ToolTipText: p.text,
        QPalette.ColorRole.Link: p.accent,
        QPalette.ColorRole.PlaceholderText: p.muted,
        QPalette.ColorRole.Mid: p.border,
        QPalette.ColorRole.Light: p.base,
        QPalette.ColorRole.Dark: p.border,
    }
    for role, color in roles.items():
        palette.setColor(role, QColor(color))
    for role in (
        QPalette.ColorRole.Text,
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.ButtonText,
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(p.muted))
    return palette


def style_sheet(p: Palette) -> str:
    """The application's one style sheet. Widgets pick variants with dynamic properties:
    `primary` (the main button of a view), `role` = muted | warning | error | heading."""
    s = SPACE
    return f"""
QWidget {{ color: {p.text}; }}
QMainWindow, QDialog {{ background: {p.window}; }}
QWidget#sidebar {{ background: {p.surface}; }}
QToolBar {{ background: {p.window}; border: none; padding: {s[1]}px {s[3]}px; spacing: {s[2]}px; }}
QStatusBar {{ background: {p.window}; color: {p.muted}; border-top: 1px solid {p.border}; }}
QPushButton, QToolButton {{
    background: {p.base}; border: 1px solid {p.border}; border-radius: {RADIUS - 2}px;
    padding: {s[2] - 2}px {s[3]}px;
}}
QPushButton:hover, QToolButton:hover {{ border-color: {p.accent}; }}
QPushButton:focus, QToolButton:focus {{ border: 2px solid {p.accent}; }}
QPushButton:disabled {{ color: {p.muted}; background: {p.surface}; }}
QPushButton[primary="true"] {{
    background: {p.accent}; color: {p.on_accent}; border: 1px solid {p.accent}; font-weight: 600;
}}
QPushButton[primary="true"]:disabled {{ background: {p.border}; color: {p.muted}; }}
QToolButton {{ border: none; background: transparent; }}
QToolButton:checked {{ background: {p.selection}; }}
QLineEdit, QPlainTextEdit {{
    background: {p.base}; border: 1px solid {p.border}; border-radius: {RADIUS - 2}px;
    padding: {s[1]}px {s[2]}px; selection-background-color: {p.selection};
    selection-color: {p.text};
}}
QPlainTextEdit {{ padding: {s[2]}px; }}
QLineEdit:focus, QPlainTextEdit:focus {{ border: 2px solid {p.accent}; }}
QCheckBox::indicator {{ width: 16px; height: 16px; border: 1px solid {p.muted};
    border-radius: 4px; background: {p.base}; }}
QCheckBox::indicator:checked {{ background: {p.accent}; border-color: {p.accent}; }}
QCheckBox:focus {{ color: {p.accent}; }}
QLineEdit[invalid="true"] {{ border: 2px solid {p.danger}; }}
QPlainTextEdit[readOnly="true"] {{
    background: {p.surface}; color: {p.muted}; border-style: dashed; }}
QListWidget, QTreeWidget {{
    background: transparent; border: none; outline: 0;
}}
QListWidget::item {{ padding: {s[2]}px; border-radius: {RADIUS - 2}px; }}
QListWidget::item:selected {{ background: {p.selection}; color: {p.text}; }}
QListWidget::item:hover {{ background: {p.border}; }}
QListWidget:focus {{ border: 1px solid {p.accent}; border-radius: {RADIUS - 2}px; }}
QTextBrowser {{ background: {p.base}; border: none; }}
QTabWidget::pane {{ border: 1px solid {p.border}; border-radius: {RADIUS - 2}px; top: -1px; }}
QTabBar::tab {{ padding: {s[2]}px {s[4]}px; color: {p.muted}; }}
QTabBar::tab:selected {{ color: {p.text}; border-bottom: 2px solid {p.accent}; }}
QGroupBox {{ border: 1px solid {p.border}; border-radius: {RADIUS}px; margin-top: {s[4]}px;
    padding: {s[3]}px; }}
QGroupBox::title {{ subcontrol-origin: margin; left: {s[3]}px; color: {p.muted}; }}
QLabel[role="muted"] {{ color: {p.muted}; }}
QLabel[role="warning"] {{ color: {p.warning}; }}
QLabel[role="error"] {{ color: {p.danger}; }}
QLabel[role="heading"] {{ font-weight: 600; color: {p.muted}; padding-top: {s[2]}px; }}
QLabel[role="drop"] {{ border: 2px dashed {p.border}; border-radius: {RADIUS}px;
    padding: {s[3]}px; color: {p.muted}; }}
QLabel[role="card"] {{ background: {p.base}; border: 1px solid {p.border};
    border-radius: {RADIUS}px; padding: {s[3]}px; }}
QProgressBar {{ border: 1px solid {p.border}; border-radius: {RADIUS - 2}px; background: {p.base};
    text-align: center; color: {p.text}; }}
QProgressBar::chunk {{ background: {p.selection}; border-radius: {RADIUS - 2}px; }}
QToolTip {{ background: {p.surface}; color: {p.text}; border: 1px solid {p.border}; }}
QMenu {{ background: {p.base}; border: 1px solid {p.border}; }}
QMenu::item:selected {{ background: {p.selection}; color: {p.text}; }}
"""


def apply(app: QApplication, theme: str, font_size: int) -> bool:
    """Apply a theme ("system" follows the desktop) and a font size; True when dark."""
    global _current
    dark = theme == "dark" or (theme == "system" and system_is_dark())
    _current = DARK if dark else LIGHT
    app.setStyle("Fusion")
    app.setPalette(qt_palette(_current))
    app.setStyleSheet(style_sheet(_current))
    font = app.font()
    if font_size > 0:
        font.setPointSize(font_size)
        app.setFont(font)
    return dark


# -- icons ---------------------------------------------------------------------------------
# Qt's own standard icons (drawn by the Fusion style, shipped with Qt, no licence to carry):
# they exist on every platform and offscreen, where desktop icon themes do not.
_ICONS = {
    "new": QStyle.StandardPixmap.SP_FileDialogNewFolder,
    "document": QStyle.StandardPixmap.SP_FileIcon,
    "add-document": QStyle.StandardPixmap.SP_DialogOpenButton,
    "send": QStyle.StandardPixmap.SP_ArrowForward,
    "stop": QStyle.StandardPixmap.SP_MediaStop,
    "regenerate": QStyle.StandardPixmap.SP_BrowserReload,
    "edit": QStyle.StandardPixmap.SP_FileDialogContentsView,
    "verified": QStyle.StandardPixmap.SP_DialogApplyButton,
    "settings": QStyle.StandardPixmap.SP_FileDialogDetailedView,
    "memory": QStyle.StandardPixmap.SP_DriveHDIcon,
    "security": QStyle.StandardPixmap.SP_VistaShield,
    "ask": QStyle.StandardPixmap.SP_MessageBoxQuestion,
    "cancel": QStyle.StandardPixmap.SP_DialogCancelButton,
}


def icon(name: str) -> QIcon:
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        return QIcon()
    return app.style().standardIcon(_ICONS[name])


# A document's type as a small badge (PDF, DOCX, MD…), drawn rather than shipped.
_TYPE_COLOURS = {
    "pdf": "#c5221f",
    "docx": "#1a5fb4",
    "md": "#6a3fb5",
    "txt": "#57606a",
    "html": "#b35900",
}


def type_badge(extension: str, size: int = 28) -> QIcon:
    label = (extension or "txt").lower()[:4]
    colour = _TYPE_COLOURS.get(label, "#1a7f37")
    icon = QIcon()
    for scale in (1, 2):
        pixmap = QPixmap(QSize(size * scale, size * scale))
        pixmap.setDevicePixelRatio(scale)
        pixmap.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pixmap)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setBrush(QColor(colour))
        painter.setPen(Qt.PenStyle.NoPen)
        painter.drawRoundedRect(QRect(1, 3, size - 2, size - 6), 5, 5)
        font = QFont()
        font.setPixelSize(max(7, size // (3 if len(label) <= 3 else 4)))
        font.setBold(True)
        painter.setFont(font)
        painter.setPen(QColor("#ffffff"))
        painter.drawText(QRect(0, 0, size, size), Qt.AlignmentFlag.AlignCenter, label.upper())
        painter.end()
        icon.addPixmap(pixmap)
    return icon


def set_role(widget: QWidget, role: str) -> None:
    """Pick a label's variant from the style sheet (muted, warning, error, heading, card)."""
    widget.setProperty("role", role)
    widget.style().unpolish(widget)
    widget.style().polish(widget)


def describe(widget: QWidget, name: str, tip: str) -> None:
    """What a screen reader calls the control, and what hovering over it explains."""
    widget.setAccessibleName(name)
    widget.setToolTip(tip)


def set_primary(button: QWidget) -> None:
    button.setProperty("primary", True)
