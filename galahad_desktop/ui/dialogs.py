"""Security, Memory, Ask and Context-full dialogs (Settings: ui/settings_dialog.py). Like
the window, they only talk to the worker; they know the window only as a Host (ui/host.py)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import (
    AskResult,
    MemoryStats,
    UsageEntry,
)
from galahad_desktop.ui import theme
from galahad_desktop.ui.format import memory_summary
from galahad_desktop.ui.host import Host
from galahad_desktop.ui.render import markdown_html
from galahad_desktop.ui.wheel import guard_wheel
from galahad_desktop.ui.worker import CANCELLED, Request


class SummaryDialog(QDialog):
    """A dialog that opens on a summary line, filled in once the core has answered (the
    subclass adds `summary` to `body` where it belongs)."""

    def __init__(self, host: Host, parent: QWidget, title: str) -> None:
        super().__init__(parent)
        self.host = host
        self.setWindowTitle(title)
        self.body = QVBoxLayout(self)
        self.summary = QLabel("…")
        self.summary.setWordWrap(True)


class SecurityDialog(SummaryDialog):
    def __init__(self, host: Host, parent: QWidget) -> None:
        super().__init__(host, parent, "Security")
        layout = self.body
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.summary)
        row = QHBoxLayout()
        self.rotate_button = QPushButton("Rotate master key")
        self.rotate_button.clicked.connect(self.rotate)
        self.lock_button = QPushButton("Lock")
        self.lock_button.clicked.connect(self.toggle_lock)
        self.audit_button = QPushButton("Run audit")
        self.audit_button.clicked.connect(self.audit)
        self.forget_button = QPushButton("Delete conversation…")
        self.forget_button.clicked.connect(host.forget_conversation)
        for button, name, tip in (
            (
                self.rotate_button,
                "Rotate master key",
                "Make a new master key and re-wrap every block's key under it",
            ),
            (self.lock_button, "Lock or unlock", "Drop the keys from memory until unlocked"),
            (self.audit_button, "Run audit", "Check every stored record and block, read-only"),
            (
                self.forget_button,
                "Delete conversation",
                "Delete the open conversation, its blocks and its keys",
            ),
        ):
            theme.describe(button, name, tip)
            row.addWidget(button)
        layout.addLayout(row)
        copies = QHBoxLayout()
        self.backup_button = QPushButton("Back up…")
        self.backup_button.setToolTip(
            "A consistent, still-encrypted copy of every conversation and document"
        )
        self.backup_button.clicked.connect(self.backup)
        self.kit_button = QPushButton("Export recovery kit…")
        self.kit_button.setToolTip(
            "The master keys wrapped under a recovery passphrase: opens your backups on "
            "another computer, or after the keyring is lost"
        )
        self.kit_button.clicked.connect(self.export_kit)
        for button in (self.backup_button, self.kit_button):
            button.setAccessibleName(button.text().rstrip("…"))
            copies.addWidget(button)
        copies.addStretch(1)
        layout.addLayout(copies)
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        theme.describe(self.output, "Results", "What the last action reported")
        layout.addWidget(self.output)
        self.locked = False
        self.refresh()

    def refresh(self) -> None:
        self.host.bridge.run(
            lambda core, _job: core.key_status(), on_done=self._show, on_error=self.host.show_error
        )

    def _show(self, status: Any) -> None:
        self.locked = status.locked
        self.lock_button.setText("Unlock" if self.locked else "Lock")
        self.summary.setText(
            f"<b>Master key</b> {html.escape(status.key_id)} is kept by "
            f"<b>{html.escape(status.backend)}</b> and never written to a file.<br>Data "
            f"directory: {html.escape(status.data_dir)}<br>State: "
            f"{'locked — keys dropped from memory' if self.locked else 'unlocked'}"
            + (
                f"<br>Retired keys kept for older copies: "
                f"{html.escape(', '.join(status.retired_key_ids))}"
                if status.retired_key_ids
                else ""
            )
        )

    def rotate(self) -> None:
        self.output.setPlainText("Rotating…")
        self.host.bridge.run(
            lambda core, _job: core.rotate_key(),
            on_done=self._rotated,
            on_error=self.host.show_error,
        )

    def _rotated(self, result: Any) -> None:
        text = (
            f"New master key {result.key_id}; re-wrapped {result.blocks_rewrapped} block keys "
            f"(payloads untouched). The old key {result.retired_key_id} stays in the keyring "
            "for copies made before ('galahad keys drop-retired' removes it)."
        )
        if result.backups_needing_retired:
            text += "\nBackups that need the old key:\n" + "\n".join(result.backups_needing_retired)
        self.output.setPlainText(text)
        self.refresh()

    def backup(self) -> None:

        folder = QFileDialog.getExistingDirectory(self, "Choose an empty folder for the backup")
        if folder:
            self.run_backup(Path(folder))

    def run_backup(self, folder: Path) -> None:
        self.output.setPlainText(f"Backing up to {folder}…")
        self.host.bridge.run(
            lambda core, _job: core.backup(folder),
            on_done=self._backed_up,
            on_error=self.host.show_error,
        )

    def _backed_up(self, result: Any) -> None:
        self.output.setPlainText(
            f"Backed up {result.files} files ({result.bytes / 1e6:,.1f} MB, still encrypted) "
            f"to {result.path}.\nIt opens with key {result.key_id} from this computer's "
            "keyring, or anywhere with a recovery kit. Restore it with: galahad restore "
            f"{result.path}"
        )

    def export_kit(self) -> None:
        from PySide6.QtWidgets import QInputDialog, QLineEdit

        path, _filter = QFileDialog.getSaveFileName(
            self, "Save the recovery kit", "galahad-recovery-kit.json", "JSON (*.json)"
        )
        if not path:
            return
        phrase, ok = QInputDialog.getText(
            self,
            "Recovery passphrase",
            "A passphrase for the kit (at least 12 characters); keep it apart from the kit:",
            QLineEdit.EchoMode.Password,
        )
        if not ok:
            return
        again, ok = QInputDialog.getText(
            self, "Recovery passphrase", "Again:", QLineEdit.EchoMode.Password
        )
        if not ok or again != phrase:
            self.output.setPlainText("The two passphrases differ; no kit was written.")
            return
        self.run_export_kit(Path(path), phrase)

    def run_export_kit(self, path: Path, phrase: str) -> None:
        self.host.bridge.run(
            lambda core, _job: core.export_recovery_kit(phrase, path),
            on_done=lambda keys: self.output.setPlainText(
                f"Wrote the recovery kit {path} ({len(keys)} key(s)). Keep it, and its "
                "passphrase, apart from your backups."
            ),
            on_error=self.host.show_error,
        )

    def toggle_lock(self) -> None:
        locked = self.locked
        self.host.bridge.run(
            lambda core, _job: core.unlock() if locked else core.lock(),
            on_done=lambda _r: self.refresh(),
            on_error=self.host.show_error,
        )

    def audit(self) -> None:
        self.output.setPlainText("Checking every block and catalog record…")
        self.host.bridge.run(
            lambda core, _job: core.audit(), on_done=self._audited, on_error=self.host.show_error
        )

    def _audited(self, report: Any) -> None:
        lines = [f"{report.ok} of {report.blocks} blocks authenticated and match the catalog."]
        lines += [f"problem: {p}" for p in report.problems] or ["No problems found."]
        self.output.setPlainText("\n".join(lines))


CHART_LEGEND = "green: restored · red: re-read · blue: replies saved by verified answers"


class TokenChart(QWidget):
    """Cumulative tokens restored vs recomputed over time (a plain QPainter line chart)."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[UsageEntry] = []
        # Wide enough for its legend in this font (a fixed 420 px cut it off).
        self.setMinimumSize(max(420, self.fontMetrics().horizontalAdvance(CHART_LEGEND) + 60), 200)

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = self.rect().adjusted(40, 10, -10, -24)
        painter.drawRect(rect)
        if not self.history:
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, "No grafts yet")
            return
        restored = recomputed = saved = 0
        series: list[tuple[int, int, int]] = []
        for entry in self.history:
            restored += entry.restored
            recomputed += entry.recomputed
            saved += entry.library_saved_tokens
            series.append((restored, recomputed, saved))
        top = max(1, max(max(point) for point in series))
        n = max(1, len(series) - 1)

        def point(i: int, value: int) -> QPointF:
            return QPointF(
                rect.left() + rect.width() * i / n, rect.bottom() - rect.height() * value / top
            )

        colours = theme.current()
        for index, color in (
            (0, QColor(colours.success)),
            (1, QColor(colours.danger)),
            (2, QColor(colours.accent)),
        ):
            painter.setPen(QPen(color, 2))
            painter.setBrush(color)
            for i in range(len(series)):
                if i:
                    painter.drawLine(point(i - 1, series[i - 1][index]), point(i, series[i][index]))
                painter.drawEllipse(point(i, series[i][index]), 3, 3)
        painter.setPen(QPen(self.palette().text().color()))
        painter.drawText(4, rect.top() + 10, f"{top:,}")
        painter.drawText(rect.left(), self.height() - 6, CHART_LEGEND)


