"""Running Z3 with a time limit and reading models back as plain Python values."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

import z3

from placeverify.verify import budget, interrupt

interrupt.leave_ctrl_c_to_python()


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
    :class:`~placeverify.verify.budget.BudgetExhausted` rather than answering unknown.

    A query the budget bounds (its limit is what is left of the budget, or what is left could
    not absorb an overshoot of its own ``timeout_ms``: :data:`~placeverify.verify.budget.
    PIPELINE_OVERSHOOT_S`) runs in Z3's incremental SMT core (a scope is opened first), which
    honours the limit. Otherwise Z3 runs a tactic pipeline whose preprocessing polls no limit: on a
    large nonlinear loss-normaliser formula ``purify-arith`` alone takes 0.8 s, and 300 ms and
    2 s queries took 1.4 s and 3.7 s, past the budget's reserve. The pipeline stays the default
    because the two may answer with different models (and the context they leave behind changes
    later models): the counterexamples of a check within its budget stay as they were."""
    _, bounded = budget.query_limit(timeout_ms)
    solver = z3.SolverFor(logic) if logic else z3.Solver()
    if bounded:
        solver.push()
    solver.add(formula)
    limit_ms, _ = budget.query_limit(timeout_ms)  # what is left once the query is built
    solver.set("timeout", max(1, limit_ms))
    started = time.perf_counter()
    try:
        result = solver.check()
    except z3.Z3Exception as err:
        if cancelled(err):
            raise KeyboardInterrupt from None
        raise
    seconds = time.perf_counter() - started
    interrupt.raise_if_pending()  # a Ctrl-C that arrived during the call, raised now
    if result == z3.sat:
        return Outcome(SolverStatus.SAT, solver.model(), seconds)
    if result == z3.unsat:
        return Outcome(SolverStatus.UNSAT, None, seconds)
    reason = solver.reason_unknown()
    if _interrupted(reason, seconds, limit_ms):
        raise KeyboardInterrupt
    active = budget.current()
    if active is not None and active.exhausted():
        raise budget.BudgetExhausted(active.seconds)
    return Outcome(SolverStatus.UNKNOWN, None, seconds, reason)


# Ctrl-C inside a Z3 call: Z3 puts its own SIGINT handler in place of Python's for the call (its
# ``ctrl_c`` parameter, on by default), so Python never sees the signal; Z3 cancels the call, and
# the query answers unknown ("interrupted from keyboard" in the default tactic pipeline,
# "canceled" in the incremental core) or another call raises ``Z3Exception("canceled")``. That is
# the user's Ctrl-C, not a solver limit: it is raised again as KeyboardInterrupt (the CLI exits
# 130). The incremental core says "canceled" at its timeout too; the timer cannot fire before the
# limit, so a query cancelled earlier was interrupted (placeverify never cancels one itself).
_KEYBOARD = "interrupted from keyboard"
_CANCELED = "canceled"


def _interrupted(reason: str, seconds: float, limit_ms: int) -> bool:
    return reason == _KEYBOARD or (reason == _CANCELED and seconds * 1000 < limit_ms)


def cancelled(err: BaseException) -> bool:
    """Whether an exception is a Z3 call cancelled by Ctrl-C (see above)."""
    if not isinstance(err, z3.Z3Exception):
        return False
    message = err.value.decode(errors="replace") if isinstance(err.value, bytes) else str(err.value)
    return _CANCELED in message or _KEYBOARD in message


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


