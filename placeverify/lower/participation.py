"""Lowering of ``unused dense, experts`` (``docs/language/unused.md``): the parameter groups a
micro-batch may leave unused on any rank, checked against the model's groups."""

from __future__ import annotations

from collections.abc import Sequence

from placeverify.diagnostics import Code
from placeverify.ir.model import Model, ParamGroup
from placeverify.ir.strategy import LossKind
from placeverify.lower.terms import read_reaches
from placeverify.lower.values import Context
from placeverify.syntax import ast


def read_unused(ctx: Context, stmts: Sequence[ast.UnusedStmt], model: Model) -> frozenset[ParamGroup]:
    """Every group the file's ``unused`` statements name (each group once)."""
    out: set[ParamGroup] = set()
    for stmt in stmts:
        groups = read_reaches(ctx, ast.Reaches(stmt.groups, stmt.span), model) or frozenset()
        for group in sorted(groups & out):
            ctx.error(f"'{group.value}' is declared unused twice", Code.DUPLICATE, stmt.span)
        out |= groups
    return frozenset(out)


def read_empty(ctx: Context, stmts: Sequence[ast.EmptyStmt], kinds: Sequence[LossKind]) -> bool:
    """``empty microbatches`` (``docs/language/empty.md``): a micro-batch may hold no tokens.
    ``kinds``: the declared loss's kind and every named term's."""
    for index, stmt in enumerate(stmts):
        if stmt.what.text != "microbatches":
            ctx.error(f"'empty' declares micro-batches without tokens: 'empty microbatches', not "
                      f"'empty {stmt.what.text}'", Code.BAD_VALUE, stmt.what.span)
        elif index:
            ctx.error("'empty microbatches' is declared twice", Code.DUPLICATE, stmt.span)
        elif LossKind.MICROBATCH_MEAN in kinds:
            ctx.error("a declared loss averages each micro-batch (microbatch_mean), which is "
                      "undefined for a micro-batch without tokens; declare token_mean",
                      Code.BAD_VALUE, stmt.span)
        elif LossKind.SAMPLE_MEAN in kinds:
            ctx.error("micro-batches without samples are not in the language: 'empty "
                      "microbatches' needs a token loss (token_mean or sum)", Code.BAD_VALUE,
                      stmt.span)
    return bool(stmts)
