"""Replies held to a shape by grammar, on the fake engine through the one reply loop: JSON
to a schema through the server and the official client, a Gemma 4 tool call's grammar, the
grammar matcher against llama.cpp's rules of thumb, and calls read back from token ids."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest

from galahad_desktop.engine import decoding
from galahad_desktop.engine.grammar import GrammarError, json_grammar, tool_call_grammar
from galahad_desktop.engine.sampling import Sampler, SamplingParams
from galahad_desktop.engine.tool_format import (
    MalformedCall,
    ToolMarkers,
    calls,
    read_calls,
    results,
    to_tokens,
)
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.memory.results import ChatMessage, ReplyShape
from galahad_dev.gbnf import Grammar, Matcher
from tests.served import Served

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"enum": ["c", "f"]},
        "alerts": {"type": "boolean"},
    },
    "required": ["city", "days", "unit", "alerts"],
    "additionalProperties": False,
}


def _matches(grammar: str, text: str) -> bool:
    matcher = Matcher(Grammar.parse(grammar))
    stacks = matcher.stacks
    for char in text:
        stacks = matcher.advance_char(stacks, ord(char))
        if not stacks:
            return False
    return () in stacks


def test_a_schema_s_grammar_takes_what_validates_and_refuses_what_does_not() -> None:
    grammar = json_grammar(WEATHER)
    good = {"city": "Paris", "days": 3, "unit": "c", "alerts": False}
    assert _matches(grammar, json.dumps(good))
    for bad in (
        {"city": "Paris", "days": 3, "unit": "k", "alerts": False},  # not in the enum
        {"city": "Paris", "days": "3", "unit": "c", "alerts": False},  # a string for a number
        {"city": "Paris", "unit": "c", "alerts": False},  # a required key missing
    ):
        assert not _matches(grammar, json.dumps(bad)), bad
    assert not _matches(grammar, '{"city": "a\nb", "days": 1, "unit": "c", "alerts": true}')
    assert _matches(json_grammar(None), '{"anything": [1, {"x": null}]}')
    assert not _matches(json_grammar(None), "[1, 2]")  # json_object: an object


@pytest.mark.parametrize(
    "schema",
    [{"type": "teapot"}, {"$ref": "#/nowhere"}, {"type": "string", "pattern": "(["}, {"anyOf": 5}],
)
def test_a_schema_that_cannot_be_used_is_refused_by_name(schema: dict[str, Any]) -> None:
    with pytest.raises(GrammarError, match="the JSON schema cannot be used"):
        json_grammar(schema)


@pytest.mark.parametrize("flavour", ["gemma3", "gemma4"])
def test_the_fake_engine_holds_a_reply_to_a_schema(
    make_fake_core: Callable[..., Galahad], flavour: str
) -> None:
    core = make_fake_core(flavour)
    done = core.complete_chat(
        [ChatMessage("user", "Weather in Paris as JSON")],
        reply=ReplyShape(json_schema=WEATHER),
        max_tokens=400,
        temperature=0.9,
        seed=7,
    )
    assert done.finish_reason == "stop", done.text
    jsonschema.validate(json.loads(done.text), WEATHER)
    free = core.complete_chat([ChatMessage("user", "Weather in Paris as JSON")], max_tokens=40)
    with pytest.raises(ValueError):  # the same loop without the grammar: byte noise
        jsonschema.validate(json.loads(free.text), WEATHER)


def test_the_server_answers_response_format_through_the_openai_client(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    client = served.client
    answer = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Weather in Paris"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER, "strict": True},
        },
        max_tokens=400,
        temperature=0.8,
        seed=11,
    )
    assert answer.choices[0].message.refusal is None
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), WEATHER)
    pieces = []
    for chunk in client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Any JSON object"}],
        response_format={"type": "json_object"},
        max_tokens=400,
        temperature=0.8,
        seed=12,
        stream=True,
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
    assert isinstance(json.loads("".join(pieces)), dict)
    before = len(served.core.list_conversations())
    with pytest.raises(openai.BadRequestError, match="cannot be used"):
        client.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "x"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "teapot"}},
            },
        )
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": WEATHER}}],
        )
    assert refused.value.body["param"] == "tools"  # type: ignore[index]
    assert len(served.core.list_conversations()) == before  # refused: nothing stored


# -- Gemma 4's calls -----------------------------------------------------------------------
def test_a_forced_tool_call_parses_from_token_ids_and_validates(
    make_fake_core: Callable[..., Galahad],
) -> None:
    core = make_fake_core("gemma4")
    engine: Any = core.live.engine  # the fake engine: its markers are ids past the bytes
    engine.reset()
    engine.evaluate(engine.turns.start("") + engine.turns.user_turn("Weather in Paris?"))
    markers = engine.tool_markers
    assert markers is not None
    # The fake's noise never picks a markup token itself, so no free string (whose end is
    # the `<|"|>` token) would end: an enum's quotes are forced by the grammar.
    schema = {**WEATHER, "required": ["days", "unit", "alerts"]}
    schema["properties"] = {k: v for k, v in WEATHER["properties"].items() if k != "city"}
    grammar = tool_call_grammar(
        [("get_weather", schema)], (markers.call_open, markers.call_close, markers.quote), False
    )
    generation = engine.generate(
        SamplingParams(temperature=0.9, max_tokens=400, grammar=grammar, seed=5)
    )
    assert generation.stop_reason == "end"
    found, outside = read_calls(generation.tokens, markers, lambda t: engine.detokenize([t]))
    assert [name for name, _ in found] == ["get_weather"] and outside == []
    jsonschema.validate(found[0][1], schema)
    assert generation.text == ""  # the call's text is never the answer


def _fake_markers() -> ToolMarkers:
    return ToolMarkers(1000, 1001, 1002, 1003, 1004, 1005, 1006)


def _tokens(pieces: list[str | int]) -> list[int]:
    return to_tokens(pieces, lambda text: [ord(c) for c in text])


def test_calls_read_back_as_they_were_written() -> None:
    markers = _fake_markers()
    made = [
        ("get_weather", {"city": "Paris, <France>", "days": 3, "opts": {"deep": True}}),
        ("noop", {}),
        ("lists", {"tags": ["a", "b"], "n": -1.5, "none": None}),
    ]
    tokens = _tokens(calls(markers, made)) + [ord(c) for c in "then text"]
    found, outside = read_calls(tokens, markers, chr)
    assert found == made
    assert "".join(map(chr, outside)) == "then text"
    assert results(markers, [("f", "ok")])[0] == markers.response_open


@pytest.mark.parametrize(
    "pieces",
    [
        ["call:f{a:1"],  # the object does not end
        ["call:f{a:", 1006, "x"],  # a string does not end
        ["f{a:1}"],  # no call:
        ["call:f{a:1}}"],  # text after the arguments
        ["call:f{a:wat}"],  # not a value
        ["call:f{a:1}", 1002, "call:g{}"],  # a call inside a call
    ],
)
def test_a_malformed_call_is_refused_never_a_traceback(pieces: list[str | int]) -> None:
    markers = _fake_markers()
    tokens = _tokens([markers.call_open, *pieces, markers.call_close])
    with pytest.raises(MalformedCall):
        read_calls(tokens, markers, chr)
    with pytest.raises(MalformedCall):
        read_calls(_tokens([markers.call_open, "call:f{}"]), markers, chr)  # never ends


def test_the_first_candidates_choose_what_the_whole_vocabulary_would() -> None:
    """Checking the most likely tokens first (not all 262k) changes no choice: the sampler
    picks from exactly what it would have picked from."""

    class EvenOnly:
        def allows(self, token: int) -> bool:
            return token % 2 == 0

        def restrict(self, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
            out = np.full(len(logits), -np.inf, dtype=np.float32)
            kept = ids[ids % 2 == 0]
            out[kept] = logits[kept]
            return out

        def accept(self, token: int) -> None:
            pass

        def close(self) -> None:
            pass

    rng = np.random.default_rng(3)
    shortcuts = 0
    for temperature, top_k, top_p in ((0.0, 40, 0.95), (0.9, 40, 0.95), (0.3, 3000, 0.95)):
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        for scale in (1.0, 8.0):  # flat logits, and peaked ones (the top_p cut decides)
            for trial in range(20):
                logits = (rng.standard_normal(5000) * scale).astype(np.float32)
                fast = decoding._restrict(EvenOnly(), logits, params)
                whole = EvenOnly().restrict(logits, np.arange(len(logits)))
                picks = [
                    Sampler(params, seed).sample(chosen)
                    for chosen in (fast, whole)
                    for seed in (trial,)
                ]
                assert picks[0] == picks[1]
                shortcuts += int(np.isfinite(fast).sum() < np.isfinite(whole).sum())
    assert shortcuts >= 100  # the shortcut was taken (by top_k, greedy and the top_p cut)


def test_health_and_the_model_s_context_length(serve: Callable[..., Served]) -> None:
    served = serve()
    status, body, _ = served.raw("GET", "/health", key="")
    assert (status, body) == (200, {"status": "ok"})  # no key needed, nothing told
    (listed,) = served.client.models.list().data
    assert listed.model_extra == {"context_length": served.core.info().n_ctx}
    status, body, _ = served.raw("POST", "/health", key="")
    assert status == 405 and body["error"]["message"]
