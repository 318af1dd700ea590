"""The local server's hostile clients, for `eval redteam`: issue #49's findings replayed
against a real `galahad serve` on the real model.

Slow heads (40 connections without the key, a header line now and then), 260 no-key
clients pipelining requests they never read, a slow body, hostile JSON schemas (#60), a
1 MB stop string and a 1,000-character one, a 10,001-message history, a body nested 100,000
deep, 5,000-digit integers, 50 clients at once, a foreign Host, and ports that are not
ports. Each must be answered or refused within its bound (BOUNDS_S), in OpenAI's JSON shape
with a 4xx; and while the slow connections are held, a client with the key is served.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from galahad_dev.redteam import Harness

# Every request is answered or refused within these (seconds): the server's own deadlines
# (10 s for a head, 30 s for a body) plus room for a loaded 2-core machine.
BOUNDS_S = {
    "slow heads": 14.0,
    "served while held": 5.0,
    "slow body": 34.0,
    "refusal": 5.0,
    "long history": 15.0,
    "overload": 60.0,
    "short reply with a long stop": 30.0,
    "schema refusal": 5.0,  # a schema past its bounds: refused before llama.cpp sees it
    "bounded grammar": 30.0,  # issue #60's limit for a forced call with many properties
}
Answer = tuple[int, bytes, dict[str, str]]  # status (0: none), body, headers
PIPELINING_CLIENTS = 260
ASK_TIMEOUT_S = 90.0  # past any bound: a request still unanswered then is a hang


class RunningServer:
    """`galahad serve --port 0 --json` in its own process."""

    def __init__(self, h: Harness) -> None:
        self.proc = subprocess.Popen(
            [str(a) for a in h.command(["serve", "--port", "0", "--json"])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"galahad serve did not start: {self.proc.stderr.read()[-300:]}")
        started = json.loads(line)
        self.key: str = started["api_key"]
        self.port = int(started["base_url"].rsplit(":", 1)[1].split("/")[0])
        self.stderr = ""
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr += line

    def ask(self, path: str, body: bytes | None = None, host: str | None = None) -> Answer:
        """GET `path`, or POST `body` to it, with the key (and `host` as the Host header)."""
        method = "GET" if body is None else "POST"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=ASK_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {self.key}"}
        if host is not None:
            headers["Host"] = host
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(), dict(response.getheaders())
        except (OSError, http.client.HTTPException):
            return 0, b"", {}
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(5)


_TOOL = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
_CALLED = {"name": "get_time", "arguments": "{}"}


def _chat(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 4, **extra}).encode()


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _raw_answer(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while piece := sock.recv(65536):
            data += piece
    return data


def _judge(status: int, body: bytes, wanted: Sequence[int]) -> str:
    """answered | refused (a JSON 4xx) | internal (5xx) | silent (an error that is not
    OpenAI's JSON shape) | hang (no answer)."""
    if status == 0:
        return "hang"
    if status >= 500:
        return "internal"
    if status >= 400:
        try:
            shaped = isinstance(json.loads(body).get("error", {}).get("message"), str)
        except (ValueError, AttributeError):
            shaped = False
        if not shaped:
            return "silent"
    if status not in wanted:
        return "internal"
    return "answered" if status < 400 else "refused"


def server_clients(h: Harness, pick: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
    """Issue #49's hostile clients against a real server (all of them: they are few)."""
    for port in ("70000", "-1"):
        h.run("server", f"serve --port {port}", ["serve", "--port", port])
    server = RunningServer(h)
    try:
        _slow_heads(h, server)
        _pipelining(h, server)
        _slow_body(h, server)
        _refusals(h, server)
        _overload(h, server)
    finally:
        server.stop()
    if "Traceback" in server.stderr:
        h.findings.append("server: a traceback on the server's stderr")


def _record(h: Harness, name: str, verdict: str, seconds: float, bound: str, said: str) -> None:
    from galahad_dev.redteam import Outcome

    if verdict not in ("hang", "internal", "silent", "abort", "lockout") and (
        seconds > BOUNDS_S[bound]
    ):
        verdict = "hang"  # answered, but past its bound
    outcome = Outcome("server", name, None, said[:240], verdict, seconds)
    h.outcomes.append(outcome)
    if verdict in ("internal", "abort", "hang", "silent", "lockout"):
        h.findings.append(f"server/{name}: {verdict} ({said[:120]}, {seconds:.1f} s)")
    h.log(f"server    {name[:48]:48} {verdict:9} {seconds:5.1f} s")


def _slow_heads(h: Harness, server: RunningServer) -> None:
    """40 connections without the key, each sending one header line every 2 s: a client
    with the key is served meanwhile, and each slow one is closed at the head deadline."""
    slow = []
    opened = time.monotonic()
    for _ in range(40):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=BOUNDS_S["slow heads"])
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append(sock)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(2.0):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X-Slow: 1\r\n")

    threading.Thread(target=trickle, daemon=True).start()
    for attempt in range(3):
        time.sleep(1.5)
        started = time.monotonic()
        status, body, _ = server.ask("/v1/models")
        verdict = _judge(status, body, [200])
        if verdict != "answered":
            verdict = "lockout"
        _record(
            h,
            f"models while 40 slow heads are held ({attempt + 1})",
            verdict,
            time.monotonic() - started,
            "served while held",
            f"{status}",
        )
    answers = [_raw_answer(sock) for sock in slow]
    stop.set()
    for sock in slow:
        sock.close()
    closed_after = time.monotonic() - opened
    statuses = sorted({int(a.split(b" ", 2)[1]) if a[:9] == b"HTTP/1.1 " else 0 for a in answers})
    bodies_ok = all(_judge(408, a.partition(b"\r\n\r\n")[2], [408]) == "refused" for a in answers)
    verdict = "refused" if statuses == [408] and bodies_ok else "hang"
    _record(h, "40 slow heads without the key", verdict, closed_after, "slow heads", f"{statuses}")


def _pipelining(h: Harness, server: RunningServer) -> None:
    """260 connections without the key, each pipelining 20,000 requests and reading none of
    the answers (issue #60 item 1): a client with the key is never refused meanwhile."""
    health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 20_000
    hostile = []
    try:
        for _ in range(PIPELINING_CLIENTS):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.setblocking(False)
            with contextlib.suppress(OSError):  # a full buffer, or closed as unkeyed
                sock.send(health)
            hostile.append(sock)
        time.sleep(1.0)  # the server has answered into their full buffers and waits on them
        for attempt in range(5):
            started = time.monotonic()
            status, body, _ = server.ask("/v1/models")
            verdict = "answered" if _judge(status, body, [200]) == "answered" else "lockout"
            _record(
                h,
                f"models while {PIPELINING_CLIENTS} no-key clients pipeline ({attempt + 1})",
                verdict,
                time.monotonic() - started,
                "served while held",
                f"{status}",
            )
    finally:
        for sock in hostile:
            sock.close()


def _slow_body(h: Harness, server: RunningServer) -> None:
    """A body that never finishes, with the key: 408 at the body deadline."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUNDS_S["slow body"]) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {server.key}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        answer = _raw_answer(s)
    status = int(answer.split(b" ", 2)[1]) if answer[:9] == b"HTTP/1.1 " else 0
    verdict = _judge(status, answer.partition(b"\r\n\r\n")[2], [408])
    _record(h, "a body that never finishes", verdict, time.monotonic() - started, "slow body", "")


def _schema_case(name: str, schema: dict[str, Any]) -> tuple[str, bytes, None, list[int], str]:
    body = _chat(
        [_user("a")],
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        max_tokens=4,
    )
    return (name, body, None, [400], "schema refusal")


def _hostile_schemas() -> list[tuple[str, bytes, None, list[int], str]]:
    """The schemas that crashed llama.cpp's grammar parser (signal 11) or took gigabytes or
    minutes before they were bounded."""
    items = {"type": "integer"}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("maxItems 100,000", {"type": "array", "items": items, "maxItems": 100_000}),
        ("maxLength 10^6", {"type": "string", "maxLength": 10**6}),
        ("minItems 10^8", {"type": "array", "items": items, "minItems": 10**8}),
        ("a 100,000-value enum", {"enum": [f"v{i}" for i in range(100_000)]}),
        ("minItems 5 with maxItems 2", {"type": "array", "minItems": 5, "maxItems": 2}),
        ("an unbalanced pattern", {"type": "string", "pattern": "^(a$"}),
        # The converter's pattern reader looped forever on these (a thread at full CPU).
        ("a pattern with a ']' that closes nothing", {"type": "string", "pattern": "^[]a]$"}),
        ("a pattern with a '}' that closes nothing", {"type": "string", "pattern": "^a}$"}),
        ("a pattern 900 groups deep", {"type": "string", "pattern": "(" * 900 + "a" + ")" * 900}),
        (
            "a reference to itself",
            {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
        ),
    ]
    found = [_schema_case(f"a JSON schema with {n}", s) for n, s in cases]
    optional = {f"p{i}": {"type": "string"} for i in range(26)}
    forced = _chat(
        [_user("a")],
        tools=[
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": optional}},
            }
        ],
        tool_choice="required",
        max_tokens=4,
    )
    # Gemma 3 has no tool syntax (a 400); on Gemma 4 the linear call grammar answers.
    found.append(
        ("26 optional tool properties, a call forced", forced, None, [200, 400], "bounded grammar")
    )
    return found


def _refusals(h: Harness, server: RunningServer) -> None:
    history = [
        _user("hi") if i % 2 == 0 else {"role": "assistant", "content": "ok"} for i in range(10_001)
    ]
    cases: list[tuple[str, bytes, str | None, Sequence[int], str]] = [
        ("a 1 MB stop string", _chat([_user("hi")], stop="x" * 1_000_000), None, [400], "refusal"),
        (
            "a 1,000-character stop on a long reply",
            _chat([_user("Write a long story.")], stop=["ab" * 500], max_tokens=200),
            None,
            [200],
            "short reply with a long stop",
        ),
        ("a 10,001-message history", _chat(history), None, [400], "long history"),
        ("a body nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, None, [400], "refusal"),
        (
            "a 5,000-digit seed",
            b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "seed": 1'
            + b"7" * 5000
            + b"}",
            None,
            [400],
            "refusal",
        ),
        (
            "a 5,000-digit max_tokens",
            b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": 9'
            + b"9" * 5000
            + b"}",
            None,
            [400],
            "refusal",
        ),
        ("tools: 0", _chat([_user("a")], tools=0), None, [400], "refusal"),
        (
            "tools on a model without tool syntax",
            _chat([_user("a")], tools=_TOOL),
            None,
            [400],
            "refusal",
        ),
        (
            "a tool result no call asked for",
            _chat([_user("a"), {"role": "tool", "tool_call_id": "x", "content": "r"}]),
            None,
            [400],
            "refusal",
        ),
        (
            "two tool calls under one id, one answer",
            _chat(
                [
                    _user("a"),
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": _CALLED},
                            {"id": "c", "type": "function", "function": _CALLED},
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c", "content": "12:00"},
                ],
                tools=_TOOL,
            ),
            None,
            [400],
            "refusal",
        ),
        (
            "an unusable JSON schema",
            _chat(
                [_user("a")],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "teapot"}},
                },
            ),
            None,
            [400],
            "refusal",
        ),
        *_hostile_schemas(),
        (
            'include_usage: "no"',
            _chat([_user("a")], stream=True, stream_options={"include_usage": "no"}),
            None,
            [400],
            "refusal",
        ),
        ("Host: evil.example with the key", _chat([_user("a")]), "evil.example", [403], "refusal"),
    ]
    for name, body, host, wanted, bound in cases:
        started = time.monotonic()
        status, answer, _ = server.ask("/v1/chat/completions", body, host)
        said = f"{status} {answer[:160].decode(errors='replace')}"
        _record(h, name, _judge(status, answer, wanted), time.monotonic() - started, bound, said)


def _overload(h: Harness, server: RunningServer) -> None:
    """50 clients at once: each is answered or told to come back (429, Retry-After)."""
    body = _chat([_user("Say one word.")], max_tokens=2)

    def one(_: int) -> tuple[Answer, float]:
        started = time.monotonic()
        return server.ask("/v1/chat/completions", body), time.monotonic() - started

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(one, range(50)))
    for number, ((status, answer, headers), seconds) in enumerate(results):
        verdict = _judge(status, answer, [200, 429])
        if status == 429 and not headers.get("Retry-After", headers.get("retry-after")):
            verdict = "silent"
        _record(h, f"one of 50 at once ({number + 1})", verdict, seconds, "overload", f"{status}")
