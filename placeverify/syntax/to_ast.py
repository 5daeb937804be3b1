"""Parse tree -> AST: :class:`AstBuilder`, one AST class per rule of ``grammar/placement.lark``.

As in lark's ``ast_utils.create_transformer`` (``examples/advanced/create_ast.py``), the rule
``snake_case`` builds the class ``SnakeCase`` of :mod:`placeverify.syntax.ast`, and most rules need
no hand-written method: the builder derives them from the dataclass fields. A token child becomes
an :class:`~placeverify.syntax.ast.Name`, a missing optional part of a tuple field becomes ``()``,
and the span comes from Lark's propagated positions (the ``WithMeta`` of lark's helper). Rules
whose children are a repetition (``block: "{" entry* "}"``) fill the class's one tuple field, like
lark's ``AsList``. Only rules that do more than that have methods below.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from lark import Token, Transformer, v_args

from placeverify.diagnostics import Code, Diagnostic, Severity, Span
from placeverify.syntax import ast
from placeverify.syntax.spans import meta_span, token_span

MAX_NUMBER_DIGITS = 100
MAX_NUMBER_EXPONENT = 100  # number literals lie within 1e-100 .. 1e100 (in magnitude)

_QUANTITY = re.compile(r"^(?P<number>[+-]?[\d_.eE+-]+?)[ \t]*(?P<unit>[A-Za-zµ]+(/s)?)$")


def number_of(text: str) -> Fraction:
    """The exact value of a number literal (``_`` separators allowed)."""
    return Fraction(text.replace("_", ""))


_NUMBER_PARTS = re.compile(r"^[+-]?(?P<whole>\d*)(?:\.(?P<fraction>\d*))?(?:[eE](?P<exponent>[+-]?\d+))?$")


def number_problem(text: str) -> str | None:
    """Why a number literal is out of range (checked on the text: 1e999999999 is never built)."""
    match = _NUMBER_PARTS.match(text.replace("_", ""))
    if match is None:
        return None
    whole, fraction = match["whole"], match["fraction"] or ""
    if len(whole) + len(fraction) > MAX_NUMBER_DIGITS:
        return f"has more than {MAX_NUMBER_DIGITS} digits"
    exponent_text = (match["exponent"] or "0").lstrip("+-").lstrip("0") or "0"
    if len(exponent_text) > 6:
        return "is out of range"
    exponent = int(match["exponent"] or 0)
    digits = whole.lstrip("0")
    if digits:
        magnitude = exponent + len(digits) - 1
    elif fraction.strip("0"):
        magnitude = exponent - (len(fraction) - len(fraction.lstrip("0"))) - 1
    else:
        return None  # zero
    if abs(magnitude) > MAX_NUMBER_EXPONENT:
        return "is out of range"
    return None


def _name(token: Token) -> ast.Name:
    return ast.Name(str(token), token_span(token))


# ---- rules derived from the AST classes ------------------------------------------------------

# Classes whose rule is a repetition: its children fill the one tuple field (lark's AsList).
_AS_LIST: frozenset[type] = frozenset({ast.ListValue, ast.Block, ast.AxisTuple, ast.Group, ast.EachMicrobatch,
                                       ast.StepStmt, ast.MeshStmt, ast.File, ast.Reaches,
                                       ast.UnusedStmt, ast.PlaceFor})
# Rules named otherwise than their class.
_RENAMED: dict[str, type] = {"start": ast.File, "clip_op_stmt": ast.OpStmt}


def rule_name(cls: type) -> str:
    """The grammar rule of an AST class: ``CallPlacement`` -> ``call_placement``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


@dataclass(frozen=True, slots=True)
class _Derived:
    """How one AST class is built from the children of its rule."""

    cls: type
    tuple_fields: tuple[bool, ...]  # per field before ``span``: a tuple (a missing one is ())
    spanned: bool

    @classmethod
    def of(cls, node: type) -> _Derived:
        fields = dataclasses.fields(node)
        spanned = bool(fields) and fields[-1].name == "span"
        own = fields[:-1] if spanned else fields
        return cls(node, tuple(str(f.type).startswith("tuple[") for f in own), spanned)

    def build(self, children: list[Any], meta: Any) -> Any:
        values = [_name(c) if isinstance(c, Token) else c for c in children]
        args: list[Any]
        if self.cls in _AS_LIST:
            args = [tuple(values)]
        else:
            assert len(values) == len(self.tuple_fields), (self.cls.__name__, children)
            args = [() if value is None and is_tuple else value
                    for value, is_tuple in zip(values, self.tuple_fields, strict=True)]
        if self.spanned:
            args.append(meta_span(meta))
        return self.cls(*args)


