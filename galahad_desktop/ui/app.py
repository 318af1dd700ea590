"""Desktop entry point: QApplication, crash handling, the worker and the main window."""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from galahad_desktop.paths import default_data_dir, ensure_private_dir


def setup_logging(data_dir: Path) -> Path:
    """Log to <data dir>/logs/galahad.log (0600). Log records never carry message or document
    text: the code logs ids, counts and exception types only."""
    log_dir = ensure_private_dir(data_dir / "logs")
    path = log_dir / "galahad.log"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # exists 0600 before logging
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=1_000_000, backupCount=2)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("galahad")
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    return path


def log_crash(kind: type[BaseException], tb: TracebackType | None) -> None:
    """Type and stack only: an exception's message or locals can quote private text."""
    stack = "".join(traceback.format_tb(tb, limit=12))
    logging.getLogger("galahad.crash").error("uncaught %s\n%s", kind.__name__, stack)


def install_crash_handler(log_path: Path) -> None:
    """An uncaught exception is logged (type and stack, no values) and shown in a dialog."""

    def handler(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        log_crash(kind, tb)
        from PySide6.QtWidgets import QApplication, QMessageBox

        if QApplication.instance() is not None:
            QMessageBox.critical(
                None,
                "Galahad Desktop hit a bug",
                f"Something unexpected happened ({kind.__name__}). Your stored "
                f"conversations are safe. Details were written to {log_path}.",
            )

    sys.excepthook = handler


@dataclass(frozen=True)
class KeyChoice:
    """What the user chose before the window opens: the OS keyring (no passphrase), a
    passphrase, or to give up (`cancelled`)."""

    passphrase: str | None = None
    cancelled: bool = False


def choose_key_storage(data_dir: Path) -> KeyChoice:
    """How this data directory's key is kept, asking the user where a passphrase is
    needed."""
    from PySide6.QtWidgets import QInputDialog, QLineEdit, QMessageBox

    from galahad_desktop.memory.galahad import Galahad

    def ask(prompt: str) -> str | None:
        text, ok = QInputDialog.getText(
            None, "Galahad Desktop", prompt, QLineEdit.EchoMode.Password
        )
        return text if ok else None

    storage = Galahad.key_storage(data_dir)
    if storage.mode == "passphrase":
        given = ask("Passphrase for your Galahad data:")
        return KeyChoice(given) if given else KeyChoice(cancelled=True)
    if storage.mode == "keyring":
        return KeyChoice()
    if storage.mode == "unavailable":
        answer = QMessageBox.question(
            None,
            "No keyring",
            f"{storage.problem}\n\nProtect your data with a passphrase instead? It is never "
            "stored; without it the data cannot be opened.",
        )
        if answer != QMessageBox.StandardButton.Yes:
            return KeyChoice(cancelled=True)
        first = ask("Choose a passphrase (at least 8 characters):")
        if not first or ask("Type the passphrase again:") != first:
            QMessageBox.warning(None, "Galahad Desktop", "The passphrases did not match.")
            return KeyChoice(cancelled=True)
        return KeyChoice(first)
    return KeyChoice(cancelled=True)


def run_app(
    data_dir: Path | None = None,
    model_path: Path | None = None,
    overrides: dict[str, str] | None = None,
) -> int:
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from galahad_desktop.paths import asset_path
    from galahad_desktop.ui.main_window import MainWindow
    from galahad_desktop.ui.worker import default_bridge, default_core_factory

    os.umask(0o077)  # every file this process creates is private, whoever creates it
    data_dir = ensure_private_dir(Path(data_dir or default_data_dir()))
    log_path = setup_logging(data_dir)
    install_crash_handler(log_path)
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv)
    app.setApplicationName("Galahad Desktop")
    icon = asset_path("galahad.svg")
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))
    choice = choose_key_storage(data_dir)
    if choice.cancelled:
        return 1
    core = default_core_factory(data_dir, model_path, choice.passphrase, overrides)
    bridge = default_bridge(data_dir, core)
    window = MainWindow(bridge, data_dir)
    window.show()
    code = app.exec()
    bridge.stop()
    return int(code)