class MemoryDialog(SummaryDialog):
    def __init__(self, host: Host, parent: QWidget) -> None:
        super().__init__(host, parent, "Memory")
        layout = self.body
        self.chart = TokenChart()
        self.library_list = QListWidget()
        theme.describe(self.library_list, "Verified answers", "Answers kept and reused")
        remove = QPushButton("Remove selected verified answer")
        theme.describe(
            remove, "Remove selected verified answer", "It will not be reused; nothing else changes"
        )
        remove.clicked.connect(self.remove_selected)
        layout.addWidget(self.summary)
        layout.addWidget(self.chart, 1)
        layout.addWidget(QLabel("<b>Verified answers</b>"))
        layout.addWidget(self.library_list)
        layout.addWidget(remove)
        self.refresh()

    def refresh(self) -> None:
        self.host.bridge.run(
            lambda core, _job: core.memory_stats(),
            on_done=self._show,
            on_error=self.host.show_error,
        )
        self.host.bridge.run(
            lambda core, _job: core.verified_entries(),
            on_done=self._library,
            on_error=self.host.show_error,
        )

    def _show(self, stats: MemoryStats) -> None:
        self.summary.setText(memory_summary(stats))
        self.chart.history = stats.history
        self.chart.update()

    def _library(self, entries: list[Any]) -> None:
        self.library_list.clear()
        for entry in entries:
            question = " ".join(entry.question.split())[:80]
            answer = " ".join(entry.answer.split())[:80]
            item = QListWidgetItem(f"{question} → {answer}  ({entry.verifier}, used {entry.uses}×)")
            item.setData(Qt.ItemDataRole.UserRole, entry.id)
            self.library_list.addItem(item)

    def remove_selected(self) -> None:
        chosen = [
            str(item.data(Qt.ItemDataRole.UserRole)) for item in self.library_list.selectedItems()
        ]

        def remove(core: Galahad) -> None:
            for entry_id in chosen:
                core.verified_remove(entry_id)

        self.host.bridge.run(
            lambda core, _job: remove(core),
            on_done=lambda _r: self.refresh(),
            on_error=self.host.show_error,
        )


