"""GBNF, read and matched in Python: the fake engine's grammar constraint.

llama.cpp's grammar sampler needs a llama.cpp vocabulary; the fast tier's fake model has a
byte vocabulary of its own. This reads the same GBNF text the real engine hands llama.cpp
(literals, character classes, rule references, groups, `* + ? {m,n}`, `<[id]>` tokens) and
matches it the way llama.cpp does: a set of stacks of what may come next, advanced one
character (or one token) at a time. Left-recursive grammars are not supported (llama.cpp
refuses them too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Char = tuple[bool, tuple[tuple[int, int], ...]]  # (negated, ranges)
Symbol = tuple[str, object]  # ("c", Char) | ("t", token id) | ("n", rule name)
Stack = tuple[Symbol, ...]

_TOKEN = re.compile(
    r'\s*(?:(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])|(?P<tok><\[\d+\]>)'
    r"|(?P<def>::=)|(?P<name>[A-Za-z0-9_-]+)|(?P<op>[|()*+?])|(?P<rep>\{\d*(?:,\d*)?\})"
    r"|(?P<dot>\.)|(?P<comment>#[^\n]*))"
)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}


def _chars(body: str) -> list[int]:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            if nxt == "x":
                out.append(int(body[i + 2 : i + 4], 16))
                i += 4
                continue
            if nxt == "u":
                out.append(int(body[i + 2 : i + 6], 16))
                i += 6
                continue
            out.append(ord(_ESCAPES.get(nxt, nxt)))
            i += 2
            continue
        out.append(ord(c))
        i += 1
    return out


def _char_class(text: str) -> Char:
    body = text[1:-1]
    negated = body.startswith("^")
    codes = _chars(body[1:] if negated else body)
    ranges, i = [], 0
    while i < len(codes):
        if i + 2 < len(codes) and codes[i + 1] == ord("-"):
            ranges.append((codes[i], codes[i + 2]))
            i += 3
        else:
            ranges.append((codes[i], codes[i]))
            i += 1
    return negated, tuple(ranges)


@dataclass
class Grammar:
    rules: dict[str, list[list[Symbol]]]

    @classmethod
    def parse(cls, text: str) -> Grammar:
        tokens = [
            (m.lastgroup or "", m.group(m.lastgroup or 0))
            for m in _TOKEN.finditer(text)
            if m.lastgroup != "comment"
        ]
        grammar = cls({})
        i = 0
        while i < len(tokens):
            if tokens[i][0] != "name" or tokens[i + 1][0] != "def":
                raise ValueError(f"expected a rule at {tokens[i][1]!r}")
            name, i = tokens[i][1], i + 2
            end = i
            depth = 0
            while end < len(tokens) and not (
                depth == 0
                and tokens[end][0] == "name"
                and end + 1 < len(tokens)
                and tokens[end + 1][0] == "def"
            ):
                depth += {"(": 1, ")": -1}.get(tokens[end][1], 0) if tokens[end][0] == "op" else 0
                end += 1
            grammar.rules[name] = grammar._alternatives(tokens[i:end], name)
            i = end
        if "root" not in grammar.rules:
            raise ValueError("the grammar has no root rule")
        return grammar

    def _new_rule(self, base: str, alternatives: list[list[Symbol]]) -> Symbol:
        name = f"{base}~{len(self.rules)}"
        while name in self.rules:
            name += "'"
        self.rules[name] = alternatives
        return ("n", name)

    def _alternatives(self, tokens: list[tuple[str, str]], base: str) -> list[list[Symbol]]:
        alternatives: list[list[Symbol]] = [[]]
        i = 0
        while i < len(tokens):
            kind, text = tokens[i]
            if kind == "op" and text == "|":
                alternatives.append([])
                i += 1
                continue
            if kind == "op" and text == "(":
                depth, j = 1, i + 1
                while depth:
                    if tokens[j] == ("op", "("):
                        depth += 1
                    elif tokens[j] == ("op", ")"):
                        depth -= 1
                    j += 1
                element = [self._new_rule(base, self._alternatives(tokens[i + 1 : j - 1], base))]
                i = j
            elif kind == "lit":
                element = [("c", (False, ((c, c),))) for c in _chars(text[1:-1])]
                i += 1
            elif kind == "cls":
                element = [("c", _char_class(text))]
                i += 1
            elif kind == "tok":
                element = [("t", int(text[2:-2]))]
                i += 1
            elif kind == "dot":
                element = [("c", (True, ((10, 10),)))]
                i += 1
            elif kind == "name":
                element = [("n", text)]
                i += 1
            else:
                raise ValueError(f"unexpected {text!r}")
            if i < len(tokens) and (tokens[i][0] == "rep" or tokens[i][1] in ("*", "+", "?")):
                element = self._repeat(base, element, tokens[i][1])
                i += 1
            alternatives[-1].extend(element)
        return alternatives

    def _repeat(self, base: str, element: list[Symbol], op: str) -> list[Symbol]:
        low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(op, (0, 0))
        if op.startswith("{"):
            inner = op[1:-1]
            if "," in inner:
                a, b = inner.split(",")
                low, high = int(a or 0), (int(b) if b else None)
            else:
                low = high = int(inner)
        out = element * low
        if high is None:
            star = self._new_rule(base, [])
            self.rules[str(star[1])] = [[*element, star], []]
            return [*out, star]
        optional: list[Symbol] = []
        for _ in range(high - low):  # x? (x (x)?)? … nested from the inside out
            optional = [self._new_rule(base, [[*element, *optional], []])]
        return out + optional


class Matcher:
    """Where a grammar's match stands: the stacks of what may come next."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.stacks = self._expand([(("n", "root"),)])

    def _expand(self, stacks: list[Stack]) -> frozenset[Stack]:
        out: set[Stack] = set()
        todo = list(stacks)
        seen: set[Stack] = set()
        while todo:
            stack = todo.pop()
            if stack in seen:
                continue
            seen.add(stack)
            if stack and stack[0][0] == "n":
                for alternative in self.grammar.rules[str(stack[0][1])]:
                    todo.append((*alternative, *stack[1:]))
            else:
                out.add(stack)
        return frozenset(out)

    @property
    def complete(self) -> bool:
        return () in self.stacks

    def advance_char(self, stacks: frozenset[Stack], code: int) -> frozenset[Stack]:
        moved = []
        for stack in stacks:
            if stack and stack[0][0] == "c":
                char: Char = stack[0][1]  # type: ignore[assignment]
                negated, ranges = char
                inside = any(a <= code <= b for a, b in ranges)
                if inside != negated:
                    moved.append(stack[1:])
        return self._expand(moved)

    def advance_token(self, stacks: frozenset[Stack], token: int) -> frozenset[Stack]:
        return self._expand([s[1:] for s in stacks if s and s[0] == ("t", token)])

    def after(self, token: int, text: bytes | None) -> frozenset[Stack]:
        """The stacks after a token: a `<[id]>` match, or its text character by character
        (None: a token with no text, matched only by its id)."""
        by_id = self.advance_token(self.stacks, token)
        if by_id or text is None:
            return by_id
        stacks = self.stacks
        for code in text.decode("utf-8", "replace"):
            stacks = self.advance_char(stacks, ord(code))
            if not stacks:
                break
        return stacks
