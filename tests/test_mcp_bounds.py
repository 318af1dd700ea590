"""What an MCP server may send is bounded while it is read (issue #60 item 8), and a stdio
server's background child does not outlive the call (item 15). The servers are real
processes (galahad_dev/hostile_mcp_server.py) talking to the real SDK's session."""

from __future__ import annotations

import http.server
import resource
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from galahad_desktop.toolbox import bounds
from galahad_desktop.toolbox.mcp_client import (
    MAX_DESCRIPTION_CHARS,
    MAX_TOOLS,
    ToolServerError,
    call_tool,
    list_tools,
)
from galahad_desktop.toolbox.servers import ToolServer
from galahad_dev import hostile_mcp_server

HOSTILE = hostile_mcp_server.__file__


def hostile(*words: str, timeout_s: float = 20.0) -> ToolServer:
    return ToolServer("hostile", (sys.executable, HOSTILE, *words), timeout_s=timeout_s)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize(
    ("words", "said"),
    [
        # Reading 4 MiB through the SDK's stream takes seconds: the full suite's tier.
        pytest.param(("endless",), "a message longer than 4 MiB", marks=pytest.mark.model),
        pytest.param(("describe", "100"), "a message longer than 4 MiB", marks=pytest.mark.model),
        (("deep", "900"), "nests deeper than 100 levels"),
        (("deep", "100000"), "nests deeper than 100 levels"),
        (("tools", "5000"), "a list of 5,000 tools (at most 1,000 are read)"),
    ],
)
def test_a_listing_past_a_bound_is_stopped_at_once_and_names_it(
    words: tuple[str, ...], said: str
) -> None:
    started = time.monotonic()
    before = _peak_mb()
    with pytest.raises(ToolServerError) as raised:
        list_tools(hostile(*words))
    message = str(raised.value)
    assert "sent more than Galahad reads (listing its tools)" in message
    assert said in message and "it was stopped" in message
    assert time.monotonic() - started < 10  # not the 20 s limit: the bound stopped it
    assert _peak_mb() - before < 400  # it read at most 4 MiB of it


def test_a_result_of_too_many_parts_is_refused_by_name() -> None:
    with pytest.raises(ToolServerError, match=r"a result of 3,000 content parts"):
        call_tool(hostile("parts", "3000"), "add", {"a": 1})
    answer = call_tool(hostile("parts", "1000"), "add", {"a": 1})  # at the bound: read
    assert answer.text.count("3") == 1000 and not answer.is_error


def test_within_the_bounds_a_long_list_is_cut_and_a_long_description_shortened(
    caplog: pytest.LogCaptureFixture,
) -> None:
    offered = list_tools(hostile("tools", "300"))
    assert len(offered) == MAX_TOOLS and offered[-1].name == f"t{MAX_TOOLS - 1}"
    assert "offers 300 tools: the first 128 are used" in caplog.text
    described = list_tools(hostile("describe", "1"))[0].description  # 1 MB: within a message
    assert described.startswith("x" * MAX_DESCRIPTION_CHARS)
    assert described.endswith(f"(cut: {1024 * 1024 - MAX_DESCRIPTION_CHARS:,} more characters)")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has ended; only its parent's reaping is left


def test_a_stdio_server_s_background_child_is_stopped_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    assert [t.name for t in list_tools(hostile("child", str(pid_file)))] == ["add"]
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


class _EndlessBody(http.server.BaseHTTPRequestHandler):
    """Answers every POST with a JSON body that never ends (chunked)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        piece = b'{"jsonrpc": "2.0", "id": 0, "result": {"x": "' + b"y" * 65536
        try:
            while True:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                piece = b"y" * 65536
        except OSError:
            pass  # the client stopped reading

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endless_url() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EndlessBody)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/mcp"
    httpd.shutdown()


def test_a_url_server_streaming_an_endless_body_is_stopped_at_the_bound(
    endless_url: str,
) -> None:
    started = time.monotonic()
    before = _peak_mb()
    with pytest.raises(ToolServerError, match=r"sent more than Galahad reads .*longer than 4 MiB"):
        list_tools(ToolServer("endless", url=endless_url, timeout_s=20))
    assert time.monotonic() - started < 10
    assert _peak_mb() - before < 400


def test_message_bounds_are_measured_without_recursion() -> None:
    deep: object = 1
    for _ in range(50_000):
        deep = [deep]
    assert "nests deeper than 100 levels" in bounds.message_problem(deep)
    assert bounds.message_problem({"result": {"content": [{}] * 1000}}) == ""
