"""The window's turns: send (once), stop, regenerate and its versions, edit and branch.

A turn is one operation from the moment Send is pressed: the message box is emptied and the
question shown at once, a second Send (a double click, Enter held down, Send while another
operation runs) finds the turn already under way and adds nothing, and every step of the
turn shares one cancel, so Stop ends it wherever it is — waiting behind another operation
(it never runs, and the question goes back into the message box), or streaming (the reply
stops at the next token and what was written is kept, marked as stopped).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from galahad_desktop.jobs import Job
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import (
    ContextFull,
    Continued,
    ConversationSummary,
    EngineInfo,
    Message,
    OpenedConversation,
    TurnResult,
)
from galahad_desktop.ui.chat_view import ShownMessage
from galahad_desktop.ui.format import (
    calls_text,
    message_text,
    message_thoughts,
    shown_roles,
    turn_status,
)
from galahad_desktop.ui.worker import CANCELLED, CONVERSATIONS, MODEL_LANE

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance
    from PySide6.QtWidgets import QLabel, QProgressBar, QStackedWidget, QToolButton

    from galahad_desktop.ui.chat_view import ChatView
    from galahad_desktop.ui.prompts import Prompts
    from galahad_desktop.ui.sidebar import Sidebar
    from galahad_desktop.ui.welcome import Welcome
    from galahad_desktop.ui.worker import CoreBridge, Request

# How a reply ended, when that is not simply its end (shown on its card).
PENDING_CHAT = "pending"  # the sidebar's row for a new chat whose first turn is running
STOP_NOTES = {
    "cancelled": "stopped",
    "length": "cut at the reply length limit",
    "context_full": "stopped: the conversation is full",
    "device_lost": "cut: the device server went away",
    "tool_calls": "called a tool",
}


def shown_messages(messages: list[Message]) -> list[ShownMessage]:
    """A stored transcript as the chat shows it: roles, a turn's words, how each ended."""
    roles = shown_roles(messages)
    return [
        ShownMessage(
            roles[i],
            message_text(m, messages[i - 1] if i else None),
            message_thoughts(m),
            created_at=m.created_at,
            picture=m.picture,
            sound=m.sound,
            version=m.version,
            versions=m.versions,
            note=STOP_NOTES.get(m.stop, ""),
        )
        for i, m in enumerate(messages)
    ]


