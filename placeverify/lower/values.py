"""The lowering context and its value readers: numbers, whole numbers, quantities with units,
words, booleans, unique keys and single statements.

Every section of a ``.place`` file is lowered against one :class:`Context`, which holds the
source and the diagnostics collected so far; lowering reports every error it can find in one pass
and each points at the text it is about.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TypeVar

from placeverify.diagnostics import Code, Diagnostics, Source, Span, did_you_mean
from placeverify.syntax import ast

T = TypeVar("T")

RESERVED_AXIS_NAMES = frozenset({"world", "step", "microbatch", "ends"})

# Sanity bounds: values beyond these are typing mistakes, not plans ("absurd numbers").
MAX_PARAMS = 10**15
MAX_AXIS = 10**7
MAX_WORLD = 10**8
MAX_DIM = 10**7
MAX_LAYERS = 100_000
MAX_SEQ = 10**8
MAX_BYTES_PER_ELEMENT = 64
MAX_MEMORY = 10**16

BYTE_UNITS: dict[str, Fraction] = {
    "B": Fraction(1), "KB": Fraction(10**3), "MB": Fraction(10**6), "GB": Fraction(10**9),
    "TB": Fraction(10**12), "PB": Fraction(10**15), "KiB": Fraction(2**10),
    "MiB": Fraction(2**20), "GiB": Fraction(2**30), "TiB": Fraction(2**40), "PiB": Fraction(2**50),
    "Gb": Fraction(10**9, 8), "Tb": Fraction(10**12, 8),
}
TIME_UNITS: dict[str, Fraction] = {
    "ns": Fraction(1, 10**9), "us": Fraction(1, 10**6), "µs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000), "s": Fraction(1),
}

BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


class Context:
    """The source being lowered, its diagnostics, and the readers of single values."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.diag = Diagnostics(source)

    def error(self, message: str, code: Code, span: Span | None, *notes: str) -> None:
        self.diag.error(message, code, span, *notes)

    def number(self, value: ast.Value, what: str) -> Fraction | None:
        if isinstance(value, ast.NumberValue):
            return value.value
        if isinstance(value, ast.QuantityValue):
            self.error(f"{what} is a plain number, not '{value.text}'", Code.BAD_VALUE, value.span)
        else:
            self.error(f"{what} must be a number", Code.BAD_VALUE, value.span)
        return None

    def integer(self, value: ast.Value, what: str, low: int = 1, high: int = MAX_DIM) -> int | None:
        number = self.number(value, what)
        if number is None:
            return None
        if number.denominator != 1:
            self.error(f"{what} must be a whole number, not {literal(value, number)}",
                       Code.BAD_VALUE, value.span)
            return None
        return self.in_range(int(number), what, value.span, low, high)

    def in_range(self, n: int, what: str, span: Span, low: int, high: int) -> int | None:
        if n < low:
            kind = "zero" if n == 0 else "negative" if n < 0 else "too small"
            self.error(f"{what} must be at least {low}, got {n} ({kind})", Code.BAD_VALUE, span)
            return None
        if n > high:
            self.error(f"{what} = {count(n)} is absurdly large (the limit is {count(high)})",
                       Code.BAD_VALUE, span)
            return None
        return n

    def quantity(self, value: ast.Value, what: str, units: dict[str, Fraction], per_second: bool,
                 high: Fraction) -> Fraction | None:
        if not isinstance(value, ast.QuantityValue):
            example = {True: "25 GB/s", False: "80 GB" if units is BYTE_UNITS else "5 us"}
            self.error(f"{what} needs a unit, e.g. '{example[per_second]}'", Code.BAD_VALUE,
                       value.span)
            return None
        unit = value.unit.removesuffix("/s")
        if value.unit.endswith("/s") != per_second or unit not in units:
            valid = [u + ("/s" if per_second else "") for u in units]
            self.error(f"'{value.unit}' is not a unit of {what}{did_you_mean(value.unit, valid)}",
                       Code.BAD_VALUE, value.span)
            return None
        amount = value.number * units[unit]
        if amount <= 0:
            self.error(f"{what} must be positive, got {value.text}", Code.BAD_VALUE, value.span)
            return None
        if amount > high:
            self.error(f"{what} = {value.text} is absurdly large", Code.BAD_VALUE, value.span)
            return None
        return amount

    def word(self, value: ast.Value, what: str, choices: Sequence[str]) -> str | None:
        if isinstance(value, ast.NameValue) and value.name.text in choices:
            return value.name.text
        shown = value_text(value)
        self.error(f"unknown {what} '{shown}'{did_you_mean(shown, choices)}", Code.UNKNOWN_NAME,
                   value.span)
        return None

    def boolean(self, value: ast.Value, what: str) -> bool | None:
        if isinstance(value, ast.NameValue) and value.name.text in BOOLEANS:
            return BOOLEANS[value.name.text]
        self.error(f"{what} is true or false, not '{value_text(value)}'", Code.BAD_VALUE,
                   value.span)
        return None

    def unique(self, items: Sequence[T], key: Callable[[T], str], span: Callable[[T], Span],
               what: str) -> dict[str, T]:
        seen: dict[str, T] = {}
        for item in items:
            k = key(item)
            if k in seen:
                first = span(seen[k])
                self.error(f"duplicate {what} '{k}'", Code.DUPLICATE, span(item),
                           f"first defined at {at(first)}")
            else:
                seen[k] = item
        return seen

    def single(self, statements: Sequence[T], what: str) -> T | None:
        for extra in statements[1:]:
            first = statements[0].span  # type: ignore[attr-defined]
            self.error(f"duplicate '{what}' statement", Code.DUPLICATE, extra.span,  # type: ignore[attr-defined]
                       f"the first is at {at(first)}")
        return statements[0] if statements else None


def value_text(value: ast.Value) -> str:
    """A value as the user wrote it (``S*`` for a starred name)."""
    if isinstance(value, ast.NameValue):
        return value.name.text
    if isinstance(value, ast.StarredValue):
        return value.name.text + "*"
    if isinstance(value, ast.StringValue):
        return value.value
    if isinstance(value, ast.QuantityValue):
        return value.text
    if isinstance(value, ast.ListValue):
        return "[" + ", ".join(value_text(v) for v in value.items) + "]"
    return value.text


def at(span: Span) -> str:
    return f"line {span.line}, column {span.column}"


def literal(value: ast.Value, number: Fraction) -> str:
    """A number as the user wrote it (1e-9 stays 1e-9, not 0)."""
    return value.text if isinstance(value, ast.NumberValue) else show(number)


def count(n: int) -> str:
    """A whole number with thousands separators, or in scientific form past 10**16."""
    if abs(n) < 10**16:
        return f"{n:,}"
    digits = str(abs(n))  # not float(n): that overflows past 1e308
    mantissa = (digits[0] + "." + digits[1:4]).rstrip("0").rstrip(".")
    return f"{'-' if n < 0 else ''}{mantissa}e{len(digits) - 1}"


def show(number: Fraction) -> str:
    return str(number.numerator) if number.denominator == 1 else f"{float(number):g}"
