"""The local server against hostile clients (fast tier: the fake engine behind the real core,
server and uvicorn): slow heads, overload, hostile bodies, a foreign Host, a long history.
Each refusal is OpenAI's JSON error shape with a 4xx, and nobody without the key can keep
a client with it from being served."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from galahad_desktop.engine.decoding import StopTexts
from galahad_desktop.errors import InputError
from galahad_desktop.memory.chat.stateless import StatelessChats
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import ChatMessage
from galahad_desktop.server.app import Limits, host_allowed
from tests.served import Served


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _head(key: str = "", host: str = "127.0.0.1") -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\n{auth}".encode()


def _answer(sock: socket.socket) -> bytes:
    """What the server sent before it closed (or within the socket's timeout)."""
    data = b""
    try:
        while piece := sock.recv(65536):
            data += piece
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _body(answer: bytes) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(answer.partition(b"\r\n\r\n")[2])
    return result


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_slow_connections_without_the_key_never_lock_out_a_client_with_it(
    serve: Callable[..., Served],
) -> None:
    limits = Limits(head_timeout_s=1.0, max_waiting_heads=16, max_connections=32)
    served = serve(limits=limits)
    slow = []
    for _ in range(40):  # more than the connection cap, each sending a header now and then
        sock = socket.create_connection(("127.0.0.1", served.address.port), timeout=5)
        sock.sendall(_head())
        slow.append(sock)
    opened = time.monotonic()
    served_times = []
    for step in range(6):
        time.sleep(0.3)
        for sock in slow:
            with contextlib.suppress(OSError):  # already closed by the server, as it should
                sock.sendall(b"X-Slow: %d\r\n" % step)
        if step:  # the slow ones have waited longer than any real client's head takes
            started = time.monotonic()
            assert served.raw("GET", "/v1/models")[0] == 200
            served_times.append(time.monotonic() - started)
    assert max(served_times) < 2.0  # served while they are held, not after they time out
    answers = [_answer(sock) for sock in slow]
    for sock in slow:
        sock.close()
    assert time.monotonic() - opened < limits.head_timeout_s + 4
    # Every slow connection was closed with a 408 in OpenAI's shape: the oldest when newer
    # ones came, the rest at the deadline.
    assert {_status(a) for a in answers} == {408}
    assert {_body(a)["error"]["code"] for a in answers} == {"request_timeout"}


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_clients_that_pipeline_without_the_key_never_lock_out_one_with_it(
    serve: Callable[..., Served],
) -> None:
    served = serve(limits=Limits(max_connections=8))
    health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 20_000
    hostile = []
    for _ in range(12):  # more than the cap: each pipelines 20,000 requests, reads nothing
        sock = socket.create_connection(("127.0.0.1", served.address.port), timeout=5)
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.send(health)
        hostile.append(sock)
    time.sleep(1.0)  # the server has answered into their full buffers and waits on them
    try:
        for _ in range(5):
            started = time.monotonic()
            assert served.raw("GET", "/v1/models")[0] == 200  # never 429 server_overloaded
            assert time.monotonic() - started < 2.0
    finally:
        for sock in hostile:
            sock.close()


def test_a_body_that_trickles_after_a_refusal_does_not_hold_the_connection(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    with socket.create_connection(("127.0.0.1", served.address.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        )
        answer = _answer(sock)  # the 401 comes, then the connection ends (no 5 s wait)
    assert _status(answer) == 401 and _body(answer)["error"]["code"] == "invalid_api_key"


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_overload_is_a_429_with_retry_after_never_a_bare_503(
    serve: Callable[..., Served],
) -> None:
    served = serve(limits=Limits(max_connections=6, queue_limit=50))
    release = threading.Event()
    served.lane.submit("busy", lambda core: release.wait(20), threading.Event())
    body = json.dumps({"model": "m", "messages": [user("hello")], "max_tokens": 2}).encode()
    try:
        with ThreadPoolExecutor(12) as pool:
            asked = [
                pool.submit(served.raw, "POST", "/v1/chat/completions", body) for _ in range(12)
            ]
            time.sleep(1.0)
            # The connections are all held by requests with the key: a new one is told to
            # come back, in OpenAI's shape.
            with socket.create_connection(("127.0.0.1", served.address.port), timeout=5) as s:
                s.sendall(_head(served.key) + b"\r\n")
                late = _answer(s)
            release.set()
            results = [f.result() for f in asked]
    finally:
        release.set()
    statuses = [status for status, _body, _headers in results]
    assert _status(late) == 429 and b"retry-after: 5" in late.lower()
    assert _body(late)["error"]["type"] == "rate_limit_error"
    assert 503 not in statuses and statuses.count(200) >= 1
    for status, answer, headers in results:
        if status != 200:
            assert status == 429 and headers.get("retry-after") == "5", answer
            assert answer["error"]["code"] in ("queue_full", "server_overloaded")


HOSTILE_BODIES: list[tuple[bytes, str | None]] = [
    (b"[" * 100_000 + b"]" * 100_000, None),  # nested too deeply
    (json.dumps({"messages": [user("a")]}).encode(), "model"),  # OpenAI requires it (#59)
    (
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "seed": 1'
        + b"7" * 5000
        + b"}",
        None,
    ),
    (
        b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": 9'
        + b"9" * 5000
        + b"}",
        None,
    ),
    (json.dumps({"model": "m", "messages": [user("a")], "seed": 10**400}).encode(), "seed"),
    (json.dumps({"model": "m", "messages": [user("a")], "tools": 0}).encode(), "tools"),
    (json.dumps({"model": "m", "messages": [user("a")], "logprobs": 0}).encode(), "logprobs"),
    (
        json.dumps({"model": "m", "messages": [user("a")], "logit_bias": {"50": 10}}).encode(),
        "logit_bias",
    ),
    (
        json.dumps({"model": "m", "messages": [user("a")], "frequency_penalty": 0.5}).encode(),
        "frequency_penalty",
    ),
    (
        json.dumps({"model": "m", "messages": [user("a")], "presence_penalty": 1}).encode(),
        "presence_penalty",
    ),
    (
        json.dumps({"model": "m", "messages": [user("a")], "top_logprobs": 3}).encode(),
        "top_logprobs",
    ),
    (
        json.dumps(
            {"model": "m", "messages": [user("a")], "response_format": {"type": "xml"}}
        ).encode(),
        "response_format",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": [user("a")],
                "response_format": {"type": "json_schema", "json_schema": 3},
            }
        ).encode(),
        "response_format.json_schema.schema",
    ),
    (
        json.dumps(
            {"model": "m", "messages": [user("a")], "modalities": ["text", "audio"]}
        ).encode(),
        "modalities",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": [user("a")],
                "stream": True,
                "stream_options": {"include_usage": "no"},
            }
        ).encode(),
        "stream_options.include_usage",
    ),
    (json.dumps({"model": "m", "messages": [user("a")], "stop": "x" * 1_000_000}).encode(), "stop"),
    (
        json.dumps(
            {"model": "m", "messages": [user("a")], "stop": ["a", "b", "c", "d", "e"]}
        ).encode(),
        "stop",
    ),
]