class AskDialog(QDialog):
    """Ask the library (or one long document): the router picks the part that answers, and
    when it is unsure the user chooses among its candidates. Nothing is guessed."""

    answered = Signal(object)  # the AskResult, answered or not (for tests and the window)

    def __init__(
        self, host: Host, parent: QWidget, document_id: str | None = None, name: str | None = None
    ) -> None:
        super().__init__(parent)
        self.host = host
        self.document_id = document_id
        self.setWindowTitle(f"Ask “{name}”" if name else "Ask the library")
        self.resize(640, 480)
        self.question = QLineEdit()
        self.question.setPlaceholderText(
            "A question about this document" if document_id else "A question about your documents"
        )
        self.question.returnPressed.connect(self.ask)
        theme.describe(self.question, "Question", "Your question; Enter asks it")
        self.ask_button = QPushButton("Ask")
        theme.describe(self.ask_button, "Ask", "Find the part that answers, and answer from it")
        theme.set_primary(self.ask_button)
        self.ask_button.clicked.connect(self.ask)
        self.stop_button = QPushButton("Stop")
        theme.describe(self.stop_button, "Stop", "Stop this question (closing the window does too)")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.setEnabled(False)
        self.request: Request | None = None
        self.answer = QTextBrowser()
        self.answer.setAccessibleName("Answer")
        self.source = QLabel()
        self.source.setWordWrap(True)
        self.candidates = QListWidget()
        self.candidates.setAccessibleName("Parts that might answer")
        self.choose_button = QPushButton("Answer from this part")
        theme.describe(
            self.choose_button, "Answer from this part", "Answer from the part chosen above"
        )
        self.choose_button.clicked.connect(self.choose)
        self.candidates.itemActivated.connect(lambda _item: self.choose())
        for widget in (self.candidates, self.choose_button):
            widget.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.question, 1)
        row.addWidget(self.ask_button)
        row.addWidget(self.stop_button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.answer, 1)
        layout.addWidget(self.source)
        layout.addWidget(self.candidates)
        layout.addWidget(self.choose_button)
        self.last_question = ""
        self.text = ""

    def ask(self, part_id: str | None = None) -> None:
        question = self.question.text().strip() if not part_id else self.last_question
        if not question:
            return
        self.last_question = question
        self.text = ""
        self.answer.setHtml("<p><i>Finding the part that answers…</i></p>")
        self.source.setText("")
        self.ask_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        document_id = self.document_id
        part_id = part_id if isinstance(part_id, str) else None
        self.request = self.host.bridge.run(
            lambda core, job: core.ask(question, document_id, part_id, job),
            on_done=self._done,
            on_error=self._failed,
            on_stream=self._streamed,
            label="Asking the library",
        )
        if self.host.bridge.ahead_of(self.request):
            self.answer.setHtml("<p><i>Waiting for the model (another operation runs)…</i></p>")

    def stop(self) -> None:
        """Stop the question: a waiting one never runs, a running one ends at its next step."""
        self.host.bridge.cancel(self.request)

    def done(self, result: int) -> None:
        # Closing the dialog (Escape, the window's close button) stops its question: no
        # answer nobody can see is computed.
        self.stop()
        super().done(result)

    def _streamed(self, piece: str) -> None:
        self.text += piece
        self.answer.setHtml(markdown_html(self.text))

    def choose(self) -> None:
        item = self.candidates.currentItem() or self.candidates.item(0)
        if item is not None:
            self.ask(item.data(Qt.ItemDataRole.UserRole))

    def _done(self, result: AskResult) -> None:
        self.request = None
        self.ask_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        gated = not result.answered
        candidates = result.decision.candidates
        for widget in (self.candidates, self.choose_button):
            widget.setVisible(gated and bool(candidates))
        if gated:
            self.answer.setHtml(
                f"<p>{html.escape(result.why)}</p>"
                + ("<p>Choose the part to answer from:</p>" if candidates else "")
            )
            self.candidates.clear()
            for candidate, cited in zip(candidates, result.candidates_cited, strict=True):
                pmi = result.decision.pmi_of(candidate.part_id)
                item = QListWidgetItem(
                    f"{cited} · matches {candidate.coverage:.0%} of the question"
                )
                if pmi is not None:  # the model's own score, for those who want it
                    item.setToolTip(f"The model's score: {pmi:+.1f} (log-likelihood gain, nats)")
                item.setData(Qt.ItemDataRole.UserRole, candidate.part_id)
                self.candidates.addItem(item)
        else:
            self.answer.setHtml(markdown_html(result.text))
            graft = result.graft
            proof = ""
            if graft is not None:
                proof = "byte-exact ✓" if graft.proof.verdict == "exact" else graft.proof.verdict
            restored = graft.restored_tokens if graft else 0
            reread = graft.recomputed_tokens if graft else 0
            if result.across and result.counters is not None:
                restored += result.counters.stacked_tokens
                reread = result.counters.recomputed_tokens
                proof = (f"first part {proof}, " if proof else "") + (
                    "the others stacked: close, not byte-exact"
                )
            checked = result.decision.checked
            self.source.setText(
                (f"{checked[0].upper()}{checked[1:]} · " if checked else "")
                + f"From {result.citation} · restored {restored:,} tokens, re-read {reread:,}"
                + (f" · {proof}" if proof else "")
                + f" · {result.why}"
            )
        self.answered.emit(result)

    def _failed(self, message: str, kind: str) -> None:
        self.request = None
        self.ask_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        if kind in (CANCELLED, "CancelledError"):
            self.answer.setHtml("<p><i>Stopped.</i></p>")
            return
        self.answer.setHtml("")
        self.host.show_error(message, kind)


