"""The window's MCP tools: which servers a new chat offers (the Tools menu), and the calls
a reply makes, each asked before it runs (allow once, always for this tool, deny), shown as
a card whose result folds, stopped by Stop or by its server's time limit. The results go
back to the model, which goes on in its turn (and may call again, up to MAX_ROUNDS times
for one message).
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

from galahad_desktop.memory.results import (
    ConversationTool,
    OpenedConversation,
    ToolCall,
    ToolRun,
    ToolServerInfo,
    TurnResult,
)
from galahad_desktop.ui.worker import CANCELLED, CONVERSATIONS

if TYPE_CHECKING:
    from collections.abc import Callable

    from PySide6.QtCore import SignalInstance

    from galahad_desktop.jobs import Job
    from galahad_desktop.memory.galahad import Galahad
    from galahad_desktop.ui.chat_view import ChatView
    from galahad_desktop.ui.prompts import Prompts
    from galahad_desktop.ui.worker import CoreBridge, Request

MAX_ROUNDS = 10  # tool rounds for one message: a model that keeps calling is stopped there
STOPPED = "Stopped by the user before it answered."
DENIED = "The user did not allow this call."
NOT_REACHED = "Not run: the user stopped the turn before this call."
TOO_MANY = f"Not run: {MAX_ROUNDS} rounds of tool calls for one message is the limit."
ALLOW_ONCE, DENY = "Allow once", "Deny"


def arguments_text(call: ToolCall) -> str:
    return json.dumps(call.arguments, ensure_ascii=False, indent=2)


class ToolActions:
    """Mixed into MainWindow: these are the window's own widgets and methods."""

    if TYPE_CHECKING:
        bridge: CoreBridge
        chat: ChatView
        prompts: Prompts
        conversation_id: str | None
        turn_cancel: threading.Event | None
        generating: Request | None
        conversation_opened: SignalInstance

        def set_status(self, text: str) -> None: ...
        def show_error(self, message: str, kind: str = "") -> None: ...
        def _start_turn(
            self, work: Callable[[Galahad, Job], TurnResult], text: str = ""
        ) -> None: ...
        def _turn_done(self, result: TurnResult) -> None: ...
        def _end_turn(self) -> None: ...
        def set_context(self, used: int, n_ctx: int) -> None: ...

    def setup_tools(self) -> None:
        self.new_chat_tools: list[str] = []
        self.tool_rounds = 0
        self.chat.tools_menu.aboutToShow.connect(self._fill_tools_menu)
        self.conversation_opened.connect(self._opened_tools)

    # -- which tools a chat offers -------------------------------------------------------------
    def _fill_tools_menu(self) -> None:
        menu = self.chat.tools_menu
        menu.clear()
        menu.addAction("Reading…").setEnabled(False)
        conversation_id = self.conversation_id
        if conversation_id is None:
            self.bridge.run(lambda core, _job: core.tool_servers(), on_done=self._servers_shown)
        else:
            self.bridge.run(
                lambda core, _job: core.conversation_tools(conversation_id),
                on_done=self._tools_shown,
            )

    def _servers_shown(self, servers: list[ToolServerInfo]) -> None:
        menu = self.chat.tools_menu
        menu.clear()
        if not servers:
            menu.addAction("No tool servers yet: add one in Settings → Tools").setEnabled(False)
            return
        heading = menu.addAction("A new chat offers the tools of:")
        heading.setEnabled(False)
        for server in servers:
            action = menu.addAction(server.name)
            action.setCheckable(True)
            action.setChecked(server.name in self.new_chat_tools)
            action.setToolTip(server.target)
            action.toggled.connect(lambda on, name=server.name: self._choose_server(name, on))

    def _choose_server(self, name: str, on: bool) -> None:
        chosen = [n for n in self.new_chat_tools if n != name]
        self.new_chat_tools = [*chosen, name] if on else chosen
        self.show_new_chat_tools()
        self.set_status(
            "The next new chat offers the tools of: " + ", ".join(self.new_chat_tools)
            if self.new_chat_tools
            else "New chats offer no tools."
        )

    def show_new_chat_tools(self) -> None:
        """The Tools button of a new chat: how many servers it will offer."""
        count = len(self.new_chat_tools)
        self.chat.tools_button.setText(f"Tools ({count})" if count else "Tools")
        self.chat.tools_on = False

    def _tools_shown(self, tools: list[ConversationTool]) -> None:
        menu = self.chat.tools_menu
        menu.clear()
        if not tools:
            menu.addAction("This chat offers no tools (chosen when a chat starts)").setEnabled(
                False
            )
            return
        menu.addAction("This chat offers (fixed when it started):").setEnabled(False)
        for tool in tools:
            where = f" ({tool.server})" if tool.server else " (a program's, through the API)"
            menu.addAction(f"{tool.name}{where}").setEnabled(False)

    def _opened_tools(self, opened: OpenedConversation) -> None:
        conversation_id = opened.summary.id

        def shown(tools: list[ConversationTool]) -> None:
            if self.conversation_id == conversation_id:
                self.chat.tools_on = any(t.server for t in tools)
                self.chat.tools_button.setText(f"Tools: {len(tools)}" if tools else "Tools")
                self.chat.set_busy(self.chat.busy)

        self.bridge.run(lambda core, _job: core.conversation_tools(conversation_id), on_done=shown)

    # -- a reply's calls -------------------------------------------------------------------------
    def start_calls(self, result: TurnResult) -> None:
        """Run the calls of the reply just written, one by one, each asked first."""
        self.tool_rounds += 1
        self.turn_cancel = threading.Event()
        self.chat.set_busy(True)
        self._next_call(result.conversation_id, list(result.calls), [])

    def _next_call(
        self, conversation_id: str, pending: list[ToolCall], runs: list[ToolRun]
    ) -> None:
        if not pending:
            self._give(conversation_id, runs, answer=True)
            return
        if self.tool_rounds > MAX_ROUNDS:
            runs += [ToolRun(c.id, c.name, TOO_MANY, ran=False) for c in pending]
            self.set_status(f"The model called tools {MAX_ROUNDS} times for one message: stopped.")
            self._give(conversation_id, runs, answer=False)
            return
        call = pending[0]

        def read(core: Galahad, _job: Job) -> tuple[bool, list[ConversationTool]]:
            return core.tool_allowed(conversation_id, call.name), core.conversation_tools(
                conversation_id
            )

        self.bridge.run(
            read,
            on_done=lambda known: self._ask(conversation_id, pending, runs, *known),
            on_error=lambda m, k: self._call_failed(conversation_id, pending, runs, m, k),
            cancel=self.turn_cancel,
        )

    def _ask(
        self,
        conversation_id: str,
        pending: list[ToolCall],
        runs: list[ToolRun],
        allowed: bool,
        tools: list[ConversationTool],
    ) -> None:
        call = pending[0]
        tool = next((t for t in tools if t.name == call.name), None)
        server = tool.server if tool else "?"
        always = False
        if not allowed:
            always_label = f"Always allow {call.name}"
            choice = self.prompts.choose(
                "Run a tool?",
                f"The model asks to run the tool “{call.name}” of the server “{server}” "
                f"with these arguments:\n\n{arguments_text(call)}\n\nIt runs on this "
                "computer with your permissions.",
                [ALLOW_ONCE, always_label, DENY],
            )
            if choice not in (ALLOW_ONCE, always_label):
                run = ToolRun(call.id, call.name, DENIED, ran=False)
                self._card(call, server, "denied", "")
                self._next_call(conversation_id, pending[1:], [*runs, run])
                return
            always = choice == always_label
        self._card(call, server, "running…", "")
        self.set_status(f"Running the tool {call.name} ({server}) · Stop to stop it")

        if always:  # the user's choice is kept even if the call is then stopped
            self.bridge.run(
                lambda core, _job: core.allow_tool_always(conversation_id, call.name),
                on_error=self.show_error,
            )
        self.generating = self.bridge.run(
            lambda core, job: core.run_tool(conversation_id, call, job),
            on_done=lambda run: self._ran(conversation_id, pending, runs, server, run),
            on_error=lambda m, k: self._call_failed(conversation_id, pending, runs, m, k),
            label=f"Running the tool {call.name}",
            cancel=self.turn_cancel,
        )

    def _card(self, call: ToolCall, server: str, note: str, result: str) -> None:
        self.chat.append("tool", f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})")
        last = self.chat.messages[-1]
        last.note, last.thoughts = f"{server} · {note}", result
        self.chat.redraw()

    def _ran(
        self,
        conversation_id: str,
        pending: list[ToolCall],
        runs: list[ToolRun],
        server: str,
        run: ToolRun,
    ) -> None:
        last = self.chat.messages[-1]
        state = "failed" if run.is_error else f"ran in {run.elapsed_ms / 1000:.1f} s"
        last.note, last.thoughts = f"{server} · {state}", run.text or "(no result)"
        self.chat.redraw()
        if run.is_error and run.text.startswith("The tool server"):
            self.set_status(run.text)  # a server that crashed, or did not answer, is named
        self._next_call(conversation_id, pending[1:], [*runs, run])

    def _call_failed(
        self,
        conversation_id: str,
        pending: list[ToolCall],
        runs: list[ToolRun],
        message: str,
        kind: str,
    ) -> None:
        call = pending[0]
        if kind in (CANCELLED, "CancelledError"):
            if self.chat.messages and self.chat.messages[-1].role == "tool":
                last = self.chat.messages[-1]
                last.note, last.thoughts = last.note.replace("running…", "stopped"), STOPPED
                self.chat.redraw()
            runs = [*runs, ToolRun(call.id, call.name, STOPPED, ran=False)]
            runs += [ToolRun(c.id, c.name, NOT_REACHED, ran=False) for c in pending[1:]]
            self._give(conversation_id, runs, answer=False)
            return
        self.show_error(message, kind)
        run = ToolRun(call.id, call.name, f"The call could not be run: {message}", True, ran=False)
        self._next_call(conversation_id, pending[1:], [*runs, run])

    def _give(self, conversation_id: str, runs: list[ToolRun], answer: bool) -> None:
        """The results go back: the model goes on (a new reply card streams), or the turn is
        closed there (Stop, the round limit) and stored as stopped."""
        if answer:
            self.turn_cancel = threading.Event()
            self._start_turn(lambda core, job: core.give_tool_results(conversation_id, runs, job))
            return

        def closed(result: TurnResult) -> None:
            self._end_turn()
            self.set_context(result.context_tokens, result.n_ctx)
            self.tool_rounds = 0
            self.set_status("Stopped; the calls and what became of them are stored.")

        def failed(message: str, kind: str) -> None:
            self._end_turn()
            self.show_error(message, kind)

        self.bridge.run(
            lambda core, job: core.give_tool_results(conversation_id, runs, job, answer=False),
            on_done=closed,
            on_error=failed,
            label="Storing the stopped turn",
            cancel=threading.Event(),  # Stop has been pressed: this must still run
            changes={CONVERSATIONS},
        )


__all__ = ["MAX_ROUNDS", "ToolActions", "arguments_text"]
