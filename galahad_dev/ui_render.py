"""How fast a long conversation opens in the window, and how smoothly a reply streams into it.

A 200-message conversation (imported from a ChatGPT export, so it is read and stored once by
the real engine) is opened in the real window with the real worker. Printed:
- open_ms: from the click to the conversation drawn (its blocks grafted from disk and proved
  in the worker, then every turn rendered and painted on the main thread);
- render_ms: the main thread's part of it (200 turns to HTML, laid out and painted);
- stream_stall_ms: the longest main-thread stall while a reply streams into that
  conversation (a 5 ms QTimer's longest gap, as in galahad_dev/ui_stall.py).
Targets: render < 300 ms, stall < 50 ms. Figures, not a timed test: machines are noisy.

Run: scripts/with-keyring.sh env QT_QPA_PLATFORM=offscreen .venv/bin/python \\
         -m galahad_dev.ui_render [--messages 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.ui.chat_view import ChatView, ShownMessage
from galahad_desktop.ui.main_window import MainWindow
from galahad_desktop.ui.worker import CoreBridge, default_core_factory
from galahad_dev.bench import stamp
from galahad_dev.ui_stall import StallMeter, fresh_window_data

RENDER_TARGET_MS = 300.0
STALL_TARGET_MS = 50.0


def chatgpt_export(path: Path, messages: int) -> Path:
    """One conversation of `messages` messages: questions, and answers with Markdown lists,
    a heading now and then and a code block every fifth answer (what replies look like)."""
    mapping: dict[str, dict[str, object]] = {"root": {"message": None, "children": ["m0"]}}
    previous = "root"
    for m in range(messages):
        if m % 2 == 0:
            role, text = "user", f"Question {m // 2 + 1}: how do the towers stand?"
        else:
            role = "assistant"
            text = "They stand well.\n\n- the north tower\n- the gate"
            if m % 10 == 1:
                text += "\n\n```python\nfor tower in towers:\n    print(tower)\n```"
            if m % 20 == 3:
                text = "# Towers\n\n" + text
        mapping[f"m{m}"] = {
            "parent": previous,
            "children": [f"m{m + 1}"] if m < messages - 1 else [],
            "message": {
                "author": {"role": role},
                "content": {"content_type": "text", "parts": [text]},
                "create_time": 1_700_000_000 + m * 60,
            },
        }
        previous = f"m{m}"
    last = f"m{messages - 1}"
    export = [
        {
            "title": "Two hundred messages",
            "create_time": 1_700_000_000,
            "current_node": last,
            "mapping": mapping,
        }
    ]
    path.write_text(json.dumps(export))
    return path


def settle(app: QApplication, until: float) -> None:
    while time.perf_counter() < until:
        loop = QEventLoop()
        QTimer.singleShot(5, loop.quit)
        loop.exec()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    app, data = fresh_window_data({"n_ctx": 16384, "max_tokens": 48, "temperature": 0.0})
    export = chatgpt_export(Path(tempfile.mkdtemp()) / "conversations.json", args.messages)
    core = Galahad(data)
    imported = core.import_conversations(export)
    conversation = imported.conversations[0].conversation_id
    core.close()

    bridge = CoreBridge(default_core_factory(data, None))
    window = MainWindow(bridge, data)
    errors: list[str] = []
    window.prompts.warn = lambda _title, message: errors.append(message)  # type: ignore[method-assign,assignment]
    window.resize(1180, 760)
    window.show()
    idle = lambda: bridge.pending() == 0  # noqa: E731
    meter = StallMeter()
    meter.measure(lambda: None, idle)

    render: list[float] = []
    original = ChatView.set_messages

    def timed(view: ChatView, messages: list[ShownMessage]) -> None:
        start = time.perf_counter()
        original(view, messages)
        view.transcript.viewport().repaint()  # laid out and painted, not just parsed
        render.append((time.perf_counter() - start) * 1e3)

    ChatView.set_messages = timed  # type: ignore[method-assign,assignment]
    opened: list[float] = []
    window.conversation_opened.connect(lambda _o: opened.append(time.perf_counter()))
    start = time.perf_counter()
    window.open_conversation(conversation)
    while not opened:
        if errors:
            raise SystemExit(f"ui_render: {errors[0]}")
        settle(app, time.perf_counter() + 0.005)
    open_ms = (opened[0] - start) * 1e3
    ChatView.set_messages = original  # type: ignore[method-assign]
    graft = window.last_graft
    shown = len(window.chat.messages)
    window.chat.input.setPlainText("And the west tower?")
    stall = meter.measure(window.send, idle)
    window.close()
    bridge.stop()
    out = {
        "messages": shown,
        "open_ms": round(open_ms, 1),
        "render_ms": round(render[0], 1),
        "restore_ms": round(graft.restore_ms, 1) if graft else None,
        "restored_tokens": graft.restored_tokens if graft else 0,
        "proof": graft.proof.verdict if graft else "none",
        "stream_stall_ms": round(stall, 1),
        "render_target_ms": RENDER_TARGET_MS,
        "stall_target_ms": STALL_TARGET_MS,
        "ok": render[0] < RENDER_TARGET_MS and stall < STALL_TARGET_MS,
        "stamp": stamp(),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{shown} messages ({out['restored_tokens']:,} tokens): opened in {open_ms:.0f} ms "
            f"(restore {out['restore_ms']} ms, proof {out['proof']}); rendered on the main "
            f"thread in {render[0]:.0f} ms (target < {RENDER_TARGET_MS:.0f}); longest stall "
            f"while a reply streams: {stall:.1f} ms (target < {STALL_TARGET_MS:.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
