"""Lanes: the threads that run the window's work, each a queue the window can see and stop.

The model lane owns the core (engine, vault, catalog): one llama.cpp context serialises
model work, so requests on it run one at a time, in order. The downloads lane fetches model
files beside it (it never touches the core), so chatting goes on while a file downloads.

The window runs work through one typed helper, in the Anki style:

    bridge.run(lambda core, job: core.send(conversation_id, text, job), label="Reply",
               on_done=shown)

A request with a label is an operation the user started: it is shown (running or waiting,
`queue_changed`), and it can be stopped (`cancel`); a request stopped while it waits never
runs. Unlabelled requests are the window's own quick reads. Results and errors come back as
signals delivered on the main thread, where the callbacks run. mypy checks every call
against the core's API (`Galahad`); the worker only marshals, every piece of logic lives in
the core, which the command calls the same way.
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from galahad_desktop.errors import as_user_error
from galahad_desktop.jobs import Job
from galahad_desktop.memory.galahad import Galahad, ModelDownloads
from galahad_desktop.memory.results import Progress

log = logging.getLogger("galahad.ui")
CoreFactory = Callable[[], Galahad]
T = TypeVar("T")
Work = Callable[[Any, Job], Any]
MODEL_LANE, DOWNLOAD_LANE = "model", "downloads"
# What an operation can change, for the views that show it.
CONVERSATIONS, DOCUMENTS = "conversations", "documents"
CANCELLED = "cancelled"  # the error kind of a request stopped before it ran


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
    label: str = ""  # what the user started, in words ("" for the window's own reads)
    lane: str = MODEL_LANE
    running: bool = False
    changes: frozenset[str] = frozenset()  # what it changes (views refresh from this)


class CoreWorker(QObject):
    """Lives in a lane's thread; the only object that touches what the lane owns (the
    core, for the model lane)."""

    finished = Signal(int, object)
    failed = Signal(int, str, str)
    started = Signal(int)
    streamed = Signal(int, str)
    thought = Signal(int, str)
    progressed = Signal(int, int, int, float, float)
    paced = Signal(int, int, float)

    def __init__(self, core_factory: Callable[[], Any]) -> None:
        super().__init__()
        self._core_factory = core_factory
        self.core: Any = None

    def _job(self, request: Request) -> Job:
        rid = request.request_id
        return Job(
            on_text=lambda piece: self.streamed.emit(rid, piece),
            on_thought=lambda piece: self.thought.emit(rid, piece),
            on_progress=lambda p: self._progress(rid, p),
            cancel=request.cancel,
            on_pace=lambda n, rate: self.paced.emit(rid, n, rate),
        )

    @Slot(object)
    def run(self, request: Request) -> None:
        if request.cancel.is_set():  # stopped while it waited: it never runs
            self.failed.emit(request.request_id, "Stopped before it started.", CANCELLED)
            return
        self.started.emit(request.request_id)
        try:
            if self.core is None:
                self.core = self._core_factory()
            result = request.work(self.core, self._job(request))
            self.finished.emit(request.request_id, result)
        except Exception as exc:
            error = as_user_error(exc)
            if error is not None:
                self.failed.emit(request.request_id, error.in_window(), type(error).__name__)
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
            close = getattr(self.core, "close", None)
            if close is not None:
                close()
            self.core = None


class Lane:
    """A thread and the worker that lives in it."""

    def __init__(self, name: str, factory: Callable[[], Any]) -> None:
        self.name = name
        self.thread = QThread()
        self.thread.setObjectName(f"galahad-{name}")
        self.worker = CoreWorker(factory)
        self.worker.moveToThread(self.thread)


class CoreBridge(QObject):
    """Main-thread side: sends requests to their lanes, routes replies to callbacks, and
    says what runs and what waits."""

    _submit = Signal(object)
    _submit_download = Signal(object)
    _shutdown = Signal()
    _shutdown_downloads = Signal()
    busy_changed = Signal(bool)
    queue_changed = Signal()  # a labelled request started, finished or began to wait
    changed = Signal(object)  # frozenset[str]: what a finished operation changed

    def __init__(
        self,
        core_factory: CoreFactory,
        downloads_factory: Callable[[], ModelDownloads] | None = None,
    ) -> None:
        super().__init__()
        self._ids = itertools.count(1)
        self._callbacks: dict[int, dict[str, Callable[..., None] | None]] = {}
        self._requests: dict[int, Request] = {}
        model = Lane(MODEL_LANE, core_factory)
        self.core_thread, self.worker = model.thread, model.worker
        self._lanes = [model]
        self._submit.connect(self.worker.run)
        self._shutdown.connect(self.worker.shutdown)
        if downloads_factory is not None:
            downloads = Lane(DOWNLOAD_LANE, downloads_factory)
            self._lanes.append(downloads)
            self._submit_download.connect(downloads.worker.run)
            self._shutdown_downloads.connect(downloads.worker.shutdown)
        for lane in self._lanes:
            worker = lane.worker
            worker.finished.connect(self._on_finished)
            worker.failed.connect(self._on_failed)
            # Bound slots, never lambdas: a lambda has no thread, so PySide would call it in
            # the lane's thread and the window would be touched from there.
            worker.started.connect(self._on_started)
            worker.streamed.connect(self._on_streamed)
            worker.thought.connect(self._on_thought)
            worker.progressed.connect(self._on_progressed)
            worker.paced.connect(self._on_paced)
            lane.thread.start()

    @property
    def has_downloads_lane(self) -> bool:
        return len(self._lanes) > 1

    def run(
        self,
        work: Callable[[Galahad, Job], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[str, str], None] | None = None,
        on_stream: Callable[[str], None] | None = None,
        on_thought: Callable[[str], None] | None = None,
        on_progress: Callable[[int, int, float, float], None] | None = None,
        label: str = "",
        cancel: threading.Event | None = None,
        on_pace: Callable[[int, float], None] | None = None,
        changes: Iterable[str] = (),
    ) -> Request:
        """Run `work(core, job)` on the model lane; `on_done(result)` on this thread. A
        `label` shows the request as an operation (running or waiting); requests given
        the same `cancel` are stopped together; `changes` names what it changes
        (CONVERSATIONS, DOCUMENTS): once it is done, `changed` says so and the views that
        show those refresh themselves."""
        request = self._request(work, label, MODEL_LANE, cancel)
        request.changes = frozenset(changes)
        self._register(request, on_done, on_error, on_stream, on_thought, on_progress, on_pace)
        self._submit.emit(request)
        return request

    def download(
        self,
        work: Callable[[ModelDownloads, Job], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[str, str], None] | None = None,
        on_progress: Callable[[int, int, float, float], None] | None = None,
        label: str = "Download",
    ) -> Request:
        """Run `work(downloads, job)` on the downloads lane, beside the model's work (on the
        model lane when this bridge has no downloads lane)."""
        if not self.has_downloads_lane:
            raise RuntimeError("this bridge was made without a downloads lane")
        request = self._request(work, label, DOWNLOAD_LANE, None)
        self._register(request, on_done, on_error, None, None, on_progress, None)
        self._submit_download.emit(request)
        return request

    def _request(
        self, work: Work, label: str, lane: str, cancel: threading.Event | None
    ) -> Request:
        return Request(next(self._ids), work, cancel or threading.Event(), label, lane)

    def _register(
        self,
        request: Request,
        on_done: Callable[..., None] | None,
        on_error: Callable[[str, str], None] | None,
        on_stream: Callable[[str], None] | None,
        on_thought: Callable[[str], None] | None,
        on_progress: Callable[[int, int, float, float], None] | None,
        on_pace: Callable[[int, float], None] | None,
    ) -> None:
        self._callbacks[request.request_id] = {
            "done": on_done,
            "error": on_error,
            "stream": on_stream,
            "thought": on_thought,
            "progress": on_progress,
            "pace": on_pace,
        }
        self._requests[request.request_id] = request
        self.busy_changed.emit(True)
        if request.label:
            self.queue_changed.emit()

    def pending(self) -> int:
        return len(self._requests)

    def running(self, lane: str = MODEL_LANE) -> Request | None:
        """The labelled request running on `lane` now, if any."""
        return next(
            (r for r in self._requests.values() if r.lane == lane and r.running and r.label),
            None,
        )

    def waiting(self, lane: str = MODEL_LANE) -> list[Request]:
        """Labelled requests queued on `lane`, in the order they will run."""
        return [
            r
            for r in self._requests.values()
            if r.lane == lane and not r.running and r.label and not r.cancel.is_set()
        ]

    def ahead_of(self, request: Request) -> list[Request]:
        """Labelled requests on the same lane that run before `request`."""
        return [
            r
            for r in self._requests.values()
            if r.lane == request.lane
            and r.label
            and r.request_id < request.request_id
            and not r.cancel.is_set()
        ]

    def cancel(self, request: Request | None) -> None:
        """Stop a request: a running one at its next step, a waiting one before it runs."""
        if request is not None and request.request_id in self._requests:
            request.cancel.set()
            self.queue_changed.emit()

    def _pop(self, request_id: int) -> dict[str, Callable[..., None] | None]:
        request = self._requests.pop(request_id, None)
        callbacks = self._callbacks.pop(request_id, {})
        if not self._requests:
            self.busy_changed.emit(False)
        if request is not None and request.label:
            self.queue_changed.emit()
        return callbacks

    @Slot(int)
    def _on_started(self, request_id: int) -> None:
        request = self._requests.get(request_id)
        if request is not None:
            request.running = True
            if request.label:
                self.queue_changed.emit()

    @Slot(int, object)
    def _on_finished(self, request_id: int, result: Any) -> None:
        request = self._requests.get(request_id)
        callback = self._pop(request_id).get("done")
        if callback is not None:
            callback(result)
        if request is not None and request.changes:
            self.changed.emit(request.changes)

    @Slot(int, str, str)
    def _on_failed(self, request_id: int, message: str, kind: str) -> None:
        callback = self._pop(request_id).get("error")
        if callback is not None:
            callback(message, kind)
        elif kind != CANCELLED:
            log.warning("unhandled %s error", kind)

    @Slot(int, str)
    def _on_streamed(self, request_id: int, piece: str) -> None:
        self._relay(request_id, "stream", piece)

    @Slot(int, str)
    def _on_thought(self, request_id: int, piece: str) -> None:
        self._relay(request_id, "thought", piece)

    def _relay(self, request_id: int, kind: str, *args: Any) -> None:
        callback = self._callbacks.get(request_id, {}).get(kind)
        if callback is not None:
            callback(*args)

    @Slot(int, int, int, float, float)
    def _on_progressed(
        self, request_id: int, done: int, total: int, tps: float, eta: float
    ) -> None:
        self._relay(request_id, "progress", done, total, tps, eta)

    @Slot(int, int, float)
    def _on_paced(self, request_id: int, generated: int, rate: float) -> None:
        self._relay(request_id, "pace", generated, rate)

    def stop(self, timeout_ms: int = 30000) -> None:
        for request in self._requests.values():
            request.cancel.set()
        self._shutdown.emit()
        self._shutdown_downloads.emit()
        for lane in self._lanes:
            lane.thread.quit()
            finished = lane.thread.wait(timeout_ms)
            # quit() can end the worker's loop before it reaches the queued shutdown (when
            # a request is still running at stop time), and an open core keeps the
            # catalog's exclusive lock. Once the thread has finished, nothing else owns the
            # core, so it is closed from here.
            if finished:
                lane.worker.shutdown()
            else:
                log.error("the %s thread did not stop within %d ms", lane.name, timeout_ms)
        # Deliver replies the workers queued while stopping, so no queued event holding
        # Python objects outlives the bridge (PySide would free them during teardown).
        QCoreApplication.sendPostedEvents()
        self._callbacks.clear()
        self._requests.clear()


def default_core_factory(
    data_dir: Path,
    model_path: Path | None,
    passphrase: str | None = None,
    overrides: dict[str, str] | None = None,
) -> CoreFactory:
    """The window's core. `overrides`: settings for this run only (`galahad --set`)."""
    return lambda: Galahad(
        data_dir, model_path=model_path, overrides=overrides, passphrase=passphrase
    )


def default_bridge(data_dir: Path, core: CoreFactory) -> CoreBridge:
    """The window's lanes: the model lane over the core, a downloads lane beside it."""
    return CoreBridge(
        core,
        lambda: ModelDownloads(data_dir),
    )
