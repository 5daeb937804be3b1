"""Rule files: text -> parse tree (grammar/rules.lark) -> a :class:`Rule`.

A rule file holds one rule: a title, the quantities it quantifies over (``for every``), term
definitions (``let``), claims (``prove`` / ``refute``), and optionally the statements of a
strategy in the .place language (parsed by the .place grammar's own rules, imported by
rules.lark, and transformed by the same AST builder).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lark import Lark, Token, v_args
from lark.exceptions import UnexpectedInput

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span
from placeverify.prove.claims import ClaimKind, ClaimSense
from placeverify.syntax import ast
from placeverify.syntax.errors import syntax_diagnostic
from placeverify.syntax.grammar import PARSER_OPTIONS, grammar_path
from placeverify.syntax.parser_cache import load_or_build
from placeverify.syntax.spans import meta_span, token_span
from placeverify.syntax.to_ast import DERIVED, AstBuilder

RULES_GRAMMAR = "rules.lark"
IMPORTED = "placement__"


# ---- terms -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TNum:
    value: int | str  # an int, or a decimal's text


@dataclass(frozen=True, slots=True)
class TName:
    name: str


@dataclass(frozen=True, slots=True)
class TElem:
    """A tensor element ``X[i, r*w + j]``."""

    name: str
    indices: tuple[Term, ...]


@dataclass(frozen=True, slots=True)
class TApp:
    """An elementwise function ``gelu(x)``."""

    name: str
    args: tuple[Term, ...]


@dataclass(frozen=True, slots=True)
class TSum:
    """``sum(var < bound) body``."""

    var: str
    bound: Term
    body: Term


@dataclass(frozen=True, slots=True)
class TBin:
    op: str  # + - * / ^
    left: Term
    right: Term


@dataclass(frozen=True, slots=True)
class TNeg:
    value: Term


Term = TNum | TName | TElem | TApp | TSum | TBin | TNeg


# ---- the rule --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bound:
    name: str
    minimum: int | None
    span: Span


@dataclass(frozen=True, slots=True)
class Let:
    name: str
    params: tuple[str, ...]
    body: Term
    span: Span


@dataclass(frozen=True, slots=True)
class Claim:
    expect: ClaimSense
    kind: ClaimKind
    span: Span
    text: str
    conditions: tuple[str, ...] = ()
    key: str = ""
    left: Term | None = None
    right: Term | None = None


@dataclass
class Rule:
    source: Source
    title: str
    bounds: list[Bound] = field(default_factory=list)
    lets: dict[str, Let] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    statements: list[ast.Statement] = field(default_factory=list)
    span: Span | None = None


@functools.cache
def rules_parser() -> Lark:
    folder = grammar_path().parent
    return load_or_build((folder / RULES_GRAMMAR).read_text(encoding="utf-8"), PARSER_OPTIONS,
                         "rules", [str(folder)])


@v_args(meta=True)
class RuleBuilder(AstBuilder):
    """The .place AST builder, extended with the theorem form; imported rules lose their prefix."""

    def __default__(self, data: Any, children: list[Any], meta: Any) -> Any:
        name = str(data)
        if name.startswith(IMPORTED):
            rule = name[len(IMPORTED):]
            method = getattr(self, rule, None)
            if method is not None:
                return method(meta, children)
            if rule in DERIVED:
                return super().__default__(rule, children, meta)
        return super().__default__(data, children, meta)

    def __default_token__(self, token: Token) -> Token:
        if token.type.startswith(IMPORTED):
            return Token.new_borrow_pos(token.type[len(IMPORTED):], token.value, token)
        return token

    # terms
    def int_atom(self, meta: Any, children: list[Token]) -> Term:
        return TNum(int(children[0]))

    def decimal_atom(self, meta: Any, children: list[Token]) -> Term:
        return TNum(str(children[0]))

    def name_atom(self, meta: Any, children: list[Token]) -> Term:
        return TName(str(children[0]))

    def element(self, meta: Any, children: list[Any]) -> Term:
        return TElem(str(children[0]), tuple(children[1:]))

    def apply(self, meta: Any, children: list[Any]) -> Term:
        return TApp(str(children[0]), tuple(children[1:]))

    def negate(self, meta: Any, children: list[Any]) -> Term:
        return TNeg(children[0])

    def sum_term(self, meta: Any, children: list[Any]) -> Term:
        return TSum(str(children[0]), children[1], children[2])

    def _chain(self, children: list[Any]) -> Term:
        term: Term = children[0]
        for i in range(1, len(children), 2):
            term = TBin(str(children[i]), term, children[i + 1])
        return term

    def arith(self, meta: Any, children: list[Any]) -> Term:
        return self._chain(children)

    def product(self, meta: Any, children: list[Any]) -> Term:
        return self._chain(children)

    def power(self, meta: Any, children: list[Any]) -> Term:
        return TBin("^", children[0], TNum(int(children[1])))

    # statements
    def rule_stmt(self, meta: Any, children: list[Token]) -> tuple[str, Any, Span]:
        return ("rule", self.string_value(meta, [children[0]]).value, meta_span(meta))

    def bound(self, meta: Any, children: list[Any]) -> Bound:
        minimum = int(children[1]) if children[1] is not None else None
        return Bound(str(children[0]), minimum, token_span(children[0]))

    def for_stmt(self, meta: Any, children: list[Bound]) -> tuple[str, Any, Span]:
        return ("for", children, meta_span(meta))

    def let_stmt(self, meta: Any, children: list[Any]) -> tuple[str, Any, Span]:
        name, *params, body = children
        return ("let", Let(str(name), tuple(str(p) for p in params), body, meta_span(meta)),
                meta_span(meta))

    def conditions(self, meta: Any, children: list[Token]) -> dict[str, Any]:
        return {"kind": ClaimKind.CONDITIONS, "conditions": tuple(str(c) for c in children)}

    def memory_claim(self, meta: Any, children: list[Any]) -> dict[str, Any]:
        return {"kind": ClaimKind.MEMORY, "key": str(children[0]), "right": children[1]}

    def communication_claim(self, meta: Any, children: list[Any]) -> dict[str, Any]:
        return {"kind": ClaimKind.COMMUNICATION, "key": str(children[0]), "right": children[1]}

    def identity_claim(self, meta: Any, children: list[Any]) -> dict[str, Any]:
        return {"kind": ClaimKind.IDENTITY, "left": children[0], "right": children[1]}

    def prove_stmt(self, meta: Any, children: list[Any]) -> tuple[str, Any, Span]:
        return ("prove", children[0], meta_span(meta))

    def refute_stmt(self, meta: Any, children: list[Any]) -> tuple[str, Any, Span]:
        return ("refute", children[0], meta_span(meta))

    def start(self, meta: Any, children: list[Any]) -> list[Any]:
        return children


def parse_rule(source: Source) -> Rule:
    try:
        tree = rules_parser().parse(source.text)
    except UnexpectedInput as err:
        diagnostic = syntax_diagnostic(err, source)
        message = diagnostic.message.replace(IMPORTED, "")
        raise PlaceError([Diagnostic(diagnostic.severity, message, diagnostic.code, diagnostic.span,
                                     diagnostic.notes)], source) from None
    items = RuleBuilder().transform(tree)
    rule = Rule(source, Path(source.path).stem)
    errors: list[Diagnostic] = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], str):
            tag, value, span = item
            if tag == "rule":
                rule.title, rule.span = value, span
            elif tag == "for":
                rule.bounds.extend(value)
            elif tag == "let":
                if value.name in rule.lets:
                    errors.append(Diagnostic(Severity.ERROR, f"'{value.name}' is defined twice",
                                             Code.DUPLICATE, span))
                rule.lets[value.name] = value
            else:
                text = _text(source, span).removeprefix(tag).strip()
                rule.claims.append(Claim(ClaimSense(tag), value["kind"], span, text,
                                         value.get("conditions", ()), value.get("key", ""),
                                         value.get("left"), value.get("right")))
        else:
            rule.statements.append(item)
    if not rule.claims:
        errors.append(Diagnostic(Severity.ERROR, "the rule has no 'prove' or 'refute' claim",
                                 Code.RULE, source.end_span()))
    if errors:
        raise PlaceError(errors, source)
    return rule


def _text(source: Source, span: Span) -> str:
    lines = source.text.splitlines()[span.line - 1:span.end_line]
    if not lines:
        return ""
    lines[-1] = lines[-1][:span.end_column - 1] if len(lines) > 1 else \
        lines[-1][span.column - 1:span.end_column - 1]
    if len(lines) > 1:
        lines[0] = lines[0][span.column - 1:]
    return " ".join(" ".join(line.split()) for line in lines)
