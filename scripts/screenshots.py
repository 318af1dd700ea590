"""Take the README's screenshots from real windows with the real engine, in the light and the
dark theme, at 1x and 2x (HiDPI).

Run: scripts/with-keyring.sh scripts/with-x.sh .venv/bin/python scripts/screenshots.py
(under a real X server and window manager, so dialogs get their frames), or with
QT_QPA_PLATFORM=offscreen. Each theme and scale runs in its own process (the scale factor
must be set before Qt starts) and writes docs/screenshots/<theme>/<name>[@2x].png.
`--theme dark --scale 2` takes one set.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
sys.path.insert(0, str(ROOT))  # galahad_dev (the test corpus) lives beside the package

# An imported conversation (a Markdown transcript): what a reply with a heading, a list and
# code looks like, whatever the embedded demo model would have written.
TRANSCRIPT = """## You

How do I read a file line by line in Python, and count the lines that mention a knight?

## Gemma

# Reading a file line by line

Open the file in a `with` block, so it is closed even if something fails, and iterate
over it — Python reads one line at a time, however large the file is:

```python
count = 0
with open("chronicle.txt", encoding="utf-8") as chronicle:
    for line in chronicle:
        if "knight" in line.lower():
            count += 1
print(count)
```

- `encoding="utf-8"` avoids surprises on systems with another default.
- `line.lower()` makes the match case-insensitive.

## You

And only the first ten matches?

## Gemma

Stop the loop once you have them: keep a list and `break` when it holds ten lines.
"""


PICTURE_TRANSCRIPT = """## You

I will show you the whiteboard from this morning's planning meeting.

## Gemma

