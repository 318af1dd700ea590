"""The conversation: the transcript (each turn a card with its actions: copy, regenerate,
edit, branch; code blocks with their language and Copy; a folded "Thinking…" section), the
message box and the turn buttons.

Each turn's HTML is kept until its text changes, so streaming re-renders only the last turn
and opening a long conversation renders each turn once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QMimeData, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QGuiApplication,
    QImage,
    QKeyEvent,
    QKeySequence,
    QResizeEvent,
    QShortcut,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QAbstractButton,
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.ui import theme
from galahad_desktop.ui.memo_player import MemoPlayer, wav_seconds
from galahad_desktop.ui.render import code_blocks, message_html
from galahad_desktop.ui.thumbnails import Thumbnails

INCREMENTAL_TURNS = 3  # at most this many trailing turns are replaced in place


@dataclass
class ShownMessage:
    role: str
    text: str
    thoughts: str = ""
    expanded: bool = False
    created_at: float = 0.0
    picture: bytes | None = None  # a picture put into the conversation (its PNG)
    sound: bytes | None = None  # a voice memo put into the conversation (its WAV)
    version: int = 1  # a reply's version (Regenerate keeps the earlier ones)
    versions: int = 1
    note: str = ""  # how a reply ended, when not at its end ("stopped", "length limit")


class Transcript(QTextBrowser):
    """The transcript's browser: pictures come from memory (galahad-picture:KEY), never
    from a file or the network."""

    def __init__(self, thumbnails: Thumbnails) -> None:
        super().__init__()
        self.thumbnails = thumbnails

    def loadResource(self, kind: int, name: QUrl | str) -> Any:
        url = QUrl(name) if isinstance(name, str) else name
        if url.scheme() == "galahad-picture":
            return self.thumbnails.cached(url.path())
        if kind == QTextDocument.ResourceType.ImageResource.value:
            return None  # no other image is loaded (a reply cannot make the view fetch one)
        return super().loadResource(kind, url)


class MessageBox(QPlainTextEdit):
    """The message box: text as usual; a pasted (or dropped) picture is handed to the
    window as an image, never inserted as text."""

    picture_pasted = Signal(QImage)
    submitted = Signal()  # Enter (or Shift+Enter, when swapped): send the message
    enter_sends = True

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            modifiers = event.modifiers()
            shift = bool(modifiers & Qt.KeyboardModifier.ShiftModifier)
            if not modifiers & Qt.KeyboardModifier.ControlModifier and shift != self.enter_sends:
                if not event.isAutoRepeat():  # a held key sends once
                    self.submitted.emit()
                event.accept()
                return
            if shift:  # a new line either way round
                self.insertPlainText("\n")
                event.accept()
                return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        if source.hasImage():
            image = source.imageData()
            if isinstance(image, QImage) and not image.isNull():
                self.picture_pasted.emit(image)
            return
        super().insertFromMimeData(source)


class ChatView(QWidget):
    copied = Signal(str)  # what was put on the clipboard (for the status line and tests)
    regenerate_requested = Signal()
    edit_requested = Signal(int)  # the index of a user message: edit it into a new branch
    branch_requested = Signal(int)  # the index of a reply: ask its question again, branched
    version_requested = Signal(int, int)  # a reply's index and the version to show
    play_failed = Signal(str)  # why a memo's sound cannot be played (for the status line)

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[ShownMessage] = []
        self.model_name = "Gemma"
        self.focus_index = -1
        self.show_times = False
        self.busy = False
        self._tools_on = False  # the open chat offers tools (set by the window)
        self._html: dict[int, tuple[tuple[object, ...], str]] = {}  # index -> (key, html)
        self._shown: list[str] = []  # each turn's HTML as the document holds it
        self.thumbnails = Thumbnails()
        self.player = MemoPlayer()
        self.player.finished.connect(self._played)
        self.player.failed.connect(self.play_failed)
        self.transcript = Transcript(self.thumbnails)
        self.transcript.setAccessibleName("Conversation")
        self.transcript.setToolTip(
            "The conversation. Ctrl+Up and Ctrl+Down step through messages; Ctrl+Shift+C "
            "copies the one in focus."
        )
        self.transcript.setOpenLinks(False)
        self.transcript.setOpenExternalLinks(False)
        self.transcript.anchorClicked.connect(self._anchor)
        self._build_input()
        self.turn_row = self._build_turn_tools()
        self._lay_out(self.turn_row)

    def _build_input(self) -> None:
        """The message box and its buttons (send, stop, regenerate, edit, verify)."""
        self.input = MessageBox()
        self.input.setPlaceholderText("Message the model (Enter sends, Shift+Enter a new line)")
        self.input.setAccessibleName("Message")
        self.input.setToolTip(
            "Write a message; Enter sends it (Shift+Enter makes a new line; the setting "
            "'enter_sends' swaps them), Escape stops a reply."
        )
        self.input.setTabChangesFocus(True)  # Tab leaves the box: the app works without a mouse
        self.input.setFixedHeight(90)
        self.send_button = QPushButton(theme.icon("send"), "Send")
        theme.set_primary(self.send_button)
        self.stop_button = QPushButton(theme.icon("stop"), "Stop")
        self.stop_button.setEnabled(False)
        self.regenerate_button = QPushButton(theme.icon("regenerate"), "Regenerate")
        self.edit_button = QPushButton(theme.icon("edit"), "Edit your last message")
        self.verify_button = QPushButton(theme.icon("verified"), "Mark verified")
        for button, tip in (
            (self.send_button, "Send the message (Enter, or Ctrl+Enter)"),
            (self.stop_button, "Stop the reply; what was written is kept (Escape)"),
            (self.regenerate_button, "Write the last reply again (Ctrl+R)"),
            (
                self.edit_button,
                "Change your last message here and continue in a new branch (Ctrl+E)",
            ),
            (
                self.verify_button,
                "Store the last answer in the verified library (checkable answers must pass)",
            ),
        ):
            button.setToolTip(tip)
            button.setAccessibleName(button.text().rstrip("…"))
        # The turn's own actions say their names where there is room, and are icons
        # (named for screen readers, explained on hover) in a narrow window.
        self.turn_labels: dict[QAbstractButton, str] = {
            self.regenerate_button: "Regenerate",
            self.edit_button: "Edit",
            self.verify_button: "Verify",
        }
        for named, label in self.turn_labels.items():
            named.setText(label)
            named.setMinimumWidth(36)  # its name must not set the chat's narrowest width

    def _label_turn_buttons(self, width: int) -> None:
        """Names on the turn's buttons when the row has room for them, else icons."""
        for button, label in self.turn_labels.items():
            button.setText(label)
        self.turn_row.invalidate()
        if self.turn_row.sizeHint().width() > width - 2 * theme.SPACE[4]:
            for button in self.turn_labels:
                button.setText("")

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._label_turn_buttons(event.size().width())

    def _build_turn_tools(self) -> QHBoxLayout:
        """The row under the message box: the turn's actions, attach, think, stop, send."""
        self.attach_button = QToolButton()
        self.attach_button.setIcon(theme.icon("document"))
        self.attach_button.setText("Attach")
        self.attach_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.attach_button.setAccessibleName("Attach a document")
        self.attach_button.setToolTip("Add a document: from your library, or a file")
        self.attach_menu = QMenu(self.attach_button)
        self.attach_button.setMenu(self.attach_menu)
        self.attach_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.conversation_button = QToolButton()
        self.conversation_button.setIcon(theme.icon("settings"))
        self.conversation_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.turn_labels[self.conversation_button] = "Chat settings"  # an icon said nothing
        self.conversation_button.setText("Chat settings")
        self.conversation_button.setMinimumWidth(36)
        self.conversation_button.setAccessibleName("This conversation's settings")
        self.conversation_button.setToolTip(
            "This conversation: its system prompt, creativity and longest reply"
        )
        self.tools_button = QToolButton()
        self.tools_button.setText("Tools")
        self.tools_button.setAccessibleName("Tools")
        self.tools_button.setToolTip("The MCP tools a new chat may call (Settings → Tools)")
        self.tools_menu = QMenu(self.tools_button)
        self.tools_button.setMenu(self.tools_menu)
        self.tools_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.thinking_box = QCheckBox("Think first")
        self.thinking_box.setToolTip(
            "Let the model think before answering (Gemma 4). Set when a conversation starts; "
            "the thoughts are shown, never kept."
        )
        self.thinking_box.setAccessibleName("Think first")
        buttons = QHBoxLayout()
        for button in (self.regenerate_button, self.edit_button, self.verify_button):
            buttons.addWidget(button)
        buttons.addWidget(self.attach_button)
        buttons.addWidget(self.conversation_button)
        buttons.addStretch(1)
        buttons.addWidget(self.tools_button)
        buttons.addWidget(self.thinking_box)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        return buttons

    def _lay_out(self, buttons: QHBoxLayout) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(theme.SPACE[4], theme.SPACE[3], theme.SPACE[4], theme.SPACE[3])
        layout.setSpacing(theme.SPACE[2])
        self.documents_label = QLabel()
        self.documents_label.setAccessibleName("Documents in this conversation")
        self.documents_label.setToolTip(
            "What this conversation holds: its documents are part of its memory"
        )
        self.documents_label.setWordWrap(True)
        theme.set_role(self.documents_label, "muted")
        self.documents_label.setVisible(False)
        self.documents: list[str] = []
        layout.addWidget(self.documents_label)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.input)
        # Said under the box when Enter could not send (a reply is being written): the text
        # stays, unsent, and what follows is not joined to it unseen.
        self.input_note = QLabel()
        self.input_note.setAccessibleName("Why the message was not sent")
        self.input_note.setWordWrap(True)
        theme.set_role(self.input_note, "muted")
        self.input_note.setVisible(False)
        self.editing: int | None = None  # the message being edited in the box
        self.draft_before_edit = ""
        layout.addWidget(self.input_note)
        layout.addLayout(buttons)
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(60)
        self._render_timer.timeout.connect(self.redraw)
        for keys, slot in (
            ("Ctrl+Up", lambda: self.move_focus(-1)),
            ("Ctrl+Down", lambda: self.move_focus(1)),
            ("Ctrl+Shift+C", self.copy_focused),
        ):
            QShortcut(QKeySequence(keys), self, slot)
        self.refresh_actions()  # an empty chat: nothing to write again, edit or verify

    def dark(self) -> bool:
        return theme.current().name == "dark"

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.stop_button.setEnabled(busy)
        self.send_button.setEnabled(not busy)
        if not busy and self.input_note.isVisible():
            self.input_note.setText(
                "The reply is done: your message is still here, press Enter to send it."
            )
        self.refresh_actions()

    def note_unsent(self, note: str) -> None:
        """Say under the message box why what is in it was not sent; "" clears it."""
        self.input_note.setText(note)
        self.input_note.setVisible(bool(note))

    def begin_edit(self, index: int) -> None:
        """Edit a message you sent in the message box itself (a dialog did this): its text
        there, what was being written kept aside until the edit is sent or cancelled."""
        if self.editing is None:
            self.draft_before_edit = self.input.toPlainText()
        self.editing = index
        self.input.setPlainText(self.messages[index].text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.input.setFocus()
        number = sum(1 for m in self.messages[: index + 1] if m.role == "user")
        self.note_unsent(
            f"Editing your message {number}: Enter continues from it in a new branch (this "
            "conversation keeps what followed it) · Escape cancels."
        )

    def end_edit(self) -> None:
        """The edit is over (sent, or cancelled): what was being written comes back."""
        if self.editing is None:
            return
        self.editing = None
        self.input.setPlainText(self.draft_before_edit)
        self.draft_before_edit = ""
        self.note_unsent("")

    @property
    def tools_on(self) -> bool:
        return self._tools_on

    @tools_on.setter
    def tools_on(self, on: bool) -> None:
        self._tools_on = on
        self.refresh_actions()

    def refresh_actions(self) -> None:
        """The turn's icon buttons only where they can act (they were enabled on an empty
        chat): a reply to write again or verify, a message to edit; a chat with tools says
        why it has no Regenerate or Edit."""
        replied = any(m.role == "model" and m.text for m in self.messages)
        self.verify_button.setEnabled(not self.busy and replied)
        for button, tip in (
            (self.regenerate_button, "Write the last reply again (Ctrl+R)"),
            (
                self.edit_button,
                "Change your last message here and continue in a new branch (Ctrl+E)",
            ),
        ):
            button.setEnabled(not self.busy and replied and not self.tools_on)
            button.setToolTip(
                "Not in a chat with tools: a reply there ran tools, and writing it again "
                "would run them again. Start a new chat to ask differently."
                if self.tools_on
                else tip
            )

    # -- the transcript ------------------------------------------------------------------
    def set_documents(self, names: list[str]) -> None:
        """The chips above the transcript: the documents this conversation holds."""
        self.documents = list(dict.fromkeys(names))
        self.documents_label.setText("Holds: " + "  ·  ".join(self.documents))
        self.documents_label.setVisible(bool(self.documents))

    def add_document(self, name: str) -> None:
        self.set_documents([*self.documents, name])

    def set_messages(self, messages: list[ShownMessage]) -> None:
        """Show a conversation, opened at its newest message (an edit under way of the one
        shown before is cancelled: its message is not here)."""
        self.end_edit()
        self.messages = messages
        self._html.clear()
        self._shown = []
        self.focus_index = len(messages) - 1
        self.refresh_actions()
        self.redraw()
        self.scroll_to_newest()
        # Again once the cards are laid out (pictures and long cards grow the document).
        QTimer.singleShot(0, self.scroll_to_newest)

    def scroll_to_newest(self) -> None:
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def set_show_times(self, show: bool) -> None:
        self.show_times = show
        self.redraw()

    def actions_of(self, index: int) -> tuple[str, ...]:
        """The links in a turn's header: what can be done with it now."""
        message = self.messages[index]
        if message.role == "user":
            return ("copy",) if self.tools_on else ("copy", "edit")
        if message.role != "model" or not message.text:
            return ()
        if self.tools_on:  # a chat with tools: its turns are not regenerated nor branched
            return ("copy",)
        last = index == len(self.messages) - 1
        if self.busy and last:
            return ()
        return ("copy", "regenerate") if last else ("copy", "branch")

    def turn_html(self, index: int) -> str:
        m = self.messages[index]
        palette = theme.current()
        actions = self.actions_of(index)
        when = m.created_at if self.show_times else 0.0
        picture = None
        if m.picture:
            image = self.thumbnails.image(m.picture)
            picture = (self.thumbnails.key(m.picture), image.width(), image.height())
        memo = None
        if m.sound:
            memo = (wav_seconds(m.sound), self.player.playing == index)
        key = (
            m.role,
            m.text,
            m.thoughts,
            m.expanded,
            palette.name,
            actions,
            when,
            self.model_name,
            picture,
            memo,
            m.version,
            m.versions,
            m.note,
        )
        cached = self._html.get(index)
        if cached is not None and cached[0] == key:
            return cached[1]
        html = message_html(
            m.role,
            m.text,
            palette,
            index,
            m.thoughts,
            m.expanded,
            self.model_name,
            actions,
            when,
            picture,
            (m.version, m.versions),
            m.note,
            memo,
        )
        self._html[index] = (key, html)
        return html

    def append(self, role: str, text: str = "", created_at: float = 0.0) -> None:
        self.messages.append(ShownMessage(role, text, created_at=created_at or time.time()))
        self.refresh_actions()
        self.redraw()

    def stream(self, piece: str, thought: bool = False) -> None:
        if not self.messages:
            return
        if thought:
            self.messages[-1].thoughts += piece
        else:
            self.messages[-1].text += piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def redraw(self) -> None:
        """Show the turns. When only the last few turns changed (a reply streaming in, a turn
        added), only they are replaced in the document: the turns above are neither parsed
        nor laid out again, so a long conversation streams as smoothly as a short one."""
        for stale in [i for i in self._html if i >= len(self.messages)]:
            del self._html[stale]
        turns = [self.turn_html(i) for i in range(len(self.messages))]
        bar = self.transcript.verticalScrollBar()
        following = bar.value() >= bar.maximum() - 8  # the reader is at the newest words
        shown = self._shown
        same = 0
        while same < min(len(shown), len(turns)) and shown[same] is turns[same]:
            same += 1
        document = self.transcript.document()
        frames = document.rootFrame().childFrames()
        if same >= len(turns) - INCREMENTAL_TURNS and len(frames) == len(shown) and same > 0:
            cursor = QTextCursor(document)
            cursor.setPosition(frames[same].firstPosition() - 1 if same < len(frames) else 0)
            if same < len(frames):
                cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
                cursor.removeSelectedText()
            else:
                cursor.movePosition(QTextCursor.MoveOperation.End)
            if same < len(turns):
                cursor.insertHtml("".join(turns[same:]))
        else:
            self.transcript.setHtml("".join(turns))
        self._shown = turns
        if following or not turns:
            bar.setValue(bar.maximum())

    def _anchor(self, url: QUrl) -> None:
        if url.scheme() != "galahad":
            return
        parts = url.path().split("/")
        action, numbers = parts[0], [int(p) for p in parts[1:] if p.isdigit()]
        if not numbers or numbers[0] >= len(self.messages):
            return
        message = self.messages[numbers[0]]
        if action == "copy":
            self.copy(message.text)
        elif action == "regenerate":
            self.regenerate_requested.emit()
        elif action == "edit" and message.role == "user":
            self.edit_requested.emit(numbers[0])
        elif action == "branch" and message.role == "model":
            self.branch_requested.emit(numbers[0])
        elif action == "copy-code" and len(numbers) == 2:
            blocks = code_blocks(message.text)
            if numbers[1] < len(blocks):
                self.copy(blocks[numbers[1]])
        elif action in ("version-previous", "version-next"):
            self.step_version(numbers[0], -1 if action == "version-previous" else 1)
        elif action in ("play", "stop") and message.sound:
            self._play(numbers[0], message.sound if action == "play" else None)
        elif action == "toggle-thoughts":
            message.expanded = not message.expanded
            position = self.transcript.verticalScrollBar().value()
            self.redraw()
            self.transcript.verticalScrollBar().setValue(position)

    def step_version(self, index: int | None, step: int) -> bool:
        """Show the version `step` away (wrapping) of the reply at `index` (None: the last
        reply that has more than one); False when there is none to page."""
        if index is None:
            index = next(
                (i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i].versions > 1),
                -1,
            )
        if not 0 <= index < len(self.messages) or self.messages[index].versions < 2:
            return False
        message = self.messages[index]
        self.version_requested.emit(index, (message.version - 1 + step) % message.versions + 1)
        return True

    def _play(self, index: int, wav: bytes | None) -> None:
        """Play a memo card's sound from memory (never a file), or stop it."""
        problem = self.player.play(index, wav) if wav is not None else self.player.stop()
        if problem:
            self.play_failed.emit(problem)
        self.redraw()  # the card's key holds whether it plays: only it is drawn again

    def _played(self) -> None:
        self.redraw()  # the card that played shows Play again

    def copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)

    # -- keyboard ------------------------------------------------------------------------
    def move_focus(self, delta: int) -> None:
        """Ctrl+Up / Ctrl+Down: step through the messages (Ctrl+Shift+C copies one)."""
        if not self.messages:
            return
        self.focus_index = max(0, min(len(self.messages) - 1, self.focus_index + delta))
        self.transcript.scrollToAnchor(f"m{self.focus_index}")

    def copy_focused(self) -> None:
        if 0 <= self.focus_index < len(self.messages):
            self.copy(self.messages[self.focus_index].text)
