"""Gemma 4's tool syntax as tokens: declarations, calls and results, and calls read back.

Written from the model's own chat template (the published Gemma 4 template, which the Gemma 4
test model carries; tests/test_tools_model.py renders both and compares tokens):
declarations go in the system turn (`<|tool>declaration:NAME{…}<tool|>`), a call in the model
turn (`<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`), and a result back into the
same model turn (`<|tool_response>response:NAME{value:<|"|>…<|"|>}<tool_response|>`), after
which the model goes on. The markers and the string quote `<|"|>` are tokens placed by id;
every text between them is tokenized as text (markup.py: typed text never becomes markup).
Calls are read back from token ids, never from displayed text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MARKER_TEXTS = (
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
)
Piece = str | int  # text, or a marker token's id


@dataclass(frozen=True)
class ToolMarkers:
    tool_open: int
    tool_close: int
    call_open: int
    call_close: int
    response_open: int
    response_close: int
    quote: int

    @classmethod
    def find(cls, single_token: Callable[[str], int | None]) -> ToolMarkers | None:
        """The markers' ids in a vocabulary; None when any is not one token (no tools)."""
        ids = [single_token(text) for text in MARKER_TEXTS]
        if any(i is None for i in ids):
            return None
        return cls(*[int(i) for i in ids if i is not None])


STANDARD_KEYS = ("description", "type", "properties", "required", "nullable")


class _Writer:
    """Pieces of the template's output: text and marker ids."""

    def __init__(self, markers: ToolMarkers) -> None:
        self.q = markers.quote
        self.pieces: list[Piece] = []

    def put(self, *parts: Piece) -> None:
        self.pieces.extend(parts)

    def string(self, text: str) -> None:
        self.put(self.q, text, self.q)

    def argument(self, value: Any, escape_keys: bool = True) -> None:
        """The template's format_argument."""
        if isinstance(value, str):
            self.string(value)
        elif isinstance(value, bool):
            self.put("true" if value else "false")
        elif isinstance(value, Mapping):
            self.put("{")
            for number, key in enumerate(sorted(value)):
                if number:
                    self.put(",")
                if escape_keys:
                    self.string(str(key))
                else:
                    self.put(str(key))
                self.put(":")
                self.argument(value[key], escape_keys)
            self.put("}")
        elif isinstance(value, list | tuple):
            self.put("[")
            for number, item in enumerate(value):
                if number:
                    self.put(",")
                self.argument(item, escape_keys)
            self.put("]")
        else:
            self.put(_scalar(value))

    def required(self, names: Sequence[Any]) -> None:
        self.put("required:[")
        for number, name in enumerate(names):
            if number:
                self.put(",")
            self.string(str(name))
        self.put("]")

    def parameters(self, properties: Mapping[str, Any]) -> None:
        """The template's format_parameters (its standard keys are skipped as it skips them)."""
        first = True
        for key in sorted(properties):
            if key in STANDARD_KEYS:
                continue
            if not first:
                self.put(",")
            first = False
            value = properties[key]
            self.property(key, value if isinstance(value, Mapping) else {})

    def property(self, key: str, value: Mapping[str, Any]) -> None:
        self.put(f"{key}:{{")
        written = False  # a field is written: the next one needs a comma

        def field(*parts: Piece) -> None:
            nonlocal written
            if written:
                self.put(",")
            written = True
            self.put(*parts)

        if value.get("description"):
            field("description:")
            self.string(str(value["description"]))
        kind = str(value.get("type", "")).upper()
        if kind == "STRING" and value.get("enum"):
            field("enum:")
            self.argument(value["enum"])
        elif kind == "ARRAY" and isinstance(value.get("items"), Mapping) and value["items"]:
            field()
            self.items(value["items"])
        if value.get("nullable"):
            field("nullable:true")
        if kind == "OBJECT":
            field("properties:{")
            inner = value.get("properties")
            self.parameters(inner if isinstance(inner, Mapping) else value)
            self.put("}")
            if value.get("required"):
                field()
                self.required(value["required"])
        field("type:")
        self.string(kind)
        self.put("}")

    def items(self, items: Mapping[str, Any]) -> None:
        self.put("items:{")
        first = True
        for key in sorted(items):
            value = items[key]
            if value is None:
                continue
            if not first:
                self.put(",")
            first = False
            if key == "properties":
                self.put("properties:{")
                if isinstance(value, Mapping):
                    self.parameters(value)
                self.put("}")
            elif key == "required":
                self.required(value)
            elif key == "type":
                self.put("type:")
                upper = value.upper() if isinstance(value, str) else [str(v).upper() for v in value]
                self.argument(upper)
            else:
                self.put(f"{key}:")
                self.argument(value)
        self.put("}")

    def declaration(self, name: str, description: str, params: Mapping[str, Any]) -> None:
        """The template's format_function_declaration."""
        self.put(f"declaration:{name}{{description:")
        self.string(description)
        if params:
            self.put(",parameters:{")
            if params.get("properties"):
                self.put("properties:{")
                self.parameters(params["properties"])
                self.put("},")
            if params.get("required"):
                self.required(params["required"])
                self.put(",")
            if params.get("type"):
                self.put("type:")
                self.string(str(params["type"]).upper())
                self.put("}")
        self.put("}")


def _scalar(value: Any) -> str:
    """A number or null as the template prints it (Python's own str, as Jinja does)."""
    if value is None:
        return "None"
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(str(value))
    return str(value)


def declarations(
    markers: ToolMarkers, tools: Sequence[tuple[str, str, Mapping[str, Any]]]
) -> list[Piece]:
    """`<|tool>declaration:…<tool|>` for each (name, description, parameters)."""
    w = _Writer(markers)
    for name, description, params in tools:
        w.put(markers.tool_open)
        w.declaration(name, description, params)
        w.put(markers.tool_close)
    return w.pieces


