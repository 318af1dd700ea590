"""MCP tools in the window's chats, the core half (fast tier, fake Gemma 4 engine): servers
kept encrypted and authenticated, a chat that offers their tools, a call read from the
reply's tokens, its result given back and answered in the same turn, the whole conversation
resumed from its blocks with nothing re-read. Only the MCP round trip is replaced here
(`list_tools`/`call_tool`); tests/test_mcp_tools.py runs the same steps against a real SDK
server in a subprocess."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from galahad_desktop.errors import GalahadError, InputError, IntegrityError
from galahad_desktop.memory import facade_tools
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import ToolRun
from galahad_desktop.toolbox import mcp_client
from galahad_desktop.toolbox.mcp_client import OfferedTool, ToolAnswer, ToolServerError
from galahad_desktop.toolbox.servers import ToolServer, parse_server
from galahad_desktop.ui.format import message_text, message_thoughts, shown_roles

ADD = OfferedTool(
    "add",
    "Add two whole numbers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)


class FakeServers:
    """The MCP round trip, answered in-process; the calls it was asked to make."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: str = ""

    def list_tools(self, server: ToolServer, job: Any = None) -> list[OfferedTool]:
        return [ADD, OfferedTool("echo", "Say it back.", {"type": "object"})]

    def call_tool(
        self, server: ToolServer, name: str, arguments: dict[str, Any], job: Any = None
    ) -> ToolAnswer:
        self.calls.append((server.name, name, arguments))
        if self.fail:
            raise ToolServerError(self.fail)
        return ToolAnswer(str(arguments["a"] + arguments["b"]), False, 3.0)


@pytest.fixture()
def servers(monkeypatch: pytest.MonkeyPatch) -> FakeServers:
    fake = FakeServers()
    monkeypatch.setattr(facade_tools, "list_tools", fake.list_tools)
    monkeypatch.setattr(facade_tools, "call_tool", fake.call_tool)
    return fake


def _with_calc(make_fake_core: Callable[..., Galahad]) -> Galahad:
    """A Gemma 4 core (the fake engine) with the stand-in calculator server added."""
    core = make_fake_core("gemma4")
    core.add_tool_server("calc", "calc-server")
    return core


def _calls(core: Galahad, *text: bytes) -> None:
    """The fake model's next replies: Gemma 4 call tokens around each call's text."""
    engine: Any = core.live.engine
    ids = engine.ids
    engine.script = []
    for piece in text:
        engine.script += [ids["<|tool_call>"], *piece, ids["<tool_call|>"]]
    engine.script += [ids["<|tool_response>"]]


def _answers(core: Galahad, text: bytes) -> None:
    engine: Any = core.live.engine
    engine.script = [*text, engine.ids["<turn|>"]]


@pytest.mark.parametrize(
    ("name", "target", "header", "problem"),
    [
        ("has space", "prog", "", "letters"),
        ("ok", "", "", "command to run or a URL"),
        ("ok", "ftp://host/x", "", "only http"),
        ("ok", "prog 'unclosed", "", "not valid"),
        ("ok", "prog\nrm -rf ~", "", "line break"),
        ("web", "https://h/mcp", "no colon here", "'Name: value'"),
        ("web", "https://h/mcp", "Bad Name: x", "'Name: value'"),
        ("web", "https://h/mcp", "X-Token: a\rb", "not usable"),
        ("web", "prog --serve", "Authorization: Bearer x", "environment"),
    ],
)
def test_a_server_that_cannot_be_used_is_refused_by_name(
    name: str, target: str, header: str, problem: str
) -> None:
    with pytest.raises(InputError, match=problem):
        parse_server(name, target, headers=[header] if header else [])


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        (
            "https://bob:hunter2@api.example.com/mcp?token=abc&v=2",
            "https://bob:•••@api.example.com/mcp?token=•••&v=•••",
        ),
        ("https://ghp_secret@api.example.com/mcp", "https://•••@api.example.com/mcp"),
        ("http://127.0.0.1:8000/mcp", "http://127.0.0.1:8000/mcp"),
        (
            "env API_KEY=sk-live-1 node server.js --api-key=zz --token tt --port 8",
            "env API_KEY=••• node server.js --api-key=••• --token ••• --port 8",
        ),
        ("python server.py NAME=kept", "python server.py NAME=kept"),
    ],
)
def test_what_may_be_a_secret_is_masked_where_servers_are_listed(target: str, shown: str) -> None:
    server = parse_server("web", target)
    assert server.target == shown
    assert server.url or " ".join(server.command) == target  # what runs is unchanged


