"""Source spans of Lark tokens and of the positions Lark propagates to parse-tree nodes.

The parser is built with ``propagate_positions=True`` (see :mod:`.grammar`), so every rule's
``meta`` carries the line and column range of its text; both are 1-based, end exclusive.
"""

from __future__ import annotations

from typing import Any

from lark import Token

from placeverify.diagnostics import Span


def token_span(token: Token) -> Span:
    """The text a token covers (at least one column wide)."""
    line = token.line or 1
    column = token.column or 1
    end_line = token.end_line or line
    end_column = token.end_column or column + max(1, len(token.value))
    return Span(line, column, end_line, end_column)


def meta_span(meta: Any) -> Span:
    """The text a parse-tree node covers; an empty node (no tokens) points at the file's start."""
    if getattr(meta, "empty", True):
        return Span.point(1, 1)
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)