def calls(markers: ToolMarkers, made: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Piece]:
    """The calls a model turn made, as the template writes an assistant's tool_calls."""
    w = _Writer(markers)
    for name, arguments in made:
        w.put(markers.call_open, f"call:{name}{{")
        for number, key in enumerate(sorted(arguments)):
            if number:
                w.put(",")
            w.put(f"{key}:")
            w.argument(arguments[key], escape_keys=False)
        w.put("}", markers.call_close)
    return w.pieces


def results(markers: ToolMarkers, answered: Sequence[tuple[str, str]]) -> list[Piece]:
    """Tool results (name, text) given back inside the model turn."""
    w = _Writer(markers)
    for name, text in answered:
        w.put(markers.response_open, f"response:{name}{{value:")
        w.string(text)
        w.put("}", markers.response_close)
    return w.pieces


def to_tokens(pieces: Sequence[Piece], encode_text: Callable[[str], list[int]]) -> list[int]:
    """Marker ids as they are; each run of text between them tokenized as one text."""
    tokens: list[int] = []
    run: list[str] = []
    for piece in [*pieces, -1]:
        if isinstance(piece, str):
            run.append(piece)
            continue
        if run:
            tokens += encode_text("".join(run))
            run = []
        if piece >= 0:
            tokens.append(piece)
    return tokens


# -- reading calls back ------------------------------------------------------------------
class MalformedCall(ValueError):
    """A call the model wrote that does not parse (the reply keeps it as text)."""


_QUOTE = None  # the quote token in a call's character list


class _Reader:
    def __init__(self, chars: list[str | None]) -> None:
        self.chars = chars
        self.at = 0

    def peek(self) -> str | None:
        return self.chars[self.at] if self.at < len(self.chars) else "\x00end"

    def take(self, expected: str) -> None:
        for char in expected:
            if self.peek() != char:
                raise MalformedCall(f"expected {expected!r}")
            self.at += 1

    def name(self) -> str:
        start = self.at
        while isinstance(self.peek(), str) and (
            str(self.peek()).isalnum() or self.peek() in ("_", "-", ".")
        ):
            self.at += 1
        if self.at == start:
            raise MalformedCall("expected a name")
        return "".join(str(c) for c in self.chars[start : self.at])

    def value(self, depth: int = 0) -> Any:
        if depth > 32:
            raise MalformedCall("nested too deeply")
        char = self.peek()
        if char is _QUOTE:
            self.at += 1
            start = self.at
            while self.at < len(self.chars) and self.chars[self.at] is not _QUOTE:
                self.at += 1
            if self.at >= len(self.chars):
                raise MalformedCall("a string does not end")
            text = "".join(str(c) for c in self.chars[start : self.at])
            self.at += 1
            return text
        if char == "{":
            return self.object(depth)
        if char == "[":
            self.at += 1
            items: list[Any] = []
            while self.peek() != "]":
                if items:
                    self.take(",")
                items.append(self.value(depth + 1))
            self.at += 1
            return items
        start = self.at
        while (
            isinstance(self.peek(), str)
            and str(self.peek()) not in ",}]"
            and (self.peek() != "\x00end")
        ):
            self.at += 1
        word = "".join(str(c) for c in self.chars[start : self.at]).strip()
        if word in ("true", "false"):
            return word == "true"
        if word in ("null", "None"):
            return None
        try:
            number = json.loads(word)
        except ValueError:
            raise MalformedCall(f"{word[:40]!r} is not a value") from None
        if not isinstance(number, int | float) or isinstance(number, bool):
            raise MalformedCall(f"{word[:40]!r} is not a value")
        return number

    def object(self, depth: int) -> dict[str, Any]:
        self.take("{")
        out: dict[str, Any] = {}
        while self.peek() != "}":
            if out:
                self.take(",")
            if self.peek() is _QUOTE:  # a key may be quoted
                key = self.value(depth + 1)
                if not isinstance(key, str):
                    raise MalformedCall("a key is not a name")
            else:
                key = self.name()
            self.take(":")
            out[key] = self.value(depth + 1)
        self.at += 1
        return out


def read_calls(
    tokens: Sequence[int], markers: ToolMarkers, text_of: Callable[[int], str]
) -> tuple[list[tuple[str, dict[str, Any]]], list[int]]:
    """The calls in a reply's tokens, and the tokens outside them (the reply's text).
    Raises MalformedCall when a call does not parse or does not end."""
    found: list[tuple[str, dict[str, Any]]] = []
    outside: list[int] = []
    inside: list[int] | None = None
    for token in tokens:
        if token == markers.call_open:
            if inside is not None:
                raise MalformedCall("a call starts inside another")
            inside = []
        elif token == markers.call_close:
            if inside is None:
                raise MalformedCall("a call ends that never started")
            found.append(_one_call(inside, markers, text_of))
            inside = None
        elif inside is not None:
            inside.append(token)
        else:
            outside.append(token)
    if inside is not None:
        raise MalformedCall("a call does not end")
    return found, outside


def _one_call(
    tokens: list[int], markers: ToolMarkers, text_of: Callable[[int], str]
) -> tuple[str, dict[str, Any]]:
    chars: list[str | None] = []
    for token in tokens:
        if token == markers.quote:
            chars.append(_QUOTE)
        else:
            chars.extend(text_of(token))
    reader = _Reader(chars)
    reader.take("call:")
    name = reader.name()
    arguments = reader.object(0)
    if reader.at != len(chars):
        raise MalformedCall("text follows the call's arguments")
    return name, arguments
