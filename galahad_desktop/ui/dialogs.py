"""Settings, Security and Memory dialogs. Like the window, they only talk to the worker."""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

from galahad_desktop.ui.main_window import human_bytes
from galahad_desktop.ui.render import markdown_html

if TYPE_CHECKING:
    from galahad_desktop.ui.main_window import MainWindow


class SettingsDialog(QDialog):
    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window_ = window
        self.setWindowTitle("Settings")
        self.editors: dict[str, QWidget] = {}
        self.runtime_keys: set[str] = set()
        self.initial: dict[str, Any] = {}
        layout = QVBoxLayout(self)
        self.form = QFormLayout()
        model_row = QHBoxLayout()
        self.model_path = QLineEdit()
        self.model_path.setPlaceholderText("Embedded Gemma 3 270M")
        browse = QPushButton("Choose GGUF…")
        browse.clicked.connect(self.choose_model)
        self.download_button = QPushButton("Download…")
        self.download_button.setToolTip("Download a Gemma GGUF from the Hugging Face Hub")
        self.download_button.clicked.connect(self.download_model)
        model_row.addWidget(self.model_path, 1)
        model_row.addWidget(browse)
        model_row.addWidget(self.download_button)
        self.model_info = QLabel()
        self.model_info.setWordWrap(True)
        self.form.addRow("Model", model_row)
        self.form.addRow("", self.model_info)
        layout.addLayout(self.form)
        self.warning = QLabel()
        self.warning.setStyleSheet("color: #b06000")
        self.warning.setWordWrap(True)
        layout.addWidget(self.warning)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        window.bridge.call("settings", on_done=self._loaded, on_error=window.show_error)

    def _loaded(self, data: dict[str, Any]) -> None:
        values = data["values"]
        self.initial = dict(values)
        self.model_path.setText(values.get("model_path", ""))
        self.model_path.textChanged.connect(self._changed)
        if values.get("model_path"):
            self.inspect(values["model_path"])
        else:
            info = self.window_.info.get("model", {})
            self.model_info.setText(self._describe(info) if info else "")
        for spec in data["declared"]:
            key = spec["key"]
            if key == "model_path":
                continue
            value = values[key]
            editor: QWidget
            if spec["type"] == "bool":
                editor = QCheckBox()
                editor.setChecked(bool(value))
                editor.toggled.connect(self._changed)
            elif spec["choices"]:
                editor = QComboBox()
                editor.addItems([str(c) for c in spec["choices"]])
                editor.setCurrentText(str(value))
                editor.currentTextChanged.connect(self._changed)
            elif spec["type"] == "int":
                editor = QSpinBox()
                minimum = spec["minimum"]
                editor.setRange(int(minimum) if minimum is not None else -(2**31), 2**31 - 1)
                editor.setValue(int(value))
                editor.valueChanged.connect(self._changed)
            elif spec["type"] == "float":
                editor = QDoubleSpinBox()
                editor.setDecimals(3)
                editor.setRange(float(spec["minimum"] or 0.0), 100.0)
                editor.setSingleStep(0.05)
                editor.setValue(float(value))
                editor.valueChanged.connect(self._changed)
            else:
                editor = QLineEdit(str(value))
                editor.textChanged.connect(self._changed)
            editor.setToolTip(spec["description"])
            if spec["runtime"]:
                self.runtime_keys.add(key)
            self.editors[key] = editor
            self.form.addRow(key.replace("_", " "), editor)

    def values(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model_path": self.model_path.text().strip()}
        for key, editor in self.editors.items():
            if isinstance(editor, QCheckBox):
                out[key] = editor.isChecked()
            elif isinstance(editor, QComboBox):
                out[key] = editor.currentText()
            elif isinstance(editor, QSpinBox | QDoubleSpinBox):
                out[key] = editor.value()
            elif isinstance(editor, QLineEdit):
                out[key] = editor.text()
        return out

    def changed_runtime(self) -> list[str]:
        runtime = self.runtime_keys | {"model_path"}
        return [k for k, v in self.values().items() if k in runtime and self.initial.get(k) != v]

    def _changed(self, *_: Any) -> None:
        changed = self.changed_runtime()
        self.warning.setText(
            f"Changing {', '.join(changed)} alters the runtime fingerprint: stored blocks will "
            "be re-read (not grafted) on next use, then stored again."
            if changed
            else ""
        )

    def choose_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Choose a GGUF model", str(Path.home()), "GGUF models (*.gguf)"
        )
        if path:
            self.model_path.setText(path)
            self.inspect(path)

    def inspect(self, path: str) -> None:
        self.model_info.setText("Reading the model's metadata…")
        self.window_.bridge.call(
            "inspect_model",
            path,
            on_done=lambda info: self.model_info.setText(self._describe(info)),
            on_error=lambda message, kind: self.model_info.setText(message),
        )

    def download_model(self) -> None:
        from PySide6.QtWidgets import QInputDialog

        repo, ok = QInputDialog.getText(
            self,
            "Download from the Hugging Face Hub",
            "Repository (e.g. google/gemma-3-1b-it-qat-q4_0-gguf):",
        )
        if not ok or not repo.strip():
            return
        filename, ok = QInputDialog.getText(
            self, "Download from the Hugging Face Hub", "GGUF file in that repository:"
        )
        if ok and filename.strip():
            self.start_download(repo.strip(), filename.strip())

    def start_download(self, repo: str, filename: str) -> None:
        self.download_button.setEnabled(False)
        self.model_info.setText(f"Downloading {filename}…")
        self.download_request = self.window_.bridge.call(
            "download_model",
            repo,
            filename,
            on_done=self._downloaded,
            on_error=self._download_failed,
            on_progress=self._download_progress,
        )

    def _download_progress(self, done: int, total: int, rate: float, eta: float) -> None:
        self.model_info.setText(
            f"Downloading: {done / 1e6:,.0f} of {total / 1e6:,.0f} MB · {rate / 1e6:.1f} MB/s"
        )

    def _downloaded(self, result: dict[str, Any]) -> None:
        self.download_button.setEnabled(True)
        self.model_path.setText(result["path"])
        self.inspect(result["path"])

    def _download_failed(self, message: str, kind: str) -> None:
        self.download_button.setEnabled(True)
        self.model_info.setText(message)

    def reject(self) -> None:
        request = getattr(self, "download_request", None)
        if request is not None:
            request.cancel.set()  # the partial file stays; the next download resumes it
        super().reject()

    @staticmethod
    def _describe(info: dict[str, Any]) -> str:
        return (
            f"{info.get('name')} · {info.get('architecture')} · "
            f"{info.get('n_params', 0) / 1e6:,.0f}M parameters · {info.get('quantization')} · "
            f"context {info.get('context_length') or info.get('n_ctx_train', 0):,} · "
            f"chat template: {'yes' if info.get('has_chat_template') else 'no'}"
        )

    def save(self) -> None:
        changes = {k: v for k, v in self.values().items() if self.initial.get(k) != v}
        if not changes:
            self.accept()
            return
        self.window_.bridge.call(
            "update_settings", changes, on_done=self._saved, on_error=self.window_.show_error
        )

    def _saved(self, result: dict[str, Any]) -> None:
        if result["runtime_changed"]:
            self.window_.set_status(
                "Settings saved · the model is reloaded on next use; "
                "stored blocks will be re-read once"
            )
            self.window_.bridge.call(
                "open", on_done=self.window_._opened, on_error=self.window_.show_error
            )
        self.accept()


