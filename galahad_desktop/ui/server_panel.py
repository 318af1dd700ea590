"""The window's Local server: the OpenAI-compatible API on 127.0.0.1, switched on and off.

Requests from API clients go to the window's own model lane (`BridgeLane`), so they queue
with the window's chat, show in the status bar with a Stop, and refresh the sidebar when a
conversation changes. The panel shows the address and the key (hidden until asked), and
makes a new key on request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop import errors
from galahad_desktop.errors import GalahadError
from galahad_desktop.server import DEFAULT_PORT
from galahad_desktop.server.app import ServerIdentity
from galahad_desktop.server.lane import Work
from galahad_desktop.ui.wheel import guard_wheel
from galahad_desktop.ui.worker import CANCELLED, CONVERSATIONS, CoreBridge

if TYPE_CHECKING:
    from galahad_desktop.server.running import LocalServer


def _error(kind: str, message: str) -> BaseException:
    """The core's error again, from its kind and message (the lane reports them as text)."""
    if kind == CANCELLED:
        return errors.CancelledError(message)
    found = getattr(errors, kind, None)
    if isinstance(found, type) and issubclass(found, GalahadError):
        return found(message)
    return GalahadError(message)


@dataclass(frozen=True)
class _Refused:
    error: GalahadError


class BridgeLane(QObject):
    """The server's `CoreLane` over the window's model lane (submitted from the server's
    thread, run on the main thread's bridge)."""

    _submitted = Signal(object)

    def __init__(self, bridge: CoreBridge) -> None:
        super().__init__()
        self.bridge = bridge
        self._lock = threading.Lock()
        self._count = 0
        self._submitted.connect(self._run, Qt.ConnectionType.QueuedConnection)

    def submit(self, label: str, work: Work, cancel: threading.Event) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            self._count += 1
        self._submitted.emit((label, work, cancel, future))
        return future

    def waiting(self) -> int:
        with self._lock:
            return self._count

    def _settle(self, future: Future[Any], result: Any = None, error: Any = None) -> None:
        with self._lock:
            self._count -= 1
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    @Slot(object)
    def _run(self, item: tuple[str, Work, threading.Event, Future[Any]]) -> None:
        _label, work, cancel, future = item

        def run(core: Any, _job: Any) -> Any:
            # The core's own error goes back whole (its type, the field it names, its
            # words), not as the window's text: rebuilt from that, a refused schema or
            # tools on Gemma 3 was a 500.
            try:
                return work(core)
            except GalahadError as exc:
                return _Refused(exc)

        def done(result: Any) -> None:
            if isinstance(result, _Refused):
                self._settle(future, error=result.error)
            else:
                self._settle(future, result)

        self.bridge.run(
            run,
            on_done=done,
            on_error=lambda message, kind: self._settle(future, error=_error(kind, message)),
            label="Answering a program (local API)",
            cancel=cancel,
            changes=(CONVERSATIONS,),
        )


class ServerHost:
    """The window's server, if one is running (it outlives the panel, not the window)."""

    def __init__(self, bridge: CoreBridge) -> None:
        self.bridge = bridge
        self.lane = BridgeLane(bridge)
        self.server: LocalServer | None = None
        self.key = ""
        self.model = ""
        self.context_length = 0

    @property
    def address(self) -> str:
        return self.server.address.base_url if self.server is not None else ""

    def start(self, port: int) -> str:
        """Serve on 127.0.0.1:`port` (key and model already fetched); the base URL."""
        from galahad_desktop.server.running import LocalServer  # uvicorn: only when asked

        self.server = LocalServer(
            self.lane,
            ServerIdentity(self.model, lambda: self.key, context_length=self.context_length),
            "127.0.0.1",
            port,
        )
        self.server.start()
        return self.address

    def may_quit(self, confirm: Callable[[str, str], bool]) -> bool:
        """Whether the window may close: asked first while programs may be using it."""
        return self.server is None or confirm(
            "Quit Galahad?",
            f"The local server at {self.address} is on: programs using it lose it when "
            "Galahad quits, and a request it is answering is stopped.",
        )

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()


