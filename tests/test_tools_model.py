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
