"""Bounds a JSON schema and its grammar must keep before llama.cpp is handed either.

llama.cpp's grammar parser is recursive: a schema whose counts become deep nesting
(`maxItems` 20,000 is 20,000 nested groups) overflows the native stack and kills the whole
process, and one whose counts become long rules (`minItems` 10^8, a 100,000-value enum) takes
gigabytes or minutes. So a schema is walked here first, without recursion, and refused by
the name of the part that passes a bound; then the grammar itself is measured (size, rules,
nesting, repetition counts) in case a bound was reached another way. Nothing here imports
llama.cpp: the checks are plain Python and cheap.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

# Counts a schema may ask for (items, characters, properties, a pattern's {m,n}). llama.cpp
# refuses repetitions over 2,000 itself; 1,000 leaves room for a schema that nests a few.
MAX_REPEAT = 1000
MAX_ENUM = 1000  # values of one enum: each is an alternative the sampler tries every token
MAX_NODES = 5000  # schema objects in one schema
MAX_PROPERTIES = 500  # of one object: the converter recurses once per optional property
MAX_PATTERN = 2000  # characters of one pattern
MAX_PATTERN_GROUPS = 32  # groups nested in one another in a pattern (each is a recursion)
MAX_JSON_DEPTH = 64  # JSON levels of one schema (each schema level is two: properties, name)
MAX_GRAMMAR_BYTES = 256 * 1024
MAX_GRAMMAR_RULES = 4000
MAX_GRAMMAR_NESTING = MAX_REPEAT + 64  # parenthesised groups inside groups, in one rule
MAX_SAFE_INTEGER = 2**53  # what every JSON reader holds exactly

_COUNTS = {
    "minItems": "items",
    "maxItems": "items",
    "minLength": "characters",
    "maxLength": "characters",
    "minProperties": "properties",
    "maxProperties": "properties",
}
_PAIRS = (("minItems", "maxItems"), ("minLength", "maxLength"), ("minProperties", "maxProperties"))
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")

Refuse = Callable[[str], Exception]


def check_schema_bounds(schema: Any, where: str, refuse: Refuse) -> None:
    """Raise `refuse(message)` for the first part of `schema` a grammar cannot hold within
    the bounds above, or that cannot be honoured at all (a minimum over its maximum, a
    pattern that is no regular expression, a $ref to nothing)."""
    todo: list[tuple[Any, str, int]] = [(schema, where, 1)]
    nodes = 0
    refs: list[tuple[str, str]] = []  # (the $ref, where it is)
    while todo:
        value, path, depth = todo.pop()
        if depth > MAX_JSON_DEPTH:
            raise refuse(f"{where} nests more than {MAX_JSON_DEPTH} levels deep (at {path}).")
        if isinstance(value, list):
            todo.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_SAFE_INTEGER:
                raise refuse(f"{path} is an integer too large to use (more than 2^53).")
            continue
        if not isinstance(value, dict):
            continue
        nodes += 1
        if nodes > MAX_NODES:
            raise refuse(f"{where} has more than {MAX_NODES} parts; send a smaller schema.")
        _check_keywords(value, path, schema, refuse)
        if "$ref" in value:
            refs.append((value["$ref"], f"{path}.$ref"))
        todo.extend((child, f"{path}.{key}", depth + 1) for key, child in value.items())
    _check_ref_cycles(schema, refs, refuse)


def _check_keywords(node: dict[str, Any], path: str, root: Any, refuse: Refuse) -> None:
    for key, noun in _COUNTS.items():
        if key not in node:
            continue
        count = node[key]
        if isinstance(count, bool) or not isinstance(count, int):
            raise refuse(f"{path}.{key} must be a whole number, not {_shown(count)}.")
        if count < 0:
            raise refuse(f"{path}.{key} must not be negative (it is {count}).")
        if count > MAX_REPEAT:
            raise refuse(
                f"{path}.{key} is {count}; a reply can be held to at most {MAX_REPEAT} {noun}."
            )
    for low, high in _PAIRS:
        if low in node and high in node and node[low] > node[high]:
            raise refuse(
                f"{path}.{low} ({node[low]}) is more than {high} ({node[high]}): "
                "no value can have both."
            )
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list) or not values:
            raise refuse(f"{path}.enum must be a non-empty list.")
        if len(values) > MAX_ENUM:
            raise refuse(
                f"{path}.enum has {len(values)} values; a reply can be held to at most {MAX_ENUM}."
            )
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        for kind in kinds:
            if kind not in _TYPES:
                raise refuse(f"{path}.type is {_shown(kind)}; one of {', '.join(_TYPES)}.")
    properties = node.get("properties")
    if isinstance(properties, dict) and len(properties) > MAX_PROPERTIES:
        raise refuse(
            f"{path}.properties has {len(properties):,} names; an object can be held to at "
            f"most {MAX_PROPERTIES}."
        )
    if "pattern" in node:
        _check_pattern(node["pattern"], f"{path}.pattern", refuse)
    if "$ref" in node:
        _check_ref(node["$ref"], f"{path}.$ref", root, refuse)


def _check_pattern(pattern: Any, path: str, refuse: Refuse) -> None:
    if not isinstance(pattern, str):
        raise refuse(f"{path} must be a string.")
    if len(pattern) > MAX_PATTERN:
        raise refuse(f"{path} has {len(pattern):,} characters; at most {MAX_PATTERN:,}.")
    _check_pattern_reading(pattern, path, refuse)  # before re: it recurses on deep groups
    try:
        with warnings.catch_warnings():  # re's FutureWarnings ("nested set") would reach the log
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except re.error as exc:
        raise refuse(f"{path} is not a regular expression ({exc.msg}).") from None
    for match in _QUANTIFIER.finditer(pattern):
        counts = [int(g) for g in match.groups() if g]
        if max(counts) > MAX_REPEAT:
            raise refuse(
                f"{path} repeats {match.group(0)}; at most {MAX_REPEAT} repetitions can be held."
            )
        if len(counts) == 2 and counts[0] > counts[1]:
            raise refuse(f"{path} has {match.group(0)}, whose minimum is over its maximum.")


def _check_pattern_reading(pattern: str, path: str, refuse: Refuse) -> None:
    """Read the pattern as llama-cpp-python's converter does: a class ends at its first
    unescaped ']', a count at its '}'. A ']' or '}' left over is a character to Python's re
    but stops the converter's reader, which then loops forever (`^[]a]$` held a request's
    thread at full CPU). Groups nested past MAX_PATTERN_GROUPS are refused as well: the
    converter and re both recurse once per group."""
    depth = 0
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if char in "[{":
            close = "]" if char == "[" else "}"
            i += 1
            while i < n and pattern[i] != close:
                i += 2 if pattern[i] == "\\" and char == "[" else 1
            if i >= n:
                raise refuse(f"{path} has a {char!r} that is never closed; write it as '\\{char}'.")
        elif char in "]}":
            raise refuse(
                f"{path} has a {char!r} that closes nothing (at character {i + 1}); write it "
                f"as '\\{char}'."
            )
        elif char == "(":
            depth += 1
            if depth > MAX_PATTERN_GROUPS:
                raise refuse(f"{path} nests more than {MAX_PATTERN_GROUPS} groups in one another.")
        elif char == ")":
            depth -= 1
        i += 1


def _check_ref(ref: Any, path: str, root: Any, refuse: Refuse) -> None:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise refuse(
            f"{path} must point inside the schema ('#/$defs/NAME'); other references "
            "cannot be fetched."
        )
    if _target(root, ref) is _NOTHING:
        raise refuse(f"{path} is {ref!r}, which names nothing in the schema.")


_NOTHING = object()


def _target(root: Any, ref: str) -> Any:
    target = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            return _NOTHING
        target = target[part]
    return target


def _leading_refs(node: Any, depth: int = 0) -> list[str]:
    """The $refs a value of `node` may begin with before it writes a character (through
    anyOf, oneOf and allOf; depth is bounded by the walk's MAX_JSON_DEPTH)."""
    if not isinstance(node, dict) or depth > MAX_JSON_DEPTH:
        return []
    if isinstance(node.get("$ref"), str):
        return [node["$ref"]]
    found: list[str] = []
    for key in ("anyOf", "oneOf", "allOf"):
        options = node.get(key)
        if isinstance(options, list):
            for option in options:
                found += _leading_refs(option, depth + 1)
    return found


def _check_ref_cycles(root: Any, refs: list[tuple[str, str]], refuse: Refuse) -> None:
    """Refuse a $ref that leads back to itself before anything is written (`a` is
    `anyOf: [a, string]`): its grammar is left-recursive, which no parser can follow. A
    reference inside an array or object (a tree) writes '[' or '{' first and is fine."""
    following = {ref: _leading_refs(_target(root, ref)) for ref, _ in refs}
    for start, path in refs:
        seen: set[str] = set()
        todo = list(following.get(start, []))
        while todo:
            ref = todo.pop()
            if ref == start:
                raise refuse(
                    f"{path} ({start!r}) leads back to itself before anything is written: "
                    "no value could ever end."
                )
            if ref not in seen:
                seen.add(ref)
                todo.extend(following.get(ref, _leading_refs(_target(root, ref))))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_grammar_bounds(grammar: str, where: str, refuse: Refuse) -> None:
    """Raise `refuse(message)` if the GBNF is past what llama.cpp's parser and sampler are
    known to take safely: its size, its rule count, groups nested in groups, and `{m,n}`
    counts (each is expanded into rules by llama.cpp)."""
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise refuse(
            f"{where} makes a grammar of {len(grammar):,} characters; at most "
            f"{MAX_GRAMMAR_BYTES:,} can be used. Send a smaller schema."
        )
    rules = grammar.count("::=")
    if rules > MAX_GRAMMAR_RULES:
        raise refuse(
            f"{where} makes a grammar of {rules:,} rules; at most {MAX_GRAMMAR_RULES:,} "
            "can be used. Send a smaller schema."
        )
    deepest = _nesting(grammar)
    if deepest > MAX_GRAMMAR_NESTING:
        raise refuse(
            f"{where} nests {deepest:,} groups in one another in its grammar; at most "
            f"{MAX_GRAMMAR_NESTING:,} can be used (lower maxItems or maxLength)."
        )
    for match in _QUANTIFIER.finditer(_outside_literals(grammar)):
        counts = [int(g) for g in match.groups() if g]
        if max(counts) > MAX_REPEAT:
            raise refuse(
                f"{where} asks for {max(counts):,} repetitions; at most {MAX_REPEAT:,} can be held."
            )


def _outside_literals(grammar: str) -> str:
    """The grammar with its string literals and character classes blanked (their braces
    and parentheses are characters, not structure)."""
    out: list[str] = []
    i, n = 0, len(grammar)
    while i < n:
        char = grammar[i]
        if char in '"[':
            close = '"' if char == '"' else "]"
            i += 1
            while i < n and grammar[i] != close:
                i += 2 if grammar[i] == "\\" else 1
            out.append(" ")
            i += 1
            continue
        if char == "#":  # a comment runs to the end of its line
            while i < n and grammar[i] != "\n":
                i += 1
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _nesting(grammar: str) -> int:
    deepest = depth = 0
    for char in _outside_literals(grammar):
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest
