"""One worker thread owns the core (engine, vault, catalog); the window never waits on it.

The window runs core work through one typed helper, in the Anki style:

    bridge.run(lambda core, job: core.send(conversation_id, text, job), on_done=shown)

The work crosses to the worker thread as a queued signal; the worker calls it there with the
core and a `Job` whose streaming, thought and progress callbacks emit signals, and whose
cancel is the request's. Results and errors come back as signals delivered on the main
thread, where the callbacks run. mypy checks every call against the core's API (`Galahad`);
the worker only marshals, every piece of logic lives in the core, which the command calls
the same way.
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from galahad_desktop.errors import as_user_error
from galahad_desktop.jobs import Job
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import Progress

log = logging.getLogger("galahad.ui")
CoreFactory = Callable[[], Galahad]
T = TypeVar("T")
Work = Callable[[Galahad, Job], Any]


def _where(work: Work) -> str:
    """Where the work was written (for the log: a lambda has no useful name)."""
    code = getattr(work, "__code__", None)
    if code is None:
        return getattr(work, "__qualname__", "work")
    return f"{Path(code.co_filename).name}:{code.co_firstlineno}"


@dataclass
class Request:
    request_id: int
    work: Work
    cancel: threading.Event = field(default_factory=threading.Event)


class CoreWorker(QObject):
    """Lives in the worker thread; the only object that touches the core."""

    finished = Signal(int, object)
    failed = Signal(int, str, str)
    streamed = Signal(int, str)
    thought = Signal(int, str)
    progressed = Signal(int, int, int, float, float)

    def __init__(self, core_factory: CoreFactory) -> None:
        super().__init__()
        self._core_factory = core_factory
        self.core: Galahad | None = None

    def _job(self, request: Request) -> Job:
        rid = request.request_id
        return Job(
            on_text=lambda piece: self.streamed.emit(rid, piece),
            on_thought=lambda piece: self.thought.emit(rid, piece),
            on_progress=lambda p: self._progress(rid, p),
            cancel=request.cancel,
        )

    @Slot(object)
    def run(self, request: Request) -> None:
        try:
            if self.core is None:
                self.core = self._core_factory()
            result = request.work(self.core, self._job(request))
            self.finished.emit(request.request_id, result)
        except Exception as exc:
            error = as_user_error(exc)
            if error is not None:
                self.failed.emit(request.request_id, str(error), type(error).__name__)
                return
            # Type and stack only: an exception's message can quote private text.
            where = _where(request.work)
            log.error(
                "request %s failed: %s\n%s",
                where,
                type(exc).__name__,
                "".join(traceback.format_tb(exc.__traceback__, limit=8)),
            )
            self.failed.emit(
                request.request_id,
                f"Something went wrong ({type(exc).__name__}). Your stored conversations are "
                "safe; details are in the log file.",
                "crash",
            )

    def _progress(self, request_id: int, p: Progress) -> None:
        self.progressed.emit(request_id, p.done, p.total, p.tokens_per_s, p.eta_s)

    @Slot()
    def shutdown(self) -> None:
        if self.core is not None:
            self.core.close()
            self.core = None


class CoreBridge(QObject):
    """Main-thread side: sends requests, routes replies to callbacks."""

    _submit = Signal(object)
    _shutdown = Signal()
    busy_changed = Signal(bool)

    def __init__(self, core_factory: CoreFactory) -> None:
        super().__init__()
        self._ids = itertools.count(1)
        self._callbacks: dict[int, dict[str, Callable[..., None] | None]] = {}
        self._requests: dict[int, Request] = {}
        self.core_thread = QThread()
        self.core_thread.setObjectName("galahad-core")
        self.worker = CoreWorker(core_factory)
        self.worker.moveToThread(self.core_thread)
        self._submit.connect(self.worker.run)
        self._shutdown.connect(self.worker.shutdown)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        # Bound slots, never lambdas: a lambda has no thread, so PySide would call it in the
        # core thread and the window would be touched from there.
        self.worker.streamed.connect(self._on_streamed)
        self.worker.thought.connect(self._on_thought)
        self.worker.progressed.connect(self._on_progressed)
        self.core_thread.start()

    def run(
        self,
        work: Callable[[Galahad, Job], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[str, str], None] | None = None,
        on_stream: Callable[[str], None] | None = None,
        on_thought: Callable[[str], None] | None = None,
        on_progress: Callable[[int, int, float, float], None] | None = None,
    ) -> Request:
        """Run `work(core, job)` on the worker thread; `on_done(result)` on this one."""
        request = Request(next(self._ids), work)
        self._callbacks[request.request_id] = {
            "done": on_done,
            "error": on_error,
            "stream": on_stream,
            "thought": on_thought,
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
            log.warning("unhandled %s error", kind)

    @Slot(int, str)
    def _on_streamed(self, request_id: int, piece: str) -> None:
        self._relay(request_id, "stream", piece)

    @Slot(int, str)
    def _on_thought(self, request_id: int, piece: str) -> None:
        self._relay(request_id, "thought", piece)

    def _relay(self, request_id: int, kind: str, piece: str) -> None:
        callback = self._callbacks.get(request_id, {}).get(kind)
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
        finished = self.core_thread.wait(timeout_ms)
        # quit() can end the worker's loop before it reaches the queued shutdown (when a
        # request is still running at stop time), and an open core keeps the catalog's
        # exclusive lock. Once the thread has finished, nothing else owns the core, so it
        # is closed from here.
        if finished:
            self.worker.shutdown()
        else:
            log.error("the core thread did not stop within %d ms", timeout_ms)
        # Deliver replies the worker queued while stopping, so no queued event holding
        # Python objects outlives the bridge (PySide would free them during teardown).
        QCoreApplication.sendPostedEvents()
        self._callbacks.clear()
        self._requests.clear()


def default_core_factory(
    data_dir: Path, model_path: Path | None, passphrase: str | None = None
) -> CoreFactory:
    return lambda: Galahad(data_dir, model_path=model_path, passphrase=passphrase)
