"""The local OpenAI-compatible server (fast tier: the fake engine behind the real core,
server, uvicorn and the official `openai` client; the real model is in test_server_model)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from galahad_desktop.engine.decoding import StopTexts
from galahad_desktop.errors import IntegrityError
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import ChatMessage
from galahad_desktop.server.app import Limits
from galahad_desktop.server.running import check_host
from tests.served import Served


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_openai_client_lists_completes_and_streams(serve: Callable[..., Served]) -> None:
    served = serve()
    models = served.client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    plain = served.client.chat.completions.create(
        model="any",
        messages=[{"role": "system", "content": "Be brief."}, user("Hello")],
        max_tokens=12,
    )
    reply = plain.choices[0].message.content
    assert reply and plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage is not None and plain.usage.completion_tokens > 0
    assert plain.usage.prompt_tokens_details is not None
    assert plain.usage.prompt_tokens_details.cached_tokens == 0  # nothing was stored yet
    history = [{"role": "system", "content": "Be brief."}, user("Hello"), assistant(reply)]
    stream = served.client.chat.completions.create(
        model="any",
        messages=[*history, user("And then?")],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert finish in ("stop", "length")
    assert usage is not None and usage.prompt_tokens_details is not None
    # The first turn was still in the context: only the new message was read.
    assert usage.prompt_tokens_details.cached_tokens >= plain.usage.prompt_tokens
    conversations = [c for c in served.core.list_conversations() if c.origin == "api"]
    assert len(conversations) == 1 and conversations[0].n_messages == 4
    stored = served.core.messages(conversations[0].id)
    assert stored[-1].text == "".join(pieces)  # what streamed is what was stored


def test_history_survives_a_restart_and_is_grafted(
    make_fake_core: Callable[..., Galahad], tmp_path: Path
) -> None:
    core = make_fake_core()
    first = core.complete_chat([ChatMessage("user", "Tell me about owls.")], max_tokens=10)
    second = core.complete_chat(
        [
            ChatMessage("user", "Tell me about owls."),
            ChatMessage("assistant", first.text),
            ChatMessage("user", "And their eyes?"),
        ],
        max_tokens=10,
    )
    core.close()
    again = make_fake_core()
    history = [
        ChatMessage("user", "Tell me about owls."),
        ChatMessage("assistant", first.text),
        ChatMessage("user", "And their eyes?"),
        ChatMessage("assistant", second.text),
    ]
    third = again.complete_chat([*history, ChatMessage("user", "Why?")], max_tokens=10)
    assert third.conversation_id == first.conversation_id == second.conversation_id
    assert third.matched_turns == 2
    assert third.turn.graft is not None and third.turn.graft.proof.verdict == "exact"
    # Everything before the new message came from the stored block, not a re-read.
    assert third.cached_tokens >= second.prompt_tokens + second.completion_tokens
    assert third.read_tokens < 20
    # The same history sent to a fresh store is read in full and answers the same.
    fresh = make_fake_core(data=tmp_path / "fresh")
    reread = fresh.complete_chat([*history, ChatMessage("user", "Why?")], max_tokens=10)
    assert reread.cached_tokens == 0 and reread.read_tokens >= third.cached_tokens
    assert reread.text == third.text


def test_an_api_conversation_a_crash_left_empty_is_gone_at_the_next_start(
    make_fake_core: Callable[..., Galahad],
) -> None:
    core = make_fake_core()
    answered = core.complete_chat([ChatMessage("user", "Tell me about owls.")], max_tokens=6)
    left = core.stateless._create("You are terse.")  # what a request killed mid-read leaves
    mine = core.new_conversation()  # the person's own new chat, empty for now
    core.close()
    again = make_fake_core()
    ids = {c.id for c in again.list_conversations()}
    assert left not in ids and {answered.conversation_id, mine} <= ids
    assert again.start_notes() == ["Removed 1 empty API conversation a crash left."]
    assert again.audit().problems == []


def test_a_history_that_leaves_a_stored_one_continues_in_a_copy(
    make_fake_core: Callable[..., Galahad],
) -> None:
    core = make_fake_core()
    first = core.complete_chat([ChatMessage("user", "One")], max_tokens=6)
    core.complete_chat(
        [
            ChatMessage("user", "One"),
            ChatMessage("assistant", first.text),
            ChatMessage("user", "Two"),
        ],
        max_tokens=6,
    )
    before = [m.text for m in core.messages(first.conversation_id)]
    other = core.complete_chat(
        [
            ChatMessage("user", "One"),
            ChatMessage("assistant", first.text),
            ChatMessage("user", "Three"),
        ],
        max_tokens=6,
    )
    assert other.conversation_id != first.conversation_id
    assert other.matched_turns == 1 and other.cached_tokens > 0
    assert [m.text for m in core.messages(first.conversation_id)] == before  # untouched
    assert [m.text for m in core.messages(other.conversation_id)][:2] == before[:2]
    # Turns nobody stored are read once: the next call finds them.
    unknown = [ChatMessage("user", "Elsewhere"), ChatMessage("assistant", "A reply we wrote")]
    read = core.complete_chat([*unknown, ChatMessage("user", "Go on")], max_tokens=6)
    assert read.matched_turns == 0 and read.cached_tokens == 0
    core.close()
    core = make_fake_core()
    found = core.complete_chat([*unknown, ChatMessage("user", "Something else")], max_tokens=6)
    assert found.matched_turns == 1 and found.cached_tokens > 0
    origins = {c.id: c.origin for c in core.list_conversations()}
    assert set(origins.values()) == {"api"}


def test_the_index_is_sealed_and_forgotten_with_its_conversation(
    make_fake_core: Callable[..., Galahad],
) -> None:
    core = make_fake_core()
    done = core.complete_chat([ChatMessage("user", "Hi")], max_tokens=6)
    history = [ChatMessage("user", "Hi"), ChatMessage("assistant", done.text)]
    catalog = core.vault.catalog
    (row,) = catalog.select("api_prefixes")
    catalog.update("api_prefixes", row["id"], {"seq": 0})  # edited on disk
    with pytest.raises(IntegrityError, match="API history"):
        core.complete_chat([*history, ChatMessage("user", "Again")], max_tokens=6)
    assert any("API history" in p for p in core.audit().problems)
    catalog.update("api_prefixes", row["id"], {"seq": row["seq"]})
    assert not core.audit().problems
    core.forget(done.conversation_id)
    assert catalog.select("api_prefixes") == []
    assert not core.audit().problems


def test_stop_texts_are_held_back_and_end_the_reply() -> None:
    held = StopTexts(["END", "\n\n"])
    shown = [
        p for piece in ("Hello E", "N", "and more", " E", "ND after") for p in held.feed(piece)
    ]
    assert "".join(shown) == "Hello ENand more " and held.hit
    assert held.feed("late") == [] and held.flush() == []
    open_end = StopTexts(["STOP"])
    assert "".join(open_end.feed("ends with ST")) == "ends with "
    assert open_end.flush() == ["ST"]  # never became a stop text: shown at the end
    assert StopTexts([]).feed("x") == ["x"]


def test_stop_ends_a_reply_through_the_api(serve: Callable[..., Served]) -> None:
    served = serve()

    def ask(prompt: str, **extra: Any) -> Any:
        return served.client.chat.completions.create(
            model="m", messages=[user(prompt)], max_tokens=24, temperature=0, **extra
        ).choices[0]

    prompt, free = next(
        (p, text)
        for p in (f"Count to {n}" for n in range(40))
        if len(text := ask(p).message.content or "") > 4
    )
    cut = ask(prompt, stop=[free[2:4]])
    assert cut.message.content == free[: free.index(free[2:4])]
    assert cut.finish_reason == "stop"


def test_keys_authenticate_and_are_never_logged(
    serve: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    served = serve()
    caplog.set_level(logging.INFO, logger="galahad.server.access")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.address.base_url, api_key="gk-wrong").models.list()
    status, body, headers = served.raw("GET", "/v1/models", key="")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert headers.get("www-authenticate") == "Bearer"
    served.client.chat.completions.create(model="m", messages=[user("private words")], max_tokens=4)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "POST /v1/chat/completions 200" in logged and "GET /v1/models 401" in logged
    assert served.key not in logged and "gk-wrong" not in logged and "private" not in logged
    old = served.key
    served.key = served.lane.call(lambda c: c.api_key(rotate=True))
    assert served.key != old and served.lane.call(lambda c: c.api_key()) == served.key
    assert served.raw("GET", "/v1/models", key=old)[0] == 401
    assert served.raw("GET", "/v1/models")[0] == 200


# A valid 1×1 PNG as a data URL: parsed, then refused by the text-only model (no projector).
PNG_1PX = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNgYGAA"
    "AAAEAAH2FzhVAAAAAElFTkSuQmCC"
)
BAD_REQUESTS: list[tuple[bytes, str | None]] = [
    (
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": PNG_1PX}},
                        ],
                    }
                ],
            }
        ).encode(),
        None,
    ),
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"model": "m", "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
    (
        json.dumps({"model": "m", "messages": [{"role": "tool", "content": "x"}]}).encode(),
        "messages[0].tool_call_id",
    ),
    (
        json.dumps({"model": "m", "messages": [{"role": "robot", "content": "x"}]}).encode(),
        "messages[0].role",
    ),
    (
        json.dumps({"model": "m", "messages": [{"role": "user", "content": 5}]}).encode(),
        "messages[0].content",
    ),
    (json.dumps({"model": "m", "messages": [{"role": "user"}]}).encode(), "messages[0].content"),
    (json.dumps({"model": "m", "messages": [user("a"), assistant("b")]}).encode(), None),
    (
        json.dumps({"model": "m", "messages": [user("a")], "temperature": "hot"}).encode(),
        "temperature",
    ),
    (json.dumps({"model": "m", "messages": [user("a")], "temperature": 9}).encode(), "temperature"),
    (json.dumps({"model": "m", "messages": [user("a")], "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({"model": "m", "messages": [user("a")], "seed": -1}).encode(), "seed"),
    (json.dumps({"model": "m", "messages": [user("a")], "stop": [1]}).encode(), "stop"),
    (json.dumps({"model": "m", "messages": [user("a")], "stream": "yes"}).encode(), "stream"),
    (json.dumps({"model": "m", "messages": [user("a")], "n": 2}).encode(), "n"),
    (
        json.dumps(
            {"model": "m", "messages": [user("a")], "tools": [{"type": "function"}]}
        ).encode(),
        "tools[0]",
    ),
    (
        json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
        ).encode(),
        "messages[0].content[0]",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
                        ],
                    }
                ],
            }
        ).encode(),
        "messages[0].content[0]",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AA=="},
                            }
                        ],
                    },
                    user("a"),
                ],
            }
        ).encode(),
        "messages[0].content",
    ),
    (
        json.dumps(
            {"model": "m", "messages": [user("a"), {"role": "system", "content": "late"}]}
        ).encode(),
        None,
    ),
    (json.dumps({"model": "m", "messages": [user("bad \udcff")]}).encode(), None),
]


def test_bad_requests_are_400_and_change_nothing(serve: Callable[..., Served]) -> None:
    served = serve()
    for body, param in BAD_REQUESTS:
        status, answer, _headers = served.raw("POST", "/v1/chat/completions", body)
        assert status == 400, (body, answer)
        error = answer["error"]
        assert error["type"] == "invalid_request_error" and error["message"], body
        assert error["param"] == param, (body, error)
    assert served.lane.call(lambda c: c.list_conversations()) == []


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_limits_answer_in_openais_terms(serve: Callable[..., Served]) -> None:
    served = serve(limits=Limits(max_body_bytes=2_000, body_timeout_s=0.5, queue_limit=1))
    big = json.dumps({"model": "m", "messages": [user("x" * 5_000)]}).encode()
    assert served.raw("POST", "/v1/chat/completions", big)[0] == 413
    assert served.raw("GET", "/v1/nowhere")[0] == 404
    assert served.raw("DELETE", "/v1/models")[0] == 405
    # A client that sends half a body and stalls is cut off.
    with socket.create_connection(("127.0.0.1", served.address.port), timeout=5) as slow:
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {served.key}\r\n".encode()
            + b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mess'
        )
        assert b" 408 " in slow.recv(4096).split(b"\r\n")[0] + b" "
    # The model is busy with one request: the next is told to come back.
    release = threading.Event()
    served.lane.submit("busy", lambda core: release.wait(10), threading.Event())
    try:
        status, body, headers = served.raw(
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "m", "messages": [user("a")]}).encode(),
        )
        assert status == 429 and body["error"]["type"] == "rate_limit_error"
        assert headers.get("retry-after") == "5"
    finally:
        release.set()


@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_a_client_that_leaves_cancels_its_request(serve: Callable[..., Served]) -> None:
    served = serve()
    release = threading.Event()
    served.lane.submit("busy", lambda core: release.wait(10), threading.Event())
    body = json.dumps({"model": "m", "messages": [user("never answered")]}).encode()
    with socket.create_connection(("127.0.0.1", served.address.port), timeout=5) as leaving:
        leaving.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {served.key}\r\n".encode()
            + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 5
        while served.lane.waiting() < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert served.lane.waiting() == 2  # queued behind the busy one
    time.sleep(0.6)  # the server notices the closed connection
    release.set()
    assert served.lane.call(lambda c: c.list_conversations()) == []  # it never ran


def test_the_server_answers_loopback_only_unless_asked() -> None:
    assert check_host("127.0.0.1", False) == "127.0.0.1"
    assert check_host("::1", False) == "::1"
    with pytest.raises(Exception, match="--allow-network"):
        check_host("0.0.0.0", False)
    assert check_host("0.0.0.0", True) == "0.0.0.0"
    with pytest.raises(Exception, match="not an IP address"):
        check_host("localhost; rm", False)


def test_a_system_prompt_and_a_pasted_document_are_read_once_across_requests(
    make_fake_core: Callable[..., Galahad], tmp_path: Path
) -> None:
    # Gemma 3 folds a system prompt into the first user turn: its block ends inside it.
    core = make_fake_core()
    words = "You are the harbour master's assistant. Answer in one short sentence. " * 3
    doc = "The north pier serves ferries and the south pier serves fishing boats. " * 6
    first = core.complete_chat(
        [ChatMessage("system", words), ChatMessage("user", "Hello")], max_tokens=6
    )
    other = core.complete_chat(
        [ChatMessage("system", words), ChatMessage("user", "Where do ferries go?")],
        max_tokens=6,
    )
    assert first.cached_tokens == 0 and other.conversation_id != first.conversation_id
    assert other.cached_tokens > 40 and other.turn.graft is not None
    assert other.turn.graft.proof.verdict == "exact"
    assert other.cached_tokens + other.read_tokens >= other.prompt_tokens
    pasted = [ChatMessage("system", words), ChatMessage("user", doc + "\n\nHow many piers?")]
    read = core.complete_chat(pasted, max_tokens=6)
    assert read.cached_tokens == other.cached_tokens  # the system prompt, not the document
    core.close()
    core = make_fake_core()  # after a restart, another question on the same document
    asked = [ChatMessage("system", words), ChatMessage("user", doc + "\n\nWho uses it?")]
    again = core.complete_chat(asked, max_tokens=6)
    assert again.cached_tokens > 300 and again.read_tokens < 30
    # The same request to a fresh store reads it all and answers the same.
    fresh = make_fake_core(data=tmp_path / "fresh").complete_chat(asked, max_tokens=6)
    assert fresh.cached_tokens == 0 and fresh.text == again.text
    assert b"north pier" not in (core.data_dir / "catalog.sqlite").read_bytes()
    assert core.vault.catalog.count("prompts") == 2 and not core.audit().problems
    assert all(v.proof == "exact" for v in core.verify())
    # Forgetting the conversations that began so forgets the prompts' blocks.
    for conversation in core.list_conversations():
        core.forget(conversation.id)
    assert core.vault.catalog.count("prompts") == 0 and core.vault.catalog.count("blocks") == 0


def test_a_first_message_shares_only_up_to_its_last_paragraph_break(
    make_fake_core: Callable[..., Galahad],
) -> None:
    core = make_fake_core()
    doc = "Tides are measured at the harbour mouth every hour of the day. " * 6
    done = core.complete_chat([ChatMessage("user", doc + "\n\nWhen?")], max_tokens=4)
    assert core.vault.catalog.count("prompts") == 1
    # No paragraph break after the document: nothing to share, nothing stored for it.
    whole = core.complete_chat([ChatMessage("user", doc + " When?")], max_tokens=4)
    assert whole.cached_tokens == 0 and core.vault.catalog.count("prompts") == 1
    assert done.conversation_id != whole.conversation_id
