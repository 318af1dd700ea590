"""A job: one request's streaming, thoughts, progress and cancellation.

The window (or the command) makes one `Job` per request and hands it to the core, which hands
it on to the engine: the five callbacks and flags a long operation needs travel as one value
instead of five loose parameters on every method. `NO_JOB` streams nowhere and is never
cancelled (it holds no Event, so sharing it is safe).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from galahad_desktop.errors import CancelledError


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    elapsed_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float:
        rate = self.tokens_per_s
        return (self.total - self.done) / rate if rate > 0 else float("inf")


TextFn = Callable[[str], None]
ProgressFn = Callable[[Progress], None]
PaceFn = Callable[[int, float], None]  # tokens generated so far, tokens/s


@dataclass(frozen=True)
class Job:
    on_text: TextFn | None = None  # the answer, piece by piece
    on_thought: TextFn | None = None  # a thinking model's thoughts, never mixed into the answer
    on_progress: ProgressFn | None = None  # tokens read so far, for long reads
    cancel: threading.Event | None = None  # set from another thread to stop at the next step
    on_pace: PaceFn | None = None  # a reply's pace while it streams (live tokens/s)

    @staticmethod
    def cancellable(
        on_text: TextFn | None = None,
        on_thought: TextFn | None = None,
        on_progress: ProgressFn | None = None,
    ) -> Job:
        return Job(on_text, on_thought, on_progress, threading.Event())

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def check(self, message: str = "Cancelled; nothing was stored.") -> None:
        """Raise CancelledError once the job was cancelled."""
        if self.cancelled:
            raise CancelledError(message)

    def text(self, piece: str) -> None:
        if self.on_text is not None:
            self.on_text(piece)

    def thought(self, piece: str) -> None:
        if self.on_thought is not None:
            self.on_thought(piece)

    def progress(self, progress: Progress) -> None:
        if self.on_progress is not None:
            self.on_progress(progress)

    def pace(self, generated: int, tokens_per_s: float) -> None:
        if self.on_pace is not None:
            self.on_pace(generated, tokens_per_s)

    def step(self, offset: int, total: int, start: float | None = None) -> Job:
        """This job for one step of a larger whole: the step's progress is reported as
        `offset` plus its own, of `total`, timed from `start` (a perf_counter) when given."""
        outer = self.on_progress
        if outer is None:
            return self

        def report(p: Progress) -> None:
            elapsed = p.elapsed_s if start is None else time.perf_counter() - start
            outer(Progress(offset + p.done, total, elapsed))

        return replace(self, on_progress=report)

    def silent(self) -> Job:
        """The same cancellation, nothing streamed (work the user does not read)."""
        return Job(cancel=self.cancel)


NO_JOB = Job()
