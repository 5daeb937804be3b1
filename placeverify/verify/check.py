"""The one interface every verification family meets, and how an unmodelled statement is handled.

A :class:`Check` is a family of obligations about one condition (xdsl's pass registry,
CrossHair's checker map): ``run(strategy, ctx)`` yields :class:`Finding` s, each an obligation
with the evidence behind it and the warnings found along the way. The families are listed, in
report order, in :data:`placeverify.verify.checks.CHECKS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from placeverify.diagnostics import Diagnostic
from placeverify.evidence import Evidence
from placeverify.ir.strategy import Strategy
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.budget import TIME_BUDGET, Budget, BudgetExhausted, TooLarge, active
from placeverify.verify.z3.solve import cancelled


@dataclass(frozen=True, slots=True)
class Context:
    """What every check is run with."""

    timeout_ms: int  # per solver query at most; past it the obligation is 'unknown'
    budget: Budget | None = field(default=None)  # the whole verification's time budget


@dataclass(frozen=True, slots=True)
class Finding:
    """One obligation, its evidence (for the counterexample trace) and the warnings (cost notes)
    found while deciding it."""

    obligation: Obligation
    evidence: Evidence | None = None
    warnings: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True, slots=True)
class Check:
    condition: Condition
    name: str  # the family in words, e.g. "gradient integrity"
    run: Callable[[Strategy, Context], Iterable[Finding]]


def run_check(check: Check, strategy: Strategy, ctx: Context) -> list[Finding]:
    """A family's findings, or *unknown* obligations where it could not finish: at the statement
    a backend does not model (never skipped, never proved), when the time budget ran out, or when
    the family failed (an exception is a bug in placeverify, reported as such and never proved;
    ``PLACEVERIFY_DEBUG=1`` lets it through with its traceback)."""
    found: list[Finding] = []
    try:
        if ctx.budget is None:
            found.extend(check.run(strategy, ctx))
        else:
            with active(ctx.budget):
                ctx.budget.checkpoint()
                found.extend(check.run(strategy, ctx))
        return found
    except TooLarge as err:
        return [*found, Finding(Obligation(check.condition,
                                           f"{check.name}: encoded within the size limit",
                                           Verdict.UNKNOWN, err.span or strategy.step.span,
                                           ObligationKind.TOO_LARGE, reason=str(err)))]
    except Unmodelled as err:
        return [*found, Finding(Obligation(check.condition,
                                           f"{check.name}: every statement of the step is modelled",
                                           Verdict.UNKNOWN, err.span or strategy.step.span,
                                           ObligationKind.NOT_MODELLED,
                                           reason=f"not modelled: {err}"))]
    except BudgetExhausted as err:
        return [*found, out_of_time(check, strategy, err)]
    except Exception as err:  # a bug in a family: unknown for it, the other families still run
        if cancelled(err):  # Ctrl-C inside a Z3 call (placeverify.verify.z3.solve): the user's
            raise KeyboardInterrupt from None
        if os.environ.get("PLACEVERIFY_DEBUG"):
            raise
        return [*found, Finding(Obligation(
            check.condition, f"{check.name}: the check ran to completion", Verdict.UNKNOWN,
            strategy.step.span, ObligationKind.INTERNAL_ERROR,
            reason=f"internal error in {check.name}: {type(err).__name__}: {err} (a bug in "
                   "placeverify; rerun with PLACEVERIFY_DEBUG=1 for the traceback)"))]


def out_of_time(check: Check, strategy: Strategy, err: BudgetExhausted | None = None) -> Finding:
    """The *unknown* obligation that stands for what a family left undecided when the budget ran
    out (or for the whole family, when it never started)."""
    detail = str(err) if err is not None else f"{TIME_BUDGET}: the check's budget ran out first"
    return Finding(Obligation(check.condition, f"{check.name}: decided within the time budget",
                              Verdict.UNKNOWN, strategy.step.span, ObligationKind.TIME_BUDGET,
                              reason=detail))
