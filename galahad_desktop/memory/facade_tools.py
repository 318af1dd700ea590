"""The facade's tools half: the MCP servers the window's chats may use, a conversation's
tools, running a call the user allowed and giving its result back. Mixed into `Galahad`
(memory/galahad.py); it holds no state of its own."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.errors import InputError, NotFoundError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.chat.tool_turns import tool_records
from galahad_desktop.memory.chat.window_tools import WindowTools
from galahad_desktop.memory.results import (
    ConversationTool,
    Tool,
    ToolCall,
    ToolRun,
    ToolServerInfo,
    TurnResult,
)
from galahad_desktop.memory.tool_servers import ToolServers
from galahad_desktop.toolbox.mcp_client import ToolServerError, call_tool, list_tools, sdk_version
from galahad_desktop.toolbox.servers import DEFAULT_TIMEOUT_S, ToolServer

log = logging.getLogger(__name__)


def callable_name(name: str, server: str, taken: set[str]) -> str:
    """A tool's name as the model calls it: letters, digits, '_', '.', '-' (at most 64),
    unique among the chat's tools (the server's own name is kept for the call)."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", name)[:64] or "tool"
    if not re.match(r"[A-Za-z_]", name):
        name = f"_{name}"[:64]
    if name in taken:
        name = f"{server}_{name}"[:64]
    while name in taken:
        name = f"{name[:60]}_{len(taken)}"
    return name


class ToolFacade:
    tool_servers_room: ToolServers
    window_tools: WindowTools

    if TYPE_CHECKING:  # Galahad's

        def sampling(
            self, conversation_id: str | None = None, **changes: Any
        ) -> SamplingParams: ...

    # -- the servers -----------------------------------------------------------------------
    @staticmethod
    def tools_sdk() -> str:
        """The MCP SDK's version ("" when this build cannot load it)."""
        return sdk_version()

    def tool_servers(self) -> list[ToolServerInfo]:
        """The MCP servers added in Settings → Tools."""
        config = self.tool_servers_room.load()
        return [
            ToolServerInfo(
                s.name,
                s.target,
                s.timeout_s,
                tuple(
                    sorted(a.split("/", 1)[1] for a in config.always if a.startswith(s.name + "/"))
                ),
            )
            for s in config.servers
        ]

    def add_tool_server(
        self,
        name: str,
        target: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: Sequence[str] = (),
        check: bool = False,
        job: Job = NO_JOB,
    ) -> ToolServerInfo:
        """Add an MCP server: a command line (run with stdio) or an http(s) URL, with the
        "Name: value" headers it needs (kept encrypted, never shown again). `check`: it is
        started (or reached) and asked for its tools first; one that fails is not added."""
        offered: list[str] = []

        def starts(server: ToolServer) -> None:
            try:
                offered.extend(t.name for t in list_tools(server, job))
            except ToolServerError as exc:
                raise ToolServerError(
                    f"{exc} Nothing was added. A server that can only start later is added "
                    "without this check (tools add --no-check; in Settings → Tools, untick "
                    "'Check that it starts')."
                ) from None

        server = self.tool_servers_room.add(
            name, target, timeout_s, headers, starts if check else None
        )
        return ToolServerInfo(server.name, server.target, server.timeout_s, (), tuple(offered))

    def remove_tool_server(self, name: str) -> None:
        """Remove an MCP server (and what of it was allowed to run without asking)."""
        self.tool_servers_room.remove(name)

    def server_tools(self, name: str, job: Job = NO_JOB) -> list[Tool]:
        """The tools a server offers now (it is started, or reached, to ask)."""
        offered = list_tools(self.tool_servers_room.server(name), job)
        return [Tool(t.name, t.description, t.parameters) for t in offered]

    # -- a conversation's tools --------------------------------------------------------------
    def use_tools(
        self, conversation_id: str, servers: Sequence[str], job: Job = NO_JOB
    ) -> list[ConversationTool]:
        """Offer the tools of `servers` in a conversation that has not started (each server
        is asked for its tools now). A name the model cannot call is made callable (other
        characters become '_'; a name two servers share gets its server's prefix); a tool
        that cannot be declared (a schema nested too deep, Gemma's string marker in it) is
        left out and logged."""
        chosen: list[tuple[str, str, Tool]] = []
        names: set[str] = set()
        for server in servers:
            for offered in self.server_tools(server, job):
                name = callable_name(offered.name, server, names)
                tool = Tool(name, offered.description.replace('<|"|>', '"'), offered.parameters)
                try:
                    tool_records([tool])
                except InputError as exc:
                    log.warning("tool %s of %s left out: %s", offered.name, server, exc)
                    continue
                names.add(name)
                chosen.append((server, offered.name, tool))
        if not chosen:
            raise InputError("The servers chosen offer no tools this model can call.")
        self.window_tools.enable(conversation_id, chosen)
        return self.window_tools.offered(conversation_id)

    def conversation_tools(self, conversation_id: str) -> list[ConversationTool]:
        """The tools a conversation offers the model (fixed when it started)."""
        return self.window_tools.offered(conversation_id)

    def tool_allowed(self, conversation_id: str, name: str) -> bool:
        """Whether the user allowed this tool to run without asking."""
        tool = self._tool(conversation_id, name)
        return self.tool_servers_room.allowed(tool.server, tool.tool)

    def allow_tool_always(self, conversation_id: str, name: str) -> None:
        """Let this tool of its server run without asking, in every chat (Settings → Tools
        shows it; removing the server forgets it)."""
        tool = self._tool(conversation_id, name)
        self.tool_servers_room.allow_always(tool.server, tool.tool)

    def _tool(self, conversation_id: str, name: str) -> ConversationTool:
        for tool in self.window_tools.offered(conversation_id):
            if tool.name == name:
                return tool
        raise NotFoundError(f"The conversation offers no tool named '{name}'.")

    def run_tool(self, conversation_id: str, call: ToolCall, job: Job = NO_JOB) -> ToolRun:
        """Run a call the user allowed, on its server. A tool that fails, a server that
        crashes or does not answer in time: the result says so (the model is told, the
        window shows it); Stop raises CancelledError."""
        tool = self._tool(conversation_id, call.name)
        server = self.tool_servers_room.server(tool.server)
        try:
            answer = call_tool(server, tool.tool, call.arguments, job)
        except ToolServerError as exc:
            return ToolRun(call.id, call.name, str(exc), is_error=True)
        return ToolRun(call.id, call.name, answer.text, answer.is_error, answer.elapsed_ms)

    def give_tool_results(
        self, conversation_id: str, runs: Sequence[ToolRun], job: Job = NO_JOB, answer: bool = True
    ) -> TurnResult:
        """The results of the calls the last reply made, read into its turn; the model goes
        on (and may call again), or with `answer` False the turn ends there."""
        return self.window_tools.give_results(
            conversation_id, runs, self.sampling(conversation_id), job, answer
        )
