"""The Memory panel beside the chat: what Galahad keeps for this conversation and in all,
what it saved, and the proof of the last restore in plain words, one click away."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget

from galahad_desktop.memory.results import ConversationSummary, GraftReport, MemoryStats
from galahad_desktop.ui import theme
from galahad_desktop.ui.format import graft_status, human_bytes, memory_line, memory_summary


class MemoryPanel(QWidget):
    proof_requested = Signal()
    details_requested = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.setAccessibleName("Memory panel")
        s = theme.SPACE
        layout = QVBoxLayout(self)
        layout.setContentsMargins(s[3], s[3], s[3], s[3])
        layout.setSpacing(s[2])
        here = QLabel("This conversation")
        everything = QLabel("Everything kept")
        for heading in (here, everything):
            theme.set_role(heading, "heading")
        self.conversation_label = QLabel("No conversation open.")
        self.restore_label = QLabel("")
        self.totals_label = QLabel("…")
        for label in (self.conversation_label, self.restore_label, self.totals_label):
            label.setWordWrap(True)
            theme.set_role(label, "card")
        self.conversation_label.setAccessibleName("This conversation's memory")
        self.restore_label.setAccessibleName("Last restore")
        self.totals_label.setAccessibleName("Everything kept")
        self.proof_button = QPushButton(theme.icon("verified"), "Show the proof…")
        self.proof_button.setAccessibleName("Show the proof")
        self.proof_button.setToolTip("What the last restore's check showed, in plain words")
        self.proof_button.clicked.connect(self.proof_requested.emit)
        self.details_button = QPushButton(theme.icon("memory"), "Details and verified answers…")
        self.details_button.setAccessibleName("Memory details")
        self.details_button.setToolTip("Tokens restored over time, and the verified answers kept")
        self.details_button.clicked.connect(self.details_requested.emit)
        for widget in (
            here,
            self.conversation_label,
            self.restore_label,
            self.proof_button,
            everything,
            self.totals_label,
            self.details_button,
        ):
            layout.addWidget(widget)
        layout.addStretch(1)

    def show_conversation(
        self, summary: ConversationSummary | None, restore: GraftReport | None
    ) -> None:
        if summary is None:
            self.conversation_label.setText("No conversation open.")
        else:
            state = {
                "stored": "Opens by restoring its memory, not by reading it again.",
                "needs re-reading": (
                    "Its memory was given back to free disk space"
                    if summary.given_back
                    else "Made under another model or settings"
                )
                + ": the next open reads it again once, then stores it.",
                "not stored": "Nothing stored yet.",
            }.get(summary.memory, memory_line(summary)[0])
            kept = (  # memory given back keeps nothing on disk (it said "kept in 10.0 MB")
                "; none of their memory is kept on disk now"
                if summary.memory == "needs re-reading" and summary.given_back
                else f" kept in {human_bytes(summary.block_bytes)} on disk, encrypted"
            )
            self.conversation_label.setText(f"<b>{summary.n_tokens:,}</b> tokens{kept}.<br>{state}")
        self.restore_label.setText(
            graft_status(restore) if restore is not None else "Not restored in this session."
        )

    def show_totals(self, stats: MemoryStats) -> None:
        self.totals_label.setText(memory_summary(stats))
