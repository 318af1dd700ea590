"""A device server that goes away (fast tier): the calls of a model on it fail instead of
waiting for ever, a reply it cuts keeps what was streamed, and the turn goes on with an
engine loaded again without it. The same, on llama.cpp's real RPC backend with a real
`galahad serve-device` killed mid-reply and while idle: tests/test_hardware.py."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from galahad_desktop.engine.decoding import Generation, StopRules, decode_reply
from galahad_desktop.engine.device_guard import NativeThread, lost_servers
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.values import EngineConfig
from galahad_desktop.errors import DeviceLostError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import TurnResult
from galahad_desktop.vault.keys import MemoryKeyStore
from galahad_dev.fake_engine import FakeEngine


def _server() -> str:
    return f"test-{uuid.uuid4().hex[:8]}:1"  # lost servers are kept for the whole process


def test_calls_on_the_device_thread_return_and_raise_as_if_made_here() -> None:
    native = NativeThread((_server(),))
    try:
        assert native.call(lambda a, b: (a + b, threading.current_thread().name), 2, 3) == (
            5,
            "galahad-device",
        )
        with pytest.raises(ZeroDivisionError):
            native.call(lambda: 1 / 0)
        # A call made inside a call runs where it is (no deadlock on the one thread).
        assert native.call(lambda: native.call(lambda: "inner")) == "inner"
    finally:
        native.close()


def test_a_lost_device_fails_the_waiting_call_and_every_later_one() -> None:
    server = _server()
    native = NativeThread((server,))
    never = threading.Event()  # a llama.cpp call waiting on a dispatcher that is gone
    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            native.call(never.wait)
        except BaseException as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=caller)
    waiting.start()
    native.lose("The device server went away.")
    waiting.join(timeout=5)
    assert not waiting.is_alive(), "the caller still waits on the lost device"
    assert isinstance(outcome[0], DeviceLostError) and "went away" in str(outcome[0])
    with pytest.raises(DeviceLostError):
        native.call(lambda: "never run")
    freed: list[str] = []
    native.release(freed.append, "model")  # freeing would talk to the server: skipped
    assert not freed and server in lost_servers()
    native.close()
    never.set()


class _Losing:
    """A model whose device goes away while the reply's fourth token is evaluated."""

    def __init__(self) -> None:
        self.evaluated: list[int] = []

    def last_logits(self) -> np.ndarray:
        logits = np.zeros(300, dtype=np.float32)
        logits[ord("a") + len(self.evaluated)] = 10.0
        return logits

    def accept(self, token: int) -> None:
        if len(self.evaluated) == 3:
            raise DeviceLostError("The device server at 127.0.0.1:9 went away.")
        self.evaluated.append(token)

    def token_bytes(self, token: int) -> bytes:
        return bytes([token])

    def room(self) -> int:
        return 1000


def test_a_reply_cut_by_a_lost_device_ends_with_what_was_streamed() -> None:
    streamed: list[str] = []
    model = _Losing()
    rules = StopRules(lambda t: False, frozenset(), frozenset())
    params = SamplingParams(temperature=0.0, max_tokens=20, seed=1)
    generation = decode_reply(model, rules, params, Job(on_text=streamed.append))
    assert generation.stop_reason == "device_lost"
    assert generation.tokens == model.evaluated == [ord("a"), ord("b"), ord("c")]
    assert generation.text == "".join(streamed) == "abc"  # the failed token never shown
    assert "went away" in generation.problem
    with pytest.raises(DeviceLostError):
        generation.check_device()


class _EngineOnALostDevice(FakeEngine):
    """The fake engine on a device server that goes away: while the reply's fourth token is
    evaluated ("mid-reply"), or while the next message is read ("before")."""

    def __init__(self, config: EngineConfig, when: str) -> None:
        self.server = _server()
        super().__init__(dataclasses.replace(config, rpc_servers=(self.server,)))
        self.when = when
        self.armed = False  # the test arms it after the first turn
        self.reply_tokens = 0

    def _lose(self) -> None:
        native = NativeThread((self.server,))
        native.lose(f"The device server at {self.server} went away.")
        native.close()
        raise DeviceLostError(native.lost)

    def generate(self, params: SamplingParams, job: Job = NO_JOB) -> Generation:
        self.reply_tokens = 0
        return super().generate(params, job)

    def accept(self, token: int) -> None:
        if self.armed and self.when == "mid-reply" and self.reply_tokens == 3:
            self._lose()
        self.reply_tokens += 1
        super().accept(token)

    def evaluate(self, tokens: Sequence[int], job: Job = NO_JOB) -> float:
        if self.armed and self.when == "before":
            self._lose()
        return super().evaluate(tokens, job)


def _core(
    tmp_path: Path, when: str, keys: MemoryKeyStore | None = None
) -> tuple[Galahad, list[ChatEngine]]:
    made: list[ChatEngine] = []

    def factory(config: EngineConfig, cache: Path | None) -> ChatEngine:
        engine = _EngineOnALostDevice(config, when) if not made else FakeEngine(config, cache)
        made.append(engine)
        return engine

    core = Galahad(
        tmp_path / "data",
        model_path=tmp_path / "fake-gemma3.gguf",
        keystore=keys or MemoryKeyStore(),
        overrides={"n_ctx": 2048, "temperature": 0.0, "max_tokens": 12},
        engine_factory=factory,
    )
    return core, made


def _lose_on_the_second_turn(
    core: Galahad, made: list[ChatEngine], text: str
) -> tuple[TurnResult, TurnResult, list[str]]:
    """A first turn on the device, then the device goes away during the second."""
    first = core.send(None, "hello")
    assert isinstance(made[0], _EngineOnALostDevice)
    made[0].armed = True
    streamed: list[str] = []
    second = core.send(first.conversation_id, text, Job(on_text=streamed.append))
    return first, second, streamed


def _stored_replies(core: Galahad, conversation_id: str) -> list[str]:
    return [m.text for m in core.messages(conversation_id) if m.role == "model"]


def test_a_turn_cut_by_a_lost_device_is_kept_and_the_next_runs_on_another_engine(
    tmp_path: Path,
) -> None:
    keys = MemoryKeyStore()
    core, made = _core(tmp_path, "mid-reply", keys)
    try:
        first, cut, streamed = _lose_on_the_second_turn(core, made, "tell me more")
        assert cut.stop_reason == "device_lost" and "went away" in cut.notice
        assert cut.counters.generated_tokens == 3
        assert cut.context_tokens > first.context_tokens + 3  # nothing before it dropped
        assert cut.reply == "".join(streamed)
        assert _stored_replies(core, first.conversation_id)[1] == cut.reply
        assert len(made) == 2 and core.engine is made[1]  # loaded again
        third = core.send(first.conversation_id, "and then?")
        assert third.stop_reason != "device_lost" and not third.notice
    finally:
        core.close()
    again, _made = _core(tmp_path, "never", keys)
    try:
        report = again.resume(first.conversation_id)
        assert report.proof.verdict == "exact"
        assert cut.context_tokens < report.restored_tokens <= third.context_tokens
    finally:
        again.close()


def test_a_device_lost_before_the_reply_is_answered_on_another_engine(tmp_path: Path) -> None:
    core, made = _core(tmp_path, "before")
    try:
        first, second, streamed = _lose_on_the_second_turn(core, made, "go on")
        assert second.stop_reason != "device_lost" and "went away" in second.notice
        assert second.reply == "".join(streamed)  # streamed once, from the new engine
        assert len(made) == 2 and core.engine is made[1]
        assert len(_stored_replies(core, first.conversation_id)) == 2
    finally:
        core.close()
