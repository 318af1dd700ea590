"""The main window: conversations and documents on the left, the chat on the right.

It never touches the core: every action is a request to the worker (CoreBridge.call) and
every result arrives as a callback on the main thread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.ui.render import message_html
from galahad_desktop.ui.worker import CoreBridge, Request


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def keyring_label(backend: str) -> str:
    """'keyring.backends.SecretService.Keyring' -> 'SecretService'."""
    parts = [p for p in backend.split(".") if p not in ("keyring", "backends", "Keyring")]
    return parts[-1] if parts else backend


def ago(timestamp: float) -> str:
    seconds = max(0, time.time() - timestamp)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


class MainWindow(QMainWindow):
    # Emitted after each finished request the tests and the stall benchmark wait on.
    conversation_opened = Signal(dict)
    turn_finished = Signal(dict)
    deposit_finished = Signal(dict)
    lists_refreshed = Signal()
    error_shown = Signal(str)

    def __init__(self, bridge: CoreBridge, data_dir: Path, show_dialogs: bool = True) -> None:
        super().__init__()
        self.bridge = bridge
        self.data_dir = data_dir
        self.show_dialogs = show_dialogs  # tests turn modal dialogs into signals
        self.ui_settings = QSettings(str(data_dir / "ui.ini"), QSettings.Format.IniFormat)
        self.conversation_id: str | None = None
        self.messages: list[dict[str, Any]] = []
        self.generating: Request | None = None
        self.depositing: Request | None = None
        self.documents: list[dict[str, Any]] = []
        self.conversations: list[dict[str, Any]] = []
        self.n_ctx = 0
        self.info: dict[str, Any] = {}
        # No constructor keyword properties anywhere in ui/: PySide6 6.12 over-releases
        # their values (a refcount bug that aborts the interpreter at exit).
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(60)
        self._render_timer.timeout.connect(self.render_transcript)
        self.setWindowTitle("Galahad Desktop")
        self.setAcceptDrops(True)
        self._build()
        self._actions()
        geometry = self.ui_settings.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        else:
            self.resize(1100, 720)
        self.set_status("Loading the model…")
        self.bridge.call("open", on_done=self._opened, on_error=self.show_error)

    # -- layout --------------------------------------------------------------------------
    def _build(self) -> None:
        sidebar = QWidget()
        side = QVBoxLayout(sidebar)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations (Ctrl+F)")
        self.search.textChanged.connect(self._fill_conversations)
        self.new_button = QPushButton("New chat")
        self.new_button.clicked.connect(self.new_chat)
        self.conversation_list = QListWidget()
        self.conversation_list.setWordWrap(True)
        self.conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversation_list.itemActivated.connect(self._conversation_chosen)
        self.conversation_list.itemClicked.connect(self._conversation_chosen)
        self.document_list = QListWidget()
        self.document_list.setWordWrap(True)
        self.document_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.add_document_button = QPushButton("Add document…")
        self.add_document_button.clicked.connect(self.choose_document)
        self.chat_document_button = QPushButton("Chat with this document")
        self.chat_document_button.clicked.connect(self.chat_with_document)
        self.deposit_bar = QProgressBar()
        self.deposit_label = QLabel()
        self.deposit_cancel = QPushButton("Cancel")
        self.deposit_cancel.clicked.connect(self.cancel_deposit)
        for widget in (self.deposit_bar, self.deposit_label, self.deposit_cancel):
            widget.setVisible(False)
        for side_widget in (
            self.search,
            self.new_button,
            QLabel("<b>Conversations</b>"),
            self.conversation_list,
            QLabel("<b>Documents</b>"),
            self.document_list,
            self.add_document_button,
            self.chat_document_button,
            self.deposit_bar,
            self.deposit_label,
            self.deposit_cancel,
        ):
            side.addWidget(side_widget)

        chat = QWidget()
        layout = QVBoxLayout(chat)
        self.transcript = QTextBrowser()
        self.transcript.setOpenLinks(False)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message Gemma (Ctrl+Enter to send)")
        self.input.setFixedHeight(90)
        buttons = QHBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.setEnabled(False)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.clicked.connect(self.regenerate)
        self.edit_button = QPushButton("Edit a message…")
        self.edit_button.clicked.connect(self.edit_message)
        self.verify_button = QPushButton("Mark verified")
        self.verify_button.setToolTip(
            "Store the last answer in the verified library (checkable answers must pass)"
        )
        self.verify_button.clicked.connect(self.mark_verified)
        for button in (self.regenerate_button, self.edit_button, self.verify_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.input)
        layout.addLayout(buttons)

        splitter = QSplitter()
        splitter.addWidget(sidebar)
        splitter.addWidget(chat)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([300, 800])
        self.setCentralWidget(splitter)

        self.graft_label = QLabel()
        self.speed_label = QLabel()
        self.context_meter = QProgressBar()
        self.context_meter.setFormat("context %v / %m")
        self.context_meter.setFixedWidth(240)
        self.context_meter.setValue(0)
        bar = self.statusBar()
        bar.addWidget(self.graft_label, 1)
        bar.addPermanentWidget(self.speed_label)
        bar.addPermanentWidget(self.context_meter)

    def _actions(self) -> None:
        def action(menu: Any, text: str, slot: Any, shortcut: Any = None) -> QAction:
            act = QAction(text, self)
            if shortcut is not None:
                act.setShortcut(QKeySequence(shortcut))
            act.triggered.connect(slot)
            menu.addAction(act)
            return act

        file_menu = self.menuBar().addMenu("&File")
        action(file_menu, "New chat", self.new_chat, QKeySequence.StandardKey.New)
        action(file_menu, "Add document…", self.choose_document, QKeySequence.StandardKey.Open)
        action(file_menu, "Ask the library…", self.open_ask, "Ctrl+L")
        action(file_menu, "Settings…", self.open_settings, "Ctrl+,")
        action(file_menu, "Quit", self.close, QKeySequence.StandardKey.Quit)
        chat_menu = self.menuBar().addMenu("&Conversation")
        action(chat_menu, "Send", self.send, "Ctrl+Return")
        action(chat_menu, "Stop", self.stop, "Escape")
        action(chat_menu, "Regenerate last reply", self.regenerate, "Ctrl+R")
        action(chat_menu, "Edit a message…", self.edit_message, "Ctrl+E")
        action(chat_menu, "Search", lambda: self.search.setFocus(), QKeySequence.StandardKey.Find)
        action(chat_menu, "Add a document to this conversation…", self.choose_stacked_document)
        action(chat_menu, "Forget this conversation…", self.forget_conversation)
        self.library_action = action(chat_menu, "Use verified answers", self.toggle_library)
        self.library_action.setCheckable(True)
        self.library_action.setChecked(True)
        action(chat_menu, "Forget selected document…", self.forget_document)
        view_menu = self.menuBar().addMenu("&View")
        action(view_menu, "Security…", self.open_security)
        action(view_menu, "Memory…", self.open_memory)

    # -- helpers -------------------------------------------------------------------------
    def dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Window).lightness() < 128

    def set_status(self, text: str) -> None:
        self.graft_label.setText(text)

    def show_error(self, message: str, kind: str = "") -> None:
        self.set_status(message.split(".")[0])
        self.error_shown.emit(message)
        if self.show_dialogs:
            title = "Something went wrong" if kind == "crash" else "Galahad Desktop"
            QMessageBox.warning(self, title, message)

    def set_context(self, used: int, n_ctx: int) -> None:
        self.n_ctx = n_ctx or self.n_ctx
        self.context_meter.setMaximum(max(1, self.n_ctx))
        self.context_meter.setValue(min(used, self.n_ctx))

    def _set_generating(self, request: Request | None) -> None:
        self.generating = request
        busy = request is not None
        self.stop_button.setEnabled(busy)
        for widget in (
            self.send_button,
            self.regenerate_button,
            self.edit_button,
            self.verify_button,
        ):
            widget.setEnabled(not busy)

    # -- startup and lists ---------------------------------------------------------------
    def _opened(self, info: dict[str, Any]) -> None:
        self.info = info
        model = info["model"]
        self.n_ctx = info["n_ctx"]
        self.set_context(0, self.n_ctx)
        self.set_status(
            f"{model['name']} · {info['backend']} ({info['gpu_layers']} GPU layers) "
            f"· keys in {keyring_label(info['keyring'])}"
        )
        self.refresh_lists()

    def refresh_lists(self) -> None:
        self.bridge.call("lists", on_done=self._lists, on_error=self.show_error)

    def _lists(self, lists: dict[str, Any]) -> None:
        self.conversations = lists["conversations"]
        self.documents = lists["documents"]
        self._fill_conversations()
        self.document_list.clear()
        for doc in self.documents:
            parts = f" · {doc['n_parts']} parts" if doc.get("n_parts", 1) > 1 else ""
            item = QListWidgetItem(
                f"{doc['name']}\n{doc['n_tokens']:,} tokens{parts} · "
                f"{human_bytes(doc['block_bytes'])} · {doc['status']}"
            )
            item.setData(Qt.ItemDataRole.UserRole, doc["id"])
            self.document_list.addItem(item)
        self.lists_refreshed.emit()

    def _fill_conversations(self) -> None:
        needle = self.search.text().strip().lower()
        self.conversation_list.clear()
        for conv in self.conversations:
            title = conv["title"] or "New conversation"
            if needle and needle not in title.lower():
                continue
            item = QListWidgetItem(
                f"{title}\n{ago(conv['updated_at'])} · {conv['n_tokens']:,} tokens"
            )
            item.setData(Qt.ItemDataRole.UserRole, conv["id"])
            self.conversation_list.addItem(item)
            if conv["id"] == self.conversation_id:
                item.setSelected(True)

    # -- conversations -------------------------------------------------------------------
    def new_chat(self) -> None:
        self.conversation_id = None
        self.messages = []
        self.render_transcript()
        self.set_context(0, self.n_ctx)
        self.input.setFocus()

    def _conversation_chosen(self, item: QListWidgetItem) -> None:
        conversation_id = item.data(Qt.ItemDataRole.UserRole)
        if conversation_id != self.conversation_id or not self.messages:
            self.open_conversation(conversation_id)

    def open_conversation(self, conversation_id: str) -> None:
        if self.generating is not None:
            return
        self.set_status("Resuming…")
        self.bridge.call(
            "open_conversation",
            conversation_id,
            on_done=self._conversation_open,
            on_error=self.show_error,
            on_progress=self._reread_progress,
        )

    def _reread_progress(self, done: int, total: int, tps: float, eta: float) -> None:
        self.set_status(f"Re-reading {done:,}/{total:,} tokens · {tps:,.0f} tok/s")

    def _conversation_open(self, result: dict[str, Any]) -> None:
        self.conversation_id = result["conversation_id"]
        self.bridge.call(
            "library_enabled", self.conversation_id, on_done=self.library_action.setChecked
        )
        self.messages = result["messages"]
        self.render_transcript()
        self.set_context(result["context_tokens"], result["n_ctx"])
        self.set_status(self.graft_status(result["graft"], result["graft_text"]))
        self.conversation_opened.emit(result)

    @staticmethod
    def graft_status(graft: dict[str, Any] | None, text: str | None) -> str:
        if not graft or not text:
            return "Ready"
        if graft.get("fallback_reason"):
            return f"Re-read {graft['tokens']:,} tokens: {graft['fallback_reason']}"
        detail = graft["proof_detail"]
        if graft["proof"] == "exact":
            proof = "byte-exact ✓"
        elif graft["proof"] == "close":
            proof = f"close (max Δ {detail['max_abs_delta']:.0e})"
        else:
            proof = graft["proof"]
        return (
            f"Resumed {graft['restored_tokens']:,} tokens in {graft['restore_ms']:.0f} ms · {proof}"
        )

    def render_transcript(self) -> None:
        dark = self.dark()
        body = "".join(message_html(m["role"], m["text"], dark) for m in self.messages)
        if not self.messages:
            body = (
                "<p style='color:gray'>Start typing, pick a conversation, or drop a "
                "document here.</p>"
            )
        self.transcript.setHtml(body)
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    # -- turns ---------------------------------------------------------------------------
    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.generating is not None:
            return
        if self.conversation_id is None:
            self.bridge.call(
                "new_conversation",
                None,
                on_done=lambda cid: self._send_to(cid, text),
                on_error=self.show_error,
            )
        else:
            self._send_to(self.conversation_id, text)

    def _send_to(self, conversation_id: str, text: str) -> None:
        self.conversation_id = conversation_id
        self.input.clear()
        self.messages.append({"role": "user", "text": text})
        self._start_turn("send", conversation_id, text)

    def _start_turn(self, task: str, *args: Any) -> None:
        self.messages.append({"role": "model", "text": ""})
        self.render_transcript()
        self.set_status("Thinking…")
        request = self.bridge.call(
            task,
            *args,
            on_done=self._turn_done,
            on_error=self._turn_failed,
            on_stream=self._streamed,
            on_progress=self._reread_progress,
        )
        self._set_generating(request)

    def _streamed(self, piece: str) -> None:
        self.messages[-1]["text"] += piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def _turn_done(self, result: dict[str, Any]) -> None:
        self._set_generating(None)
        self.conversation_id = result["conversation_id"]
        self.messages[-1]["text"] = result["reply"]
        self.render_transcript()
        self.set_context(result["context_tokens"], result["n_ctx"])
        self.speed_label.setText(f"{result['tokens_per_s']:.1f} tok/s")
        library = result.get("library") or {}
        if library.get("mode") in ("recurrence", "transfer"):
            proof = "byte-exact ✓" if result["proof"] == "exact" else result["proof"]
            status = f"{library['label']} · {proof}"
        elif result.get("graft_text"):
            status = self.graft_status(_graft_of(result), result["graft_text"])
        else:
            status = "Saved"
        if result["stop_reason"] == "cancelled":
            status = f"Stopped · kept {result['generated_tokens']} tokens · {status}"
        self.set_status(f"{status} · saved in {result['persist_ms']:.0f} ms")
        self.refresh_lists()
        self._compact_after_turn(result["conversation_id"])
        self.turn_finished.emit(result)

    def _turn_failed(self, message: str, kind: str) -> None:
        self._set_generating(None)
        if self.messages and self.messages[-1]["role"] == "model" and not self.messages[-1]["text"]:
            self.messages.pop()
        self.render_transcript()
        self.show_error(message, kind)

    def stop(self) -> None:
        if self.generating is not None:
            self.generating.cancel.set()
            self.set_status("Stopping…")

    def regenerate(self) -> None:
        if self.generating is not None or self.conversation_id is None:
            return
        if not self.messages or self.messages[-1]["role"] != "model":
            return
        self.messages.pop()
        self._start_turn("regenerate", self.conversation_id)

    def edit_message(self) -> None:
        if self.generating is not None or self.conversation_id is None:
            return
        users = [(i, m) for i, m in enumerate(self.messages) if m["role"] == "user"]
        if not users:
            return
        labels = [f"{n + 1}: {m['text'][:60]}" for n, (_i, m) in enumerate(users)]
        choice, ok = QInputDialog.getItem(
            self, "Edit a message", "Message:", labels, len(labels) - 1, False
        )
        if not ok:
            return
        seq, message = users[labels.index(choice)]
        text, ok = QInputDialog.getMultiLineText(
            self, "Edit a message", "Continue from this message in a new branch:", message["text"]
        )
        if ok and text.strip():
            self.start_branch(seq, text.strip())

    def start_branch(self, seq: int, text: str) -> None:
        assert self.conversation_id is not None
        conversation_id = self.conversation_id
        self.messages = [*self.messages[:seq], {"role": "user", "text": text}]
        self._start_turn("branch", conversation_id, seq, text)

    # -- verified answers ----------------------------------------------------------------
    verified_added = Signal(dict)

    def mark_verified(self) -> None:
        if self.conversation_id is None or self.generating is not None:
            return
        self.bridge.call(
            "mark_verified", self.conversation_id, on_done=self._verified, on_error=self.show_error
        )

    def _verified(self, entry: dict[str, Any]) -> None:
        how = entry["verdict"].get("detail", "")
        self.set_status(f"Stored as a verified answer ({entry['verifier']}: {how})")
        self.verified_added.emit(entry)

    def toggle_library(self, enabled: bool) -> None:
        if self.conversation_id is not None:
            self.bridge.call(
                "set_library", self.conversation_id, bool(enabled), on_error=self.show_error
            )

    # -- documents -----------------------------------------------------------------------
    def choose_document(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self,
            "Add documents",
            str(Path.home()),
            "Documents (*.txt *.md *.pdf *.docx *.py *.js *.ts *.c *.h *.cpp *.rs *.go *.java "
            "*.json *.yaml *.toml *.html *.csv);;All files (*)",
        )
        for path in paths:
            self.deposit(Path(path))

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        for url in event.mimeData().urls():
            if url.isLocalFile():
                self.deposit(Path(url.toLocalFile()))

    def deposit(self, path: Path) -> None:
        self.deposit_label.setText(f"Reading {path.name}…")
        self.deposit_bar.setValue(0)
        for widget in (self.deposit_bar, self.deposit_label, self.deposit_cancel):
            widget.setVisible(True)
        self.depositing = self.bridge.call(
            "deposit",
            str(path),
            on_done=self._deposited,
            on_error=self._deposit_failed,
            on_progress=self._deposit_progress,
        )

    def _deposit_progress(self, done: int, total: int, tps: float, eta: float) -> None:
        self.deposit_bar.setMaximum(total)
        self.deposit_bar.setValue(done)
        eta_text = f"{eta:.0f} s" if eta != float("inf") else "…"
        self.deposit_label.setText(f"{done:,}/{total:,} tokens · {tps:,.0f} tok/s · ETA {eta_text}")

    def _deposit_over(self) -> None:
        self.depositing = None
        for widget in (self.deposit_bar, self.deposit_label, self.deposit_cancel):
            widget.setVisible(False)

    def _deposited(self, result: dict[str, Any]) -> None:
        self._deposit_over()
        self.set_status(
            f"Stored '{result['name']}': {result['tokens']:,} tokens read in "
            f"{result['prefill_ms'] / 1e3:.1f} s · {human_bytes(result['block_bytes'])}"
        )
        self.refresh_lists()
        self.deposit_finished.emit(result)

    def _deposit_failed(self, message: str, kind: str) -> None:
        self._deposit_over()
        self.show_error(message, kind)

    def cancel_deposit(self) -> None:
        if self.depositing is not None:
            self.depositing.cancel.set()

    def selected_document(self) -> str | None:
        items = self.document_list.selectedItems()
        if not items and self.document_list.count() == 1:
            items = [self.document_list.item(0)]
        return items[0].data(Qt.ItemDataRole.UserRole) if items else None

    def chat_with_document(self) -> None:
        document_id = self.selected_document()
        if document_id is None:
            self.show_error("Select a document first.")
            return
        doc = next((d for d in self.documents if d["id"] == document_id), None)
        if doc is not None and doc.get("n_parts", 1) > 1:
            # Longer than the context: each question is routed to the part that answers it.
            self.open_ask(document_id)
            return
        self.bridge.call(
            "new_conversation",
            document_id,
            on_done=self.open_conversation,
            on_error=self.show_error,
        )

    def open_ask(self, document_id: str | None = None) -> None:
        from galahad_desktop.ui.dialogs import AskDialog

        name = None
        if isinstance(document_id, str):
            name = next((d["name"] for d in self.documents if d["id"] == document_id), None)
        else:
            document_id = None
        self.ask_dialog = AskDialog(self, document_id, name)
        if self.show_dialogs:
            self.ask_dialog.show()

    def choose_stacked_document(self) -> None:
        if self.conversation_id is None or self.generating is not None:
            self.show_error("Open a conversation first: the document is added to it.")
            return
        path, _ = QFileDialog.getOpenFileName(self, "Add a document to this conversation")
        if path:
            self.add_to_conversation(Path(path))

    def add_to_conversation(self, path: Path) -> None:
        """Read only the new document on top of the conversation (a chain link)."""
        if self.conversation_id is None:
            return
        self.messages.append({"role": "document", "text": path.name})
        self.render_transcript()
        self.set_status(f"Reading {path.name} into this conversation…")
        request = self.bridge.call(
            "add_document",
            self.conversation_id,
            str(path),
            on_done=self._document_added,
            on_error=self._turn_failed,
            on_progress=self._reread_progress,
        )
        self._set_generating(request)

    def _document_added(self, result: dict[str, Any]) -> None:
        self._set_generating(None)
        self.messages = [{"role": m["role"], "text": m["text"]} for m in result["messages"]]
        self.render_transcript()
        self.set_context(result["context_tokens"], result["n_ctx"])
        c = result  # the turn's counters, flattened
        self.set_status(
            f"Added '{result['name']}': read {c['new_tokens']:,} new tokens, restored "
            f"{c['restored_tokens']:,}, re-read {c['recomputed_tokens']:,} · saved in "
            f"{result['persist_ms']:.0f} ms"
        )
        self.refresh_lists()
        self.turn_finished.emit(result)

    def _compact_after_turn(self, conversation_id: str) -> None:
        self.bridge.call(
            "compact_if_needed",
            conversation_id,
            on_done=self._compacted,
            on_error=self.show_error,
        )

    def _compacted(self, result: dict[str, Any] | None) -> None:
        if result and result.get("merged"):
            self.set_status(
                f"Compacted: merged {result['merged']} older turns into one block "
                f"({human_bytes(result['freed_bytes'])} freed)"
            )

    # -- forgetting ----------------------------------------------------------------------
    def _confirm(self, text: str) -> bool:
        if not self.show_dialogs:
            return True
        answer = QMessageBox.question(self, "Forget", text)
        return answer == QMessageBox.StandardButton.Yes

    def forget_conversation(self) -> None:
        if self.conversation_id is None or self.generating is not None:
            return
        if self._confirm("Forget this conversation? Its messages, blocks and keys are deleted."):
            self.bridge.call(
                "forget", self.conversation_id, on_done=self._forgotten, on_error=self.show_error
            )

    def forget_document(self) -> None:
        document_id = self.selected_document()
        if document_id and self._confirm("Forget this document and the conversations built on it?"):
            self.bridge.call(
                "forget", document_id, on_done=self._forgotten, on_error=self.show_error
            )

    def _forgotten(self, result: dict[str, Any]) -> None:
        if self.conversation_id in result["conversations"]:
            self.new_chat()
        self.set_status(f"Forgot {result['kind']} ({result['blocks']} blocks deleted)")
        self.refresh_lists()

    # -- dialogs -------------------------------------------------------------------------
    def open_settings(self) -> None:
        from galahad_desktop.ui.dialogs import SettingsDialog

        SettingsDialog(self).exec()

    def open_security(self) -> None:
        from galahad_desktop.ui.dialogs import SecurityDialog

        SecurityDialog(self).exec()

    def open_memory(self) -> None:
        from galahad_desktop.ui.dialogs import MemoryDialog

        MemoryDialog(self).exec()

    # -- closing -------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        self.ui_settings.setValue("geometry", self.saveGeometry())
        self.ui_settings.sync()
        ui_ini = self.data_dir / "ui.ini"
        if ui_ini.exists():  # QSettings creates files with the umask's mode
            ui_ini.chmod(0o600)
        if self.generating is not None:
            self.generating.cancel.set()
        if self.depositing is not None:
            self.depositing.cancel.set()
        super().closeEvent(event)


def _graft_of(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "restored_tokens": result["restored_tokens"],
        "restore_ms": result["restore_ms"],
        "proof": result["proof"],
        "proof_detail": result["proof_detail"],
        "fallback_reason": result.get("fallback_reason"),
        "tokens": result["restored_tokens"] + result["recomputed_tokens"],
    }
