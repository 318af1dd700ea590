"""The worker bridge on its own, with a stand-in core: fast, and able to pin down races that
the window tests with the real model only hit now and then (they hold the catalog's lock)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from galahad_desktop.jobs import Job, Progress
from galahad_desktop.ui.worker import CoreBridge

pytestmark = pytest.mark.gui


class StandInCore:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.closed = 0

    def slow(self) -> str:
        self.started.set()
        self.release.wait(10)
        return "done"

    def echo(self, value: Any) -> Any:
        return value

    def close(self) -> None:
        self.closed += 1


def test_stop_while_a_request_runs_still_closes_the_core(qtbot) -> None:  # type: ignore[no-untyped-def]
    core = StandInCore()
    bridge = CoreBridge(lambda: core)  # type: ignore[arg-type, return-value]
    bridge.run(lambda core, _job: core.slow())
    assert core.started.wait(10)
    # The request is still running when stop() posts the shutdown and quits the loop: the
    # loop can end before it reaches the shutdown, which used to leave the core open.
    threading.Timer(0.2, core.release.set).start()
    bridge.stop()
    assert core.closed == 1
    assert not bridge.core_thread.isRunning()


def test_stop_when_idle_closes_the_core_once(qtbot) -> None:  # type: ignore[no-untyped-def]
    core = StandInCore()
    bridge = CoreBridge(lambda: core)  # type: ignore[arg-type, return-value]
    results: list[Any] = []
    bridge.run(lambda core, _job: core.echo(7), on_done=results.append)
    qtbot.waitUntil(lambda: bool(results), timeout=10_000)  # delivered on the main thread
    assert results == [7]
    bridge.stop()
    assert core.closed == 1


def test_a_crash_is_a_message_and_a_job_streams_back(qtbot, caplog) -> None:  # type: ignore[no-untyped-def]
    """A crash shows a message without the exception's text (it can quote private text) and
    logs where the work was written; a job's stream and progress arrive on the main thread."""
    core = StandInCore()
    bridge = CoreBridge(lambda: core)  # type: ignore[arg-type, return-value]
    errors: list[tuple[str, str]] = []
    title = "a private title"

    def broken(core: Any, job: Any) -> None:
        raise KeyError(title)

    bridge.run(broken, on_error=lambda m, k: errors.append((m, k)))
    qtbot.waitUntil(lambda: bool(errors), timeout=10_000)
    assert errors[0][1] == "crash" and "private" not in errors[0][0]
    assert "test_worker.py" in caplog.text and "private" not in caplog.text
    pieces: list[str] = []
    ticks: list[int] = []
    results: list[Any] = []

    def streaming(core: Any, job: Job) -> str:
        job.text("Hel")
        job.text("lo")
        job.progress(Progress(5, 10, 1.0))
        return "done"

    bridge.run(
        streaming,
        on_done=results.append,
        on_stream=pieces.append,
        on_progress=lambda done, total, _tps, _eta: ticks.append(done),
    )
    qtbot.waitUntil(lambda: bool(results), timeout=10_000)
    assert (pieces, ticks, results) == (["Hel", "lo"], [5], ["done"])
    bridge.stop()
