"""Running Z3 with a time limit and reading models back as plain Python values."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

import z3


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
    solver = z3.SolverFor(logic) if logic else z3.Solver()
    solver.set("timeout", max(1, int(timeout_ms)))
    solver.add(formula)
    started = time.perf_counter()
    result = solver.check()
    seconds = time.perf_counter() - started
    if result == z3.sat:
        return Outcome(SolverStatus.SAT, solver.model(), seconds)
    if result == z3.unsat:
        return Outcome(SolverStatus.UNSAT, None, seconds)
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


