"""Text -> parse tree -> AST: the public entry points of the ``.place`` front end.

Reading is defensive (:mod:`.source`); the one cached Lark LALR parser comes from
:mod:`.grammar`; every Lark error becomes a :class:`~placeverify.diagnostics.Diagnostic` that
points at the offending text and says what was expected (:mod:`.errors`); the parse tree becomes
the AST (:mod:`.to_ast`).
"""

from __future__ import annotations

import re

from lark import Token, Tree
from lark.exceptions import UnexpectedInput

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source
from placeverify.syntax import ast
from placeverify.syntax.errors import syntax_diagnostic, too_deep
from placeverify.syntax.grammar import parser
from placeverify.syntax.source import read_source
from placeverify.syntax.to_ast import AstBuilder

__all__ = ["parse_source", "parse_text", "read_source", "tree_of"]


def parse_source(source: Source) -> ast.File:
    """Parse a source into an AST, or raise :class:`PlaceError` pointing at the bad text."""
    if not _has_statements(source.text):
        raise PlaceError([Diagnostic(
            Severity.ERROR, "the file has no statements; a strategy needs at least "
            "'model', 'mesh' and 'place'", Code.EMPTY_FILE)], source)
    deep = too_deep(source.text)
    if deep is not None:
        raise PlaceError([deep], source)
    try:
        tree = parser().parse(source.text)
    except UnexpectedInput as err:
        raise PlaceError([syntax_diagnostic(err, source)], source) from None
    builder = AstBuilder()
    result = builder.transform(tree)
    if builder.errors:
        raise PlaceError(builder.errors, source)
    assert isinstance(result, ast.File)
    return result


def parse_text(text: str, path: str = "<text>") -> ast.File:
    """Parse text that did not come from a file (tests, the REPL)."""
    return parse_source(Source(path, text))


_COMMENT_OR_SPACE = re.compile(r"(#[^\r\n]*|\s+)*")


def _has_statements(text: str) -> bool:
    match = _COMMENT_OR_SPACE.match(text)
    return match is None or match.end() < len(text)


def tree_of(text: str) -> Tree[Token]:
    """The raw Lark parse tree (for golden tests of the grammar)."""
    return parser().parse(text)
