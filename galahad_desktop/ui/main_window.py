"""The main window: the sidebar (search, conversations by date, documents), the first screen
or the chat, the model switcher, and the status line (graft, tokens/s, context).

It never touches the core: every action is a request to the worker (CoreBridge.call) and
every result arrives as a typed value in a callback on the main thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QActionGroup,
    QCloseEvent,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QLabel,
    QMainWindow,
    QProgressBar,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QToolBar,
    QToolButton,
    QWidget,
)

from galahad_desktop.errors import InputError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import (
    ConversationSummary,
    EngineInfo,
    GraftReport,
    ModelFile,
    OpenedConversation,
)
from galahad_desktop.models.catalog import Recommendation
from galahad_desktop.ui import theme
from galahad_desktop.ui.chat_view import ChatView
from galahad_desktop.ui.format import (
    graft_status,
    resume_note,
)
from galahad_desktop.ui.message_keys import TypingToMessageBox
from galahad_desktop.ui.prompts import Prompts
from galahad_desktop.ui.server_panel import ServerHost, ServerPanel
from galahad_desktop.ui.sidebar import Sidebar
from galahad_desktop.ui.welcome import Welcome
from galahad_desktop.ui.wheel import guard_wheel
from galahad_desktop.ui.window_documents import DocumentActions
from galahad_desktop.ui.window_look import LookActions
from galahad_desktop.ui.window_models import ModelActions
from galahad_desktop.ui.window_tools import ToolActions
from galahad_desktop.ui.window_turns import TurnActions, shown_messages
from galahad_desktop.ui.worker import CONVERSATIONS, DOCUMENTS, CoreBridge, Request


def first_size(screen: QSize) -> tuple[int, int]:
    """A first window that fits the screen: most of it, never past it, and not tiny."""
    width = max(min(screen.width(), 900), min(int(screen.width() * 0.8), 1600))
    height = max(min(screen.height(), 600), min(int(screen.height() * 0.85), 1100))
    return width, height


class MainWindow(TurnActions, ToolActions, LookActions, ModelActions, DocumentActions, QMainWindow):
    # Emitted after requests the tests and the stall benchmark wait on.
    opened = Signal(object)  # EngineInfo
    conversation_opened = Signal(object)  # OpenedConversation
    turn_finished = Signal(object)  # TurnResult
    deposit_finished = Signal(object)  # DepositResult
    import_finished = Signal(object)  # ImportResult
    lists_refreshed = Signal()
    models_listed = Signal()
    error_shown = Signal(str)
    verified_added = Signal(object)
    context_full = Signal(object)  # ContextFull

    splitter: QSplitter

    def __init__(self, bridge: CoreBridge, data_dir: Path) -> None:
        super().__init__()
        self.bridge = bridge
        self.server_host = ServerHost(bridge)
        self.data_dir = data_dir
        self.prompts = Prompts(self)  # every modal question goes through it
        self.ui_settings = QSettings(str(data_dir / "ui.ini"), QSettings.Format.IniFormat)
        self.info: EngineInfo | None = None
        self.conversation_id: str | None = None
        self.generating: Request | None = None  # the turn's reply, once it is asked for
        self.turn_cancel: threading.Event | None = None  # the turn under way (all its steps)
        # A new chat's own settings, kept with it from its first message.
        self.new_chat_settings: tuple[str, float | None, int | None] = ("", None, None)
        self.working: Request | None = None  # a deposit or an import
        self.downloading: Request | None = None  # a model file, on the downloads lane
        self.model_files: list[ModelFile] = []
        self.recommendation: Recommendation | None = None
        self.n_ctx = 0  # 0 until the model is open
        self.context_used = 0  # tokens the open conversation's context holds (may pass n_ctx)
        self.reopened = False  # the last conversation is opened once, when the list first comes
        self.focus_on_open = False  # reopened at start: what is typed is the next message
        self.last_graft: GraftReport | None = None  # the last restore's report (its proof)
        self.setWindowTitle("Galahad Desktop")
        self.setAcceptDrops(True)
        self._build()
        self.setup_tools()
        self._actions()
        self._apply_theme()
        geometry = self.ui_settings.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        else:
            self.resize(*first_size(self.screen().availableGeometry().size()))
        splitter_state = self.ui_settings.value("splitter")
        if isinstance(splitter_state, QByteArray):
            self.splitter.restoreState(splitter_state)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(200)
        self._search_timer.timeout.connect(self._search)
        self.settings_saved()
        self.set_status("Loading the model…")
        self.engine_changed()
        self.say_start_notes()
        self.refresh_lists()
        # The first screen opens ready for a message, as peers do (the search box had it).
        self.welcome.message.setFocus()

    # -- layout --------------------------------------------------------------------------
    def _build(self) -> None:
        self._build_sidebar()
        self._build_chat()
        self._build_pages()
        self._build_memory_panel()
        self._build_toolbar()
        self._build_status_bar()

    def _build_sidebar(self) -> None:
        self.sidebar = Sidebar()
        self.sidebar.new_button.clicked.connect(self.new_chat)
        self.sidebar.conversation_chosen.connect(self.open_conversation)
        self.sidebar.rename_requested.connect(self.rename)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.sidebar.forget_requested.connect(self.forget)
        self.sidebar.pin_toggled.connect(self.toggle_pin)
        self.sidebar.storage_action.connect(self.storage_action)
        pinned = self.ui_settings.value("pinned", [])
        self.sidebar.pinned = {str(p) for p in (pinned if isinstance(pinned, list) else [pinned])}
        self.sidebar.search_changed.connect(lambda _t: self._search_timer.start())
        self.sidebar.picture_wanted.connect(self.load_picture_icon)
        self.sidebar.add_document_button.clicked.connect(self.choose_document)
        self.sidebar.chat_document_button.clicked.connect(self.chat_with_document)
        self.sidebar.play_document_button.clicked.connect(self.play_memo)
        self.sidebar.deposit_cancel.clicked.connect(self.cancel_work)

    def _build_chat(self) -> None:
        self.chat = ChatView()
        self.chat.send_button.clicked.connect(self.send)
        self.chat.input.submitted.connect(self.send)
        self.chat.version_requested.connect(self.show_version)
        self.chat.conversation_button.clicked.connect(self.open_conversation_settings)
        self.chat.attach_menu.aboutToShow.connect(
            lambda: self.fill_attach_menu(self.chat.attach_menu)
        )
        self.chat.input.picture_pasted.connect(self.paste_picture)
        self.chat.stop_button.clicked.connect(self.stop)
        self.chat.regenerate_button.clicked.connect(self.regenerate)
        self.chat.edit_button.clicked.connect(self.edit_message)
        self.chat.verify_button.clicked.connect(self.mark_verified)
        self.chat.copied.connect(lambda text: self.set_status(f"Copied {len(text):,} characters"))
        self.chat.play_failed.connect(self.set_status)
        self.chat.player.finished.connect(self._memo_played)
        self.chat.regenerate_requested.connect(self.regenerate)
        self.chat.edit_requested.connect(self.edit_message_at)
        self.chat.branch_requested.connect(self.branch_reply)

    def _build_pages(self) -> None:
        self.welcome = Welcome()
        self.welcome.get_model.connect(self.get_gemma4)
        self.welcome.cancel_download.connect(self.cancel_download)
        self.welcome.choose_documents.connect(self.choose_document)
        self.welcome.start_chat.connect(self.new_chat)
        self.welcome.send_message.connect(self.send_from_welcome)
        self.pages = QStackedWidget()
        self.pages.addWidget(self.welcome)
        self.pages.addWidget(self.chat)
        self.typing = TypingToMessageBox(self, self.chat.input, self.welcome.message)
        app = QApplication.instance()
        if app is not None:
            app.installEventFilter(self.typing)
        self.splitter = QSplitter()
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(self.pages)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([300, 880])
        self.setCentralWidget(self.splitter)

    def _build_toolbar(self) -> None:
        toolbar = QToolBar("Model")
        toolbar.setObjectName("model-toolbar")
        toolbar.setMovable(False)
        model_label = QLabel("Model")
        theme.set_role(model_label, "muted")
        toolbar.addWidget(model_label)
        self.model_switcher = QComboBox()
        guard_wheel(self.model_switcher)
        self.model_switcher.setMinimumWidth(320)
        self.model_switcher.setAccessibleName("Model")
        self.model_switcher.setToolTip(
            "The model in use: the ones on this computer, and Gemma 4 sizes to download "
            "(with their size and whether they fit)"
        )
        model_label.setBuddy(self.model_switcher)
        self.model_switcher.activated.connect(self._model_chosen)
        toolbar.addWidget(self.model_switcher)
        spacer = QWidget()
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        toolbar.addWidget(spacer)
        self.toolbar_buttons: dict[str, QToolButton] = {}
        for name, text, tip, slot in (
            (
                "ask",
                "Ask the library",
                "Ask your documents a question (Ctrl+L)",
                lambda: self.open_ask(),
            ),
            (
                "memory",
                "Memory",
                "Show what is kept, what it saved and the last proof (Ctrl+M)",
                self.toggle_memory_panel,
            ),
            (
                "settings",
                "Settings",
                "Model, performance, memory and answers (Ctrl+,)",
                self.open_settings,
            ),
        ):
            button = QToolButton()
            button.setIcon(theme.icon(name))
            button.setText(text)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            button.setAccessibleName(text)
            button.setToolTip(tip)
            button.clicked.connect(slot)
            toolbar.addWidget(button)
            self.toolbar_buttons[name] = button
        self.addToolBar(toolbar)

    def _build_status_bar(self) -> None:
        self.graft_label = QLabel()
        self.graft_label.setAccessibleName("Status")
        self.proof_button = QToolButton()
        self.proof_button.setText("Proof")
        self.proof_button.setIcon(theme.icon("verified"))
        self.proof_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.proof_button.setAccessibleName("Show the proof of the last restore")
        self.proof_button.setToolTip("What the last restore's check showed, in plain words")
        self.proof_button.clicked.connect(self.show_proof)
        self.speed_label = QLabel()
        self.speed_label.setAccessibleName("Reply speed")
        self.context_meter = QProgressBar()
        self.context_meter.setFixedWidth(200)
        self.set_context(0, 0)
        self.context_meter.setAccessibleName("Context used")
        self.context_meter.setToolTip("Tokens in this conversation's context, of the most it holds")
        self.lane_label = QLabel()
        self.lane_label.setAccessibleName("Running now")
        self.lane_label.setToolTip("What is running and what waits for the model")
        self.lane_label.setVisible(False)
        self.lane_stop = QToolButton()
        self.lane_stop.setIcon(theme.icon("stop"))
        self.lane_stop.setText("Stop")
        self.lane_stop.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.lane_stop.setAccessibleName("Stop what is running")
        self.lane_stop.clicked.connect(self.stop_running)
        self.lane_stop.setVisible(False)
        self.bridge.queue_changed.connect(self.show_lanes)
        self.bridge.changed.connect(self._refresh_changed)
        self.download_bar = QProgressBar()
        self.download_bar.setAccessibleName("Download")
        self.download_bar.setFixedWidth(320)
        self.download_bar.setVisible(False)
        self.download_cancel = QToolButton()
        self.download_cancel.setText("Stop download")
        self.download_cancel.setAccessibleName("Stop the download")
        self.download_cancel.setToolTip("Stop the download; starting it again resumes it")
        self.download_cancel.clicked.connect(self.cancel_download)
        self.download_cancel.setVisible(False)
        bar = self.statusBar()
        bar.addWidget(self.graft_label, 1)
        bar.addPermanentWidget(self.download_bar)
        bar.addPermanentWidget(self.download_cancel)
        bar.addPermanentWidget(self.lane_label)
        bar.addPermanentWidget(self.lane_stop)
        bar.addPermanentWidget(self.proof_button)
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
        action(file_menu, "Import conversations…", self.import_conversations, "Ctrl+I")
        action(file_menu, "Get Gemma 4…", lambda: self.get_gemma4(""))
        action(file_menu, "Settings…", self.open_settings, "Ctrl+,")
        action(file_menu, "Local server…", self.open_server_panel)
        action(file_menu, "Quit", self.close, QKeySequence.StandardKey.Quit)
        chat_menu = self.menuBar().addMenu("&Conversation")
        action(chat_menu, "Send", self.send, "Ctrl+Return")
        action(chat_menu, "Stop", self.stop, "Escape")
        action(chat_menu, "Regenerate last reply", self.regenerate, "Ctrl+R")
        action(
            chat_menu, "Previous version of the reply", lambda: self.page_version(-1), "Alt+Left"
        )
        action(chat_menu, "Next version of the reply", lambda: self.page_version(1), "Alt+Right")
        action(chat_menu, "Edit your last message", self.edit_message, "Ctrl+E")
        action(chat_menu, "Rename…", self.rename_current, "F2")
        action(chat_menu, "Export…", lambda: self.export_conversation(self.conversation_id))
        action(chat_menu, "Search", self.focus_search, "Ctrl+K")
        action(chat_menu, "Previous conversation", lambda: self.step_conversation(-1), "Alt+Up")
        action(chat_menu, "Next conversation", lambda: self.step_conversation(1), "Alt+Down")
        action(chat_menu, "Add a document to this conversation…", self.choose_stacked_document)
        action(chat_menu, "Delete conversation…", self.forget_conversation)
        self.library_action = action(chat_menu, "Use verified answers", self.toggle_library)
        self.library_action.setCheckable(True)
        self.library_action.setChecked(True)
        action(chat_menu, "Delete selected document…", self.forget_document)
        view_menu = self.menuBar().addMenu("&View")
        themes = QActionGroup(self)
        current = str(self.ui_settings.value("theme", "system"))
        for name in theme.THEMES:
            act = action(
                view_menu, f"{name.capitalize()} theme", lambda _c=False, n=name: self.set_theme(n)
            )
            act.setCheckable(True)
            act.setChecked(name == current)
            themes.addAction(act)
        view_menu.addSeparator()
        action(
            view_menu, "Larger text", lambda: self.change_font(1), QKeySequence.StandardKey.ZoomIn
        )
        action(
            view_menu,
            "Smaller text",
            lambda: self.change_font(-1),
            QKeySequence.StandardKey.ZoomOut,
        )
        view_menu.addSeparator()
        action(view_menu, "Switch light / dark", self.toggle_theme, "Ctrl+Shift+T")
        self.times_action = action(
            view_menu, "Show message times", lambda on: self.chat.set_show_times(bool(on))
        )
        self.times_action.setCheckable(True)
        view_menu.addSeparator()
        self.memory_action = action(
            view_menu, "Memory panel", lambda on: self.memory_dock.setVisible(bool(on)), "Ctrl+M"
        )
        self.memory_action.setCheckable(True)
        self.memory_action.setChecked(self.memory_dock.isVisible())
        action(view_menu, "Proof of the last restore…", self.show_proof, "Ctrl+Shift+P")
        action(view_menu, "Security…", self.open_security)
        action(view_menu, "Memory details…", self.open_memory)

    # -- helpers -------------------------------------------------------------------------
    def set_status(self, text: str) -> None:
        self.graft_label.setText(text)

    def show_error(self, message: str, kind: str = "") -> None:
        self.set_status(message.split(". ")[0])
        self.error_shown.emit(message)
        self.prompts.warn("Something went wrong" if kind == "crash" else "Galahad Desktop", message)

    def set_context(self, used: int, n_ctx: int) -> None:
        """The meter says the real count, past the limit too; nothing before the model
        says how much its context holds."""
        self.n_ctx = n_ctx or self.n_ctx
        self.context_used = used
        meter = self.context_meter
        if not self.n_ctx:
            meter.setRange(0, 1)
            meter.setValue(0)
            meter.setFormat("context —")
            return
        meter.setRange(0, self.n_ctx)
        meter.setValue(min(used, self.n_ctx))
        full = " · full" if used >= self.n_ctx else ""
        meter.setFormat(f"context {used:,} / {self.n_ctx:,}{full}")

    def _set_generating(self, request: Request | None) -> None:
        self.generating = request
        self.turn_cancel = request.cancel if request is not None else None
        self.chat.set_busy(request is not None)

    # -- lists and search ----------------------------------------------------------------
    def refresh_lists(self) -> None:
        self.bridge.run(
            lambda core, _job: core.list_conversations(),
            on_done=self._conversations,
            on_error=self._conversations_failed,
        )
        self.bridge.run(
            lambda core, _job: core.list_documents(),
            on_done=self._documents,
            on_error=self.show_error,
        )

    def _refresh_changed(self, changes: frozenset[str]) -> None:
        """An operation finished and said what it changed: the lists showing it refresh."""
        if CONVERSATIONS in changes:
            self.bridge.run(
                lambda core, _job: core.list_conversations(),
                on_done=self._conversations,
                on_error=self.show_error,
            )
        if DOCUMENTS in changes:
            self.bridge.run(
                lambda core, _job: core.list_documents(),
                on_done=self._documents,
                on_error=self.show_error,
            )
        if changes & {CONVERSATIONS, DOCUMENTS}:  # what the disk budget gave back, said once
            self.bridge.run(
                lambda core, _job: core.given_back_since(),
                on_done=lambda done: self.given_back(done, changes),
            )

    def _conversations(self, conversations: list[ConversationSummary]) -> None:
        self.sidebar.current = self.conversation_id
        self.sidebar.set_conversations(conversations)
        self.refresh_memory()
        self.lists_refreshed.emit()
        if not self.reopened:  # the first list after start: back where the person left off
            self.reopened = True
            own = [c for c in conversations if c.origin != "api" and not c.damaged]
            if own and self.conversation_id is None and self.turn_cancel is None:
                self.open_conversation(max(own, key=lambda c: c.updated_at).id)
                self.focus_on_open = not self.sidebar.search.text()

    def _conversations_failed(self, message: str, kind: str = "") -> None:
        listing = self.sidebar.conversation_list
        listing.placeholder = "Conversations could not be listed (see the message)."
        listing.viewport().update()
        self.show_error(message, kind)

    def _documents(self, documents: list[Any]) -> None:
        self.sidebar.set_documents(documents)
        self.lists_refreshed.emit()

    def focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def _search(self) -> None:
        query = self.sidebar.search.text().strip()
        if not query:
            self.sidebar.set_matches(None)
            return
        self.bridge.run(
            lambda core, _job: core.search(query),
            on_done=lambda hits: self.sidebar.show_hits(hits, query),
            on_error=self.show_error,
        )

    def page_version(self, step: int) -> None:
        if not self.chat.step_version(None, step):
            self.set_status("No reply here has other versions (Regenerate makes them).")

    def step_conversation(self, delta: int) -> None:
        target = self.sidebar.step(delta)
        if target is not None:
            self.open_conversation(target)

    # -- conversations -------------------------------------------------------------------
    def new_chat(self) -> None:
        self.conversation_id = None
        self.new_chat_settings = ("", None, None)
        self.sidebar.mark_current(None)  # no row stays highlighted for the chat left
        self.memory_panel.show_conversation(None, None)  # nor its memory shown
        self.set_status("New conversation: its memory is stored after the first reply.")
        self.chat.set_messages([])
        self.chat.set_documents([])
        self.chat.thinking_box.setEnabled(True)
        self.show_new_chat_tools()
        self.pages.setCurrentWidget(self.chat)
        self.set_context(0, self.n_ctx)
        self.speed_label.clear()  # the pace was the last chat's reply, not this one's
        self.chat.note_unsent("")
        self.chat.input.setFocus()

    def open_conversation(self, conversation_id: str) -> None:
        if self.turn_cancel is not None:
            self.set_status("A reply is being written here; Stop it before opening another.")
            return
        self.set_status("Resuming…")
        # The chat being opened shows at once, the one left never lingers: its words come
        # first (quick), then its memory is restored or, given back, read again with
        # progress (seconds). Nothing can be sent until it is open.
        self.chat.set_messages([])
        self.chat.set_documents([])
        self.chat.note_unsent("")
        self.chat.input.setEnabled(False)
        self.pages.setCurrentWidget(self.chat)
        self.bridge.run(
            lambda core, _job: core.messages(conversation_id),
            on_done=lambda messages: self.chat.set_messages(shown_messages(messages)),
            label="Opening the conversation",
        )
        self.bridge.run(
            lambda core, job: core.open_conversation(conversation_id, job),
            on_done=self._conversation_open,
            on_error=self._open_failed,
            on_progress=self._reread_progress,
        )

    def _open_failed(self, message: str, kind: str = "") -> None:
        self.chat.input.setEnabled(True)
        self.show_error(message, kind)

    def _reread_progress(self, done: int, total: int, tps: float, eta: float) -> None:
        eta_text = f" · ETA {eta:.0f} s" if eta != float("inf") else ""
        self.set_status(f"Re-reading {done:,}/{total:,} tokens · {tps:,.0f} tok/s{eta_text}")

    def _conversation_open(self, opened: OpenedConversation) -> None:
        self.conversation_id = opened.summary.id
        self.sidebar.current = self.conversation_id
        self.library_action.setChecked(opened.library_enabled)
        self.chat.set_documents(list(opened.documents))
        self.chat.set_messages(shown_messages(opened.messages))
        self.chat.input.setEnabled(True)
        self.last_graft = opened.graft
        note = resume_note(opened.graft)
        if note:
            self.sidebar.restores[opened.summary.id] = note
        self.chat.thinking_box.setChecked(opened.summary.thinking)
        self.chat.thinking_box.setEnabled(False)
        self.pages.setCurrentWidget(self.chat)
        if self.focus_on_open:  # once the chat page shows (a hidden box takes no focus)
            self.focus_on_open = False
            self.chat.input.setFocus()
        self.set_context(opened.context_tokens, opened.n_ctx)
        status = graft_status(opened.graft)
        if opened.other_model:
            status = f"Made with another model, re-read once under this one · {status}"
        self.set_status(status)
        self.sidebar.fill()
        self.refresh_memory()
        self.conversation_opened.emit(opened)

    def rename_current(self) -> None:
        if self.conversation_id is not None:
            self.sidebar.begin_rename(self.conversation_id)

    def rename(self, conversation_id: str, title: str) -> None:
        self.bridge.run(
            lambda core, _job: core.rename(conversation_id, title),
            on_done=self._renamed,
            on_error=self._rename_failed,
            changes={CONVERSATIONS},
        )

    def _renamed(self, summary: ConversationSummary) -> None:
        self.set_status(f"Renamed to '{summary.title}'")

    def _rename_failed(self, message: str, kind: str) -> None:
        self.show_error(message, kind)
        self.refresh_lists()

    # -- verified answers ----------------------------------------------------------------
    def mark_verified(self) -> None:
        if self.conversation_id is None or self.turn_cancel is not None:
            return
        if not self.prompts.confirm(
            "Mark as verified",
            "Keep the last answer as verified? The same question is then answered with it, "
            "word for word, without asking the model (Memory details lists and removes it).",
        ):
            self.set_status("Not marked as verified.")
            return
        conversation_id = self.conversation_id
        self.bridge.run(
            lambda core, _job: core.mark_verified(conversation_id),
            on_done=self._verified,
            on_error=self.show_error,
        )

    def _verified(self, entry: Any) -> None:
        self.set_status(
            f"Stored as a verified answer ({entry.verifier}: {entry.verdict.get('detail', '')})"
        )
        self.verified_added.emit(entry)

    def toggle_library(self, enabled: bool) -> None:
        if self.conversation_id is not None:
            conversation_id = self.conversation_id
            enabled = bool(enabled)
            self.bridge.run(
                lambda core, _job: core.set_library(conversation_id, enabled),
                on_error=self.show_error,
            )

    # -- forgetting ----------------------------------------------------------------------
    def _confirm(self, text: str) -> bool:
        return self.prompts.confirm("Delete", text)

    def forget(self, item_id: str) -> None:
        if self._confirm(
            "Delete this conversation? Its messages, blocks and keys are deleted "
            "(crypto-shredded); it cannot be undone."
        ):
            self.bridge.run(
                lambda core, _job: core.forget(item_id),
                on_done=self._forgotten,
                on_error=self.show_error,
                changes={CONVERSATIONS, DOCUMENTS},
            )

    def forget_conversation(self) -> None:
        if self.conversation_id is not None and self.turn_cancel is None:
            self.forget(self.conversation_id)

    def forget_document(self) -> None:
        document_id = self.sidebar.selected_document()
        if document_id and self._confirm("Delete this document and the conversations built on it?"):
            self.bridge.run(
                lambda core, _job: core.forget(document_id),
                on_done=self._forgotten,
                on_error=self.show_error,
                changes={CONVERSATIONS, DOCUMENTS},
            )

    def _forgotten(self, result: Any) -> None:
        if self.conversation_id in result.conversations:
            self.new_chat()
        self.set_status(f"Forgot {result.kind} ({result.blocks} blocks deleted)")

    # -- dialogs -------------------------------------------------------------------------
    def settings_saved(self) -> None:
        """Take up the window's own settings (which key sends a message)."""
        try:
            enter_sends = bool(Galahad.stored_settings(self.data_dir).get("enter_sends", True))
        except (InputError, OSError):
            enter_sends = True
        self.chat.input.enter_sends = self.welcome.message.enter_sends = enter_sends

    def open_settings(self) -> None:
        from galahad_desktop.ui.settings_dialog import SettingsDialog

        SettingsDialog(self, self).exec()

    def open_security(self) -> None:
        from galahad_desktop.ui.dialogs import SecurityDialog

        SecurityDialog(self, self).exec()

    def open_memory(self) -> None:
        from galahad_desktop.ui.dialogs import MemoryDialog

        MemoryDialog(self, self).exec()

    # -- closing -------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.server_host.may_quit(self.prompts.confirm):
            event.ignore()
            return
        self.ui_settings.setValue("geometry", self.saveGeometry())
        self.ui_settings.setValue("splitter", self.splitter.saveState())
        self.ui_settings.sync()
        ui_ini = self.data_dir / "ui.ini"
        if ui_ini.exists():  # QSettings creates files with the umask's mode
            ui_ini.chmod(0o600)
        if self.turn_cancel is not None:
            self.turn_cancel.set()
        for request in (self.working, self.downloading):
            if request is not None:
                request.cancel.set()
        self.server_host.stop()
        super().closeEvent(event)

    def open_server_panel(self) -> ServerPanel:
        """File ▸ Local server…: the OpenAI-compatible API, on the window's model lane."""
        panel = ServerPanel(self.server_host, self)
        panel.show()
        return panel
