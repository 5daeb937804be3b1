"""Running Z3 with a time limit and reading models back as plain Python values."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

import z3

from placeverify.verify import budget


class SolverStatus(StrEnum):
    SAT = "sat"
    UNSAT = "unsat"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Outcome:
    status: SolverStatus
    model: Any | None
    seconds: float
    reason: str = ""


def check(formula: Any, timeout_ms: int, logic: str | None = None) -> Outcome:
    """Decide ``formula`` within ``timeout_ms``, or within what is left of the active time budget
    (:mod:`placeverify.verify.budget`) if less; a query cut short by the budget raises
    :class:`~placeverify.verify.budget.BudgetExhausted` rather than answering unknown."""
    limit_ms = budget.query_ms(timeout_ms)
    solver = z3.SolverFor(logic) if logic else z3.Solver()
    solver.set("timeout", max(1, limit_ms))
    solver.add(formula)
    started = time.perf_counter()
    result = solver.check()
    seconds = time.perf_counter() - started
    if result == z3.sat:
        return Outcome(SolverStatus.SAT, solver.model(), seconds)
    if result == z3.unsat:
        return Outcome(SolverStatus.UNSAT, None, seconds)
    active = budget.current()
    if active is not None and active.exhausted():
        raise budget.BudgetExhausted(active.seconds)
    return Outcome(SolverStatus.UNKNOWN, None, seconds, solver.reason_unknown())


def value(model: Any, term: Any) -> Fraction:
    """A numeric term's value in a model, as an exact fraction."""
    v = model.eval(term, model_completion=True)
    if z3.is_int_value(v):
        return Fraction(v.as_long())
    if z3.is_rational_value(v):
        return Fraction(v.numerator_as_long(), v.denominator_as_long())
    if z3.is_algebraic_value(v):
        return Fraction(v.approx(20).as_decimal(20).rstrip("?"))
    raise ValueError(f"not a number: {v}")


def truthy(model: Any, formula: Any) -> bool:
    return bool(z3.is_true(model.eval(formula, model_completion=True)))