class SecurityDialog(QDialog):
    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window_ = window
        self.setWindowTitle("Security")
        layout = QVBoxLayout(self)
        self.summary = QLabel("…")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.summary)
        row = QHBoxLayout()
        self.rotate_button = QPushButton("Rotate master key")
        self.rotate_button.clicked.connect(self.rotate)
        self.lock_button = QPushButton("Lock")
        self.lock_button.clicked.connect(self.toggle_lock)
        self.audit_button = QPushButton("Run audit")
        self.audit_button.clicked.connect(self.audit)
        self.forget_button = QPushButton("Forget this conversation…")
        self.forget_button.clicked.connect(window.forget_conversation)
        for button in (self.rotate_button, self.lock_button, self.audit_button, self.forget_button):
            row.addWidget(button)
        layout.addLayout(row)
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        layout.addWidget(self.output)
        self.locked = False
        self.refresh()

    def refresh(self) -> None:
        self.window_.bridge.call("security", on_done=self._show, on_error=self.window_.show_error)

    def _show(self, info: dict[str, Any]) -> None:
        self.locked = info["locked"]
        self.lock_button.setText("Unlock" if self.locked else "Lock")
        self.summary.setText(
            f"<b>Master key</b> {info['key_id']} is kept by <b>{info['keyring']}</b> and never "
            f"written to a file.<br>Data directory: {info['data_dir']}<br>"
            f"State: {'locked — keys dropped from memory' if self.locked else 'unlocked'}"
        )

    def rotate(self) -> None:
        self.output.setPlainText("Rotating…")
        self.window_.bridge.call(
            "rotate_key", on_done=self._rotated, on_error=self.window_.show_error
        )

    def _rotated(self, result: dict[str, Any]) -> None:
        self.output.setPlainText(
            f"New master key {result['key_id']}; re-wrapped "
            f"{result['blocks']} block keys (payloads untouched)."
        )
        self.refresh()

    def toggle_lock(self) -> None:
        task = "unlock" if self.locked else "lock"
        self.window_.bridge.call(
            task, on_done=lambda _r: self.refresh(), on_error=self.window_.show_error
        )

    def audit(self) -> None:
        self.output.setPlainText("Checking every block…")
        self.window_.bridge.call("audit", on_done=self._audited, on_error=self.window_.show_error)

    def _audited(self, report: dict[str, Any]) -> None:
        lines = [
            f"{report['ok']} of {report['blocks']} blocks authenticated and match the catalog."
        ]
        lines += [f"problem: {p}" for p in report["problems"]] or ["No problems found."]
        self.output.setPlainText("\n".join(lines))


