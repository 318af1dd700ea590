"""Grammars that hold a reply to a shape: JSON (optionally to a schema), a Gemma 4 tool call.

The grammars are GBNF, the language of llama.cpp's grammar sampler. A JSON schema is turned
into GBNF by llama-cpp-python's converter (`llama_grammar.json_schema_to_gbnf`, a port of
llama.cpp's); a Gemma 4 tool call has no converter anywhere, so its grammar is written here
from the tool's parameter schema, in the call syntax Gemma 4 was trained on
(`call:NAME{key:<|"|>text<|"|>,n:3}`, keys unquoted, strings between `<|"|>` tokens).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from galahad_desktop.engine.schema_bounds import check_grammar_bounds, check_schema_bounds
from galahad_desktop.errors import InputError

# The converter's string character lets raw control characters through, which no JSON
# reader accepts (llama.cpp's own converter has since excluded them): hold them out.
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_STRICT_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'
SCHEMA_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class GrammarError(InputError):
    """A schema no grammar can be made from (the message names what is wrong)."""

    param = "response_format"


class ToolSchemaError(GrammarError):
    """A tool's parameter schema no call grammar can be made from."""

    param = "tools"


def json_grammar(schema: Mapping[str, Any] | None, where: str = "the JSON schema") -> str:
    """GBNF for a JSON value that follows `schema` (None: any JSON object). Structure,
    types, enums, required keys and patterns are held; numeric bounds and string lengths
    are not (the converter does not enforce them)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # pure Python; loads llama.cpp

    def refuse(message: str) -> GrammarError:
        return GrammarError(f"{where} cannot be used: {message}")

    # Bounded before the converter sees it: the converter would spend gigabytes on
    # minItems 10^8, and llama.cpp's parser overflows its stack on deep repetitions.
    check_schema_bounds({"type": "object"} if schema is None else schema, "the schema", refuse)
    text = json.dumps(_refs_readable({"type": "object"} if schema is None else schema))
    try:
        grammar: str = json_schema_to_gbnf(text)
    except RecursionError:
        raise GrammarError(f"{where} is nested too deeply.") from None
    except Exception as exc:  # the converter asserts, or fails on a wrong type
        raise GrammarError(f"{where} cannot be used: {_reason(exc)}.") from None
    check_grammar_bounds(grammar, "the schema", refuse)
    return grammar.replace(_LOOSE_CHAR, _STRICT_CHAR)


def _refs_readable(schema: Any) -> Any:
    """The schema with each `$ref` that has other keys beside it moved into an `anyOf`.
    The converter reads no key beside a `$ref` (it reads the reference alone) and so never
    resolves the references inside them: `{"$defs": {...}, "$ref": "#/$defs/a"}`, the
    usual way to send a recursive schema, failed with "cannot be used: '#/$defs/a'"."""
    if isinstance(schema, list):
        return [_refs_readable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    readable = {key: _refs_readable(value) for key, value in schema.items()}
    if "$ref" in readable and len(readable) > 1:
        ref = readable.pop("$ref")
        readable.pop("oneOf", None)  # the converter read neither beside a $ref
        readable["anyOf"] = [{"$ref": ref}]
    return readable


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    text = text.replace("stdin#", "#")
    return text[:300]


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """A JSON schema as an object, its grammar made once to find what cannot be used."""
    if not isinstance(schema, dict):
        raise GrammarError(f"{where} must be a JSON schema object.")
    json_grammar(schema, where)
    return schema


# -- Gemma 4's tool calls -------------------------------------------------------------------
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


def check_tool_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolSchemaError(
            f"{where} must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or '_'."
        )
    return name


def _literal(text: str) -> str:
    return json.dumps(text)  # a GBNF string literal is written as a JSON one


class _CallGrammar:
    """GBNF for Gemma 4's argument syntax, rule by rule, from parameter schemas."""

    def __init__(self, quote: int) -> None:
        self.quote = f"<[{quote}]>"  # the `<|"|>` token, never its characters
        self.rules: dict[str, str] = {
            "g-str": f"{self.quote} g-char* {self.quote}",
            # Any text but the start of a marker: `<|"|>` can only be the token.
            "g-char": '[^<] | "<" [^|]',
            "g-int": '"-"? ([0-9] | [1-9] [0-9]{0,15})',
            "g-num": 'g-int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?',
            "g-bool": '"true" | "false"',
            "g-null": '"null"',
            "g-any": "g-str | g-num | g-bool | g-null | g-any-obj | g-any-arr",
            "g-any-obj": '"{" (g-key ":" g-any ("," g-key ":" g-any)*)? "}"',
            "g-any-arr": '"[" (g-any ("," g-any)*)? "]"',
            "g-key": "[A-Za-z_] [A-Za-z0-9_]{0,63}",
        }
        self.depth = 0

    def add(self, name: str, body: str) -> str:
        self.rules[name] = body
        return name

    def value(self, schema: Any, name: str, where: str) -> str:
        """The rule for one value of `schema`."""
        self.depth += 1
        try:
            if self.depth > 12:
                raise ToolSchemaError(f"{where} is nested too deeply.")
            return self._value(schema, name, where)
        finally:
            self.depth -= 1

    def _value(self, schema: Any, name: str, where: str) -> str:
        if schema is True or schema == {}:
            return "g-any"
        if not isinstance(schema, dict):
            raise ToolSchemaError(f"{where} must be a JSON schema object.")
        if "$ref" in schema:
            raise ToolSchemaError(f"{where} uses $ref, which tool parameters cannot use here.")
        if "const" in schema:
            return self.add(name, self._constant(schema["const"], where))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise ToolSchemaError(f"{where}.enum must be a non-empty list.")
            return self.add(name, " | ".join(self._constant(v, where) for v in values))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise ToolSchemaError(f"{where}.{key} must be a non-empty list.")
                parts = [
                    self.value(o, f"{name}-{i}", f"{where}.{key}[{i}]")
                    for i, o in enumerate(options)
                ]
                return self.add(name, " | ".join(parts))
        kind = schema.get("type", "object" if "properties" in schema else None)
        if isinstance(kind, list):
            parts = [self._value({**schema, "type": k}, f"{name}-{k}", where) for k in kind]
            return self.add(name, " | ".join(parts))
        if kind is None:
            return "g-any"
        if kind not in SCHEMA_TYPES:
            raise ToolSchemaError(f"{where}.type is {kind!r}; one of {', '.join(SCHEMA_TYPES)}.")
        if kind == "object":
            return self.object(schema, name, where)
        if kind == "array":
            items = self.value(schema.get("items", {}), f"{name}-item", f"{where}.items")
            return self.add(name, f'"[" ({items} ("," {items})*)? "]"')
        simple = {"string": "g-str", "number": "g-num", "integer": "g-int"}
        simple.update({"boolean": "g-bool", "null": "g-null"})
        return simple[kind]

    def object(self, schema: Mapping[str, Any], name: str, where: str) -> str:
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise ToolSchemaError(f"{where}.properties must be an object.")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ToolSchemaError(f"{where}.required must be a list of names.")
        if not properties:
            return "g-any-obj"
        pairs: list[tuple[str, bool]] = []
        for key in sorted(properties):  # Gemma 4 writes keys sorted, as its template does
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", key):
                raise ToolSchemaError(
                    f"{where}.properties has a name Gemma 4 cannot write: {key!r}."
                )
            rule = self.value(properties[key], f"{name}-{key}", f"{where}.properties.{key}")
            self.add(f"{name}-{key}-kv", f"{_literal(key + ':')} {rule}")
            pairs.append((f"{name}-{key}-kv", key in required))
        return self.add(name, f'"{{" {self._members(name, pairs)} "}}"')

    def _members(self, name: str, pairs: list[tuple[str, bool]]) -> str:
        """The members in order, each required one present, optional ones optional; a
        comma before every member but the first written. Two rules per member (from here,
        none written yet / some written), so the grammar grows with the member count: the
        written-out alternatives it replaced doubled with each optional member."""
        n = len(pairs)
        self.add(f"{name}-m{n}", '""')  # none left, none written
        self.add(f"{name}-c{n}", '""')  # none left, some written
        for i in range(n - 1, -1, -1):
            rule, needed = pairs[i]
            later = f"{name}-c{i + 1}"
            if needed:
                self.add(f"{name}-m{i}", f"{rule} {later}")
                self.add(f"{name}-c{i}", f'"," {rule} {later}')
            else:
                self.add(f"{name}-m{i}", f"{rule} {later} | {name}-m{i + 1}")
                self.add(f"{name}-c{i}", f'("," {rule})? {later}')
        return f"{name}-m0"

    def _constant(self, value: Any, where: str) -> str:
        if isinstance(value, str):
            return (
                f"{self.quote} {_literal(value)} {self.quote}"
                if value
                else (f"{self.quote} {self.quote}")
            )
        if isinstance(value, bool) or value is None or isinstance(value, int | float):
            return _literal(json.dumps(value))
        raise ToolSchemaError(
            f"{where}: only strings, numbers, true, false and null can be constants."
        )


