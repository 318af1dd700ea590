"""Schemas sent to the local server that used to crash it (signal 11 in llama.cpp's grammar
parser), take gigabytes (minItems 10^8, optional tool properties) or hold the model for
minutes (huge enums): each is refused before llama.cpp sees it, with a 400 in OpenAI's shape
naming the part, and the server goes on. The model tests hand the largest accepted grammars
to the real llama.cpp, and check that a grammar it refuses is not dumped on stderr."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from galahad_desktop.engine.grammar import (
    GrammarError,
    ToolSchemaError,
    json_grammar,
    tool_call_grammar,
)
from galahad_desktop.engine.schema_bounds import MAX_REPEAT, _nesting
from galahad_desktop.memory.galahad import Galahad
from tests.served import Served
from tests.test_reply_grammar import _matches

ITEMS = {"type": "integer"}
HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"type": "array", "items": ITEMS, "maxItems": 20_000}, "maxItems is 20000"),
    ({"type": "array", "items": ITEMS, "maxItems": 30_000}, "maxItems is 30000"),
    ({"type": "array", "items": ITEMS, "maxItems": 100_000}, "maxItems is 100000"),
    ({"type": "string", "maxLength": 20_000}, "maxLength is 20000"),
    ({"type": "string", "maxLength": 10**6}, "maxLength is 1000000"),
    ({"type": "array", "items": ITEMS, "minItems": 10**8}, "minItems is 100000000"),
    ({"enum": [f"value {i}" for i in range(100_000)]}, "enum has 100000 values"),
    ({"type": "array", "items": ITEMS, "minItems": "5"}, "minItems must be a whole number"),
    ({"type": "array", "items": ITEMS, "maxItems": 2.5}, "maxItems must be a whole number"),
    ({"type": "array", "items": ITEMS, "minItems": -5}, "minItems must not be negative"),
    ({"type": "array", "items": ITEMS, "minItems": 5, "maxItems": 2}, "no value can have both"),
    ({"type": "string", "pattern": "^(a$"}, "pattern is not a regular expression"),
    ({"type": "string", "pattern": "a{5000}"}, "at most 1000 repetitions"),
    ({"$ref": "#/$defs/b"}, "names nothing in the schema"),
    ({"type": "object", "properties": {"x": {"type": "teapot"}}}, "x.type is 'teapot'"),
    # The converter's pattern reader looped forever on a ']' or '}' it does not close.
    ({"type": "string", "pattern": "^[]a]$"}, "']' that closes nothing"),
    ({"type": "string", "pattern": "^a}$"}, "'}' that closes nothing"),
    # Python's re and the converter both recursed once per group: a RecursionError.
    ({"type": "string", "pattern": "^" + "(" * 900 + "a" + ")" * 900 + "$"}, "nests more than 32"),
    (
        {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}},
        "has 2,000 names",
    ),
    # x is `anyOf: [x, string]` (it is wrapped as the property x): a left-recursive grammar.
    ({"anyOf": [{"$ref": "#/properties/x"}, {"type": "string"}]}, "leads back to itself"),
]


def _as_object(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": schema}, "required": ["x"]}


def _ask_with_schema(
    client: openai.OpenAI, schema: dict[str, Any], text: str = "x", max_tokens: int = 4
) -> Any:
    """A chat completion held to `schema` (wrapped as an object's one required field)."""
    return client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": _as_object(schema)},
        },
        max_tokens=max_tokens,
    )


@pytest.mark.timeout(20)  # the converter's endless loop on '^[]a]$' never returned
@pytest.mark.parametrize(("schema", "named"), HOSTILE, ids=[n for _, n in HOSTILE])
def test_a_hostile_schema_is_refused_by_the_part_it_names(
    schema: dict[str, Any], named: str
) -> None:
    started = time.perf_counter()
    with pytest.raises(GrammarError, match="cannot be used") as refused:
        json_grammar(_as_object(schema), "the JSON schema")
    assert named in str(refused.value)
    assert "Python" not in str(refused.value) and "sys." not in str(refused.value)
    assert time.perf_counter() - started < 2.0  # refused before anything large is built


def test_the_largest_counts_accepted_stay_within_what_llama_cpp_takes() -> None:
    """At the bounds the grammar nests no deeper than llama.cpp was measured to parse on a
    512 KB stack (an 8 MB thread has 16 times that); one past them is refused."""
    at_bound = json_grammar(
        _as_object(
            {
                "type": "array",
                "items": {"type": "string", "maxLength": MAX_REPEAT},
                "maxItems": MAX_REPEAT,
            }
        )
    )
    assert _nesting(at_bound) <= MAX_REPEAT + 64
    with pytest.raises(GrammarError):
        json_grammar(_as_object({"type": "string", "maxLength": MAX_REPEAT + 1}))


QUOTE = 52


def test_optional_tool_properties_grow_the_call_grammar_linearly_and_still_hold_it() -> None:
    def grammar(n: int, required: tuple[str, ...] = ()) -> str:
        props = {f"p{i:02d}": {"type": "integer"} for i in range(n)}
        schema = {"type": "object", "properties": props, "required": list(required)}
        return tool_call_grammar([("f", schema)], (48, 49, QUOTE), many=False)

    small, large = len(grammar(12)), len(grammar(24))
    assert large < 2.5 * small, (small, large)  # it doubled with each optional one before
    assert len(grammar(64)) < 40_000
    held = grammar(4, required=("p02",))
    # llama.cpp's tokens are written <[id]> in GBNF; the matcher reads them as characters
    # here, so the call's markers are matched as their literal spellings.
    for good in ("{p02:1}", "{p00:1,p02:2}", "{p02:1,p03:4}", "{p00:1,p01:2,p02:3,p03:4}"):
        assert _token_matches(held, good), good
    for bad in ("{}", "{p00:1}", "{,p02:1}", "{p02:1,}", "{p02:1p03:4}", "{p03:4,p02:1}"):
        assert not _token_matches(held, bad), bad


