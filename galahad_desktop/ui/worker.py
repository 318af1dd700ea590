"""One worker thread owns the core (engine, vault, catalog); the window never waits on it.

The window calls `CoreBridge.call(name, *args, on_done=..., on_error=...)`. The request
crosses to the worker thread as a queued signal, runs `CoreTasks.<name>` there, and the
result comes back as a signal delivered on the main thread, where the callback runs.
Streaming text and progress travel the same way. Cancellation is a threading.Event the
window sets directly; the core checks it between tokens and batches.
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from galahad_desktop.engine.engine import Progress
from galahad_desktop.errors import GalahadError
from galahad_desktop.ui.tasks import CoreTasks

log = logging.getLogger("galahad.ui")


@dataclass
class Request:
    request_id: int
    name: str
    args: tuple[Any, ...]
    cancel: threading.Event = field(default_factory=threading.Event)


class CoreWorker(QObject):
    """Lives in the worker thread; the only object that touches the core."""

    finished = Signal(int, object)
    failed = Signal(int, str, str)
    streamed = Signal(int, str)
    progressed = Signal(int, int, int, float, float)

    def __init__(self, tasks_factory: Callable[[], CoreTasks]) -> None:
        super().__init__()
        self._tasks_factory = tasks_factory
        self._tasks: CoreTasks | None = None

    @Slot(object)
    def run(self, request: Request) -> None:
        try:
            if self._tasks is None:
                self._tasks = self._tasks_factory()
            handler = getattr(self._tasks, request.name)
            result = handler(
                *request.args,
                stream=lambda piece: self.streamed.emit(request.request_id, piece),
                progress=lambda p: self._progress(request.request_id, p),
                cancel=request.cancel,
            )
            self.finished.emit(request.request_id, result)
        except GalahadError as exc:
            self.failed.emit(request.request_id, str(exc), type(exc).__name__)
        except Exception as exc:  # reported to the window as a crash
            # Type and stack only: an exception's message can quote private text.
            log.error(
                "task %s failed: %s\n%s",
                request.name,
                type(exc).__name__,
                "".join(traceback.format_tb(exc.__traceback__, limit=8)),
            )
            self.failed.emit(
                request.request_id,
                f"Something went wrong in '{request.name}': "
                f"{type(exc).__name__}. Details are in the log file.",
                "crash",
            )

    def _progress(self, request_id: int, p: Progress) -> None:
        self.progressed.emit(request_id, p.done, p.total, p.tokens_per_s, p.eta_s)

    @Slot()
    def shutdown(self) -> None:
        if self._tasks is not None:
            self._tasks.close()
            self._tasks = None


class CoreBridge(QObject):
    """Main-thread side: sends requests, routes replies to callbacks."""

    _submit = Signal(object)
    _shutdown = Signal()
    busy_changed = Signal(bool)

    def __init__(self, tasks_factory: Callable[[], CoreTasks]) -> None:
        super().__init__()
        self._ids = itertools.count(1)
        self._callbacks: dict[int, dict[str, Callable[..., None] | None]] = {}
        self._requests: dict[int, Request] = {}
        self.core_thread = QThread()
        self.core_thread.setObjectName("galahad-core")
        self.worker = CoreWorker(tasks_factory)
        self.worker.moveToThread(self.core_thread)
        self._submit.connect(self.worker.run)
        self._shutdown.connect(self.worker.shutdown)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        self.worker.streamed.connect(self._on_streamed)
        self.worker.progressed.connect(self._on_progressed)
        self.core_thread.start()

    def call(
        self,
        name: str,
        *args: Any,
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[str, str], None] | None = None,
        on_stream: Callable[[str], None] | None = None,
        on_progress: Callable[[int, int, float, float], None] | None = None,
    ) -> Request:
        request = Request(next(self._ids), name, args)
        self._callbacks[request.request_id] = {
            "done": on_done,
            "error": on_error,
            "stream": on_stream,
            "progress": on_progress,
        }
        self._requests[request.request_id] = request
        self.busy_changed.emit(True)
        self._submit.emit(request)
        return request

    def pending(self) -> int:
        return len(self._requests)

    def _pop(self, request_id: int) -> dict[str, Callable[..., None] | None]:
        self._requests.pop(request_id, None)
        callbacks = self._callbacks.pop(request_id, {})
        if not self._requests:
            self.busy_changed.emit(False)
        return callbacks

    @Slot(int, object)
    def _on_finished(self, request_id: int, result: Any) -> None:
        callback = self._pop(request_id).get("done")
        if callback is not None:
            callback(result)

    @Slot(int, str, str)
    def _on_failed(self, request_id: int, message: str, kind: str) -> None:
        callback = self._pop(request_id).get("error")
        if callback is not None:
            callback(message, kind)
        else:
            self.unhandled_error(message, kind)

    def unhandled_error(self, message: str, kind: str) -> None:
        log.warning("unhandled %s error", kind)

    @Slot(int, str)
    def _on_streamed(self, request_id: int, piece: str) -> None:
        callback = self._callbacks.get(request_id, {}).get("stream")
        if callback is not None:
            callback(piece)

    @Slot(int, int, int, float, float)
    def _on_progressed(
        self, request_id: int, done: int, total: int, tps: float, eta: float
    ) -> None:
        callback = self._callbacks.get(request_id, {}).get("progress")
        if callback is not None:
            callback(done, total, tps, eta)

    def stop(self, timeout_ms: int = 30000) -> None:
        for request in self._requests.values():
            request.cancel.set()
        self._shutdown.emit()
        self.core_thread.quit()
        self.core_thread.wait(timeout_ms)
        # Deliver replies the worker queued while stopping, so no queued event holding
        # Python objects outlives the bridge (PySide would free them during teardown).
        QCoreApplication.sendPostedEvents()
        self._callbacks.clear()
        self._requests.clear()


def default_tasks_factory(
    data_dir: Path, model_path: Path | None, passphrase: str | None = None
) -> Callable[[], CoreTasks]:
    return lambda: CoreTasks(data_dir, model_path, passphrase=passphrase)
