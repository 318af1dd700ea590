"""Tool turns of an API conversation: what the model was offered, what it called, what came
back, as tokens and as the conversation keeps them.

A reply that calls tools leaves its model turn open (Gemma 4 goes on in the same turn once
the results are given back): its block ends inside the turn (`mid_turn`), its message keeps
the calls (encrypted, as its content) and `stop = "tool_calls"`. The results are the next
step's prompt: a message of role `tool` whose text is the results as JSON, read as
`<|tool_response>…<tool_response|>` straight after the calls, no turn markers around them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from galahad_desktop.engine.decoding import Generation
from galahad_desktop.engine.grammar import (
    check_tool_name,
    check_tool_parameters,
    tool_call_grammar,
)
from galahad_desktop.engine.protocol import ChatEngine
from galahad_desktop.engine.tool_format import (
    MalformedCall,
    ToolMarkers,
    calls,
    declarations,
    read_calls,
    results,
    to_tokens,
)
from galahad_desktop.errors import InputError
from galahad_desktop.memory.results import ReplyShape, Tool, ToolCall

CALLED = "tool_calls"  # a reply's stop when it called tools: its model turn goes on
NO_TOOL_MODEL = (
    "This model does not call tools: it has no tool syntax (Gemma 3 has none). Load a "
    "Gemma 4 model to use 'tools', or send the request without them."
)
Results = tuple[tuple[str, str], ...]  # (tool name, what it returned), in order


class ToolsRefused(InputError):
    """Tools this model or this request cannot use (the API names the field)."""

    param = "tools"


def markers_of(engine: ChatEngine) -> ToolMarkers:
    if engine.tool_markers is None:
        raise ToolsRefused(NO_TOOL_MODEL)
    return engine.tool_markers


MAX_SCHEMA_DEPTH = 16


def _depth(value: Any) -> int:
    """How deeply a JSON value nests (without recursing: a hostile schema may nest deep)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth > MAX_SCHEMA_DEPTH:
            return depth
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else []
        )
        todo.extend((child, depth + 1) for child in children)
    return deepest


def tool_records(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The tools as a conversation keeps them (and as its history's tag names them)."""
    for number, tool in enumerate(tools):
        check_tool_name(tool.name, f"tools[{number}].function.name")
        if _depth(tool.parameters) > MAX_SCHEMA_DEPTH:
            raise ToolsRefused(
                f"tools[{number}].function.parameters nests more than {MAX_SCHEMA_DEPTH} deep."
            )
        check_tool_parameters(tool.parameters, f"tools[{number}].function.parameters")
        for text in (tool.name, tool.description, json.dumps(tool.parameters)):
            if '<|"|>' in text:
                raise ToolsRefused(f"tools[{number}] holds Gemma's string marker <|\"|>.")
    return [
        {"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools
    ]


def declared(engine: ChatEngine, tools: Sequence[dict[str, Any]]) -> list[int]:
    """The tools' declarations as the system turn holds them."""
    pieces = declarations(
        markers_of(engine), [(t["name"], t["description"], t["parameters"]) for t in tools]
    )
    return to_tokens(pieces, engine.encode_text)


def call_tokens(engine: ChatEngine, made: Sequence[ToolCall]) -> list[int]:
    pieces = calls(markers_of(engine), [(c.name, c.arguments) for c in made])
    return to_tokens(pieces, engine.encode_text)


def result_tokens(engine: ChatEngine, answered: Results) -> list[int]:
    return to_tokens(results(markers_of(engine), answered), engine.encode_text)


def calls_json(made: Sequence[ToolCall]) -> str:
    return json.dumps(
        [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in made], ensure_ascii=False
    )


def results_json(answered: Results) -> str:
    return json.dumps([{"name": n, "content": t} for n, t in answered], ensure_ascii=False)


def results_from_json(text: str) -> Results:
    return tuple((r["name"], r["content"]) for r in json.loads(text))


def grammar(engine: ChatEngine, reply: ReplyShape) -> str:
    """The grammar of a reply that must call (tool_choice required or a tool's name); ""
    when the model chooses."""
    if reply.tool_choice in ("auto", "none") or not reply.tools:
        return ""
    markers = markers_of(engine)
    named = reply.tool_choice[1:] if reply.tool_choice.startswith("=") else None
    offered = [(t.name, t.parameters) for t in reply.tools if named in (None, t.name)]
    ids = (markers.call_open, markers.call_close, markers.quote)
    return tool_call_grammar(offered, ids, many=reply.parallel_calls and named is None)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def read_reply(
    engine: ChatEngine, generation: Generation, offered: Sequence[Tool]
) -> tuple[str, tuple[ToolCall, ...]]:
    """(the reply's text, the calls it made). A call that does not parse, or names a tool
    not offered, is not a call: the reply keeps what the model wrote, as text. A call the
    token limit cut is left out; the complete ones before it are read."""
    markers = engine.tool_markers
    tokens = generation.answer_tokens
    if markers is None or markers.call_open not in tokens:
        return generation.text, ()
    if generation.stop_reason == "length":
        # The limit cut a call part way: that call was never made; those before it were.
        last_open = len(tokens) - 1 - tokens[::-1].index(markers.call_open)
        if markers.call_close not in tokens[last_open:]:
            tokens = tokens[:last_open]
            if markers.call_open not in tokens:
                return generation.text, ()
    names = {t.name for t in offered}
    try:
        found, _outside = read_calls(tokens, markers, lambda t: engine.detokenize([t]))
    except MalformedCall:
        return engine.detokenize(generation.answer_tokens), ()
    if not found or any(name not in names for name, _ in found):
        return engine.detokenize(generation.answer_tokens), ()
    return generation.text, tuple(ToolCall(new_call_id(), n, a) for n, a in found)