@v_args(meta=True)
class AstBuilder(Transformer[Token, Any]):
    """Builds one AST node per grammar rule; spans come from Lark's propagated positions.

    Number literals out of range are collected in ``errors`` (and stand in as 0) so that one pass
    reports all of them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[Diagnostic] = []

    def __default__(self, data: Any, children: list[Any], meta: Any) -> Any:
        derived = DERIVED.get(str(data))
        if derived is None:
            return super().__default__(data, children, meta)  # type: ignore[no-untyped-call]
        return derived.build(children, meta)

    def _number(self, text: str, span: Span) -> Fraction:
        problem = number_problem(text)
        if problem is not None:
            shown = text if len(text) <= 24 else text[:21] + "..."
            self.errors.append(Diagnostic(
                Severity.ERROR, f"the number {shown} {problem}", Code.BAD_VALUE, span,
                (f"numbers are written with at most {MAX_NUMBER_DIGITS} digits, between "
                 f"1e-{MAX_NUMBER_EXPONENT} and 1e{MAX_NUMBER_EXPONENT} in size",)))
            return Fraction(0)
        return number_of(text)

    # values
    def number_value(self, meta: Any, children: list[Token]) -> ast.NumberValue:
        token = children[0]
        span = token_span(token)
        return ast.NumberValue(str(token), self._number(str(token), span), span)

    def quantity_value(self, meta: Any, children: list[Token]) -> ast.QuantityValue:
        token = children[0]
        match = _QUANTITY.match(str(token))
        assert match is not None, token
        span = token_span(token)
        return ast.QuantityValue(self._number(match["number"], span), match["unit"], str(token),
                                 span)

    def string_value(self, meta: Any, children: list[Token]) -> ast.StringValue:
        token = children[0]
        raw = str(token)[1:-1]
        value = re.sub(r"\\(.)", r"\1", raw)
        return ast.StringValue(value, token_span(token))

    def starred_value(self, meta: Any, children: list[Token]) -> ast.StarredValue:
        name = _name(children[0])
        return ast.StarredValue(name, name.span.cover(token_span(children[1])))

    # lists without a class of their own
    def args(self, meta: Any, children: list[Any]) -> tuple[ast.Arg, ...]:
        return tuple(children)

    def group_list(self, meta: Any, children: list[Any]) -> tuple[ast.Group, ...]:
        return tuple(children)

    # expressions and step items
    def expr(self, meta: Any, children: list[Any]) -> ast.Expr:
        rest = tuple((str(children[i]), children[i + 1]) for i in range(1, len(children), 2))
        return ast.Expr(children[0], tuple((op.replace("×", "*"), f) for op, f in rest),
                        meta_span(meta))

    def target(self, meta: Any, children: list[Any]) -> ast.Target:
        selectors = tuple(_name(c) for c in children[1:] if c is not None)
        return ast.Target(_name(children[0]), selectors, meta_span(meta))

    def on_microbatch(self, meta: Any, children: list[Any]) -> ast.OnMicrobatch:
        return ast.OnMicrobatch(children[0], tuple(children[1:]), meta_span(meta))

    # top level
    def strategy_stmt(self, meta: Any, children: list[Token]) -> ast.StrategyStmt:
        token = children[0]
        return ast.StrategyStmt(self.string_value(meta, [token]), meta_span(meta))

    def offload_stmt(self, meta: Any, children: list[Any]) -> ast.OffloadStmt:
        *states, device = children
        return ast.OffloadStmt(tuple(_name(s) for s in states),
                               _name(device) if device is not None else None, meta_span(meta))

    def clip_stmt(self, meta: Any, children: list[Any]) -> ast.ClipStmt:
        return ast.ClipStmt(tuple(children[1:]), meta_span(meta))


def _ast_classes() -> list[type]:
    """Every node class of :mod:`placeverify.syntax.ast` (``Name`` is a part, not a rule)."""
    return [c for c in vars(ast).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
            and c.__module__ == ast.__name__ and c is not ast.Name]


def _derive() -> dict[str, _Derived]:
    rules = {rule_name(c): c for c in _ast_classes() if c is not ast.File} | _RENAMED
    return {rule: _Derived.of(c) for rule, c in rules.items() if not hasattr(AstBuilder, rule)}


DERIVED: dict[str, _Derived] = _derive()
"""The rules :class:`AstBuilder` builds without a method of its own, each with its class."""


def built_rules() -> frozenset[str]:
    """Every rule the builder turns into an AST node: a method of its own or a derived one."""
    methods = {n for n, v in vars(AstBuilder).items() if not n.startswith("_") and callable(v)}
    return frozenset(methods | set(DERIVED))