def test_a_server_is_a_command_line_or_a_url() -> None:
    stdio = parse_server("files", "npx -y '@mcp/server files' ~/Docs", 30)
    assert stdio.command == ("npx", "-y", "@mcp/server files", "~/Docs") and not stdio.url
    assert parse_server("web", "http://127.0.0.1:8000/mcp").url == "http://127.0.0.1:8000/mcp"
    relative = parse_server("local", "./bin/server --port 3")  # found from where it was added
    assert relative.command == (str(Path.cwd() / "bin" / "server"), "--port", "3")


def test_servers_are_kept_encrypted_and_a_changed_list_is_refused(
    make_fake_core: Callable[..., Galahad], tmp_path: Path
) -> None:
    core = make_fake_core("gemma4")
    core.add_tool_server("calc", "calc-server --token sk-SECRET-123", 20)
    core.add_tool_server(
        "web", "https://tools.example/mcp", headers=["Authorization: Bearer sk-HEADER-456"]
    )
    with pytest.raises(InputError, match="already named"):
        core.add_tool_server("calc", "other")
    assert [(s.name, s.target, s.timeout_s) for s in core.tool_servers()] == [
        ("calc", "calc-server --token •••", 20.0),
        ("web", "https://tools.example/mcp (+1 header)", 60.0),  # its value never shown
    ]
    assert core.tool_servers_room.server("calc").command[-1] == "sk-SECRET-123"  # what runs
    data = tmp_path / "data"
    for path in data.rglob("*"):  # a token in a command stays private, in every file
        if path.is_file():
            assert b"sk-SECRET-123" not in path.read_bytes(), path
            assert b"sk-HEADER-456" not in path.read_bytes(), path
    catalog = data / "catalog.sqlite"
    web = core.tool_servers_room.server("web")  # kept whole, shown only as a count
    assert web.headers == (("Authorization", "Bearer sk-HEADER-456"),)
    core.remove_tool_server("web")
    assert [s.name for s in core.tool_servers()] == ["calc"]
    core.close()
    db = sqlite3.connect(catalog)  # a byte of the sealed list changed on disk
    blob = bytearray(db.execute("SELECT value FROM meta WHERE key='tool_servers'").fetchone()[0])
    blob[-1] ^= 1
    db.execute("UPDATE meta SET value=? WHERE key='tool_servers'", [bytes(blob)])
    db.commit()
    db.close()
    reopened = make_fake_core("gemma4")
    with pytest.raises(IntegrityError, match="failed authentication"):
        reopened.tool_servers()
    assert reopened.list_conversations() == []  # nothing else is refused for it


def test_a_call_runs_its_result_is_answered_and_the_chat_resumes_exact(
    make_fake_core: Callable[..., Galahad], servers: FakeServers
) -> None:
    core = _with_calc(make_fake_core)
    _calls(core, b"call:add{a:2,b:40}")
    called = core.send(None, "What is 2 + 40?", tools=["calc"])
    (call,) = called.calls
    assert (call.name, call.arguments) == ("add", {"a": 2, "b": 40})
    conversation_id = called.conversation_id
    assert core.list_conversations()[0].preview == "Called a tool"  # not "no messages"
    assert [t.name for t in core.conversation_tools(conversation_id)] == ["add", "echo"]
    assert not core.tool_allowed(conversation_id, "add")
    run = core.run_tool(conversation_id, call)
    assert servers.calls == [("calc", "add", {"a": 2, "b": 40})] and run.text == "42"
    _answers(core, b"It is 42.")
    answered = core.give_tool_results(conversation_id, [run])
    assert answered.reply == "It is 42." and not answered.calls
    # Only the result was read: the call's turn was still in the context.
    assert answered.counters.new_tokens < 40
    messages = core.messages(conversation_id)
    assert [m.role for m in messages] == ["user", "model", "tool", "model"]
    assert messages[1].calls == (call,) and messages[1].stop == "tool_calls"
    assert core.list_conversations()[0].preview == "It is 42."
    # As the window shows them: the call on its card, the result folded under it.
    assert message_text(messages[1]) == 'Called add({"a": 2, "b": 40})'
    assert message_text(messages[2], messages[1]) == 'add({"a": 2, "b": 40})'
    assert message_thoughts(messages[2]) == "42"
    assert shown_roles(messages) == ["user", "model", "tool", "model"]
    exported = core.export(conversation_id, "md").text or ""
    assert 'Called add({"a": 2, "b": 40})' in exported and "↳ add returned: 42" in exported
    core.close()
    reopened = make_fake_core("gemma4")
    opened = reopened.open_conversation(conversation_id)
    assert opened.graft.recomputed_tokens == 0 and opened.graft.proof.verdict == "exact"
    _answers(reopened, b"Yes.")
    assert reopened.send(conversation_id, "Sure?").reply == "Yes."  # it goes on, with tools