class ServerPanel(QDialog):
    """File ▸ Local server…: on/off, address, key."""

    changed = Signal()  # the server started or stopped (tests wait on it)

    def __init__(self, host: ServerHost, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.setWindowTitle("Local server")
        self.setAccessibleName("Local server")
        intro = QLabel(
            "Serve the loaded model to other programs (editors, scripts, agents) through an "
            "OpenAI-compatible API on this computer only. What they send is stored encrypted "
            "like your own conversations, and a history they send again is grafted, not "
            "re-read."
        )
        intro.setWordWrap(True)
        self.toggle = QCheckBox("Serve the OpenAI-compatible API on 127.0.0.1")
        self.toggle.setAccessibleName("Serve the local API")
        self.port = QSpinBox()
        guard_wheel(self.port)
        self.port.setRange(1024, 65535)
        self.port.setValue(DEFAULT_PORT)
        self.port.setAccessibleName("Port")
        self.address = QLineEdit()
        self.address.setReadOnly(True)
        self.address.setAccessibleName("Address")
        self.address.setPlaceholderText("not serving")
        self.key = QLineEdit()
        self.key.setReadOnly(True)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setAccessibleName("API key")
        self.show_key = QPushButton("Show")
        self.show_key.setCheckable(True)
        self.show_key.setAccessibleName("Show the API key")
        self.copy_key = QPushButton("Copy")
        self.copy_key.setAccessibleName("Copy the API key")
        self.new_key = QPushButton("New key")
        self.new_key.setAccessibleName("Make a new API key")
        self.status = QLabel("")
        self.status.setWordWrap(True)
        key_row = QHBoxLayout()
        for widget in (self.key, self.show_key, self.copy_key, self.new_key):
            key_row.addWidget(widget)
        form = QFormLayout()
        form.addRow("Port", self.port)
        form.addRow("Address", self.address)
        form.addRow("API key", key_row)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.toggle)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(buttons)
        self.toggle.toggled.connect(self._toggled)
        self.show_key.toggled.connect(
            lambda on: self.key.setEchoMode(
                QLineEdit.EchoMode.Normal if on else QLineEdit.EchoMode.Password
            )
        )
        self.copy_key.clicked.connect(self._copy_key)
        self.new_key.clicked.connect(self._rotate)
        self._show()
        self._fetch_key(rotate=False)

    def _show(self) -> None:
        serving = self.host.server is not None
        self.toggle.blockSignals(True)
        self.toggle.setChecked(serving)
        self.toggle.blockSignals(False)
        self.port.setEnabled(not serving)
        self.address.setText(self.host.address)
        if self.host.key:
            self.key.setText(self.host.key)

    def _fetch_key(self, rotate: bool, then: Any = None) -> None:
        def work(core: Any, _job: Any) -> tuple[str, str, int]:
            info = core.info()
            return core.api_key(rotate=rotate), info.model.name, info.n_ctx

        def done(found: tuple[str, str, int]) -> None:
            self.host.key, self.host.model, self.host.context_length = found
            self._show()
            if then is not None:
                then()

        self.host.bridge.run(work, done, lambda message, _kind: self.status.setText(message))

    def _rotate(self) -> None:
        self._fetch_key(rotate=True)
        self.status.setText("A new key was made; programs using the old one must be given it.")

    def _copy_key(self) -> None:
        """The key to the clipboard, and said so (the button gave no sign it worked)."""
        QGuiApplication.clipboard().setText(self.key.text())
        self.status.setText("API key copied: paste it where the program asks for an API key.")

    def _toggled(self, on: bool) -> None:
        if not on:
            self.host.stop()
            self.status.setText("Stopped.")
            self._show()
            self.changed.emit()
            return

        def start() -> None:
            try:
                address = self.host.start(self.port.value())
            except GalahadError as exc:
                self.status.setText(exc.in_window())
                self._show()
                return
            self.status.setText(f"Serving {self.host.model} at {address}.")
            self._show()
            self.changed.emit()

        self._fetch_key(rotate=False, then=start)