def test_hostile_bodies_are_4xx_json_and_never_a_traceback(
    serve: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    served = serve()
    caplog.set_level(logging.WARNING)
    for body, param in HOSTILE_BODIES:
        started = time.monotonic()
        status, answer, headers = served.raw("POST", "/v1/chat/completions", body)
        assert status == 400, (body[:80], answer)
        assert headers.get("content-type") == "application/json"
        error = answer["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, body[:80]
        assert time.monotonic() - started < 5
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert served.lane.call(lambda c: c.list_conversations()) == []
    # Fields that change nothing are taken, and the reply has the spec's nullable refusal.
    fine = {
        "model": "m",
        "messages": [user("hello")],
        "max_tokens": 3,
        "n": 1,
        "logprobs": False,
        "user": "someone",
        "metadata": {"a": "b"},
        "store": False,
        "service_tier": "auto",
        "frequency_penalty": 0,
        "tool_choice": "none",
        "tools": [],
        "response_format": {"type": "text"},
    }
    status, answer, _headers = served.raw("POST", "/v1/chat/completions", json.dumps(fine).encode())
    assert status == 200, answer
    message = answer["choices"][0]["message"]
    assert message["refusal"] is None and message["annotations"] == []


@pytest.mark.parametrize(
    ("host", "network", "allowed"),
    [
        ("127.0.0.1", False, True),
        ("127.0.0.1:8080", False, True),
        ("localhost:8080", False, True),
        ("LOCALHOST", False, True),
        ("[::1]:8080", False, True),
        ("evil.example", False, False),
        ("evil.example:8080", False, False),
        ("127.0.0.1.evil.example", False, False),
        ("192.168.1.5:8080", False, False),
        ("192.168.1.5:8080", True, True),
        ("evil.example", True, False),  # a name that rebinds to this computer, even then
        ("", False, False),
        ("127.0.0.1:80:80", False, False),
        ("[::1", False, False),
    ],
)
def test_only_names_of_this_computer_are_accepted_as_host(
    host: str, network: bool, allowed: bool
) -> None:
    assert host_allowed(host, network) is allowed


def test_a_request_through_a_foreign_host_name_is_refused_even_with_the_key(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    for host, wanted in (("evil.example", 403), (f"localhost:{served.address.port}", 200)):
        with socket.create_connection(("127.0.0.1", served.address.port), timeout=5) as sock:
            sock.sendall(_head(served.key, host) + b"Connection: close\r\n\r\n")
            answer = _answer(sock)
        assert _status(answer) == wanted, answer
    assert _body(answer)["object"] == "list"


def test_a_history_that_cannot_fit_is_refused_before_any_of_it_is_read(
    serve: Callable[..., Served],
    make_fake_core: Callable[..., Galahad],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[str] = []
    real_read = StatelessChats._read_pair

    def counted(self: StatelessChats, *args: Any) -> None:
        read.append("pair")
        real_read(self, *args)

    monkeypatch.setattr(StatelessChats, "_read_pair", counted)
    history = [
        user("hi") if i % 2 == 0 else {"role": "assistant", "content": "ok"} for i in range(10_001)
    ]
    served = serve()
    started = time.monotonic()
    status, answer, _ = served.raw(
        "POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": history}).encode()
    )
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert time.monotonic() - started < 10 and read == []
    assert served.lane.call(lambda c: c.list_conversations()) == []
    # The same check through the core: a history that fits is still read and answered.
    core = served.core
    with pytest.raises(InputError, match="context_length_exceeded"):
        served.lane.call(
            lambda c: c.complete_chat([ChatMessage("user", "word " * 100_000)], max_tokens=4)
        )
    done = served.lane.call(
        lambda c: c.complete_chat(
            [ChatMessage("user", "a"), ChatMessage("assistant", "b"), ChatMessage("user", "c")],
            max_tokens=4,
        )
    )
    assert read == ["pair"] and done.text and core.list_conversations()


def test_stop_texts_match_across_pieces_with_overlapping_prefixes() -> None:
    overlapping = StopTexts(["aab"])
    assert [p for piece in "aaab" for p in overlapping.feed(piece)] == ["a"]
    assert overlapping.hit
    repeated = StopTexts(["abab"])
    assert repeated.feed("xaba") == ["x"] and repeated.feed("bab") == [] and repeated.hit
    two = StopTexts(["bc", "abcd"])
    assert two.feed("zabcd") == ["za"]  # the first stop text to end ends the reply
    long_stop = "ab" * 500
    held = StopTexts([long_stop])
    shown = [p for _ in range(2000) for p in held.feed("ab" * 4 + "c")]
    assert "".join(shown) == ("ab" * 4 + "c") * 2000 and not held.hit