def test_always_allowed_denied_stopped_and_crashed_calls(
    make_fake_core: Callable[..., Galahad], servers: FakeServers
) -> None:
    core = _with_calc(make_fake_core)
    _calls(core, b"call:add{a:1,b:1}", b"call:add{a:2,b:2}")
    called = core.send(None, "Two sums", tools=["calc"])
    conversation_id = called.conversation_id
    assert len(called.calls) == 2
    core.allow_tool_always(conversation_id, "add")
    assert core.tool_allowed(conversation_id, "add")
    assert core.tool_servers()[0].always == ("add",)
    servers.fail = "The tool server 'calc' failed (the tool 'add'): it stopped."
    crashed = core.run_tool(conversation_id, called.calls[0])
    assert crashed.is_error and "'calc'" in crashed.text  # the model is told, by name
    stopped = ToolRun(called.calls[1].id, "add", "Stopped by the user.", ran=False)
    with pytest.raises(InputError, match="needs its result"):
        core.give_tool_results(conversation_id, [crashed])  # one result for two calls
    closed = core.give_tool_results(conversation_id, [crashed, stopped], answer=False)
    assert closed.stop_reason == "cancelled" and closed.reply == ""
    with pytest.raises(InputError, match="called no tools"):
        core.give_tool_results(conversation_id, [crashed])
    _answers(core, b"Fine.")
    assert core.send(conversation_id, "Never mind").reply == "Fine."
    messages = core.messages(conversation_id)
    assert [m.role for m in messages] == ["user", "model", "tool", "model", "user", "model"]
    # The turn closed at the stopped calls is a note in the window, not an empty reply.
    assert shown_roles(messages)[3] == "note" and "stopped" in message_text(
        messages[3], messages[2]
    )
    core.remove_tool_server("calc")
    assert core.tool_servers() == []


def test_a_new_message_while_calls_wait_closes_them_first(
    make_fake_core: Callable[..., Galahad], servers: FakeServers
) -> None:
    core = _with_calc(make_fake_core)
    _calls(core, b"call:add{a:1,b:2}")
    conversation_id = core.send(None, "Add", tools=["calc"]).conversation_id
    _answers(core, b"OK.")
    assert core.send(conversation_id, "Forget it").reply == "OK."
    tool = core.messages(conversation_id)[2]
    assert tool.role == "tool" and "Not run" in tool.text
    # Its turns are not question-and-answer pairs: carried on from a summary only.
    with pytest.raises(InputError, match="from a summary"):
        core.continue_with_recent(conversation_id, "More")
    with pytest.raises(InputError, match="keeps its system turn"):
        core.branch_with_system_prompt(conversation_id, "Be brief.")


def test_tools_are_chosen_when_a_chat_starts_and_gemma3_has_none(
    make_fake_core: Callable[..., Galahad], servers: FakeServers, tmp_path: Path
) -> None:
    core = _with_calc(make_fake_core)
    _answers(core, b"Hi.")
    conversation_id = core.send(None, "Hello").conversation_id
    with pytest.raises(InputError, match="when a conversation starts"):
        core.use_tools(conversation_id, ["calc"])
    with pytest.raises(GalahadError, match="No tool server is named 'nope'"):
        core.send(None, "Hello", tools=["nope"])
    assert len(core.list_conversations()) == 1  # the failed chat left nothing behind
    gemma3 = make_fake_core("gemma3", data=tmp_path / "three")
    gemma3.add_tool_server("calc", "calc-server")
    with pytest.raises(InputError, match="does not call tools"):
        gemma3.send(None, "Hello", tools=["calc"])
    assert gemma3.list_conversations() == []


