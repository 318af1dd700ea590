"""Take the README's screenshots from real windows (offscreen), with the real engine.

Run: scripts/with-keyring.sh env QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/screenshots.py
Writes docs/screenshots/*.png.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from galahad_desktop.settings import Settings
from galahad_desktop.ui.dialogs import MemoryDialog, SecurityDialog, SettingsDialog
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.worker import CoreBridge, default_tasks_factory

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"


def wait_until(predicate, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    loop_deadline = timeout_s * 1000
    waited = 0
    while not predicate():
        loop = QEventLoop()
        QTimer.singleShot(20, loop.quit)
        loop.exec()
        waited += 20
        if waited > loop_deadline:
            raise TimeoutError("screenshot step timed out")


def settle(ms: int = 300) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def shot(widget: QWidget, name: str) -> None:
    settle()
    widget.grab().save(str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv)
    data = Path(tempfile.mkdtemp()) / "data"
    data.mkdir(mode=0o700)
    Settings(data).update({"n_ctx": 8192, "max_tokens": 60})

    def new_window() -> MainWindow:
        bridge = CoreBridge(default_tasks_factory(data, None))
        window = MainWindow(bridge, data, show_dialogs=False)
        window.resize(1180, 760)
        window.show()
        wait_until(lambda: bridge.pending() == 0)
        return window

    window = new_window()
    window.input.setPlainText("Write a short poem about the knights of the round table.")
    pieces: list[str] = []
    window.bridge.worker.streamed.connect(lambda _r, p: pieces.append(p))
    window.send()
    wait_until(lambda: len(pieces) >= 25)
    shot(window, "chat-streaming")
    wait_until(lambda: window.generating is None and window.bridge.pending() == 0)
    window.input.setPlainText("Give it a title.")
    window.send()
    wait_until(lambda: window.generating is None and window.bridge.pending() == 0)
    window.close()
    window.bridge.stop()

    window = new_window()
    window.conversation_list.itemClicked.emit(window.conversation_list.item(0))
    wait_until(lambda: "Resumed" in window.graft_label.text())
    shot(window, "resume-status")

    doc = Path(tempfile.mkdtemp()) / "round-table-minutes.md"
    lines = [
        f"- Day {i}: Sir {['Gawain', 'Percival', 'Bors', 'Kay'][i % 4]} reported "
        f"{i % 9 + 1} sightings near the lake."
        for i in range(250)
    ]
    doc.write_text("# Minutes of the Round Table\n\n" + "\n".join(lines))
    window.deposit(doc)
    wait_until(
        lambda: (
            window.deposit_bar.value() > 0
            and window.deposit_bar.maximum() > 0
            and window.deposit_bar.value() < window.deposit_bar.maximum()
        )
    )
    shot(window, "documents-deposit")
    wait_until(lambda: window.depositing is None and window.bridge.pending() == 0)

    # Some history for the Memory view: a verified answer used again, and two resumes.
    window.new_chat()
    window.input.setPlainText("Say a greeting to the knights.")
    window.send()
    wait_until(lambda: window.generating is None and window.bridge.pending() == 0)
    window.mark_verified()
    wait_until(lambda: window.bridge.pending() == 0)
    window.new_chat()
    window.input.setPlainText("Say a greeting to the knights.")
    window.send()
    wait_until(lambda: window.generating is None and window.bridge.pending() == 0)
    for conversation in window.conversations[:2]:
        window.bridge.call("lock")
        window.bridge.call("unlock")
        window.open_conversation(conversation["id"])
        wait_until(lambda: window.bridge.pending() == 0)
    for dialog_type, name in (
        (SettingsDialog, "settings"),
        (SecurityDialog, "security"),
        (MemoryDialog, "memory"),
    ):
        dialog = dialog_type(window)
        dialog.resize(720, 560)
        dialog.show()
        wait_until(lambda: window.bridge.pending() == 0)
        if isinstance(dialog, SecurityDialog):
            dialog.audit()
            wait_until(lambda: window.bridge.pending() == 0)
        shot(dialog, name)
        dialog.close()

    # A document longer than the context: stored in parts, asked through the router.
    from galahad_desktop.bench.corpus import Corpus

    corpus = Corpus(4)
    sections, needles = [], []
    for k in range(8):
        text, planted = corpus.document(800, k, needles=1, decoys=1)
        sections.append(f"## Ledger {k + 1}\n\n{text}")
        needles += planted
    ledger = Path(tempfile.mkdtemp()) / "harbour-ledger.md"
    ledger.write_text("\n\n".join(sections))
    window.deposit(ledger)
    wait_until(lambda: window.depositing is None and window.bridge.pending() == 0, 600)
    window.open_ask()
    ask = window.ask_dialog
    ask.resize(720, 480)
    ask.show()
    ask.question.setText(f"What is {needles[3].name}'s access code?")
    ask.ask()
    wait_until(lambda: window.bridge.pending() == 0 and ask.source.text() != "")
    shot(ask, "ask-routed")
    ask.question.setText(f"What is {corpus.absent_name()}'s access code?")
    ask.ask()
    wait_until(lambda: window.bridge.pending() == 0 and not ask.candidates.isHidden())
    shot(ask, "ask-gated")
    ask.close()
    window.close()
    window.bridge.stop()
    app.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
