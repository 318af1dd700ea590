"""Settings in plain words: five sections (Model, Performance, Memory and documents, Answers,
Privacy), each setting with a plain name, a one-line explanation and its unit, the advanced
ones folded. Values are checked as they are typed (the same check as `galahad settings`),
and a change that forces stored blocks to be re-read says so before it is saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
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
    QPushButton,
    QScrollArea,
    QSpinBox,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.errors import InputError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import ModelInfo
from galahad_desktop.settings import GROUPS, Setting, coerce
from galahad_desktop.sizes import human_size
from galahad_desktop.ui import theme
from galahad_desktop.ui.host import Host
from galahad_desktop.ui.tools_page import ToolsPage
from galahad_desktop.ui.wheel import guard_wheel


def describe_model(info: ModelInfo) -> str:
    return (
        f"{info.name} · {info.architecture} · {info.n_params / 1e6:,.0f}M parameters · "
        f"{info.quantization} · context {info.n_ctx_train:,} · "
        + ("" if info.has_chat_template else "no chat format of its own (Gemma's is used) · ")
        + info.label
    )


PRIVACY_TEXT = (
    "Everything Galahad keeps — the model's memory of your conversations and documents, "
    "the messages, titles and document text — is encrypted on disk with AES-256-GCM. The "
    "keys live in your system's keyring, never in a file. Every record read back is "
    "authenticated; a changed or swapped file is refused, not used. Nothing leaves this "
    "computer: the model runs here."
)


class Section(QWidget):
    """One tab: a form of the usual settings, then the advanced ones folded under a button."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        outer = QVBoxLayout(self)
        outer.setSpacing(theme.SPACE[3])
        self.form = QFormLayout()
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form.setVerticalSpacing(theme.SPACE[3])
        outer.addLayout(self.form)
        self.advanced_button = QToolButton()
        self.advanced_button.setCheckable(True)
        self.advanced_button.setArrowType(Qt.ArrowType.RightArrow)
        self.advanced_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.advanced_button.setAccessibleName(f"Advanced {name.lower()} settings")
        self.advanced_button.setToolTip("Settings most people never need to change")
        self.advanced_button.toggled.connect(self.fold)
        self.advanced = QWidget()
        self.advanced_form = QFormLayout(self.advanced)
        self.advanced_form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.advanced_form.setVerticalSpacing(theme.SPACE[3])
        self.advanced.setVisible(False)
        self.advanced_button.setVisible(False)
        outer.addWidget(self.advanced_button)
        outer.addWidget(self.advanced)
        outer.addStretch(1)
        self.n_advanced = 0

    def add(self, spec: Setting, editor: QWidget) -> None:
        holder = QWidget()
        column = QVBoxLayout(holder)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(theme.SPACE[1])
        row = QHBoxLayout()
        row.addWidget(editor, 1)
        if spec.unit and spec.unit != "bytes" and not isinstance(editor, QSpinBox | QDoubleSpinBox):
            unit = QLabel(spec.unit)
            theme.set_role(unit, "muted")
            row.addWidget(unit)
        column.addLayout(row)
        explanation = QLabel(spec.description)
        explanation.setWordWrap(True)
        theme.set_role(explanation, "muted")
        column.addWidget(explanation)
        label = QLabel(spec.label or spec.key)
        label.setBuddy(editor)
        label.setToolTip(f"{spec.key} in `galahad settings`")
        editor.setAccessibleName(spec.label or spec.key)
        editor.setAccessibleDescription(spec.description)
        editor.setToolTip(spec.description)
        if spec.advanced:
            self.n_advanced += 1
            self.advanced_form.addRow(label, holder)
            self.advanced_button.setText(f"Advanced ({self.n_advanced})")
            self.advanced_button.setVisible(True)
        else:
            self.form.addRow(label, holder)

    def fold(self, shown: bool) -> None:
        self.advanced.setVisible(shown)
        self.advanced_button.setArrowType(
            Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow
        )