def check_tool_parameters(parameters: Mapping[str, Any] | None, where: str) -> None:
    """Refuse a tool's parameter schema a call grammar could not be made from, whether or
    not this request forces a call: the same tools are accepted under every tool_choice."""
    check_schema_bounds(parameters or {"type": "object"}, where, ToolSchemaError)
    _CallGrammar(0).value(parameters or {"type": "object"}, "check", where)


def tool_call_grammar(
    tools: Sequence[tuple[str, Mapping[str, Any]]],
    markers: tuple[int, int, int],
    many: bool,
) -> str:
    """GBNF for a reply that is one Gemma 4 tool call (or several when `many`) of the given
    tools, each `(name, parameter schema)`. `markers`: the ids of `<|tool_call>`,
    `<tool_call|>` and `<|"|>`."""
    call_open, call_close, quote = markers
    g = _CallGrammar(quote)
    calls = []
    for index, (name, parameters) in enumerate(tools):
        where = f"tools[{index}].function.parameters"
        check_schema_bounds(parameters or {"type": "object"}, where, ToolSchemaError)
        args = g.value(parameters or {"type": "object"}, f"t{index}-args", where)
        calls.append(g.add(f"t{index}", f"{_literal('call:' + name)} {args}"))
    g.add("call", f"<[{call_open}]> ({' | '.join(calls)}) <[{call_close}]>")
    g.add("root", "call+" if many else "call")
    grammar = "\n".join(f"{name} ::= {body}" for name, body in g.rules.items()) + "\n"
    check_grammar_bounds(grammar, "the tools' parameters", ToolSchemaError)
    return grammar
