"""The first screen: what the app does, which model is running (and, for the embedded demo
model, that it only continues text), a drop zone for documents, and the way to Gemma 4 —
recommended for this machine, downloaded with progress, SHA-256 checked, switched to."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent, QMouseEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.memory.results import EngineInfo
from galahad_desktop.models.catalog import GIB, Candidate, Recommendation
from galahad_desktop.ui import theme
from galahad_desktop.ui.chat_view import MessageBox


class DropZone(QLabel):
    """A dashed box to drop documents on (the window takes the drop), or to click."""

    clicked = Signal()

    def mousePressEvent(self, event: QMouseEvent) -> None:
        self.clicked.emit()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        # Focusable and opened with Enter or Space: usable without a mouse.
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
            self.clicked.emit()
        else:
            super().keyPressEvent(event)


def offered(recommendation: Recommendation) -> tuple[Candidate | None, bool]:
    """What the first screen offers: the recommended size, else the quickest size that fits
    (shown with its honest speed, to download anyway); (None, False) when none fits."""
    if recommendation.recommended is not None:
        chosen = next(c for c in recommendation.candidates if c.size == recommendation.recommended)
        return chosen, False
    fitting = [c for c in recommendation.candidates if c.fits]
    if not fitting:
        return None, False
    return max(fitting, key=lambda c: c.decode_tps), True


class Welcome(QWidget):
    get_model = Signal(str)  # the Gemma 4 size to download
    cancel_download = Signal()
    choose_documents = Signal()
    start_chat = Signal()
    send_message = Signal(str)  # typed on the first screen: a new chat's first message

    def __init__(self) -> None:
        super().__init__()
        self.chosen_size = ""  # the Gemma 4 size the offer stands for
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.setSpacing(theme.SPACE[4])
        title = QLabel("<h1>Galahad Desktop</h1>")
        intro = QLabel(
            "A private chat with a model that runs on this computer. Everything the model "
            "reads — your conversations and documents — is kept as encrypted memory, so a "
            "past chat resumes, or a document loads, in milliseconds instead of being read "
            "again, and every restore is checked to be byte-exact. Keys stay in your "
            "system's keyring."
        )
        intro.setWordWrap(True)
        self.model_label = QLabel("Loading the model…")
        self.model_label.setWordWrap(True)
        self.model_label.setTextFormat(Qt.TextFormat.RichText)
        self.offer = QFrame()
        self.offer.setFrameShape(QFrame.Shape.StyledPanel)
        offer = QVBoxLayout(self.offer)
        self.offer_label = QLabel()
        self.offer_label.setWordWrap(True)
        self.offer_label.setTextFormat(Qt.TextFormat.RichText)
        row = QHBoxLayout()
        self.get_button = QPushButton("Download Gemma 4")
        self.get_button.clicked.connect(lambda: self.get_model.emit(self.chosen_size))
        self.get_button.setAccessibleName("Download Gemma 4")
        self.get_button.setToolTip("Download the recommended Gemma 4, checked before use")
        theme.set_primary(self.get_button)
        self.cancel_button = QPushButton("Pause")
        self.cancel_button.clicked.connect(self.cancel_download.emit)
        self.cancel_button.setVisible(False)
        self.cancel_button.setAccessibleName("Pause the download")
        self.cancel_button.setToolTip("Pause; the download resumes where it stopped")
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Download progress")
        self.progress.setVisible(False)
        row.addWidget(self.get_button)
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        offer.addWidget(self.offer_label)
        offer.addLayout(row)
        self.offer.setVisible(False)
        self.drop_zone = DropZone(
            "Drop documents here (.txt, .md, .pdf, .docx, source files; pictures and scans "
            "with a Gemma 4 that has its projector; voice memos with Gemma 4 E2B or E4B) to "
            "read them once and keep them — or click to choose."
        )
        self.drop_zone.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.drop_zone.setWordWrap(True)
        self.drop_zone.setMinimumHeight(90)
        theme.set_role(self.drop_zone, "drop")
        self.drop_zone.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.drop_zone.setAccessibleName("Add documents")
        self.drop_zone.setToolTip("Drop files here, or press Enter to choose them")
        self.drop_zone.clicked.connect(self.choose_documents.emit)
        chat = QPushButton(theme.icon("new"), "Start a chat")
        chat.setAccessibleName("Start a chat")
        chat.setToolTip("Start a conversation with the model (Ctrl+N)")
        chat.clicked.connect(self.start_chat.emit)
        self.message = MessageBox()
        self.message.setPlaceholderText(
            "Write a message to start a chat — Enter sends, Shift+Enter breaks a line"
        )
        self.message.setAccessibleName("Message")
        self.message.setFixedHeight(theme.SPACE[4] * 4)
        self.message.setTabChangesFocus(True)
        self.message.submitted.connect(self._submit)
        for widget in (
            title,
            intro,
            self.model_label,
            self.message,
            self.offer,
            self.drop_zone,
            chat,
        ):
            layout.addWidget(widget)
        layout.addStretch(1)

    def _submit(self) -> None:
        text = self.message.toPlainText().strip()
        if text:
            self.message.clear()
            self.send_message.emit(text)

    def show_model(self, info: EngineInfo) -> None:
        model = info.model
        note = ""
        if model.kind == "demo":
            note = (
                "<br><b>This is the embedded demo model:</b> a "
                f"{html.escape(model.label)}. It shows how everything works, but it will not "
                "answer questions. Get Gemma 4 below for real conversations."
            )
        elif model.kind == "base":
            note = f"<br>{html.escape(model.label)}."
        words = int(info.n_ctx * 0.75)  # a token is about three quarters of a word
        self.model_label.setText(
            f"Running <b>{html.escape(model.name)}</b> on {html.escape(info.device_note())} · "
            f"a conversation holds about {words:,} words{note}"
        )
        # The technical names stay one hover away.
        self.model_label.setToolTip(
            f"{model.n_params / 1e6:,.0f}M parameters, {model.quantization} · context "
            f"{info.n_ctx:,} tokens · turn format: {info.turn_format_note} · library "
            f"questions matched by {info.routing}"
        )

    def show_offer(self, recommendation: Recommendation, installed: bool) -> None:
        if installed:
            self.offer.setVisible(False)
            return
        self.offer.setVisible(True)
        chosen, anyway = offered(recommendation)
        if chosen is None:
            # Nothing fits in this computer's memory: say so, and the way forward.
            self.get_button.setEnabled(False)
            self.offer_label.setText(
                f"<b>Gemma 4</b>: {html.escape(recommendation.reason)}<br>No size fits in "
                "this computer's memory. A smaller GGUF you already have can be chosen "
                "under Settings → Model."
            )
            return
        self.chosen_size = chosen.size
        self.get_button.setEnabled(True)
        self.get_button.setText(
            f"Download Gemma 4 {chosen.size} anyway ({chosen.bytes / 1e9:.1f} GB)"
            if anyway
            else f"Download Gemma 4 {chosen.size}"
        )
        headline = (
            f"<b>The Gemma 4 that fits: {html.escape(chosen.size)}</b> — slow here: about "
            f"{chosen.decode_tps:.1f} words a second, a page read in about "
            f"{400 / max(chosen.prefill_tps, 0.1):.0f} s (estimated on this computer)"
            if anyway
            else f"<b>Recommended for this computer: Gemma 4 {html.escape(chosen.size)}</b> "
            f"({html.escape(chosen.active_params)}, about {chosen.decode_tps:.0f} words a "
            "second here)"
        )
        self.offer_label.setText(
            f"{headline}.<br>{html.escape(recommendation.reason)}"
            f"<br>Download: about {chosen.bytes / 1e9:.1f} GB of disk · memory "
            f"{chosen.memory_needed / GIB:.1f} GiB · each token of chat or document costs "
            f"{chosen.kv_bytes_per_token / 1024:.0f} KiB of stored memory.<br>"
            f"From {html.escape(chosen.repo)} on the Hugging Face Hub; its SHA-256 is checked "
            "before it is used."
        )

    def show_progress(self, done: int, total: int) -> None:
        self.progress.setVisible(True)
        self.cancel_button.setVisible(True)
        self.get_button.setEnabled(False)
        self.progress.setMaximum(max(1, total // 1_000_000))
        self.progress.setValue(done // 1_000_000)
        self.progress.setFormat(f"{done / 1e9:.2f} of {total / 1e9:.2f} GB")

    def download_over(self) -> None:
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self.get_button.setEnabled(True)
