"""Guards for the UI package's rules."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

UI = Path(__file__).resolve().parent.parent / "galahad_desktop" / "ui"
CORE = UI.parent


def test_no_constructor_keyword_properties_in_ui() -> None:
    """PySide6 6.12 over-releases values passed as constructor keyword properties (e.g.
    QListWidget(wordWrap=True)), which aborts the interpreter later. Use setters."""
    offenders = []
    for path in UI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id.startswith("Q")
                and node.keywords
            ):
                offenders.append(f"{path.name}:{node.lineno} {node.func.id}")
    assert offenders == []


def test_qt_is_imported_only_in_ui() -> None:
    offenders = []
    for path in CORE.rglob("*.py"):
        if UI in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] in ("PySide6", "PyQt5", "PyQt6") for n in names):
                offenders.append(str(path.relative_to(CORE)))
    assert offenders == []


def test_signals_do_not_leak_references_to_bools() -> None:
    """PySide6 6.12.0 decrements True's refcount on every emit of a bool (found here as an
    abort at interpreter exit); the pin in pyproject.toml keeps that release out."""
    import sys

    from PySide6.QtCore import QObject, Signal

    class Emitter(QObject):
        flag = Signal(bool)
        value = Signal(int, object)

    emitter = Emitter()
    emitter.flag.connect(lambda _flag: None)
    emitter.value.connect(lambda _i, _v: None)
    # True is immortal from Python 3.12 on (its count never moves), so the count that can
    # fail is an ordinary object's: delivered 50 times, it must be neither lost nor leaked.
    token = object()
    before = sys.getrefcount(token)
    for _ in range(50):
        emitter.flag.emit(True)
        emitter.value.emit(1, token)
    assert sys.getrefcount(token) - before == 0  # 6.12.0 lost one per delivery


def test_the_window_starts_without_importing_llama_cpp() -> None:
    """Issue #59: importing the window loaded llama.cpp (249 ms before it could show); the
    engine is imported when the worker opens a model, never with the window's modules."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys, galahad_desktop.ui.app, galahad_desktop.ui.main_window; "
        "print(sorted(m for m in sys.modules if m == 'llama_cpp' or m.startswith('llama_cpp.')))"
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_window_honours_set_for_its_run(monkeypatch: Any) -> None:
    """`galahad --set max_tokens=40` started the window with the stored settings: --set was
    accepted and ignored."""
    import galahad_desktop.ui.app as app
    import galahad_desktop.ui.worker as worker
    from galahad_desktop.cli import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr(app, "run_app", lambda **kw: seen.update(kw) or 0)
    assert main(["--set", "max_tokens=40"]) == 0
    assert seen["overrides"] == {"max_tokens": "40"}
    made: dict[str, Any] = {}
    monkeypatch.setattr(worker, "Galahad", lambda *a, **kw: made.update(kw))
    worker.default_core_factory(Path("d"), None, None, {"max_tokens": "40"})()
    assert made["overrides"] == {"max_tokens": "40"}