class SettingsDialog(QDialog):
    saved = Signal(bool)  # runtime changed

    def __init__(self, host: Host, parent: QWidget) -> None:
        super().__init__(parent)
        self.host = host
        self.setWindowTitle("Settings")
        self.setAccessibleName("Settings")
        self.resize(720, 640)
        self.editors: dict[str, QWidget] = {}
        self.optional: set[str] = set()
        self.runtime_keys: set[str] = set()
        self.initial: dict[str, Any] = {}
        self.invalid: dict[str, str] = {}  # key -> what is wrong with the text typed
        layout = QVBoxLayout(self)
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Settings sections")
        self.sections: dict[str, Section] = {}
        for name in GROUPS:
            section = Section(name)
            self.sections[name] = section
            scroll = QScrollArea()
            scroll.setWidgetResizable(True)
            scroll.setWidget(section)
            scroll.setFrameShape(QScrollArea.Shape.NoFrame)
            self.tabs.addTab(scroll, name)
        self._model_rows()
        self._privacy()
        self.tabs.addTab(ToolsPage(host), "Tools")
        layout.addWidget(self.tabs, 1)
        self.warning = QLabel()
        theme.set_role(self.warning, "warning")
        self.warning.setWordWrap(True)
        self.warning.setAccessibleName("Warning")
        self.problems = QLabel()
        theme.set_role(self.problems, "error")
        self.problems.setWordWrap(True)
        self.problems.setAccessibleName("Problems")
        layout.addWidget(self.warning)
        layout.addWidget(self.problems)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        self.save_button.setAccessibleName("Save")
        self.save_button.setToolTip("Save the settings")
        theme.set_primary(self.save_button)
        cancel = self.buttons.button(QDialogButtonBox.StandardButton.Cancel)
        cancel.setAccessibleName("Cancel")
        cancel.setToolTip("Close without saving")
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        # Filled at once from what is stored, never behind the model's work: the dialog
        # opens filled while a reply or a read is running.
        try:
            stored = Galahad.stored_settings(host.data_dir)
        except (InputError, OSError) as exc:
            host.show_error(f"The settings could not be read: {exc}")
            stored = {spec.key: spec.default for spec in Galahad.declared_settings()}
        self.declared = Galahad.declared_settings()
        self._loaded(stored)
        self.disk_use = QLabel()
        self.disk_use.setWordWrap(True)
        self.disk_use.setAccessibleName("Disk space memory takes")
        theme.set_role(self.disk_use, "card")
        self.sections["Memory and documents"].form.insertRow(0, self.disk_use)
        self._show_disk_use(stored.get("disk_budget"))

    def _model_rows(self) -> None:
        """The Model section's file row (with Choose GGUF…) and what the file is."""
        model_row = QHBoxLayout()
        self.model_path = QLineEdit()
        self.model_path.setPlaceholderText("Embedded Gemma 3 270M (demo)")
        self.model_path.setAccessibleName("Model file")
        self.model_path.setToolTip("A GGUF model file; empty uses the embedded demo model")
        browse = QPushButton("Choose GGUF…")
        browse.setAccessibleName("Choose a model file")
        browse.setToolTip("Pick a .gguf model file on this computer")
        browse.clicked.connect(self.choose_model)
        model_row.addWidget(self.model_path, 1)
        model_row.addWidget(browse)
        self.model_info = QLabel()
        self.model_info.setWordWrap(True)
        self.model_info.setAccessibleName("About the model")
        theme.set_role(self.model_info, "muted")
        model_label = QLabel("Model file")
        model_label.setBuddy(self.model_path)
        self.sections["Model"].form.addRow(model_label, model_row)
        self.sections["Model"].form.addRow("", self.model_info)

    def _show_disk_use(self, chosen: Any) -> None:
        """What kept memory takes now against the budget (read from the folder itself:
        never waits behind the model's work)."""
        try:
            used, budget, rule = Galahad.disk_use(self.host.data_dir, chosen)
        except OSError as exc:
            self.disk_use.setText(f"The data folder could not be measured ({exc.strerror}).")
            return
        limit = f"of a {human_size(budget)} budget" if budget else "with no limit"
        self.disk_use.setText(
            f"Kept memory takes <b>{human_size(used)}</b> {limit} ({rule}). When a save would "
            "go past it, what was used longest ago gives its memory back (its messages stay) "
            "and is read again once when next opened; kept conversations never do."
        )

    def _privacy(self) -> None:
        section = self.sections["Privacy"]
        text = QLabel(PRIVACY_TEXT)
        text.setWordWrap(True)
        text.setAccessibleName("How your data is kept")
        section.form.addRow(text)
        security = QPushButton(theme.icon("security"), "Keys, backups and recovery…")
        security.setAccessibleName("Keys, backups and recovery")
        security.setToolTip("Where the keys are, back up, export a recovery kit, rotate keys")
        security.clicked.connect(self._open_security)
        section.form.addRow(security)

    def _open_security(self) -> None:
        from galahad_desktop.ui.dialogs import SecurityDialog

        SecurityDialog(self.host, self).exec()

    def _editor(self, spec: Setting, value: Any) -> QWidget:
        editor: QWidget
        if spec.type is bool:
            editor = QCheckBox()
            editor.setChecked(bool(value))
            editor.toggled.connect(self._changed)
        elif spec.choices:
            editor = QComboBox()
            editor.addItems([str(c) for c in spec.choices])
            editor.setCurrentText(str(value))
            editor.currentTextChanged.connect(self._changed)
        elif spec.unit == "bytes":  # a size: "20 GB", empty for the automatic budget
            editor = QLineEdit("" if value is None else human_size(value).replace(".0 ", " "))
            editor.setPlaceholderText("automatic (a quarter of the disk); 0: no limit")
            self.optional.add(spec.key)
            editor.textChanged.connect(lambda text, key=spec.key: self._typed(key, text))
        elif spec.optional or spec.type is str:
            editor = QLineEdit("" if value is None else str(value))
            if spec.optional:
                editor.setPlaceholderText("the model's recommendation")
                self.optional.add(spec.key)
            editor.textChanged.connect(lambda text, key=spec.key: self._typed(key, text))
        elif spec.type is int:
            editor = QSpinBox()
            limit = 2**31 - 1  # a spin box holds a C int
            editor.setRange(int(spec.minimum or 0), min(limit, int(spec.maximum or limit)))
            editor.setValue(int(value))
            editor.setGroupSeparatorShown(True)
            editor.valueChanged.connect(self._changed)
        else:
            editor = QDoubleSpinBox()
            editor.setDecimals(3)
            editor.setRange(float(spec.minimum or 0.0), float(spec.maximum or 100.0))
            editor.setSingleStep(0.05)
            editor.setValue(float(value))
            editor.valueChanged.connect(self._changed)
        if spec.unit and isinstance(editor, QSpinBox | QDoubleSpinBox):
            editor.setSuffix(f" {spec.unit}")
        if spec.special and isinstance(editor, QSpinBox | QDoubleSpinBox):
            editor.setSpecialValueText(spec.special)  # never "-1 layers"
        if isinstance(editor, QSpinBox | QDoubleSpinBox | QComboBox):
            guard_wheel(editor)
        return editor

    def _loaded(self, values: dict[str, Any]) -> None:
        self.initial = dict(values)
        self.model_path.setText(values.get("model_path", ""))
        self.model_path.textChanged.connect(self._changed)
        if values.get("model_path"):
            self.inspect(values["model_path"])
        elif self.host.info is not None:
            self.model_info.setText(describe_model(self.host.info.model))
        for spec in self.declared:
            if spec.key == "model_path":
                continue
            editor = self._editor(spec, values[spec.key])
            if spec.runtime:
                self.runtime_keys.add(spec.key)
            self.editors[spec.key] = editor
            self.sections.get(spec.group, self.sections["Answers"]).add(spec, editor)

    def _typed(self, key: str, text: str) -> None:
        """Check a typed value as `galahad settings` would; say what is wrong under the
        field and hold Save until it is right."""
        editor = self.editors.get(key)
        try:
            coerce(key, text.strip())
            self.invalid.pop(key, None)
        except InputError as error:
            self.invalid[key] = error.in_window()
        if editor is not None:
            editor.setProperty("invalid", key in self.invalid)
            editor.style().unpolish(editor)
            editor.style().polish(editor)
        self.problems.setText("\n".join(self.invalid.values()))
        self.save_button.setEnabled(not self.invalid)
        self._changed()

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
                text = editor.text().strip()
                out[key] = None if key in self.optional and not text else text
        return out

    def changed_runtime(self) -> list[str]:
        runtime = self.runtime_keys | {"model_path"}
        return [k for k, v in self.values().items() if k in runtime and self.initial.get(k) != v]

    def label_of(self, key: str) -> str:
        spec = next((s for s in getattr(self, "declared", ()) if s.key == key), None)
        return spec.label if spec is not None and spec.label else key

    def _changed(self, *_: Any) -> None:
        changed = [self.label_of(k) for k in self.changed_runtime()]
        self.warning.setText(
            f"Changing {', '.join(changed)} changes how the model computes: each stored "
            "conversation and document is read again once when next used (not restored from "
            "disk), then kept again."
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
        model = Path(path)
        self.host.bridge.run(
            lambda core, _job: core.inspect_model(model),
            on_done=lambda info: self.model_info.setText(describe_model(info)),
            on_error=lambda message, kind: self.model_info.setText(message),
        )

    def save(self) -> None:
        if self.invalid:
            return
        changes = {k: v for k, v in self.values().items() if self.initial.get(k) != v}
        if not changes:
            self.accept()
            return
        self.save_button.setEnabled(False)
        self.save_button.setText("Saving…")
        self.host.bridge.run(
            lambda core, _job: core.update_settings(changes),
            on_done=self._saved,
            on_error=self._save_failed,
            label="Saving the settings",
        )

    def _save_failed(self, message: str, kind: str) -> None:
        self.save_button.setEnabled(True)
        self.save_button.setText("Save")
        self.host.show_error(message, kind)

    def _saved(self, runtime_changed: bool) -> None:
        if runtime_changed:
            self.host.set_status(
                "Settings saved · the model is reloaded; stored blocks will be re-read once"
            )
            self.host.engine_changed()
        else:
            self.host.set_status("Settings saved ✓")
        self.host.settings_saved()
        self.saved.emit(runtime_changed)
        self.accept()