Please do: drop the photo here. I will read it once and keep it in this conversation's
memory, so later questions about it cost nothing.
"""


def whiteboard(path: Path) -> Path:
    """A photo-like whiteboard: boxes, arrows and handwriting-sized words."""
    from PIL import Image, ImageDraw, ImageFont

    board = Image.new("RGB", (1280, 860), (246, 246, 240))
    draw = ImageDraw.Draw(board)
    font = ImageFont.load_default(size=38)
    small = ImageFont.load_default(size=28)
    draw.rectangle((60, 60, 1220, 800), outline=(120, 120, 120), width=6)
    draw.text((110, 100), "Q3 launch plan", fill=(30, 60, 150), font=font)
    for i, (label, colour) in enumerate(
        (("Design", (200, 60, 60)), ("Build", (40, 130, 70)), ("Ship", (30, 60, 150)))
    ):
        x = 120 + i * 380
        draw.rounded_rectangle((x, 260, x + 300, 420), 24, outline=colour, width=8)
        draw.text((x + 70, 315), label, fill=colour, font=font)
        if i < 2:
            draw.line((x + 310, 340, x + 370, 340), fill=(60, 60, 60), width=8)
    for j, line in enumerate(("- beta to 40 users by 15 July", "- price page: Kay", "- risks?")):
        draw.text((130, 500 + 70 * j), line, fill=(40, 40, 40), font=small)
    board.save(path)
    return path


def shoot(theme: str, scale: int, only_pictures: bool = False) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

    from galahad_desktop.settings import Settings
    from galahad_desktop.ui.dialogs import AskDialog, MemoryDialog, SecurityDialog
    from galahad_desktop.ui.format import proof_words
    from galahad_desktop.ui.main_window import MainWindow
    from galahad_desktop.ui.settings_dialog import SettingsDialog
    from galahad_desktop.ui.worker import CoreBridge, default_core_factory
    from galahad_dev.corpus import Corpus

    out = OUT / theme
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if scale == 1 else f"@{scale}x"
    app = QApplication(sys.argv)

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
        path = out / f"{name}{suffix}.png"
        widget.grab().save(str(path))
        print("wrote", path.relative_to(ROOT))

    if only_pictures:
        shoot_pictures(theme, shot, wait_until)
        app.quit()
        return 0
    data = Path(tempfile.mkdtemp()) / "data"
    data.mkdir(mode=0o700)
    Settings(data).update({"n_ctx": 8192, "max_tokens": 60})
    bridge = CoreBridge(default_core_factory(data, None))
    window = MainWindow(bridge, data)
    window.prompts.inform = lambda title, message: None  # type: ignore[method-assign]
    window.set_theme(theme)
    window.resize(1180, 760)
    window.show()
    idle = lambda: window.generating is None and bridge.pending() == 0  # noqa: E731
    wait_until(idle)
    wait_until(lambda: window.welcome.offer.isVisible(), 30)
    shot(window, "first-screen")

    # History: an imported conversation, a document read once, a chat of our own.
    transcript = Path(tempfile.mkdtemp()) / "reading-files.md"
    transcript.write_text(TRANSCRIPT)
    window.import_conversations(transcript)
    wait_until(lambda: window.working is None and idle(), 600)
    doc = Path(tempfile.mkdtemp()) / "round-table-minutes.md"
    lines = [
        f"- Day {i}: Sir {['Gawain', 'Percival', 'Bors', 'Kay'][i % 4]} reported "
        f"{i % 9 + 1} sightings near the lake."
        for i in range(120)
    ]
    doc.write_text("# Minutes of the Round Table\n\n" + "\n".join(lines))
    window.deposit(doc)
    bar = window.sidebar.deposit_bar
    wait_until(lambda: 0 < bar.value() < bar.maximum(), 120)
    shot(window, "documents-deposit")
    wait_until(lambda: window.working is None and idle(), 600)
    window.new_chat()
    window.chat.input.setPlainText("Write a short poem about the knights of the round table.")
    pieces: list[str] = []
    bridge.worker.streamed.connect(lambda _r, p: pieces.append(p))
    window.send()
    wait_until(lambda: len(pieces) >= 25)
    shot(window, "chat-streaming")
    wait_until(idle)

    # A new window: the imported conversation resumed from disk, the Memory panel open.
    window.close()
    bridge.stop()
    bridge = CoreBridge(default_core_factory(data, None))
    window = MainWindow(bridge, data)
    window.prompts.inform = lambda title, message: None  # type: ignore[method-assign]
    window.resize(1320, 800)
    window.show()
    wait_until(idle)
    imported = next(c for c in window.sidebar.conversations if "file" in c.title.lower())
    window.memory_dock.setVisible(True)
    window.open_conversation(imported.id)
    wait_until(lambda: "Resumed" in window.graft_label.text() and idle())
    wait_until(lambda: "byte-exact" in window.memory_panel.restore_label.text())
    shot(window, "conversation")

    proof = QMessageBox(
        QMessageBox.Icon.Information,
        "The proof of the last restore",
        proof_words(window.last_graft),
        parent=window,
    )
    proof.show()
    shot(proof, "proof")
    proof.close()

    settings = SettingsDialog(window, window)
    settings.resize(760, 620)
    settings.show()
    wait_until(lambda: "n_batch" in settings.editors)
    settings.tabs.setCurrentIndex(1)  # Performance: plain names, explanations, units
    shot(settings, "settings")
    settings.tabs.setCurrentIndex(2)
    settings.sections["Memory and documents"].advanced_button.setChecked(False)
    shot(settings, "settings-memory")
    settings.close()
    for dialog_type, name in ((SecurityDialog, "security"), (MemoryDialog, "memory")):
        view = dialog_type(window, window)
        view.resize(720, 560)
        view.show()
        wait_until(lambda: bridge.pending() == 0)
        shot(view, name)
        view.close()

    # A question to the library, routed to the document's part that answers it.
    corpus = Corpus(4)
    sections, needles = [], []
    for k in range(8):
        text, planted = corpus.document(800, k, needles=1, decoys=1)
        sections.append(f"## Ledger {k + 1}\n\n{text}")
        needles += planted
    ledger = Path(tempfile.mkdtemp()) / "harbour-ledger.md"
    ledger.write_text("\n\n".join(sections))
    window.deposit(ledger)
    wait_until(lambda: window.working is None and idle(), 900)
    window.open_ask()
    ask = window.ask_dialog
    assert isinstance(ask, AskDialog)
    ask.resize(720, 480)
    ask.show()
    answers: list[object] = []
    ask.answered.connect(answers.append)
    ask.question.setText(f"What is {needles[3].name}'s access code?")
    ask.ask()
    wait_until(lambda: bridge.pending() == 0 and len(answers) == 1)
    shot(ask, "ask-routed")
    ask.close()
    window.close()
    bridge.stop()
    shoot_pictures(theme, shot, wait_until)
    app.quit()
    return 0


def shoot_pictures(theme: str, shot: Callable[..., None], wait_until: Callable[..., None]) -> None:
    """A picture dropped into a conversation, on the Gemma 4 test model with its test
    projector (its replies are noise, so the conversation is an imported one and the view
    shows the picture's card, the model's fixed acknowledgement and the status line)."""
    from galahad_desktop.paths import default_model_path
    from galahad_desktop.settings import Settings
    from galahad_desktop.ui.main_window import MainWindow
    from galahad_desktop.ui.worker import CoreBridge, default_core_factory
    from galahad_dev import gemma4_model, gemma4_projector

    model = gemma4_model.build(default_model_path())
    gemma4_projector.build(out_dir=model.parent)
    data = Path(tempfile.mkdtemp()) / "data"
    data.mkdir(mode=0o700)
    Settings(data).update({"n_ctx": 4096, "max_tokens": 8, "model_path": str(model)})
    bridge = CoreBridge(default_core_factory(data, None))
    window = MainWindow(bridge, data)
    window.prompts.inform = lambda title, message: None  # type: ignore[method-assign]
    window.prompts.choose = lambda title, text, buttons: buttons[0]  # type: ignore[method-assign]
    window.set_theme(theme)
    window.resize(1180, 760)
    window.show()
    idle = lambda: window.generating is None and bridge.pending() == 0  # noqa: E731
    wait_until(idle)
    transcript = Path(tempfile.mkdtemp()) / "planning-meeting.md"
    transcript.write_text(PICTURE_TRANSCRIPT)
    window.import_conversations(transcript)
    wait_until(lambda: window.working is None and idle(), 600)
    conversation = window.sidebar.conversations[0]
    window.open_conversation(conversation.id)
    wait_until(lambda: window.conversation_id == conversation.id and idle())
    window.add_to_conversation(whiteboard(Path(tempfile.mkdtemp()) / "whiteboard.png"))
    wait_until(lambda: idle() and any(m.picture for m in window.chat.messages), 600)
    wait_until(lambda: "Read picture" in window.graft_label.text())
    shot(window, "picture")
    window.close()
    bridge.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--theme", choices=("light", "dark"))
    parser.add_argument("--scale", type=int, choices=(1, 2))
    parser.add_argument("--pictures", action="store_true", help="only the picture view")
    args = parser.parse_args()
    if args.theme and args.scale:
        return shoot(args.theme, args.scale, args.pictures)
    for theme in ("light", "dark"):
        for scale in (1, 2):
            env = {**os.environ, "QT_SCALE_FACTOR": str(scale)}
            command = [sys.executable, __file__, "--theme", theme, "--scale", str(scale)]
            command += ["--pictures"] if args.pictures else []
            if subprocess.run(command, env=env, check=False).returncode != 0:
                print(f"screenshots: the {theme} {scale}x set failed", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
