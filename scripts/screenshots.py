"""Take the README's screenshots from real windows with the real engine.

Run: scripts/with-keyring.sh scripts/with-x.sh .venv/bin/python scripts/screenshots.py
(under a real X server and window manager, so dialogs get their frames), or with
QT_QPA_PLATFORM=offscreen. Writes docs/screenshots/*.png.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from galahad_desktop.settings import Settings
from galahad_desktop.ui.dialogs import (
    ContextFullDialog,
    MemoryDialog,
    SecurityDialog,
    SettingsDialog,
)
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.worker import CoreBridge, default_core_factory
from galahad_dev.corpus import Corpus

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"


def wait_until(predicate: Callable[[], bool], timeout_s: float = 300.0) -> None:
    waited = 0.0
    while not predicate():
        loop = QEventLoop()
        QTimer.singleShot(20, loop.quit)
        loop.exec()
        waited += 0.02
        if waited > timeout_s:
            raise TimeoutError("screenshot step timed out")


def settle(ms: int = 400) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def shot(widget: QWidget, name: str) -> None:
    settle()
    widget.grab().save(str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")


def idle(window: MainWindow) -> Callable[[], bool]:
    return lambda: window.generating is None and window.bridge.pending() == 0


def chatgpt_export(path: Path, conversations: int) -> Path:
    """A ChatGPT data export (conversations.json) with a few longer conversations."""
    items = []
    for c in range(conversations):
        mapping: dict[str, dict[str, object]] = {"root": {"message": None, "children": ["m0"]}}
        previous = "root"
        for m in range(8):
            role = "user" if m % 2 == 0 else "assistant"
            text = (
                f"Question {m // 2 + 1} about the castle's {['walls', 'towers', 'moat'][c % 3]}?"
                if role == "user"
                else "The chronicles describe it at length. " * 12
            )
            mapping[f"m{m}"] = {
                "parent": previous,
                "children": [f"m{m + 1}"] if m < 7 else [],
                "message": {
                    "author": {"role": role},
                    "content": {"content_type": "text", "parts": [text]},
                    "create_time": 1_760_000_000 + c * 3600 + m * 60,
                },
            }
            previous = f"m{m}"
        items.append(
            {
                "title": f"Castle notes {c + 1}",
                "create_time": 1_760_000_000 + c * 3600,
                "current_node": "m7",
                "mapping": mapping,
            }
        )
    path.write_text(json.dumps(items))
    return path


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    OUT.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv)
    data = Path(tempfile.mkdtemp()) / "data"
    data.mkdir(mode=0o700)
    Settings(data).update({"n_ctx": 8192, "max_tokens": 60})
    bridges: list[CoreBridge] = []

    def new_window() -> MainWindow:
        bridge = CoreBridge(default_core_factory(data, None))
        bridges.append(bridge)
        window = MainWindow(bridge, data, show_dialogs=False)
        window.resize(1180, 760)
        window.show()
        wait_until(lambda: bridge.pending() == 0)
        return window

    window = new_window()
    wait_until(lambda: window.welcome.offer.isVisible(), 30)
    shot(window, "first-screen")

    window.input.setPlainText("Write a short poem about the knights of the round table.")
    pieces: list[str] = []
    window.bridge.worker.streamed.connect(lambda _r, p: pieces.append(p))
    window.send()
    wait_until(lambda: len(pieces) >= 25)
    shot(window, "chat-streaming")
    wait_until(idle(window))
    window.input.setPlainText("Give it a title.")
    window.send()
    wait_until(idle(window))
    window.close()
    window.bridge.stop()

    window = new_window()
    bar = window.sidebar.deposit_bar
    first = window.sidebar.conversations[0].id
    window.open_conversation(first)
    wait_until(lambda: "Resumed" in window.graft_label.text())
    shot(window, "resume-status")

    export = chatgpt_export(Path(tempfile.mkdtemp()) / "conversations.json", 6)
    window.import_conversations(export)
    wait_until(lambda: 0 < bar.value() < bar.maximum())
    shot(window, "import-progress")
    wait_until(lambda: window.working is None and window.bridge.pending() == 0, 600)

    doc = Path(tempfile.mkdtemp()) / "round-table-minutes.md"
    lines = [
        f"- Day {i}: Sir {['Gawain', 'Percival', 'Bors', 'Kay'][i % 4]} reported "
        f"{i % 9 + 1} sightings near the lake."
        for i in range(250)
    ]
    doc.write_text("# Minutes of the Round Table\n\n" + "\n".join(lines))
    window.deposit(doc)
    wait_until(lambda: 0 < bar.value() < bar.maximum())
    shot(window, "documents-deposit")
    wait_until(lambda: window.working is None and window.bridge.pending() == 0, 600)

    # A conversation that no longer fits: the choices, with what each re-reads.
    Settings(data).update({"n_ctx": 512, "max_tokens": 12})
    window.close()
    window.bridge.stop()
    window = new_window()
    window.new_chat()
    for turn in range(10):
        window.input.setPlainText(f"Turn {turn}: tell me about the castle walls and the towers.")
        window.send()
        wait_until(idle(window))
    fulls: list[object] = []
    window.context_full.connect(fulls.append)
    window.input.setPlainText("One more question about the towers " * 40)
    window.send()
    wait_until(lambda: window.bridge.pending() == 0)
    if not fulls:
        raise SystemExit("screenshots: the conversation did not fill its context")
    dialog = ContextFullDialog(fulls[0], window)  # type: ignore[arg-type]
    dialog.resize(640, 380)
    dialog.show()
    shot(dialog, "context-full")
    dialog.close()
    Settings(data).update({"n_ctx": 8192, "max_tokens": 60})
    window.close()
    window.bridge.stop()

    window = new_window()
    # Some history for the Memory view: a verified answer used again, and two resumes.
    window.new_chat()
    window.input.setPlainText("What is 37 * 12 + 5?")
    window.send()
    wait_until(idle(window))
    window.mark_verified()
    wait_until(lambda: window.bridge.pending() == 0)
    for conversation in window.sidebar.conversations[:2]:
        window.open_conversation(conversation.id)
        wait_until(lambda: window.bridge.pending() == 0)
    for dialog_type, name in (
        (SettingsDialog, "settings"),
        (SecurityDialog, "security"),
        (MemoryDialog, "memory"),
    ):
        view = dialog_type(window, window)  # type: ignore[arg-type]
        view.resize(720, 560)
        view.show()
        wait_until(lambda: window.bridge.pending() == 0)
        shot(view, name)
        view.close()

    # A document longer than the context: stored in parts, asked through the router.
    corpus = Corpus(4)
    sections, needles = [], []
    for k in range(8):
        text, planted = corpus.document(800, k, needles=1, decoys=1)
        sections.append(f"## Ledger {k + 1}\n\n{text}")
        needles += planted
    ledger = Path(tempfile.mkdtemp()) / "harbour-ledger.md"
    ledger.write_text("\n\n".join(sections))
    window.deposit(ledger)
    wait_until(lambda: window.working is None and window.bridge.pending() == 0, 900)
    window.open_ask()
    ask = window.ask_dialog
    assert ask is not None
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
    for bridge in bridges:
        bridge.stop()
    app.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
