"""Helpers the tests import: run the `galahad` command as a user would, and a test story."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from galahad_dev.hardening import galahad_command

ROOT = Path(__file__).resolve().parent.parent
# A small context and short replies keep model tests quick; byte-exactness depends on neither
# (the Gemma 4 test model's random weights never end a reply on their own: 256 tokens a turn
# without a cap). A test about long replies sets its own.
TEST_OVERRIDES: dict[str, Any] = {
    "n_ctx": 4096,
    "n_threads": 2,
    "temperature": 0.0,
    "max_tokens": 64,
}


def cli_command(*args: str, data_dir: Path, model: Path | None = None) -> list[str]:
    """The `galahad` command line the tests run (the test context size, greedy replies)."""
    settings = {key: TEST_OVERRIDES[key] for key in ("n_ctx", "max_tokens")} | {"temperature": 0}
    return galahad_command(data_dir, settings, *(["--model", str(model)] if model else []), *args)


def run_cli(
    *args: str,
    data_dir: Path,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
    model: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `galahad` in a new process (a fresh engine), as a user would."""
    full_env = {**os.environ, **(env or {})}
    cmd = cli_command(*args, data_dir=data_dir, model=model)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=full_env, timeout=timeout, input=stdin
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"galahad {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return proc


@contextlib.contextmanager
def media_cores(data: Path, default_model: Path) -> Iterator[Callable[..., Any]]:
    """Cores opened on one data directory under one in-memory keystore (each a new engine,
    as a new process would be), with the test settings and no reranker; closed after."""
    from galahad_desktop.memory.galahad import Galahad
    from galahad_desktop.vault.keys import MemoryKeyStore

    keystore = MemoryKeyStore()
    opened: list[Galahad] = []

    def factory(model: Path | None = None, **overrides: Any) -> Galahad:
        core = Galahad(
            data,
            model_path=model or default_model,
            keystore=keystore,
            overrides={**TEST_OVERRIDES, "rerank": False, **overrides},
        )
        opened.append(core)
        return core

    try:
        yield factory
    finally:
        for core in opened:
            core.close()


def cli_json(*args: str, data_dir: Path, **kw: Any) -> dict[str, Any]:
    proc = run_cli(*args, "--json", data_dir=data_dir, **kw)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {proc.stdout!r}"
    result: dict[str, Any] = json.loads(lines[0])
    return result


def ask_grafts_exactly(
    deposited: dict[str, Any], question: str, data: Path, model: Path, kind: str
) -> None:
    """`galahad ask` on a deposited document restores its whole block, proved exact, and
    `list` names it by its kind."""
    asked = cli_json(
        "ask", deposited["document_id"], question, "--max-tokens", "6", data_dir=data, model=model
    )
    assert asked["proof"] == "exact", asked
    assert asked["recomputed_tokens"] == 0
    assert asked["restored_tokens"] == deposited["tokens"]
    listed = cli_json("list", data_dir=data, model=model)
    assert [d["kind"] for d in listed["documents"]] == [kind]


def resumes_from_its_blocks(
    core: Any, conversation: str, message: str, last: Any, media_tokens: int, params: Any
) -> None:
    """A chat holding two pictures (or a memo's two parts), sent again in a new engine: all
    of it grafted from the blocks and proved exact, the media not read again, and
    Regenerate re-reads nothing."""
    from galahad_desktop.engine.vision import pictures_in

    decoded = core.engine.decoded_tokens
    resumed = core.send(conversation, message, params=params)
    assert resumed.graft is not None and resumed.graft.proof.verdict == "exact"
    assert resumed.counters.recomputed_tokens == 0
    assert resumed.counters.restored_tokens == last.context_tokens - len(core.engine.probe_tokens)
    assert pictures_in(core.engine.tokens) == [0, 1]
    # Only the probe, the message and the reply were decoded.
    assert core.engine.decoded_tokens - decoded < media_tokens
    assert core.regenerate(conversation, params=params).counters.recomputed_tokens == 0


def resumed_in_a_new_engine(core: Any, conversation: str, open_core: Callable[[], Any]) -> Any:
    """Close `core` and resume the conversation in a new one (as a new process would): the
    same ledger, grafted and proved exact, nothing re-read. The new core is returned."""
    ledger = list(core.engine.tokens)
    core.close()
    again = open_core()
    report = again.resume(conversation)
    assert report.proof.verdict == "exact" and report.recomputed_tokens == 0
    assert again.engine.tokens == ledger
    return again