class TurnActions:
    """Mixed into MainWindow: these are the window's own widgets and methods."""

    if TYPE_CHECKING:
        bridge: CoreBridge
        chat: ChatView
        sidebar: Sidebar
        pages: QStackedWidget
        prompts: Prompts
        conversation_id: str | None
        generating: Request | None
        turn_cancel: threading.Event | None
        new_chat_settings: tuple[str, float | None, int | None]
        new_chat_tools: list[str]
        tool_rounds: int
        n_ctx: int
        context_used: int
        speed_label: QLabel
        lane_label: QLabel
        lane_stop: QToolButton
        context_meter: QProgressBar
        turn_finished: SignalInstance
        context_full: SignalInstance
        info: EngineInfo | None
        welcome: Welcome

        def set_status(self, text: str) -> None: ...
        def show_error(self, message: str, kind: str = "") -> None: ...
        def set_context(self, used: int, n_ctx: int) -> None: ...
        def refresh_lists(self) -> None: ...
        def _reread_progress(self, done: int, total: int, tps: float, eta: float) -> None: ...
        def open_conversation(self, conversation_id: str) -> None: ...
        def new_chat(self) -> None: ...
        def start_calls(self, result: TurnResult) -> None: ...
        def _conversation_open(self, opened: OpenedConversation) -> None: ...

    # -- what runs and what waits ---------------------------------------------------------
    def show_lanes(self) -> None:
        """The status bar's line of operations: the one running, what waits behind it, and
        a download beside them; Stop stops the running one."""
        running = self.bridge.running()
        waiting = self.bridge.waiting()
        parts = []
        if running is not None:
            parts.append(f"{running.label}…" + (" (stopping)" if running.cancel.is_set() else ""))
        if waiting:
            parts.append("waiting: " + ", ".join(r.label for r in waiting))
        downloading = self.bridge.running("downloads") if self.bridge.has_downloads_lane else None
        if downloading is not None:
            parts.append(f"{downloading.label} (beside)")
        self.lane_label.setText(" · ".join(parts))
        self.lane_label.setVisible(bool(parts))
        self.lane_stop.setVisible(running is not None or bool(waiting))
        self.lane_stop.setToolTip(
            f"Stop: {running.label}" if running is not None else "Stop what waits"
        )

    def stop_running(self) -> None:
        """The status bar's Stop: the running operation, else the first waiting one."""
        target = self.bridge.running() or next(iter(self.bridge.waiting(MODEL_LANE)), None)
        if target is not None and target is self.generating:
            self.stop()
        elif target is not None:
            self.bridge.cancel(target)

    # -- sending ---------------------------------------------------------------------------
    def send_from_welcome(self, text: str) -> None:
        """The first screen's message box: a new chat, and the message sent in it."""
        self.new_chat()
        self.chat.input.setPlainText(text)
        self.send()

    def send(self) -> None:
        text = self.chat.input.toPlainText().strip()
        if not text:
            return
        if self.turn_cancel is not None:  # a turn is under way: nothing is sent twice
            self.set_status("A reply is being written; Stop it first, or wait for it.")
            self.chat.note_unsent(
                "Not sent yet: a reply is being written. Your message waits here; press "
                "Enter again when the reply ends, or Stop it."
            )
            return
        if self.chat.editing is not None:  # an edit in the box: a new branch from it
            index = self.chat.editing
            self.chat.end_edit()
            self.start_branch(index, text)
            return
        self.chat.note_unsent("")
        self.turn_cancel = threading.Event()
        self.chat.set_busy(True)
        self.chat.input.clear()
        if self.conversation_id is None:
            thinking = self.chat.thinking_box.isChecked() and self.chat.thinking_box.isVisible()
            self._show_question(text)
            self._show_pending_chat(text)
            # The conversation is made with its first turn (none is left if it fails).
            system, temperature, max_tokens = self.new_chat_settings
            tools = tuple(self.new_chat_tools)
            self.chat.tools_on = bool(tools)
            self._start_turn(
                lambda core, job: core.send(
                    None,
                    text,
                    job,
                    compact=True,
                    thinking=thinking,
                    system_prompt=system or None,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    tools=tools,
                ),
                text,
            )
            return
        conversation_id = self.conversation_id
        self.bridge.run(
            lambda core, _job: core.context_check(conversation_id, text),
            on_done=lambda full: self._checked(conversation_id, text, full),
            on_error=lambda m, k: self._turn_failed(m, k, text),
            label="Checking the context",
            cancel=self.turn_cancel,
        )

    def _show_pending_chat(self, text: str) -> None:
        """The new chat is listed at once (it is stored with its first turn; the list is
        read again when the turn ends, or fails)."""
        title = " ".join(text.split())[:60]
        pending = ConversationSummary(
            PENDING_CHAT,
            title,
            None,
            0,
            1,
            time.time(),
            time.time(),
            preview=title,
            memory="writing the first reply",
        )
        self.sidebar.current = PENDING_CHAT
        self.sidebar.set_conversations(
            [pending, *(c for c in self.sidebar.conversations if c.id != PENDING_CHAT)]
        )

    def _show_question(self, text: str) -> None:
        self.pages.setCurrentWidget(self.chat)
        self.chat.thinking_box.setEnabled(False)
        self.chat.append("user", text, time.time())

    def _checked(self, conversation_id: str, text: str, full: ContextFull | None) -> None:
        if full is None:
            self._send_to(conversation_id, text)
            return
        self.set_status(full.describe())
        self.set_context(full.context_tokens, full.n_ctx)
        self.context_full.emit(full)
        choice = self.prompts.context_full(full)
        if choice == "stop":
            self._end_turn()
            self.chat.input.setPlainText(text)
            self.set_status("Not sent: the conversation is full. Your message is still here.")
            return
        work: Callable[[Galahad, Job], Continued] = (
            (lambda core, job: core.continue_with_summary(conversation_id, job))
            if choice == "summary"
            else (lambda core, job: core.continue_with_recent(conversation_id, text, job))
        )
        self.set_status("Continuing in a new conversation…")
        summary = choice == "summary"
        self.generating = self.bridge.run(
            work,
            on_done=lambda continued: self._continued(continued, text),
            on_error=lambda m, k: self._turn_failed(m, k, text),
            on_progress=self._summary_reading if summary else self._reread_progress,
            label="Continuing in a new conversation",
            cancel=self.turn_cancel,
            on_pace=self._summary_pace if summary else None,
        )

    def _summary_reading(self, done: int, total: int, tps: float, eta: float) -> None:
        eta_text = f" · ETA {eta:.0f} s" if eta != float("inf") else ""
        self.set_status(
            f"Summary: reading the conversation, {done:,}/{total:,} tokens{eta_text}"
            " · Stop to cancel"
        )

    def _summary_pace(self, generated: int, tps: float) -> None:
        self.set_status(
            f"Summary: writing it, {generated:,} tokens so far · {tps:,.1f} tok/s · Stop to cancel"
        )

    def _continued(self, continued: Continued, text: str) -> None:
        self.set_status(
            f"Continued in a new conversation ({continued.kind}); re-read "
            f"{continued.reread_tokens:,} tokens"
        )
        self.conversation_id = continued.conversation_id
        self.set_context(continued.context_tokens, self.n_ctx)
        self.refresh_lists()  # the new conversation is listed and marked, whatever comes next

        def shown(messages: list[Any]) -> None:
            self.chat.set_messages(
                [ShownMessage(m.role, m.text, picture=m.picture, sound=m.sound) for m in messages]
            )
            self._send_to(continued.conversation_id, text)

        conversation_id = continued.conversation_id
        self.bridge.run(
            lambda core, _job: core.messages(conversation_id),
            on_done=shown,
            on_error=lambda m, k: self._turn_failed(m, k, text),
            cancel=self.turn_cancel,
        )

    def _send_to(self, conversation_id: str, text: str) -> None:
        self.conversation_id = conversation_id
        self._show_question(text)
        self._start_turn(
            lambda core, job: core.send(conversation_id, text, job, compact=True), text
        )

    def _start_turn(self, work: Callable[[Galahad, Job], TurnResult], text: str = "") -> None:
        """Run a turn's reply: the card streams, the pace and the context meter move with it,
        and "Thinking…" shows only while thoughts stream."""
        if self.turn_cancel is None:
            self.turn_cancel = threading.Event()
        self.chat.set_busy(True)
        self.chat.append("model")
        self.set_status("Writing the reply…")
        base = self.context_used

        def paced(generated: int, rate: float) -> None:
            self.speed_label.setText(f"{rate:.1f} tok/s")
            self.set_context(base + generated, self.n_ctx)

        def thought(piece: str) -> None:
            self.set_status("Thinking…")
            self.chat.stream(piece, thought=True)

        self.generating = self.bridge.run(
            work,
            on_done=self._turn_done,
            on_error=lambda m, k: self._turn_failed(m, k, text),
            on_stream=self.chat.stream,
            on_thought=thought,
            on_progress=self._reread_progress,
            label="Writing a reply",
            cancel=self.turn_cancel,
            on_pace=paced,
            changes={CONVERSATIONS},
        )

    def _end_turn(self) -> None:
        self.generating = None
        self.turn_cancel = None
        self.chat.set_busy(False)

    def _turn_done(self, result: TurnResult) -> None:
        self._end_turn()
        self.conversation_id = result.conversation_id
        self.sidebar.current = result.conversation_id
        last = self.chat.messages[-1]
        last.text, last.thoughts = result.reply, result.thoughts
        last.note = STOP_NOTES.get(result.stop_reason, "")
        if result.calls:  # the reply called tools: they run (once allowed) and it goes on
            last.text = f"{result.reply}\n\n{calls_text(result.calls)}".strip()
            last.note = STOP_NOTES["tool_calls"]
        last.version = last.versions = result.versions
        self.chat.redraw()
        self.set_context(result.context_tokens, result.n_ctx)
        # Said as the last reply's pace, not a live figure that seems to be still moving.
        self.speed_label.setText(f"last reply {result.tokens_per_s:.1f} tok/s")
        status = turn_status(result)
        if result.compaction is not None and result.compaction.merged:
            status += f" · compacted {result.compaction.merged} older turns"
        self.set_status(status)
        if result.notice:  # the engine was loaded again elsewhere: say where it runs now
            self.bridge.run(
                lambda core, _job: core.info(), on_done=self._engine_moved, on_error=self.show_error
            )
        self.turn_finished.emit(result)
        if result.calls:
            self.chat.tools_on = True
            self.start_calls(result)
        else:
            self.tool_rounds = 0  # the model answered: the next message may call again

    def _engine_moved(self, info: EngineInfo) -> None:
        self.info = info
        self.welcome.show_model(info)

    def _turn_failed(self, message: str, kind: str, text: str = "") -> None:
        """Nothing was stored: the cards go back to what they were and, for a new message,
        its text back into the message box."""
        self._end_turn()
        messages = self.chat.messages
        if messages and messages[-1].role == "model" and not messages[-1].text:
            messages.pop()
        if text and messages and messages[-1].role == "user" and messages[-1].text == text:
            messages.pop()
            if not self.chat.input.toPlainText().strip():
                self.chat.input.setPlainText(text)
        self.chat.redraw()
        if any(c.id == PENDING_CHAT for c in self.sidebar.conversations):
            self.refresh_lists()
        if kind == CANCELLED or kind == "CancelledError":
            self.set_status("Stopped; nothing was stored. Your message is back in the box.")
            return
        self.show_error(message, kind)

    def stop(self) -> None:
        """Stop the turn under way wherever it is (waiting, reading, writing); with none,
        Escape cancels an edit."""
        if self.turn_cancel is None and self.chat.editing is not None:
            self.chat.end_edit()
            self.set_status("The edit was cancelled; the conversation is as it was.")
            return
        if self.turn_cancel is not None:
            self.turn_cancel.set()
            self.set_status("Stopping…")
            self.show_lanes()

    # -- this conversation's own settings ------------------------------------------------
    def open_conversation_settings(self) -> None:
        from galahad_desktop.ui.dialogs import ConversationDialog

        conversation_id = self.conversation_id
        new_chat = self.new_chat_settings

        def read(core: Galahad, _job: Job) -> tuple[str, dict[str, Any], bool, dict[str, Any], int]:
            app = core.sampling()  # the settings over the model's recommendation
            defaults = {"temperature": app.temperature, "max_tokens": app.max_tokens}
            if conversation_id is None:  # a new chat: what was chosen for it so far
                system, temperature, max_tokens = new_chat
                own = {"temperature": temperature, "max_tokens": max_tokens}
                chosen = {k: v for k, v in own.items() if v is not None}
                return system, chosen, False, defaults, 0
            return (
                core.conversation_system_prompt(conversation_id),
                core.conversation_sampling(conversation_id),
                bool(core.messages(conversation_id)),
                defaults,
                core.conversation(conversation_id).n_tokens,  # what a new branch re-reads
            )

        self.bridge.run(
            read,
            on_done=lambda got: self._conversation_dialog(
                ConversationDialog, conversation_id, *got
            ),
            on_error=self.show_error,
        )

    def _conversation_dialog(
        self,
        dialog_type: Any,
        conversation_id: str | None,
        system: str,
        sampling: dict[str, Any],
        started: bool,
        defaults: dict[str, Any],
        context_tokens: int = 0,  # what a new branch under other system words re-reads
    ) -> None:
        dialog = dialog_type(self, system, sampling, started, defaults, context_tokens)
        if not dialog.exec():
            return
        system, temperature, max_tokens = dialog.values()
        if conversation_id is None:
            self.new_chat_settings = (system, temperature, max_tokens)
            self.set_status("Saved for this new chat ✓ (kept with it from its first message)")
            return
        words = dialog.new_branch_words()
        if words is not None:
            self._branch_with_system_prompt(conversation_id, words, temperature, max_tokens)
            return
        self.bridge.run(
            lambda core, _job: core.set_conversation_sampling(
                conversation_id, temperature, max_tokens
            ),
            on_done=lambda _own: self.set_status("This conversation's settings saved ✓"),
            on_error=self.show_error,
            label="Saving this conversation's settings",
        )

    def _branch_with_system_prompt(
        self, conversation_id: str, words: str, temperature: float | None, max_tokens: int | None
    ) -> None:
        """A new branch from the start under other system words; it opens when read."""

        def branch(core: Galahad, job: Job) -> Any:
            made = core.branch_with_system_prompt(conversation_id, words, job)
            core.set_conversation_sampling(made.conversation_id, temperature, max_tokens)
            return made

        def done(made: Any) -> None:
            self.open_conversation(made.conversation_id)
            self.set_status(
                f"A new branch with the new system prompt: {made.reread_tokens:,} tokens read "
                "again; the original conversation is unchanged."
            )

        self.set_status("Reading the conversation again with the new system prompt…")
        self.bridge.run(
            branch,
            on_done=done,
            on_error=self.show_error,
            on_progress=self._reread_progress,
            label="Reading the conversation again with the new system prompt",
            changes={CONVERSATIONS},
        )

    # -- regenerate and versions -------------------------------------------------------------
    def regenerate(self) -> None:
        if self.turn_cancel is not None or self.conversation_id is None or self.chat.tools_on:
            return
        messages = self.chat.messages
        if not messages or messages[-1].role != "model":
            return
        messages.pop()
        conversation_id = self.conversation_id
        self._start_turn(lambda core, job: core.regenerate(conversation_id, job, compact=True))

    def show_version(self, index: int, number: int) -> None:
        """A reply's "‹ 2/3 ›": the last reply's version becomes the one the conversation
        continues from (its own block grafted); an earlier reply's is shown as it was."""
        if self.conversation_id is None or self.turn_cancel is not None:
            return
        conversation_id = self.conversation_id
        if index == len(self.chat.messages) - 1:
            self.set_status(f"Restoring version {number}…")
            self.bridge.run(
                lambda core, job: core.choose_version(conversation_id, number, job),
                on_done=self._conversation_open,
                on_error=self.show_error,
                label="Restoring a version",
                changes={CONVERSATIONS},
            )
            return

        def shown(versions: list[Any]) -> None:
            chosen = versions[number - 1]
            message = self.chat.messages[index]
            message.text, message.thoughts, message.version = (
                chosen.text,
                chosen.thoughts,
                number,
            )
            ended = STOP_NOTES.get(chosen.stop, "")  # "stopped", "cut at …": kept per version
            earlier = "" if chosen.current else "an earlier version (not continued)"
            message.note = " · ".join(n for n in (ended, earlier) if n)
            self.chat.redraw()

        self.bridge.run(
            lambda core, _job: core.reply_versions(conversation_id, index),
            on_done=shown,
            on_error=self.show_error,
        )

    # -- edit and branch -----------------------------------------------------------------------
    def edit_message(self) -> None:
        """Edit (Ctrl+E): your last message, in the message box (each card's Edit link
        picks another)."""
        if self.turn_cancel is not None or self.conversation_id is None:
            return
        users = [i for i, m in enumerate(self.chat.messages) if m.role == "user"]
        if users:
            self.edit_message_at(users[-1])

    def edit_message_at(self, index: int) -> None:
        """A user message's "Edit" link: change it in the message box, and Enter continues
        from it in a new branch."""
        if self.turn_cancel is not None or self.conversation_id is None:
            return
        if self.chat.tools_on:
            self.set_status("A chat with tools is not branched: start a new chat instead.")
            return
        self.chat.begin_edit(index)

    def branch_reply(self, index: int) -> None:
        """An earlier reply's "Branch" link: ask its question again in a new branch."""
        if self.turn_cancel is not None or self.conversation_id is None or index < 1:
            return
        question = self.chat.messages[index - 1]
        if question.role == "user":
            self.start_branch(index - 1, question.text)

    def start_branch(self, seq: int, text: str) -> None:
        assert self.conversation_id is not None
        if self.chat.tools_on:
            self.set_status("A chat with tools is not branched: start a new chat instead.")
            return
        conversation_id = self.conversation_id
        self.chat.set_messages([*self.chat.messages[:seq], ShownMessage("user", text)])
        self._start_turn(lambda core, job: core.branch(conversation_id, seq, text, job))