def _token_matches(grammar: str, args: str) -> bool:
    """Whether `call:f{args}` between the call markers is what the grammar holds."""
    spelled = grammar.replace("<[48]>", '"\\x01"').replace("<[49]>", '"\\x02"')
    spelled = spelled.replace(f"<[{QUOTE}]>", '"\\x03"')
    return _matches(spelled, "\x01call:f" + args + "\x02")


def test_a_tool_schema_is_checked_the_same_whether_or_not_a_call_is_forced(
    serve: Callable[..., Served], make_fake_core: Callable[..., Galahad]
) -> None:
    served = serve(make_fake_core("gemma4"))
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "$ref": "#/$defs/nowhere"}},
    }
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as refused:
            served.client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "x"}],
                tools=[tool],  # type: ignore[list-item]
                tool_choice=choice,  # type: ignore[arg-type]
            )
        assert refused.value.body["param"] == "tools", choice  # type: ignore[index]
    many = {f"p{i:02d}": {"type": "string"} for i in range(26)}
    started = time.perf_counter()
    answer = served.client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "call it"}],
        tools=[
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": many}},
            }
        ],
        tool_choice={"type": "function", "function": {"name": "f"}},
        max_tokens=60,
    )
    assert answer.choices[0].finish_reason in ("tool_calls", "length", "stop")
    assert time.perf_counter() - started < 20


def test_a_recursive_schema_sent_the_usual_way_is_held() -> None:
    """`{"$defs": ..., "$ref": ...}` at the top: the converter read no key beside the
    `$ref`, so the references inside `$defs` were never resolved ("cannot be used:
    '#/$defs/node'"). A tree is a reference inside an array: it writes '[' first."""
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name"],
            }
        },
        "$ref": "#/$defs/node",
    }
    grammar = json_grammar(tree)
    assert _matches(grammar, '{"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}]}')
    assert not _matches(grammar, '{"name": "a", "kids": [{"kids": []}]}')  # a name missing


@pytest.mark.timeout(60)
def test_the_server_refuses_each_hostile_schema_and_goes_on(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    for schema, named in HOSTILE:
        started = time.perf_counter()
        with pytest.raises(openai.BadRequestError) as refused:
            _ask_with_schema(served.client, schema)
        body = refused.value.body
        assert isinstance(body, dict) and body["param"] == "response_format", named
        assert named in body["message"], (named, body["message"])
        assert time.perf_counter() - started < 30
    assert served.client.models.list().data  # alive


def test_a_huge_integer_in_a_request_is_refused_in_plain_words(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    body = b'{"model":"m","messages":[{"role":"user","content":"x"}],"seed":' + b"9" * 5000 + b"}"
    status, answer, _ = served.raw("POST", "/v1/chat/completions", body)
    assert status == 400
    message = answer["error"]["message"]
    assert "5,000 digits" in message and "sys." not in message


def test_a_tool_schema_past_the_bounds_is_refused_for_the_call_grammar() -> None:
    schema = {"type": "object", "properties": {"x": {"enum": list(range(5000))}}}
    with pytest.raises(ToolSchemaError, match="enum has 5000 values"):
        tool_call_grammar([("f", schema)], (48, 49, QUOTE), many=False)


# -- the real llama.cpp -----------------------------------------------------------------------
@pytest.mark.model
def test_the_real_server_refuses_the_crashing_schemas_and_takes_the_largest_allowed(
    make_core: Callable[..., Galahad],
) -> None:
    served = Served(make_core())
    try:
        for schema in (HOSTILE[0][0], HOSTILE[3][0], HOSTILE[4][0]):
            with pytest.raises(openai.BadRequestError):
                _ask_with_schema(served.client, schema)
        largest = {
            "type": "array",
            "items": {"type": "string", "maxLength": MAX_REPEAT},
            "maxItems": MAX_REPEAT,
        }
        answer = _ask_with_schema(served.client, largest, "A list", max_tokens=6)
        assert answer.choices[0].finish_reason == "length"  # llama.cpp held it, no crash
        assert served.client.models.list().data
    finally:
        served.close()


@pytest.mark.model
def test_a_grammar_llama_cpp_refuses_is_a_400_kind_of_error_and_stays_off_stderr(
    gemma3_path: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp prints a grammar it cannot parse, whole, with fprintf: a request's field
    names and values would reach the server's log."""
    from galahad_desktop.engine.native import GrammarSampler, NativeModel

    model = NativeModel(gemma3_path, vocab_only=True)
    try:
        capfd.readouterr()
        with pytest.raises(GrammarError, match=r"llama\.cpp could not read"):
            GrammarSampler(model, 'root ::= "secretword" missing-rule\n')
        assert "secretword" not in capfd.readouterr().err
        GrammarSampler(model, 'root ::= "fine"\n').close()  # stderr is back, the next works
    finally:
        model.close()
