"""`galahad serve` with the real Gemma 3 model and the real keyring, driven by the official
`openai` client as an editor or a script would: plain and streamed replies, a restart that
grafts the history instead of re-reading it, the key kept out of every file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.helpers import cli_command, run_cli

pytestmark = [pytest.mark.model, pytest.mark.keyring, pytest.mark.usefixtures("real_keyring")]


class Server:
    """`galahad serve --json` in its own process."""

    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            cli_command("serve", "--port", "0", "--json", data_dir=data_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(180)
        if not line or not line[0].strip():
            self.proc.kill()
            raise AssertionError(f"serve did not start: {self.proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        ready: dict[str, Any] = json.loads(line[0])
        assert set(ready) == {"base_url", "api_key"}
        assert ready["base_url"].startswith("http://127.0.0.1:")
        self.key: str = ready["api_key"]
        self.client = openai.OpenAI(base_url=ready["base_url"], api_key=self.key, timeout=120)

    def chat(self, messages: list[dict[str, str]], **extra: Any) -> Any:
        return self.client.chat.completions.create(
            model="gemma", messages=messages, max_tokens=16, temperature=0, **extra
        )

    def stop(self) -> tuple[int, str]:
        """Ctrl+C, as a user stops it."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(30)
        return code, self.proc.stderr.read()  # type: ignore[union-attr]


@pytest.fixture()
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def test_serve_remembers_the_history_across_a_restart(
    tmp_path: Path, servers: list[Server]
) -> None:
    data = tmp_path / "data"
    server = Server(data)
    servers.append(server)
    history = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "The secret word is marmalade. What is a lighthouse?"},
    ]
    first = server.chat(history)
    history.append({"role": "assistant", "content": first.choices[0].message.content})
    history.append({"role": "user", "content": "And what is a harbour?"})
    pieces, usage = [], None
    for chunk in server.chat(history, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    second = "".join(pieces)
    assert second.strip() and usage is not None
    assert usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=str(server.client.base_url), api_key="gk-nope").models.list()
    code, stderr = server.stop()
    assert code == 0 and "Server stopped" in stderr
    assert server.key not in stderr and "lighthouse" not in stderr
    # Nothing of the chat, and not the key, is on disk in plain text.
    for path in data.rglob("*"):
        if path.is_file():
            raw = path.read_bytes()
            for secret in (b"marmalade", b"lighthouse", server.key.encode()):
                assert secret not in raw, f"{secret!r} in {path}"

    again = Server(data)
    servers.append(again)
    assert again.key == server.key  # kept in the keyring
    history.append({"role": "assistant", "content": second})
    history.append({"role": "user", "content": "Which word was secret?"})
    restored = again.chat(history)
    cached = restored.usage.prompt_tokens_details.cached_tokens
    assert cached >= usage.prompt_tokens + usage.completion_tokens  # the history, grafted
    assert restored.usage.prompt_tokens - cached < 40  # only the new message was read
    _json_replies_validate_and_are_remembered(again)
    _code, log = again.stop()
    # One line per request and nothing of one (issue #60 item 13: llama.cpp's grammar dump,
    # the schema's field names with it, reached the log).
    requests = [line for line in log.splitlines() if " /v1/" in line]
    assert len(requests) == 3, log[-2000:]
    for word in ("population", "root ::=", "secret", "harbour"):
        assert word not in log, f"{word!r} in the server's log"
    # The same history sent to a server that never saw it is read in full: same reply.
    _a_fresh_server_reads_it_all_and_says_the_same(tmp_path, servers, history, restored)
    shown = run_cli("serve", "--show-key", data_dir=data).stdout.strip()
    assert shown == server.key
    rotated = run_cli("serve", "--rotate-key", data_dir=data).stdout.strip()
    assert rotated != server.key and rotated.startswith("gk-")
    listed = json.loads(run_cli("--json", "list", data_dir=data).stdout)
    assert any(c.get("origin") == "api" for c in listed["conversations"])


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def _json_replies_validate_and_are_remembered(server: Server) -> None:
    """`response_format` json_schema on the real model, held by llama.cpp's grammar: the
    reply validates, and a follow-up finds it stored like any reply."""
    asked = [{"role": "user", "content": "Name a large city and its population."}]
    answer = server.client.chat.completions.create(
        model="gemma",
        messages=asked,
        max_tokens=96,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}},
    )
    text = answer.choices[0].message.content or ""
    assert answer.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), CITY)
    follow = server.chat(
        [*asked, {"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    )
    assert follow.usage.prompt_tokens_details.cached_tokens >= answer.usage.prompt_tokens


def test_a_system_prompt_and_a_pasted_document_are_read_once_by_the_server(
    tmp_path: Path, servers: list[Server]
) -> None:
    server = Server(tmp_path / "data")
    servers.append(server)
    words = "You are the harbour master's assistant. Answer in one short sentence, politely. "
    doc = "The harbour of Port Elling has three piers; ferries use the north pier. " * 25
    system = {"role": "system", "content": words * 3}
    hello = server.chat([system, {"role": "user", "content": "Hello"}])
    other = server.chat([system, {"role": "user", "content": "Who are you?"}])
    assert hello.usage.prompt_tokens_details.cached_tokens == 0
    shared = other.usage.prompt_tokens_details.cached_tokens
    assert shared >= 40  # the folded system prompt, grafted from its own block
    question = [system, {"role": "user", "content": doc + "\n\nHow many piers are there?"}]
    server.chat(question)
    server.stop()
    again = Server(tmp_path / "data")
    servers.append(again)
    asked = [system, {"role": "user", "content": doc + "\n\nWhich pier do ferries use?"}]
    answer = again.chat(asked)
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert cached >= 400 and answer.usage.prompt_tokens - cached < 30  # the document too
    again.stop()
    _a_fresh_server_reads_it_all_and_says_the_same(tmp_path, servers, asked, answer)
    checked = json.loads(run_cli("--json", "verify", "--all", data_dir=tmp_path / "data").stdout)
    assert checked["ok"] and {v["kind"] for v in checked["results"]} >= {"prompt"}


def test_serve_refuses_a_network_address_without_the_flag_and_a_port_that_is_not_one(
    tmp_path: Path,
) -> None:
    proc = run_cli("serve", "--host", "0.0.0.0", data_dir=tmp_path / "data", check=False)
    assert proc.returncode == 4 and "--allow-network" in proc.stderr
    assert "Traceback" not in proc.stderr
    for port in ("70000", "-1"):  # not ports: named, exit 4 (was "Internal error", 70)
        proc = run_cli("serve", "--port", port, data_dir=tmp_path / "data", check=False)
        assert proc.returncode == 4 and f"--port {port} is not a port number" in proc.stderr


def _a_fresh_server_reads_it_all_and_says_the_same(
    tmp_path: Path, servers: list[Server], messages: list[Any], reply: Any
) -> None:
    """The same messages sent to a server that never saw them are read in full, and the
    reply is the same as the one that came from memory."""
    fresh = Server(tmp_path / "fresh")
    servers.append(fresh)
    reread = fresh.chat(messages)
    assert reread.usage.prompt_tokens_details.cached_tokens == 0
    assert reread.choices[0].message.content == reply.choices[0].message.content
    fresh.stop()
