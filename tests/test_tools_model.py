"""Gemma 4's tool syntax and grammar-held replies on the real llama.cpp and the Gemma 4 test
model (which carries the published Gemma 4 chat template)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import jsonschema
import pytest

from galahad_desktop.engine import gguf
from galahad_desktop.engine.engine import Engine
from galahad_desktop.engine.grammar import json_grammar, tool_call_grammar
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.tool_format import (
    MARKER_TEXTS,
    calls,
    declarations,
    read_calls,
    results,
    to_tokens,
)
from galahad_desktop.engine.values import EngineConfig
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import ChatMessage, ReplyShape, Tool, ToolCall
from galahad_desktop.vault.keys import MemoryKeyStore
from tests.helpers import TEST_OVERRIDES
from tests.served import Served

pytestmark = pytest.mark.model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather now",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "A city"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                    "days": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "opts": {
                        "type": "object",
                        "properties": {"deep": {"type": "boolean"}},
                        "required": ["deep"],
                    },
                    "maybe": {"type": "number", "nullable": True},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "noargs", "description": "", "parameters": {}}},
    {
        "type": "function",
        "function": {
            "name": "rows",
            "description": "x",
            "parameters": {
                "type": "object",
                "properties": {
                    "rows": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"a": {"type": "string"}},
                            "required": ["a"],
                        },
                    }
                },
            },
        },
    },
]
ARGUMENTS = {"city": "Paris", "days": 3, "opts": {"deep": True}, "tags": ["a", "b"], "maybe": 1.5}


@pytest.fixture(scope="module")
def engine(gemma4_path: Path) -> Iterator[Engine]:
    opened = Engine(EngineConfig(gemma4_path, n_ctx=2048))
    yield opened
    opened.close()


def _shown(engine: Engine, pieces: list[str | int]) -> str:
    return "".join(
        p if isinstance(p, str) else engine.model.piece(p, True).decode() for p in pieces
    )


def test_tool_syntax_is_the_model_s_own_template_s(engine: Engine, gemma4_path: Path) -> None:
    """Declarations, a call and its result written here are, character for character and
    token for token, what the GGUF's chat template renders."""
    template_text = gguf.read_metadata(gemma4_path)["tokenizer.chat_template"]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    rendered = env.from_string(template_text).render(
        messages=[
            {"role": "system", "content": "SYS"},
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ARGUMENTS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 15"},
            {"role": "assistant", "content": "It is sunny."},
        ],
        tools=TOOLS,
        add_generation_prompt=False,
        bos_token="",
    )
    markers = engine.tool_markers
    assert markers is not None
    assert [markers.tool_open, markers.call_open, markers.quote] == [46, 48, 52]
    declared = declarations(
        markers,
        [
            (t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in TOOLS
        ],  # type: ignore[index]
    )
    system = rendered[rendered.index("SYS") + 3 : rendered.index("<turn|>")]
    assert _shown(engine, declared) == system
    turn = calls(markers, [("get_weather", ARGUMENTS)]) + results(
        markers, [("get_weather", "sunny, 15")]
    )
    model_turn = rendered[rendered.index("<|turn>model\n") + len("<|turn>model\n") :]
    assert model_turn == _shown(engine, turn) + "It is sunny.<turn|>\n"
    # As tokens: the template's text tokenized with its markers honoured (the words here
    # hold no markup) is what to_tokens builds with the markers placed by id.
    for pieces, text in ((declared, system), (turn, model_turn[: -len("It is sunny.<turn|>\n")])):
        assert to_tokens(pieces, engine.encode_text) == engine.encode_template(text)
    assert all(engine.encode_template(m) != [] for m in MARKER_TEXTS)


def test_the_grammar_makes_the_test_model_call_a_tool_and_write_json(engine: Engine) -> None:
    """A random-weight model, held by llama.cpp's grammar sampler: a call whose arguments
    validate, read back from token ids; a JSON document that validates."""
    markers = engine.tool_markers
    assert markers is not None
    parameters: dict[str, Any] = TOOLS[0]["function"]["parameters"]  # type: ignore[index]
    prompt = engine.turns.start("") + engine.turns.user_turn("Weather in Paris?")
    engine.reset()
    engine.evaluate(prompt)
    snapshot = engine.snapshot()
    grammar = tool_call_grammar(
        [("get_weather", parameters)], (markers.call_open, markers.call_close, 52), False
    )
    for seed in (1, 2):
        engine.resume(snapshot)
        generation = engine.generate(
            SamplingParams(temperature=0.8, max_tokens=200, grammar=grammar, seed=seed)
        )
        assert generation.stop_reason == "end", generation.tokens
        found, outside = read_calls(
            generation.tokens, markers, lambda t: engine.model.piece(t, True).decode()
        )
        assert [name for name, _ in found] == ["get_weather"] and outside == []
        jsonschema.validate(found[0][1], parameters)
        assert generation.text == ""  # a call's text is never streamed as the answer
    engine.resume(snapshot)
    generation = engine.generate(
        SamplingParams(temperature=0.8, max_tokens=200, grammar=json_grammar(parameters), seed=3)
    )
    assert generation.stop_reason == "end"
    jsonschema.validate(json.loads(generation.text), parameters)


def test_a_tool_loop_on_the_gemma_4_test_model_through_the_openai_client(
    gemma4_path: Path, tmp_path: Path, keystore: MemoryKeyStore
) -> None:
    """The grammar forces a call on a random-weight Gemma 4: call, result, answer; after a
    restart the history is grafted (proof exact) and only the new message is read."""
    data = tmp_path / "data"

    def core() -> Galahad:
        return Galahad(data, model_path=gemma4_path, keystore=keystore, overrides=TEST_OVERRIDES)

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY_ONLY}}]
    ask = {"role": "user", "content": "Weather in Paris?"}
    served = Served(core())
    try:
        called = served.client.chat.completions.create(
            model="gemma",
            messages=[ask],  # type: ignore[list-item]
            tools=tools,  # type: ignore[arg-type]
            tool_choice="required",
            max_tokens=120,
            temperature=0.7,
            seed=2,
        )
        assert called.choices[0].finish_reason == "tool_calls"
        (call,) = called.choices[0].message.tool_calls or []
        jsonschema.validate(json.loads(call.function.arguments), CITY_ONLY)
        history: list[Any] = [ask, called.choices[0].message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
        answered = served.client.chat.completions.create(
            model="gemma", messages=history, tools=tools, max_tokens=8, temperature=0
        )
        assert answered.usage and answered.usage.prompt_tokens_details
        assert answered.usage.prompt_tokens_details.cached_tokens >= (
            called.usage.prompt_tokens + called.usage.completion_tokens  # type: ignore[union-attr]
        )
    finally:
        served.close()
        served.core.close()
    history.append({"role": "assistant", "content": answered.choices[0].message.content or ""})
    history.append({"role": "user", "content": "Thanks."})
    again = Served(core())
    try:
        later = again.core.complete_chat(
            [_message(m) for m in history],
            reply=ReplyShape(tools=(Tool("get_weather", "", CITY_ONLY),)),
            max_tokens=4,
            temperature=0,
        )
        assert later.turn.graft is not None and later.turn.graft.proof.verdict == "exact"
        assert later.cached_tokens >= answered.usage.prompt_tokens
        assert later.read_tokens < 20
    finally:
        again.close()
        again.core.close()


CITY_ONLY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


def _message(item: dict[str, Any]) -> ChatMessage:
    calls = tuple(
        ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in item.get("tool_calls", [])
    )
    return ChatMessage(
        item["role"], item.get("content") or "", calls=calls, call_id=item.get("tool_call_id", "")
    )