class ConversationDialog(QDialog):
    """One conversation's own settings: its system prompt (a preset as a starting point,
    or the user's own words; set before its first message, since it is the conversation's
    first tokens), and its creativity and longest reply over the app's settings. Each
    shows the value that applies (the app's until this conversation sets its own), and its
    arrows start from it. Once the conversation has begun, other system words make a new
    branch from its start (every turn read again), as the dialog says before."""

    def __init__(
        self,
        parent: QWidget,
        system_prompt: str,
        sampling: dict[str, Any],
        started: bool,
        defaults: dict[str, Any],
        context_tokens: int = 0,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("This conversation")
        self.presets = Galahad.system_prompt_presets()
        layout = QVBoxLayout(self)
        self.preset = QComboBox()
        guard_wheel(self.preset)
        self.preset.addItem("Start from a preset…", "")
        for name in self.presets:
            if name != "none":
                self.preset.addItem(name.capitalize(), name)
        theme.describe(self.preset, "Preset", "Fill the system prompt with a built-in one")
        self.preset.activated.connect(self._preset_chosen)
        self.system = QPlainTextEdit(system_prompt)
        self.system.setPlaceholderText("How the model should behave in this conversation")
        theme.describe(self.system, "System prompt", "Your own words, kept encrypted")
        self.system.setFixedHeight(120)
        self.system.textChanged.connect(self._system_edited)
        self._filling_preset = False
        self.note = note = QLabel(
            "Locked: the system prompt is the conversation's first words, so this "
            "conversation keeps it. Other words start a new branch from the beginning."
            if started
            else "Kept encrypted with the conversation."
        )
        note.setWordWrap(True)
        theme.set_role(note, "muted")
        self.preset.setEnabled(not started)
        self.system.setReadOnly(started)  # still selectable and copyable, visibly locked
        self.original_system = system_prompt.strip()
        self.branching = False
        self.branch_button = QPushButton("Change it in a new branch…")
        self.branch_button.setVisible(started)
        theme.describe(
            self.branch_button,
            "Change the system prompt in a new branch",
            f"A new conversation from the start with other words; re-reads {context_tokens:,} "
            "tokens",
        )
        self.branch_button.clicked.connect(lambda: self._unlock(context_tokens))
        if started:
            self.system.setToolTip("Locked: set before the conversation's first message")
        self._sampling_boxes(sampling, defaults)
        form = QFormLayout()
        self.system_label = QLabel("System prompt (locked)" if started else "System prompt")
        form.addRow(self.system_label, self.preset)
        form.addRow("", self.system)
        form.addRow("", note)
        form.addRow("", self.branch_button)
        form.addRow("Creativity", self.temperature)
        form.addRow("", self.temperature_follows)
        form.addRow("Longest reply", self.max_tokens)
        form.addRow("", self.max_tokens_follows)
        layout.addLayout(form)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def _sampling_boxes(self, sampling: dict[str, Any], defaults: dict[str, Any]) -> None:
        """Creativity and the longest reply, each with "the app's setting" under it."""
        self.temperature = QDoubleSpinBox()
        guard_wheel(self.temperature)
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setSingleStep(0.1)
        theme.describe(self.temperature, "Creativity", "0 always picks the likeliest word")
        self.max_tokens = QSpinBox()
        guard_wheel(self.max_tokens)
        self.max_tokens.setRange(1, 131_072)
        self.max_tokens.setSuffix(" tokens")
        theme.describe(self.max_tokens, "Longest reply", "The longest a reply may be here")
        self.temperature_follows = self._follows(
            self.temperature,
            sampling.get("temperature"),
            float(defaults["temperature"]),
            f"{float(defaults['temperature']):.2f}",
        )
        self.max_tokens_follows = self._follows(
            self.max_tokens,
            sampling.get("max_tokens"),
            int(defaults["max_tokens"]),
            f"{int(defaults['max_tokens']):,} tokens",
        )

    @staticmethod
    def _follows(box: Any, own: Any, default: float, shown: str) -> QCheckBox:
        """A checkbox "the app's setting" under `box`: while checked the box shows the
        app's value, disabled; unchecked, the arrows start from the value shown."""
        follows = QCheckBox(f"Use the app's setting ({shown})")
        follows.setToolTip("Follow Settings; uncheck to give this conversation its own value")
        box.setValue(default if own is None else own)

        def toggled(checked: bool) -> None:
            box.setEnabled(not checked)
            if checked:
                box.setValue(default)

        follows.toggled.connect(toggled)
        follows.setChecked(own is None)
        box.setEnabled(own is not None)
        return follows

    def _unlock(self, context_tokens: int) -> None:
        """Other words for a conversation under way: said what it costs, then editable."""
        self.branching = True
        self.branch_button.setVisible(False)
        self.system.setReadOnly(False)
        self.system.style().unpolish(self.system)  # the locked look follows readOnly
        self.system.style().polish(self.system)
        self.system_label.setText("System prompt (a new branch)")
        self.system.setToolTip("Your own words, kept encrypted")
        self.preset.setEnabled(True)
        self.note.setText(
            f"Changing it re-reads {context_tokens:,} tokens: a new branch starts with these "
            "words and reads this conversation's turns again. This conversation stays as it is."
        )
        self.system.setFocus()

    def new_branch_words(self) -> str | None:
        """The system words for a new branch, when the person asked for one and changed them."""
        words = self.system.toPlainText().strip()
        return words if self.branching and words != self.original_system else None

    def _preset_chosen(self, index: int) -> None:
        name = self.preset.itemData(index)
        if name:
            self._filling_preset = True
            self.system.setPlainText(self.presets[str(name)])
            self._filling_preset = False

    def _system_edited(self) -> None:
        """Words typed over a preset are the person's own: the box no longer names it."""
        if not self._filling_preset and self.preset.currentIndex() != 0:
            self.preset.setCurrentIndex(0)

    def values(self) -> tuple[str, float | None, int | None]:
        """(system prompt, temperature, longest reply); None where the settings rule."""
        return (
            self.system.toPlainText().strip(),
            None if self.temperature_follows.isChecked() else round(self.temperature.value(), 2),
            None if self.max_tokens_follows.isChecked() else self.max_tokens.value(),
        )