def get_from_fake_hub(
    repo: str, file: str, content: bytes, name: str, data_dir: Path, env: dict[str, str]
) -> dict[str, Any]:
    """`galahad models get NAME --use` from a stand-in hub serving `content` as repo/file."""
    from tests.fakehub import FakeHub

    with FakeHub(repo, file, content) as hub:
        return cli_json(
            "models",
            "get",
            name,
            "--use",
            data_dir=data_dir,
            env={**env, "HF_ENDPOINT": hub.endpoint},
        )


Test = TypeVar("Test", bound=Callable[..., Any])


def on_the_real_keyring(test: Test) -> Test:
    """A model test run on the real OS keyring (Secret Service, the `real_keyring` fixture)."""
    marked: Test = pytest.mark.model(
        pytest.mark.keyring(pytest.mark.usefixtures("real_keyring")(test))
    )
    return marked


def chatted(core: Any, texts: Sequence[str], **send: Any) -> tuple[str, list[Any]]:
    """A new conversation with these messages sent in turn: its id, each turn's result."""
    conversation: str = core.new_conversation()
    return conversation, [core.send(conversation, text, **send) for text in texts]


def story(n_sentences: int, secret: str = "Arthur's access code is 8842.") -> str:
    """A document with a needle in the middle."""
    names = ["Gawain", "Percival", "Bors", "Tristan", "Kay", "Bedivere", "Gareth"]
    lines = [
        f"{names[i % len(names)]} rode {i % 17 + 2} miles to the castle on day {i}."
        for i in range(n_sentences)
    ]
    lines.insert(n_sentences // 2, secret)
    return "\n".join(lines) + "\n"


def photo(path: Path, size: tuple[int, int] = (640, 480), seed: int = 3) -> Path:
    """A PNG of random pixels (a photo's worth of detail for the vision encoder)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def when_a_modal_opens(act: Callable[[Any], None]) -> list[str]:
    """Watch the event loop for a modal dialog (one that `exec()` blocks on), record its title
    and hand it to `act` (which closes it). Returns the titles seen."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    seen: list[str] = []

    def check() -> None:
        dialog = QApplication.activeModalWidget()
        if dialog is None:
            QTimer.singleShot(50, check)
            return
        seen.append(dialog.windowTitle())
        act(dialog)

    QTimer.singleShot(50, check)
    return seen


def dev(
    *args: str,
    tmp_path: Path,
    timeout: float = 900,
    data_dir: Path | None = None,
    model: Path | None = None,
) -> dict[str, Any]:
    """`python -m galahad_dev ...` (the development tools), one JSON object back;
    `data_dir`: where a user's data would be (a benchmark must never touch it)."""
    env = {**os.environ, **({"GALAHAD_DATA_DIR": str(data_dir)} if data_dir else {})}
    head = ["--model", str(model)] if model is not None else []
    proc = subprocess.run(
        [sys.executable, "-m", "galahad_dev", "--json", "--out", str(tmp_path), *head, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def show_window(qtbot: Any, bridge: Any, data_dir: Path, prompts: Any, wait_ms: int) -> Any:
    """The main window on a bridge, its modal questions answered by `prompts`, shown and
    settled (opened, and nothing left waiting in its lanes)."""
    from galahad_desktop.ui.main_window import MainWindow

    window = MainWindow(bridge, data_dir)
    window.prompts = prompts
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.opened, timeout=wait_ms):
        window.show()
    qtbot.waitUntil(lambda: bridge.pending() == 0, timeout=wait_ms)
    return window


@contextlib.contextmanager
def window_opener(qtbot: Any, prompts: Any, wait_ms: int) -> Iterator[Callable[[Any, Path], Any]]:
    """Open windows on bridges (`open(bridge, data_dir)`); every bridge is stopped after."""
    bridges: list[Any] = []

    def open_on(bridge: Any, data_dir: Path) -> Any:
        bridges.append(bridge)
        return show_window(qtbot, bridge, data_dir, prompts, wait_ms)

    try:
        yield open_on
    finally:
        for bridge in bridges:
            bridge.stop()


def convert_audio(source: Path, target: Path, codec: str) -> Path:
    """A recording converted with PyAV (FFmpeg) into `target`'s container and `codec`."""
    import av

    with av.open(str(source)) as reader, av.open(str(target), "w") as sink:
        stream = sink.add_stream(codec, rate=48000 if codec == "libopus" else 22050)
        for frame in reader.decode(audio=0):
            frame.pts = None
            for packet in stream.encode(frame):
                sink.mux(packet)
        for packet in stream.encode(None):
            sink.mux(packet)
    return target