def test_a_result_is_cut_and_schemas_lose_their_titles() -> None:
    import mcp_types

    long = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="x" * 20_000)])
    text = mcp_client._result_text(long)
    assert len(text) < 16_100 and text.endswith("(cut: 4,000 more characters)")
    schema = {
        "title": "A",
        "type": "object",
        "properties": {"title": {"title": "T", "type": "string"}},
    }
    assert mcp_client._clean_schema(schema) == {
        "type": "object",
        "properties": {"title": {"type": "string"}},  # a property named "title" stays
    }


def test_a_servers_awkward_tools_are_made_callable_or_left_out(
    make_fake_core: Callable[..., Galahad], monkeypatch: pytest.MonkeyPatch
) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(20):
        deep = {"type": "object", "properties": {"x": deep}}
    offered = [
        OfferedTool("read file/v2", 'Read <|"|>a file', {"type": "object"}),
        OfferedTool("9lives", "", {"type": "object"}),
        OfferedTool("x" * 80, "", {"type": "object"}),
        OfferedTool("too_deep", "", deep),
    ]
    monkeypatch.setattr(facade_tools, "list_tools", lambda server, job=None: offered)
    calls: list[str] = []

    def call(server: ToolServer, name: str, arguments: dict[str, Any], job: Any = None) -> Any:
        calls.append(name)
        return ToolAnswer("ok", False, 1.0)

    monkeypatch.setattr(facade_tools, "call_tool", call)
    core = make_fake_core("gemma4")
    core.add_tool_server("odd", "odd-server")
    core.add_tool_server("same", "same-server")
    conversation_id = core.new_conversation()
    tools = core.use_tools(conversation_id, ["odd", "same"])
    names = [t.name for t in tools]
    assert names[:3] == ["read_file_v2", "_9lives", "x" * 64]
    assert names[3:] == ["same_read_file_v2", "same__9lives", ("same_" + "x" * 64)[:64]]
    assert "too_deep" not in " ".join(names)  # left out: it cannot be declared
    assert tools[0].description == 'Read "a file'
    # A call by the model's name reaches the server's own name for the tool.
    _calls(core, b"call:same_read_file_v2{}")
    called = core.send(conversation_id, "Read it")
    assert core.run_tool(conversation_id, called.calls[0]).text == "ok"
    assert calls == ["read file/v2"]


def test_the_terminal_chat_says_where_a_call_runs(
    make_fake_core: Callable[..., Galahad],
    servers: FakeServers,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`galahad chat` in a chat with tools: a call is named, with where tools run."""
    import argparse

    from galahad_desktop.cli.chat import run_turn
    from galahad_desktop.cli.common import Output

    core = _with_calc(make_fake_core)
    conversation_id = core.new_conversation()
    core.use_tools(conversation_id, ["calc"])
    _calls(core, b"call:add{a:1,b:2}")
    args = argparse.Namespace(temperature=None, max_tokens=None, seed=None, top_p=None)
    result = run_turn(core, Output(False), conversation_id, "Add", args)
    assert result.calls and servers.calls == []  # nothing ran from the terminal
    said = capsys.readouterr().err
    assert 'called the tool add({"a": 1, "b": 2})' in said and "galahad gui" in said


def test_the_mcp_sdk_s_log_reaches_no_one_as_a_traceback() -> None:
    import io
    import logging

    from galahad_desktop.toolbox import mcp_client

    assert mcp_client.log.name == "galahad_desktop.toolbox.mcp_client"
    shown = io.StringIO()
    terminal = logging.StreamHandler(shown)  # what the command's stderr would get
    root = logging.getLogger()
    root.addHandler(terminal)
    try:
        try:
            raise ValueError("nested 900 deep\nline two")
        except ValueError:
            logging.getLogger("mcp.client.stdio").exception("Failed to parse JSONRPC message")
    finally:
        root.removeHandler(terminal)
    assert shown.getvalue() == "the MCP SDK: Failed to parse JSONRPC message (ValueError)\n"