class TokenChart(QWidget):
    """Cumulative tokens restored vs recomputed over time (a plain QPainter line chart)."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[dict[str, Any]] = []
        self.setMinimumSize(420, 200)

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
            restored += entry["restored"]
            recomputed += entry["recomputed"]
            saved += entry.get("library_saved_tokens", 0)
            series.append((restored, recomputed, saved))
        top = max(1, max(max(point) for point in series))
        n = max(1, len(series) - 1)  # a single point sits at the left edge

        def point(i: int, value: int) -> QPointF:
            return QPointF(
                rect.left() + rect.width() * i / n, rect.bottom() - rect.height() * value / top
            )

        for index, color in (
            (0, QColor("#188038")),
            (1, QColor("#d93025")),
            (2, QColor("#1a73e8")),
        ):
            painter.setPen(QPen(color, 2))
            painter.setBrush(color)
            for i in range(len(series)):
                if i:
                    painter.drawLine(point(i - 1, series[i - 1][index]), point(i, series[i][index]))
                painter.drawEllipse(point(i, series[i][index]), 3, 3)
        painter.setPen(QPen(self.palette().text().color()))
        painter.drawText(4, rect.top() + 10, f"{top:,}")
        painter.drawText(
            rect.left(),
            self.height() - 6,
            "green: restored · red: recomputed · blue: decoding saved by verified answers",
        )


class MemoryDialog(QDialog):
    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.setWindowTitle("Memory")
        layout = QVBoxLayout(self)
        self.summary = QLabel("…")
        self.summary.setWordWrap(True)
        self.window_ = window
        self.chart = TokenChart()
        self.library_list = QListWidget()
        remove = QPushButton("Remove selected verified answer")
        remove.clicked.connect(self.remove_selected)
        layout.addWidget(self.summary)
        layout.addWidget(self.chart, 1)
        layout.addWidget(QLabel("<b>Verified answers</b>"))
        layout.addWidget(self.library_list)
        layout.addWidget(remove)
        self.refresh()

    def _show(self, stats: dict[str, Any]) -> None:
        history = stats["history"]
        restore_ms = sum(h["restore_ms"] for h in history)
        prefill_ms = sum(h["prefill_ms"] for h in history)
        recomputed = stats["recomputed_tokens_total"]
        per_token = prefill_ms / recomputed if recomputed else None
        saved = (
            f"≈ {(stats['restored_tokens_total'] * per_token - restore_ms) / 1e3:,.1f} s "
            "saved (at this machine's measured re-read speed)"
            if per_token
            else f"restore time {restore_ms / 1e3:.2f} s in total"
        )
        self.summary.setText(
            f"<b>{stats['blocks']}</b> blocks on disk · {human_bytes(stats['bytes'])} · "
            f"{stats['tokens_stored']:,} tokens stored<br>"
            f"<b>{stats['restored_tokens_total']:,}</b> tokens restored instead of recomputed, "
            f"{recomputed:,} recomputed · {saved}"
        )
        library = stats.get("library", [])
        self.summary.setText(
            self.summary.text()
            + (
                f"<br><b>{len(library)}</b> verified answers, used "
                f"{sum(e['uses'] for e in library)} times, "
                f"{stats.get('library_saved_tokens_total', 0):,} decode tokens saved"
            )
        )
        self.library_list.clear()
        for entry in library:
            question = " ".join(entry["question"].split())[:80]
            answer = " ".join(entry["answer"].split())[:80]
            item = QListWidgetItem(
                f"{question} → {answer}  ({entry['verifier']}, used {entry['uses']}×)"
            )
            item.setData(Qt.ItemDataRole.UserRole, entry["id"])
            self.library_list.addItem(item)
        self.chart.history = history
        self.chart.update()

    def remove_selected(self) -> None:
        for item in self.library_list.selectedItems():
            self.window_.bridge.call(
                "remove_verified",
                item.data(Qt.ItemDataRole.UserRole),
                on_done=lambda _r: self.refresh(),
                on_error=self.window_.show_error,
            )

    def refresh(self) -> None:
        self.window_.bridge.call("memory", on_done=self._show, on_error=self.window_.show_error)


class AskDialog(QDialog):
    """Ask the library (or one long document): the router picks the part that answers, and
    when it is unsure the user chooses among its candidates. Nothing is guessed."""

    answered = Signal(object)  # the ask result, answered or not (for tests and the window)

    def __init__(
        self, window: MainWindow, document_id: str | None = None, name: str | None = None
    ) -> None:
        super().__init__(window)
        self.window_ = window
        self.document_id = document_id
        self.setWindowTitle(f"Ask “{name}”" if name else "Ask the library")
        self.resize(640, 480)
        self.question = QLineEdit()
        self.question.setPlaceholderText(
            "A question about this document" if document_id else "A question about your documents"
        )
        self.question.returnPressed.connect(self.ask)
        self.ask_button = QPushButton("Ask")
        self.ask_button.clicked.connect(self.ask)
        self.answer = QTextBrowser()
        self.source = QLabel()
        self.source.setWordWrap(True)
        self.candidates = QListWidget()
        self.choose_button = QPushButton("Answer from this part")
        self.choose_button.clicked.connect(self.choose)
        self.candidates.itemActivated.connect(lambda _item: self.choose())
        for widget in (self.candidates, self.choose_button):
            widget.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.question, 1)
        row.addWidget(self.ask_button)
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
        self.window_.bridge.call(
            "ask",
            question,
            self.document_id,
            part_id if isinstance(part_id, str) else None,
            on_done=self._done,
            on_error=self._failed,
            on_stream=self._streamed,
        )

    def _streamed(self, piece: str) -> None:
        self.text += piece
        self.answer.setHtml(markdown_html(self.text))

    def choose(self) -> None:
        item = self.candidates.currentItem() or self.candidates.item(0)
        if item is not None:
            self.ask(item.data(Qt.ItemDataRole.UserRole))

    def _done(self, result: dict[str, Any]) -> None:
        self.ask_button.setEnabled(True)
        routing = result["routing"]
        gated = not result["answered"]
        for widget in (self.candidates, self.choose_button):
            widget.setVisible(gated and bool(result["candidates"]))
        if gated:
            self.answer.setHtml(
                f"<p>Not answered: {html.escape(routing['reason'])}.</p>"
                + ("<p>Choose the part to answer from:</p>" if result["candidates"] else "")
            )
            self.candidates.clear()
            for candidate in result["candidates"]:
                item = QListWidgetItem(
                    f"{candidate['citation']} · matches {candidate['coverage']:.0%} of the question"
                )
                item.setData(Qt.ItemDataRole.UserRole, candidate["part_id"])
                self.candidates.addItem(item)
            self.source.setText("")
        else:
            self.answer.setHtml(markdown_html(result["answer"]))
            graft = result.get("graft") or {}
            proof = {"exact": "byte-exact ✓"}.get(graft.get("proof", ""), graft.get("proof", ""))
            self.source.setText(
                f"From {result['citation']} · restored {graft.get('restored_tokens', 0):,} "
                f"tokens, re-read {graft.get('recomputed_tokens', 0):,}"
                + (f" · {proof}" if proof else "")
            )
        self.answered.emit(result)

    def _failed(self, message: str, kind: str) -> None:
        self.ask_button.setEnabled(True)
        self.answer.setHtml("")
        self.window_.show_error(message, kind)
