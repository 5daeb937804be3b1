"""Lowering of ``unused dense, experts`` (README "Participation"): the parameter groups a
micro-batch may leave unused on any rank, checked against the model's groups."""

from __future__ import annotations

from collections.abc import Sequence

from placeverify.diagnostics import Code
from placeverify.ir.model import Model, ParamGroup
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
