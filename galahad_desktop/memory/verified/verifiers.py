"""Mechanical answer checks for the verified-answer library.

A verifier recognises questions it can check, gives them a canonical key (so paraphrases of
the same problem meet, and the same template with other numbers never does), and checks an
answer against the value it computes itself. Arithmetic is evaluated by walking Python's AST
with a whitelist of operators and bounded sizes: never `eval`.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

NUMBER = re.compile(r"[-−]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    expected: str
    found: str | None
    verifier: str
    detail: str


class Verifier(Protocol):
    name: str

    def key(self, question: str) -> str | None:
        """Canonical key of the problem, or None when this verifier cannot check it."""

    def check(self, question: str, answer: str) -> Verdict: ...


def _numbers(text: str) -> list[float]:
    out = []
    for raw in NUMBER.findall(text.replace("−", "-")):
        try:
            out.append(float(raw.replace(",", "")))
        except ValueError:
            continue
    return out


def stated_answer(question: str, answer: str, expected: float) -> float | None:
    """The first number the answer states that is not an echo of the question's own numbers
    (a model that rambles "What is 3 + 5? ... This is 8" states 3 first, not 8)."""
    asked = _numbers(question)
    for value in _numbers(answer):
        if _close(value, expected) or not any(_close(value, q) for q in asked):
            return value
    return None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _numeric_verdict(
    ok: bool, expected: float, stated: float | None, name: str, lead: str
) -> Verdict:
    """A number checked against the one computed: the detail is `lead` + the expected."""
    shown = None if stated is None else _format(stated)
    return Verdict(ok, _format(expected), shown, name, f"{lead}{_format(expected)}")


def _format(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


# -- arithmetic ------------------------------------------------------------------------------

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Fraction], Fraction]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_EXPRESSION = re.compile(r"[-+*/×÷^%().\d\s]{3,}")


class UnsafeExpression(ValueError):
    pass


MAX_BITS = 1024  # numerator and denominator of every intermediate value


def _bits(value: Fraction) -> int:
    return max(value.numerator.bit_length(), value.denominator.bit_length())


def safe_arithmetic(expression: str) -> Fraction:
    """Exact value of + - * / // % ** and parentheses on numbers; refuses anything else,
    huge powers and deep nesting."""
    text = expression.replace("×", "*").replace("÷", "/").replace("^", "**").replace("−", "-")
    if len(text) > 200:
        raise UnsafeExpression("expression too long")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise UnsafeExpression("not an arithmetic expression") from None

    def walk(node: ast.AST, depth: int) -> Fraction:
        if depth > 40:
            raise UnsafeExpression("nested too deeply")
        if isinstance(node, ast.Expression):
            return walk(node.body, depth + 1)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return Fraction(str(node.value))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left, depth + 1), walk(node.right, depth + 1)
            # Exact fractions grow with every power: bound the result's size before
            # computing it (1/999999 ** 64 ** 64 would take minutes and gigabytes).
            if isinstance(node.op, ast.Pow) and (
                right.denominator != 1
                or abs(right) > 64
                or abs(left) > 10**6
                or _bits(left) * abs(int(right)) > MAX_BITS
            ):
                raise UnsafeExpression("power too large")
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
                raise UnsafeExpression("division by zero")
            try:  # total: 0 ** -1 and the like are "cannot verify", never an exception
                value = _BINARY[type(node.op)](left, right)
            except (ArithmeticError, ValueError):
                raise UnsafeExpression("not a number (division by zero or overflow)") from None
            if abs(value) > 10**30 or _bits(Fraction(value)) > MAX_BITS:
                raise UnsafeExpression("value too large or too precise")
            return Fraction(value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return Fraction(_UNARY[type(node.op)](walk(node.operand, depth + 1)))
        raise UnsafeExpression(f"'{type(node).__name__}' is not allowed")

    return walk(tree, 0)


class ArithmeticVerifier:
    name = "arithmetic"

    _BINARY_OP = re.compile(r"[\d)]\s*(?:\*\*|[-+*/×÷^%])\s*[-(\d]")

    def _expression(self, question: str) -> str | None:
        text = question.replace("−", "-")
        candidates = []
        for match in _EXPRESSION.finditer(text):
            candidate = match.group().strip().rstrip(".").strip()
            glued = match.start() > 0 and not match.group()[0].isspace()
            # An operand must be a number: "x2 + 3" or "a + 1" is algebra, not arithmetic.
            if glued and (text[match.start() - 1].isalnum() or text[match.start() - 1] == "_"):
                continue
            if not re.match(r"^(?:\(|-?\d)", candidate) or not re.search(r"[\d)]$", candidate):
                continue
            if self._BINARY_OP.search(candidate):
                candidates.append(candidate)
        if not candidates:
            return None
        expression: str = max(candidates, key=len)
        try:
            safe_arithmetic(expression)
        except UnsafeExpression:
            return None
        return expression

    def key(self, question: str) -> str | None:
        expression = self._expression(question)
        if expression is None:
            return None
        canonical = re.sub(
            r"\s+", "", expression.replace("×", "*").replace("÷", "/").replace("^", "**")
        )
        return f"arithmetic:{canonical}"

    def check(self, question: str, answer: str) -> Verdict:
        expression = self._expression(question)
        if expression is None:
            return Verdict(False, "", None, self.name, "no arithmetic expression found")
        expected = float(safe_arithmetic(expression))
        stated = stated_answer(question, answer, expected)
        ok = stated is not None and _close(stated, expected)
        return _numeric_verdict(ok, expected, stated, self.name, f"{expression} = ")


# -- unit conversions ------------------------------------------------------------------------

_UNITS: dict[str, tuple[str, float]] = {}
for _dimension, _table in {
    "length": {
        "mm": 0.001,
        "millimeter": 0.001,
        "millimetre": 0.001,
        "cm": 0.01,
        "centimeter": 0.01,
        "centimetre": 0.01,
        "m": 1.0,
        "meter": 1.0,
        "metre": 1.0,
        "km": 1000.0,
        "kilometer": 1000.0,
        "kilometre": 1000.0,
        "in": 0.0254,
        "inch": 0.0254,
        "ft": 0.3048,
        "foot": 0.3048,
        "feet": 0.3048,
        "yd": 0.9144,
        "yard": 0.9144,
        "mi": 1609.344,
        "mile": 1609.344,
    },
    "mass": {
        "mg": 1e-6,
        "milligram": 1e-6,
        "g": 0.001,
        "gram": 0.001,
        "kg": 1.0,
        "kilogram": 1.0,
        "t": 1000.0,
        "tonne": 1000.0,
        "lb": 0.45359237,
        "pound": 0.45359237,
        "oz": 0.028349523125,
        "ounce": 0.028349523125,
    },
    "time": {
        "s": 1.0,
        "second": 1.0,
        "min": 60.0,
        "minute": 60.0,
        "h": 3600.0,
        "hour": 3600.0,
        "day": 86400.0,
        "week": 604800.0,
    },
    "volume": {
        "ml": 0.001,
        "milliliter": 0.001,
        "millilitre": 0.001,
        "l": 1.0,
        "liter": 1.0,
        "litre": 1.0,
        "gallon": 3.785411784,
    },
}.items():
    for _name, _factor in _table.items():
        _UNITS[_name] = (_dimension, _factor)
_TEMPERATURE = {
    "c": "celsius",
    "celsius": "celsius",
    "f": "fahrenheit",
    "fahrenheit": "fahrenheit",
    "k": "kelvin",
    "kelvin": "kelvin",
}


def _unit(word: str) -> str | None:
    w = word.lower().strip(".?,°")
    for candidate in (w, w[:-1] if w.endswith("s") else w, w[:-2] if w.endswith("es") else w):
        if candidate in _UNITS or candidate in _TEMPERATURE:
            return candidate
    return None


def _to_kelvin(value: float, scale: str) -> float:
    return {
        "celsius": value + 273.15,
        "fahrenheit": (value - 32) * 5 / 9 + 273.15,
        "kelvin": value,
    }[scale]


def _from_kelvin(value: float, scale: str) -> float:
    return {
        "celsius": value - 273.15,
        "fahrenheit": (value - 273.15) * 9 / 5 + 32,
        "kelvin": value,
    }[scale]


class UnitConversionVerifier:
    name = "unit conversion"
    _PATTERNS = (
        re.compile(
            r"convert\s+(?P<v>[-\d.,]+)\s*°?\s*(?P<a>[a-zA-Z]+)\s+(?:to|into|in)\s+"
            r"°?(?P<b>[a-zA-Z]+)",
            re.I,
        ),
        re.compile(
            r"how many\s+(?P<b>[a-zA-Z]+)\s+(?:are|is)?\s*(?:there\s+)?in\s+"
            r"(?P<v>[-\d.,]+)\s*°?\s*(?P<a>[a-zA-Z]+)",
            re.I,
        ),
        re.compile(
            r"(?P<v>[-\d.,]+)\s*°?\s*(?P<a>[a-zA-Z]+)\s+(?:is|are|equals|=)\s+how many\s+"
            r"°?(?P<b>[a-zA-Z]+)",
            re.I,
        ),
        re.compile(
            r"what is\s+(?P<v>[-\d.,]+)\s*°?\s*(?P<a>[a-zA-Z]+)\s+in\s+°?(?P<b>[a-zA-Z]+)", re.I
        ),
    )

    def _parse(self, question: str) -> tuple[float, str, str] | None:
        for pattern in self._PATTERNS:
            match = pattern.search(question)
            if not match:
                continue
            a, b = _unit(match["a"]), _unit(match["b"])
            try:
                value = float(match["v"].replace(",", ""))
            except ValueError:
                continue
            if a is None or b is None:
                continue
            if (a in _TEMPERATURE) != (b in _TEMPERATURE):
                continue
            if a in _UNITS and _UNITS[a][0] != _UNITS[b][0]:
                continue
            return value, a, b
        return None

    def expected(self, question: str) -> float | None:
        parsed = self._parse(question)
        if parsed is None:
            return None
        value, a, b = parsed
        if a in _TEMPERATURE:
            return _from_kelvin(_to_kelvin(value, _TEMPERATURE[a]), _TEMPERATURE[b])
        return value * _UNITS[a][1] / _UNITS[b][1]

    def key(self, question: str) -> str | None:
        parsed = self._parse(question)
        if parsed is None:
            return None
        value, a, b = parsed

        def canonical(unit: str) -> str:  # synonyms meet: "g", "gram", "grams"
            if unit in _TEMPERATURE:
                return _TEMPERATURE[unit]
            dimension, factor = _UNITS[unit]
            return f"{dimension}*{factor:g}"

        return f"unit:{_format(value)}:{canonical(a)}->{canonical(b)}"

    def check(self, question: str, answer: str) -> Verdict:
        expected = self.expected(question)
        if expected is None:
            return Verdict(False, "", None, self.name, "no unit conversion found")
        stated = stated_answer(question, answer, expected)
        ok = stated is not None and math.isclose(stated, expected, rel_tol=1e-3, abs_tol=1e-6)
        return _numeric_verdict(ok, expected, stated, self.name, "expected ")


VERIFIERS: list[Verifier] = [UnitConversionVerifier(), ArithmeticVerifier()]


def verifier_for(question: str) -> tuple[Verifier, str] | None:
    """The first verifier that can check this question, with the problem's canonical key."""
    for verifier in VERIFIERS:
        key = verifier.key(question)
        if key is not None:
            return verifier, key
    return None


def normalize(question: str) -> str:
    """Text normal form for questions no verifier recognises (exact-match recurrence)."""
    text = question.lower().replace("×", "*").replace("÷", "/").replace("−", "-")
    text = re.sub(r"[^\w*/+\-^%.=()]+", " ", text)
    return re.sub(r"\s+", " ", text).strip(" .?!")
