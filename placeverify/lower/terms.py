"""Lower the named loss terms beside the main loss: ``loss aux: token_mean reaches experts``.

Each term has its own single-device normalisation (a :class:`~placeverify.ir.strategy.LossKind`,
read as the main ``loss`` statement is) and the parameter groups its gradient reaches; the
single-device loss is the sum of the main loss and every term (``docs/language/loss.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

from placeverify.diagnostics import Code, did_you_mean
from placeverify.ir.model import Model, ParamGroup
from placeverify.ir.strategy import MAIN_TERM as MAIN
from placeverify.ir.strategy import LossTerm
from placeverify.lower.settings import read_loss
from placeverify.lower.values import Context
from placeverify.syntax import ast


def read_terms(ctx: Context, stmts: Sequence[ast.LossStmt], model: Model) -> tuple[LossTerm, ...]:
    """The named loss terms, in file order (each name once)."""
    out: list[LossTerm] = []
    seen: dict[str, ast.LossStmt] = {}
    for stmt in stmts:
        assert stmt.term is not None
        name = stmt.term.text
        if name == MAIN:
            ctx.error(f"'{MAIN}' names the main loss (the 'loss' statement without a name); "
                      "call this term otherwise", Code.BAD_VALUE, stmt.term.span)
            continue
        if name in seen:
            ctx.error(f"duplicate loss term '{name}'", Code.DUPLICATE, stmt.span,
                      f"the first is at line {seen[name].span.line}")
            continue
        seen[name] = stmt
        reaches = read_reaches(ctx, stmt.reaches, model)
        out.append(LossTerm(name, read_loss(ctx, stmt), reaches, stmt.span))
    return tuple(out)


def read_reaches(ctx: Context, reaches: ast.Reaches | None,
                 model: Model) -> frozenset[ParamGroup] | None:
    if reaches is None:
        return None
    names = {g.value: g for g in ParamGroup}
    present = model.groups_present()
    groups: set[ParamGroup] = set()
    for sel in reaches.groups:
        group = names.get(sel.text)
        if group is None:
            ctx.error(f"unknown parameter group '{sel.text}'{did_you_mean(sel.text, names)}",
                      Code.UNKNOWN_NAME, sel.span)
            continue
        if group not in present:
            ctx.error(f"this model has no '{sel.text}' parameters (it has "
                      f"{', '.join(g.value for g in present)})", Code.BAD_VALUE, sel.span)
            continue
        groups.add(group)
    return frozenset(groups)
