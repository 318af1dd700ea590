"""Longest main-thread stall of the desktop window during a deposit, a resume and a save.

Also while a document is added to an open conversation, while a question is routed, and
while a reply streams, a document waits to be read and a model file downloads beside them
(from a stand-in Hub on 127.0.0.1 serving the embedded model's bytes) all at once.
A 5 ms QTimer ticks on the main thread while the real window drives the real worker; the
longest gap between ticks is the longest time the UI could not respond. Target: < 50 ms.

Run: scripts/with-keyring.sh env QT_QPA_PLATFORM=offscreen .venv/bin/python \
         -m galahad_dev.ui_stall [--tokens 4000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

from galahad_desktop.models import catalog
from galahad_desktop.paths import default_model_path
from galahad_desktop.settings import Settings
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.worker import default_bridge, default_core_factory
from galahad_dev.bench import stamp
from galahad_dev.corpus import Corpus
from tests.fakehub import FakeHub


class StallMeter:
    def __init__(self) -> None:
        self.timer = QTimer()
        self.timer.setInterval(5)
        self.timer.timeout.connect(self._tick)
        self.last = time.perf_counter()
        self.worst = 0.0

    def _tick(self) -> None:
        now = time.perf_counter()
        self.worst = max(self.worst, now - self.last)
        self.last = now

    def measure(self, start: Callable[[], None], done: Callable[[], bool]) -> float:
        self.worst = 0.0
        self.last = time.perf_counter()
        self.timer.start()
        start()
        while not done():
            loop = QEventLoop()
            QTimer.singleShot(2, loop.quit)
            loop.exec()
        self.timer.stop()
        return self.worst * 1e3


def all_at_once(
    window: MainWindow, meter: StallMeter, idle: Callable[[], bool], corpus: Corpus, tokens: int
) -> float:
    """A reply streams, a document waits behind it and a model file downloads beside them."""
    model = catalog.model_for("E2B")
    content = default_model_path().read_bytes()
    with FakeHub(model.repo, model.file, content) as hub:
        os.environ["HF_ENDPOINT"] = hub.endpoint
        other = Path(tempfile.mkdtemp()) / "agenda.txt"
        other.write_text("\n".join(corpus.filler(int(tokens * 0.25))))
        window.new_chat()
        window.chat.input.setPlainText("Tell me about the harbour.")

        def start() -> None:
            window.send()
            window.deposit(other)
            window.get_gemma4("E2B")

        worst = meter.measure(start, lambda: idle() and window.downloading is None)
    del os.environ["HF_ENDPOINT"]
    return worst


def fresh_window_data(settings: dict[str, Any]) -> tuple[QApplication, Path]:
    """The application and a new data directory with these settings (a window's first
    start, measured)."""
    app = QApplication(sys.argv)
    data = Path(tempfile.mkdtemp()) / "data"
    data.mkdir(mode=0o700)
    Settings(data).update(settings)
    return app, data


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    app, data = fresh_window_data({"n_ctx": args.tokens + 3072, "max_tokens": 24})
    bridge = default_bridge(data, default_core_factory(data, None))
    window = MainWindow(bridge, data)

    def failed(_title: str, message: str) -> None:  # a modal box would wait forever here
        raise SystemExit(f"ui_stall: {message}")

    window.prompts.warn = failed  # type: ignore[method-assign,assignment]
    window.show()
    meter = StallMeter()
    idle = lambda: bridge.pending() == 0  # noqa: E731
    results = {"startup_ms": meter.measure(lambda: None, idle)}

    doc = Path(tempfile.mkdtemp()) / "minutes.txt"
    corpus = Corpus(7)
    doc.write_text("\n".join(corpus.filler(int(args.tokens * 0.5))))
    results["deposit_ms"] = meter.measure(lambda: window.deposit(doc), idle)

    def chat() -> None:
        window.sidebar.document_list.item(0).setSelected(True)
        window.chat_with_document()

    meter.measure(chat, idle)
    window.chat.input.setPlainText("Summarise the minutes in one line.")
    results["save_turn_ms"] = meter.measure(window.send, idle)
    conversation = window.conversation_id
    window.new_chat()
    # Drop the live state so the resume really grafts from disk.
    bridge.run(lambda core, _job: core.lock())
    meter.measure(lambda: None, idle)
    bridge.run(lambda core, _job: core.unlock())
    meter.measure(lambda: None, idle)
    assert conversation is not None
    results["resume_ms"] = meter.measure(lambda: window.open_conversation(conversation), idle)
    graft = window.graft_label.text()
    # A document added to the open conversation (a chain link), then a routed question.
    extra = Path(tempfile.mkdtemp()) / "appendix.txt"
    extra.write_text("\n".join(corpus.filler(int(args.tokens * 0.2))))
    results["add_document_ms"] = meter.measure(lambda: window.add_to_conversation(extra), idle)
    window.open_ask()
    window.ask_dialog.question.setText("What was sold at the harbour market?")
    results["ask_ms"] = meter.measure(window.ask_dialog.ask, idle)
    window.ask_dialog.close()
    results["reply_read_download_ms"] = all_at_once(window, meter, idle, corpus, args.tokens)
    window.close()
    bridge.stop()
    app.quit()
    out = {
        "longest_stall_ms": results,
        "target_ms": 50,
        "resume_status": graft,
        "tokens": args.tokens,
        "ok": max(results.values()) < 50,
        "stamp": stamp(),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for name, value in results.items():
            print(f"{name:>14}: longest main-thread stall {value:6.1f} ms")
        print(f"resume status: {graft}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
