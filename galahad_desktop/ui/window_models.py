"""The window's model side: what is running, the model switcher, Gemma 4 downloads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from galahad_desktop.memory.results import EngineInfo, ModelFile
from galahad_desktop.models.catalog import Recommendation
from galahad_desktop.ui.format import human_bytes, keyring_label

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance
    from PySide6.QtWidgets import QComboBox, QProgressBar, QToolButton

    from galahad_desktop.ui.chat_view import ChatView
    from galahad_desktop.ui.prompts import Prompts
    from galahad_desktop.ui.welcome import Welcome
    from galahad_desktop.ui.worker import CoreBridge, Request


class ModelActions:
    """Mixed into MainWindow: these are the window's own widgets and methods."""

    if TYPE_CHECKING:
        bridge: CoreBridge
        chat: ChatView
        welcome: Welcome
        model_switcher: QComboBox
        conversation_id: str | None
        info: EngineInfo | None
        model_files: list[ModelFile]
        recommendation: Recommendation | None
        n_ctx: int
        working: Request | None
        downloading: Request | None
        prompts: Prompts
        download_bar: QProgressBar
        download_cancel: QToolButton
        opened: SignalInstance
        models_listed: SignalInstance

        def set_status(self, text: str) -> None: ...
        def show_error(self, message: str, kind: str = "") -> None: ...
        def set_context(self, used: int, n_ctx: int) -> None: ...
        def new_chat(self) -> None: ...
        def open_conversation(self, conversation_id: str) -> None: ...

    # -- the model -----------------------------------------------------------------------
    def engine_changed(self) -> None:
        self.bridge.run(
            lambda core, _job: core.info(), on_done=self._opened, on_error=self.show_error
        )

    def say_start_notes(self) -> None:
        """What the start repaired (an interrupted restore or backup), said once."""

        def say(notes: list[str]) -> None:
            for note in notes:
                self.prompts.inform("Galahad Desktop", note)

        self.bridge.run(
            lambda core, _job: core.start_notes(), on_done=say, on_error=self.show_error
        )

    def conversation_changed(self, conversation_id: str) -> None:
        self.open_conversation(conversation_id)

    def _opened(self, info: EngineInfo) -> None:
        self.info = info
        self.n_ctx = info.n_ctx
        self.set_context(0, self.n_ctx)
        self.chat.model_name = "Gemma" if "gemma" in info.model.architecture else info.model.name
        self.chat.thinking_box.setVisible(info.supports_thinking)
        self.welcome.show_model(info)
        kind = "" if info.model.kind == "chat" else f" ({info.model.label})"
        note = "" if info.turn_format.understood else f" · {info.turn_format_note}"
        self.set_status(
            f"{info.model.name}{kind} · {info.device_note()} · keys in "
            f"{keyring_label(info.keyring)}{note}"
        )
        for problem in info.settings_problems:
            self.show_error(problem)
        self.bridge.run(
            lambda core, _job: core.model_files(), on_done=self._models, on_error=self.show_error
        )
        if self.recommendation is None:
            self.bridge.run(
                lambda core, _job: core.recommend(),
                on_done=self._recommended,
                on_error=self.show_error,
            )
        self.opened.emit(info)

    def _recommended(self, recommendation: Recommendation) -> None:
        self.recommendation = recommendation
        self._models(self.model_files)  # the switcher also lists what can be downloaded

    def _offer(self) -> None:
        if self.recommendation is None:
            return
        installed = any("gemma-4" in Path(m.path).name.lower() for m in self.model_files)
        self.welcome.show_offer(self.recommendation, installed)

    def _models(self, files: list[ModelFile]) -> None:
        self.model_files = files
        self.model_switcher.blockSignals(True)
        self.model_switcher.clear()
        for model in files:
            label = f"{model.name} · {human_bytes(model.size_bytes)}"
            self.model_switcher.addItem(label, model.path)
            if model.in_use:
                self.model_switcher.setCurrentIndex(self.model_switcher.count() - 1)
        if self.recommendation is not None:
            for candidate in self.recommendation.candidates:
                if candidate.fits and not any(candidate.file == Path(m.path).name for m in files):
                    self.model_switcher.addItem(
                        f"Gemma 4 {candidate.size} — download ({candidate.bytes / 1e9:.1f} GB)",
                        f"get:{candidate.size}",
                    )
        self.model_switcher.blockSignals(False)
        self._offer()
        self.models_listed.emit()

    def _model_chosen(self, index: int) -> None:
        target = str(self.model_switcher.itemData(index))
        if target.startswith("get:"):
            size = target[4:]
            candidate = (
                next((c for c in self.recommendation.candidates if c.size == size), None)
                if self.recommendation is not None
                else None
            )
            what = f" ({human_bytes(candidate.bytes)})" if candidate is not None else ""
            if self.prompts.confirm(
                "Download a model",
                f"Download Gemma 4 {size}{what} now? It downloads beside the chat (you can "
                "go on chatting with the current model) and can be stopped and resumed.",
            ):
                self.get_gemma4(size)
            else:
                self._models(self.model_files)  # the picker shows the model in use again
            return
        current = next((m for m in self.model_files if m.in_use), None)
        if current is not None and current.path == target:
            return
        self.switch_model(Path(target))

    def switch_model(self, path: Path) -> None:
        self.set_status(f"Switching to {path.name}…")
        self.bridge.run(
            lambda core, _job: core.use_model(path),
            on_done=lambda _c: self._switched(path),
            on_error=self.show_error,
        )

    def _switched(self, path: Path) -> None:
        self.set_status(
            f"Now using {path.name}. A conversation made with another model is re-read once "
            "when you open it."
        )
        if self.conversation_id is not None:
            self.new_chat()
        self.engine_changed()

    def get_gemma4(self, size: str) -> None:
        if self.downloading is not None:
            self.set_status("A download is already running; its progress is in the status bar.")
            return
        self.welcome.show_progress(0, 1)
        self.set_status(f"Downloading Gemma 4 {size or '(recommended)'}…")
        chosen = size or None
        label = f"Downloading Gemma 4 {size}" if size else "Downloading Gemma 4"

        def progress(done: int, total: int, _rate: float, _eta: float) -> None:
            self.welcome.show_progress(done, total)
            self.download_bar.setVisible(True)
            self.download_bar.setMaximum(max(1, total))
            self.download_bar.setValue(done)
            self.download_bar.setFormat(f"{label} · {human_bytes(done)} of {human_bytes(total)}")

        if self.bridge.has_downloads_lane:  # beside the chat: replies go on meanwhile
            self.downloading = self.bridge.download(
                lambda downloads, job: downloads.get_gemma4(chosen, job),
                on_done=self._downloaded,
                on_error=self._download_failed,
                on_progress=progress,
                label=label,
            )
        else:
            self.downloading = self.bridge.run(
                lambda core, job: core.get_gemma4(chosen, job, use=False),
                on_done=self._downloaded,
                on_error=self._download_failed,
                on_progress=progress,
                label=label,
            )
        self.download_cancel.setVisible(True)

    def cancel_download(self) -> None:
        self.bridge.cancel(self.downloading)

    def _downloaded(self, done: Any) -> None:
        self.downloading = None
        self.welcome.download_over()
        self.download_bar.setVisible(False)
        self.download_cancel.setVisible(False)
        path = done.path
        self.bridge.run(
            lambda core, _job: core.use_model(path),
            on_done=lambda _changed: self._switched_to_download(path),
            on_error=self.show_error,
            label="Switching to the downloaded model",
        )

    def _switched_to_download(self, path: Path) -> None:
        self.set_status(f"Downloaded and verified {path.name}; switched to it.")
        self.engine_changed()

    def _download_failed(self, message: str, kind: str) -> None:
        self.downloading = None
        self.welcome.download_over()
        self.download_bar.setVisible(False)
        self.download_cancel.setVisible(False)
        self.show_error(message, kind)
