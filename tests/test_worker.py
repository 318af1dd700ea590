"""The worker bridge on its own, with a stand-in core: fast, and able to pin down races that
the window tests with the real model only hit now and then (they hold the catalog's lock)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from galahad_desktop.ui.worker import CoreBridge

pytestmark = pytest.mark.gui


class StandInCore:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.closed = 0

    def slow(self, cancel: threading.Event) -> str:
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
    bridge.call("slow")
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
    bridge.call("echo", 7, on_done=results.append)
    qtbot.waitUntil(lambda: bool(results), timeout=10_000)  # delivered on the main thread
    assert results == [7]
    bridge.stop()
    assert core.closed == 1


def test_private_names_are_refused(qtbot) -> None:  # type: ignore[no-untyped-def]
    core = StandInCore()
    bridge = CoreBridge(lambda: core)  # type: ignore[arg-type, return-value]
    errors: list[tuple[str, str]] = []
    bridge.call("_secret", on_error=lambda m, k: errors.append((m, k)))
    qtbot.waitUntil(lambda: bool(errors), timeout=10_000)
    assert errors[0][1] == "crash"
    bridge.stop()
