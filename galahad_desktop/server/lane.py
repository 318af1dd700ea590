"""The core's lane for the server: one thread owns the core and runs one request at a time.

The command's server owns a `ThreadLane`; the window passes its own model lane through the
same `CoreLane` protocol, so the window's chat and the API queue behind each other.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from galahad_desktop.memory.galahad import Galahad

T = TypeVar("T")
Work = Callable[["Galahad"], Any]


class CoreLane(Protocol):
    """Where the server sends work for the core."""

    def submit(self, label: str, work: Work, cancel: threading.Event) -> Future[Any]:
        """Queue `work` (called with the core on its thread); a cancel set while it waits
        means it never runs."""
        ...

    def waiting(self) -> int:
        """Requests queued or running."""
        ...


class ThreadLane:
    """A thread that owns the core (the command's `galahad serve`)."""

    def __init__(self, core: Galahad) -> None:
        self.core = core
        self._queue: queue.Queue[tuple[Work, threading.Event, Future[Any]] | None] = queue.Queue()
        self._count = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="galahad-core", daemon=True)
        self._thread.start()

    def submit(self, label: str, work: Work, cancel: threading.Event) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            self._count += 1
        self._queue.put((work, cancel, future))
        return future

    def waiting(self) -> int:
        with self._lock:
            return self._count

    def call(self, work: Callable[[Galahad], T]) -> T:
        """Run `work` on the core's thread and wait for it (setup, the key)."""
        result: T = self.submit("setup", work, threading.Event()).result()
        return result

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, cancel, future = item
            try:
                if cancel.is_set():
                    future.cancel()  # its client left while it waited: it never runs
                    continue
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(work(self.core))
                except BaseException as exc:  # handed to the waiting request, never lost
                    future.set_exception(exc)
            finally:
                with self._lock:
                    self._count -= 1

    def close(self) -> None:
        """Stop after the work already queued."""
        self._queue.put(None)
        self._thread.join()
