"""The window's document side: add and drop documents, ask the library, stack a document
on a conversation, import and export conversations."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from PySide6.QtCore import QBuffer, QIODevice, Qt
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import QFileDialog, QMenu, QWidget

from galahad_desktop.jobs import Job
from galahad_desktop.memory.results import (
    DepositResult,
    DocumentSummary,
    ImportResult,
    Message,
    TurnResult,
)
from galahad_desktop.ui import theme
from galahad_desktop.ui.format import deposit_note, reuse_words
from galahad_desktop.ui.worker import CONVERSATIONS, DOCUMENTS

READ_ANYWAY = "Read it anyway"

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance
    from PySide6.QtWidgets import QStackedWidget

    from galahad_desktop.memory.galahad import Galahad
    from galahad_desktop.ui.chat_view import ChatView
    from galahad_desktop.ui.dialogs import AskDialog
    from galahad_desktop.ui.host import Host
    from galahad_desktop.ui.prompts import Prompts
    from galahad_desktop.ui.sidebar import Sidebar
    from galahad_desktop.ui.worker import CoreBridge, Request

MEMO_DOCUMENT = -1  # what the player plays when it plays a memo document, not a card
DOCUMENT_FILTER = (
    "Documents, pictures and voice memos (*.txt *.md *.pdf *.docx *.py *.js *.ts *.c *.h *.cpp "
    "*.rs *.go *.java *.json *.yaml *.toml *.html *.csv *.png *.jpg *.jpeg *.webp *.gif *.wav "
    "*.mp3 *.m4a *.aac *.ogg *.opus *.flac);;"
    "Pictures (*.png *.jpg *.jpeg *.webp *.gif);;"
    "Voice memos (*.wav *.mp3 *.m4a *.aac *.ogg *.opus *.flac);;All files (*)"
)


class DocumentActions:
    """Mixed into MainWindow: these are the window's own widgets and methods."""

    def _window(self) -> QWidget:
        assert isinstance(self, QWidget)  # mixed into the main window
        return self

    if TYPE_CHECKING:
        bridge: CoreBridge
        chat: ChatView
        sidebar: Sidebar
        pages: QStackedWidget
        ask_dialog: AskDialog
        conversation_id: str | None
        generating: Request | None
        turn_cancel: threading.Event | None
        working: Request | None
        prompts: Prompts
        deposit_finished: SignalInstance
        import_finished: SignalInstance
        turn_finished: SignalInstance
        conversation_opened: SignalInstance

        def set_status(self, text: str) -> None: ...
        def show_error(self, message: str, kind: str = "") -> None: ...
        def set_context(self, used: int, n_ctx: int) -> None: ...
        def refresh_lists(self) -> None: ...
        def open_conversation(self, conversation_id: str) -> None: ...
        def _reread_progress(self, done: int, total: int, tps: float, eta: float) -> None: ...
        def _set_generating(self, request: Request | None) -> None: ...
        def _turn_failed(self, message: str, kind: str) -> None: ...

    # -- documents -----------------------------------------------------------------------
    def choose_document(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self._window(), "Add documents", str(Path.home()), DOCUMENT_FILTER
        )
        for path in paths:
            self.deposit(Path(path))

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = [Path(u.toLocalFile()) for u in event.mimeData().urls() if u.isLocalFile()]
        if not paths:
            return
        if self.conversation_id is not None and self.pages.currentWidget() is self.chat:
            answer = self.prompts.choose(
                "Add a document",
                f"Add {', '.join(p.name for p in paths)} to this conversation (only the new "
                "document is read), or start a new chat on it?",
                ["Add to this conversation", "New chat on it"],
            )
            if answer == "Add to this conversation":
                self.add_to_conversation(paths[0])
                return
            if answer == "New chat on it":
                self.deposit(paths[0], open_chat=True)
            return
        if self.pages.currentWidget() is self.chat:  # a new, empty chat: they go into it
            self.start_chat_on_files(paths)
            return
        for path in paths:
            self.deposit(path)

    def deposit(self, path: Path, open_chat: bool = False, anyway: bool = False) -> None:
        self.sidebar.show_progress(True, f"Reading {path.name}…")

        def failed(message: str, kind: str) -> None:
            # Refused before reading: its memory would not fit. The person decides.
            if kind == "WontFitError":
                self._work_over()
                title = "Not enough room for its memory"
                if self.prompts.choose(title, message, [READ_ANYWAY]) == READ_ANYWAY:
                    self.deposit(path, open_chat, anyway=True)
                return
            self._work_failed(message, kind)

        self.working = self.bridge.run(
            lambda core, job: core.deposit(path, job, anyway=anyway),
            on_done=lambda result: self._deposited(result, open_chat),
            on_error=failed,
            on_progress=self._work_progress,
            label=f"Reading {path.name}",
            changes={DOCUMENTS},
        )

    def _work_progress(self, done: int, total: int, tps: float, eta: float) -> None:
        self.sidebar.deposit_bar.setMaximum(max(1, total))
        self.sidebar.deposit_bar.setValue(done)
        eta_text = f"{eta:.0f} s" if eta != float("inf") else "…"
        self.sidebar.deposit_label.setText(
            f"{done:,}/{total:,} tokens · {tps:,.0f} tok/s · ETA {eta_text}"
        )

    def _work_over(self) -> None:
        self.working = None
        self.sidebar.show_progress(False)

    def _deposited(self, result: DepositResult, open_chat: bool) -> None:
        self._work_over()
        self.set_status(deposit_note(result))
        self.deposit_finished.emit(result)
        if open_chat and result.n_parts == 1:
            document_id = result.document_id
            self.bridge.run(
                lambda core, _job: core.new_conversation(document_id),
                on_done=self.open_conversation,
                on_error=self.show_error,
            )

    def load_picture_icon(self, document_id: str) -> None:
        """A picture document's thumbnail for the Documents list (decrypted by the core,
        decoded here, kept in memory only)."""

        def shown(png: bytes | None) -> None:
            if png:
                self.sidebar.set_picture_icon(document_id, self.chat.thumbnails.icon(png))

        self.bridge.run(
            lambda core, _job: core.document_picture(document_id),
            on_done=shown,
            # The type badge stays; a picture that fails its seal is said on the status line
            # (not in a dialog: the list asks again at every refresh).
            on_error=lambda message, _kind: self.set_status(message.split("; ")[0]),
        )

    def _work_failed(self, message: str, kind: str) -> None:
        self._work_over()
        self.show_error(message, kind)

    def cancel_work(self) -> None:
        if self.working is not None:
            self.working.cancel.set()

    def fill_attach_menu(self, menu: QMenu) -> None:
        """The attach button's menu: a file from this computer, or a library document — a
        new chat grafts its stored block (0 tokens re-read); an open conversation stacks
        it after what it holds (not re-read; its first tokens recomputed, close to a full
        read but not byte-exact)."""
        menu.clear()
        menu.addAction("A file from this computer…", self.attach_file)
        documents = [d for d in self.sidebar.documents if d.n_parts == 1]
        if not documents:
            return
        menu.addSection("From your library")
        held = set(self.chat.documents) if self.conversation_id is not None else set()
        for doc in documents:
            action = menu.addAction(theme.icon("document"), doc.name)
            if self.conversation_id is None:
                action.setToolTip("A new chat on it: its stored memory is grafted, nothing re-read")
                action.triggered.connect(lambda _checked=False, d=doc.id: self.chat_with(d))
            elif doc.kind != "text" or doc.name in held:
                action.setEnabled(False)
                action.setToolTip(
                    "Already in this chat"
                    if doc.name in held
                    else "Pictures and voice memos go into a chat as files, read on top of it"
                )
            else:
                action.setToolTip(
                    "Stacked after what this chat holds: not read again, its first tokens "
                    "recomputed (close to a full read, not byte-exact)"
                )
                action.triggered.connect(lambda _checked=False, d=doc: self.stack_documents([d]))

    def attach_file(self) -> None:
        if self.conversation_id is None:  # a new, empty chat: the files go into it
            paths, _ = QFileDialog.getOpenFileNames(
                self._window(), "Attach to a new chat", str(Path.home()), DOCUMENT_FILTER
            )
            if paths:
                self.start_chat_on_files([Path(p) for p in paths])
            return
        self.choose_stacked_document()

    def chat_with(self, document_id: str) -> None:
        self.bridge.run(
            lambda core, _job: core.new_conversation(document_id),
            on_done=self.open_conversation,
            on_error=self.show_error,
        )

    def start_chat_on_files(self, paths: list[Path]) -> None:
        """Files given to a new, empty chat: each read once and kept in the library, the
        chat started on the first, the others stacked after it (not read a second time)."""
        names = ", ".join(p.name for p in paths)
        self.sidebar.show_progress(True, f"Reading {names}…")

        def start(core: Galahad, job: Job) -> tuple[str, TurnResult | None]:
            first = core.deposit(paths[0], job)
            conversation_id = core.new_conversation(first.document_id)
            turn = None
            for path in paths[1:]:
                core.deposit(path, job)
                turn = core.add_document_file(conversation_id, path, job)
            return conversation_id, turn

        def started(done: tuple[str, TurnResult | None]) -> None:
            self._work_over()
            conversation_id, turn = done
            if turn is not None and turn.stack is not None:
                note = f"Read {len(paths)} files once · {turn.stack.describe()}"
                self.conversation_opened.connect(
                    lambda _opened: self.set_status(note), Qt.ConnectionType.SingleShotConnection
                )
            self.open_conversation(conversation_id)

        self.working = self.bridge.run(
            start,
            on_done=started,
            on_error=self._work_failed,
            on_progress=self._work_progress,
            label=f"Reading {names}",
            changes={DOCUMENTS, CONVERSATIONS},
        )

    def stack_documents(self, documents: list[DocumentSummary]) -> None:
        """Library documents stacked on the open conversation: nothing read again."""
        if self.conversation_id is None or self.turn_cancel is not None:
            self.show_error("Open a conversation first: the documents are stacked on it.")
            return
        conversation_id = self.conversation_id
        for doc in documents:
            self.chat.append("document", doc.name)
        self.set_status(f"Stacking {', '.join(d.name for d in documents)} on this conversation…")
        ids = [d.id for d in documents]
        request = self.bridge.run(
            lambda core, job: core.add_stored_documents(conversation_id, ids, job),
            on_done=lambda result: self._document_added(result, Path(documents[-1].name)),
            on_error=self._stack_failed,
            label="Stacking documents",
            changes={CONVERSATIONS},
        )
        self._set_generating(request)

    def play_memo(self) -> None:
        """Play (or stop) the selected voice memo: its sound decrypted by the core, played
        from memory by the transcript's one player."""
        button = self.sidebar.play_document_button
        if self.chat.player.playing == MEMO_DOCUMENT:
            self.chat.player.stop()
            self._memo_played()
            return
        document_id = self.sidebar.selected_document()
        if document_id is None:
            return

        def loaded(wav: bytes | None) -> None:
            if wav is None:
                self.show_error("That document is not a voice memo.")
                return
            problem = self.chat.player.play(MEMO_DOCUMENT, wav)
            if problem:
                self.set_status(problem)
                return
            button.setText("■ Stop memo")
            button.setAccessibleName("Stop memo")
            self.chat.redraw()  # a memo card that was playing shows Play again

        self.bridge.run(
            lambda core, _job: core.document_memo(document_id),
            on_done=loaded,
            on_error=self.show_error,
        )

    def _memo_played(self) -> None:
        button = self.sidebar.play_document_button
        if self.chat.player.playing != MEMO_DOCUMENT:
            button.setText("▶ Play memo")
            button.setAccessibleName("Play memo")

    def chat_with_document(self) -> None:
        chosen = self.sidebar.selected_documents()
        if not chosen:
            self.show_error("Select a document first.")
            return
        docs = [d for d in self.sidebar.documents if d.id in chosen]
        if len(docs) == 1 and docs[0].n_parts > 1:
            # Longer than the context: each question is routed to the part that answers it.
            self.open_ask(docs[0].id)
            return
        if len(docs) > 1 and any(d.n_parts > 1 or d.kind != "text" for d in docs):
            self.show_error(
                "Several documents go into one chat when each is one text part: ask the "
                "library about long documents, and chat with pictures and memos one at a time."
            )
            return
        first, rest = chosen[0], chosen[1:]

        def start(core: Galahad, job: Job) -> tuple[str, TurnResult | None]:
            conversation_id = core.new_conversation(first)
            turn = core.add_stored_documents(conversation_id, rest, job) if rest else None
            return conversation_id, turn

        def started(done: tuple[str, TurnResult | None]) -> None:
            conversation_id, turn = done
            if turn is not None and turn.stack is not None:
                note = turn.stack.describe()
                self.conversation_opened.connect(
                    lambda _opened: self.set_status(note), Qt.ConnectionType.SingleShotConnection
                )
            self.open_conversation(conversation_id)

        self.bridge.run(start, on_done=started, on_error=self.show_error, changes={CONVERSATIONS})

    def open_ask(self, document_id: str | None = None) -> None:
        from galahad_desktop.ui.dialogs import AskDialog

        name = None
        if isinstance(document_id, str):
            name = next((d.name for d in self.sidebar.documents if d.id == document_id), None)
        else:
            document_id = None
        self.ask_dialog = AskDialog(cast("Host", self), self._window(), document_id, name)
        self.prompts.show(self.ask_dialog)

    def choose_stacked_document(self) -> None:
        if self.conversation_id is None or self.turn_cancel is not None:
            self.show_error("Open a conversation first: the document is added to it.")
            return
        path, _ = QFileDialog.getOpenFileName(
            self._window(), "Add a document to this conversation", str(Path.home()), DOCUMENT_FILTER
        )
        if path:
            self.add_to_conversation(Path(path))

    def add_to_conversation(self, path: Path) -> None:
        """Read only the new document on top of the conversation (a chain link)."""
        if self.conversation_id is None:
            return
        self.chat.append("document", path.name)
        self.set_status(f"Reading {path.name} into this conversation…")
        conversation_id = self.conversation_id
        request = self.bridge.run(
            lambda core, job: core.add_document_file(conversation_id, path, job),
            on_done=lambda result: self._document_added(result, path),
            on_error=self._stack_failed,
            on_progress=self._reread_progress,
            label=f"Reading {path.name}",
            changes={CONVERSATIONS},
        )
        self._set_generating(request)

    def paste_picture(self, image: QImage) -> None:
        """A picture pasted into the message box: encoded to PNG here (in memory, never a
        file), read into the open conversation (a new one when none is open)."""
        if self.turn_cancel is not None:
            self.show_error("Wait for the reply to finish, then paste the picture again.")
            return
        buffer = QBuffer()
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        image.save(buffer, "PNG")  # type: ignore[call-overload]  # PySide6 takes text
        png = bytes(buffer.data().data())
        name = f"pasted-{time.strftime('%Y%m%d-%H%M%S')}.png"
        if self.conversation_id is None:
            self.bridge.run(
                lambda core, _job: core.new_conversation(),
                on_done=lambda cid: self._paste_into(cid, png, name),
                on_error=self.show_error,
            )
            return
        self._paste_into(self.conversation_id, png, name)

    def _paste_into(self, conversation_id: str, png: bytes, name: str) -> None:
        self.conversation_id = conversation_id
        self.sidebar.current = conversation_id
        self.chat.append("document", name)
        self.chat.messages[-1].picture = png
        self.set_status("Reading the pasted picture into this conversation…")
        request = self.bridge.run(
            lambda core, job: core.add_pasted_picture(conversation_id, png, name, job),
            on_done=lambda result: self._document_added(result, Path(name)),
            on_error=self._stack_failed,
            on_progress=self._reread_progress,
            label="Reading the pasted picture",
            changes={CONVERSATIONS},
        )
        self._set_generating(request)

    def _stack_failed(self, message: str, kind: str) -> None:
        """Nothing was added: the document's (or picture's) card goes too."""
        while self.chat.messages and self.chat.messages[-1].role == "document":
            self.chat.messages.pop()
        self._turn_failed(message, kind)

    def _document_added(self, result: TurnResult, path: Path) -> None:
        self._set_generating(None)
        self.chat.append("note", result.reply)  # the app's acknowledgement, not a reply
        stacked = result.stack.documents if result.stack is not None else (path.name,)
        for name in stacked:
            self.chat.add_document(name)
        self.set_context(result.context_tokens, result.n_ctx)
        c = result.counters
        if result.stack is not None:
            self.set_status(f"{result.stack.describe()} · saved in {c.persist_ms:.0f} ms")
        elif result.audio_tokens:
            self.set_status(
                f"Heard voice memo '{path.name}' ({result.audio_tokens:,} audio tokens) in "
                f"{c.prefill_ms / 1e3:.1f} s · stored{reuse_words(c)}"
            )
            self._show_pictures(result.conversation_id)
        elif result.image_tokens:
            self.set_status(
                f"Read picture '{path.name}' ({result.image_tokens:,} tokens) in "
                f"{c.prefill_ms / 1e3:.1f} s · stored{reuse_words(c)}"
            )
            self._show_pictures(result.conversation_id)
        else:
            self.set_status(
                f"Added '{path.name}': read {c.new_tokens:,} new tokens{reuse_words(c)} · "
                f"saved in {c.persist_ms:.0f} ms"
            )
        self.turn_finished.emit(result)

    def _show_pictures(self, conversation_id: str) -> None:
        """Give the transcript's picture and memo cards their pictures and sounds (decrypted
        by the core, kept in memory only)."""

        def shown(messages: list[Message]) -> None:
            if conversation_id != self.conversation_id or len(messages) != len(self.chat.messages):
                return
            for shown_message, message in zip(self.chat.messages, messages, strict=True):
                shown_message.picture = message.picture
                shown_message.sound = message.sound
            self.chat.redraw()

        self.bridge.run(
            lambda core, _job: core.messages(conversation_id),
            on_done=shown,
            on_error=self.show_error,
        )

    # -- import and export ---------------------------------------------------------------
    def import_conversations(self, path: Path | None = None) -> None:
        if path is None or isinstance(path, bool):
            chosen, _ = QFileDialog.getOpenFileName(
                self._window(),
                "Import conversations (ChatGPT, Jan thread.json, LM Studio, Open WebUI, "
                "Markdown, Galahad)",
                str(Path.home()),
                "Chat exports (*.json *.jsonl *.md *.markdown);;All files (*)",
            )
            if not chosen:
                return
            path = Path(chosen)
        self.sidebar.show_progress(True, f"Importing {path.name}…")
        self.working = self.bridge.run(
            lambda core, job: core.import_conversations(path, job),
            on_done=self._imported,
            on_error=self._work_failed,
            on_progress=self._work_progress,
            label=f"Importing {path.name}",
            changes={CONVERSATIONS},
        )

    def _imported(self, result: ImportResult) -> None:
        self._work_over()
        skipped = "".join(f"\n• skipped '{s.title}': {s.reason}" for s in result.skipped)
        summary = (
            f"Imported {len(result.conversations)} conversation(s): {result.tokens:,} tokens "
            f"read at {result.tokens_per_s:,.0f} tok/s"
            + (" (cancelled)" if result.cancelled else "")
        )
        self.set_status(summary)
        if skipped or result.conversations:
            self.prompts.inform("Import", summary + skipped)
        self.import_finished.emit(result)

    def export_conversation(self, conversation_id: str | None) -> None:
        if not conversation_id:
            self.show_error("Open a conversation to export it.")
            return
        out, chosen = self.prompts.save_path(
            "Export conversation (the file is plain text: keep it somewhere private)",
            Path.home() / "conversation.md",
            "Markdown (*.md);;JSON, re-importable (*.json);;HTML (*.html)",
        )
        if out is None:
            return
        fmt = "json" if "JSON" in chosen else "html" if "HTML" in chosen else "md"
        self.bridge.run(
            lambda core, _job: core.export(conversation_id, fmt, out, True),
            on_done=lambda r: self.set_status(
                f"Exported {r.messages} messages to {r.path} (plain text)"
            ),
            on_error=self.show_error,
        )
