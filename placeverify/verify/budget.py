"""The time budget of one verification, shared by every solver query and encoding loop in it.

``placeverify check --timeout S`` bounds the whole verification of a file, not one query: a
:class:`Budget` holds the deadline, and while it is :func:`active` every solver query
(:func:`placeverify.verify.z3.solve.check`) gets what is left of it, capped per query, and the
encoding loops call :func:`checkpoint`. Once it runs out, :class:`BudgetExhausted` is raised; the
check runner (:func:`placeverify.verify.check.run_check`) turns it, and every family not yet
run, into *unknown* obligations with the reason :data:`TIME_BUDGET` — never proved.

The budget is a context variable rather than an argument so that it reaches every query,
including the counterexample search and the prove engine, without changing their signatures;
each thread and each ``verify`` call has its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from placeverify.diagnostics import Span
from placeverify.errors import PlaceverifyError
from placeverify.semantics.schedule import Unmodelled
from placeverify.verify.interrupt import raise_if_pending

DEFAULT_BUDGET_S = 30.0  # the whole verification of one file (check --timeout)
DEFAULT_QUERY_CAP_MS = 10_000  # one solver query at most, whatever is left of the budget
TIME_BUDGET = "time budget"
# The share of the budget no solver query may use: Z3 overshoots its own timeout, and the
# answer is read back and the remaining families marked after the query, all inside the budget.
RESERVE_FRACTION = 0.1
# How far past its own limit a query in Z3's default tactic pipeline may run: its preprocessing
# polls no limit (0.3 s and 2 s queries took 1.4 s and 3.7 s on an idle machine, several times
# that on a loaded one). A query is run where Z3 honours its limit (budget-bounded, see
# :func:`placeverify.verify.z3.solve.check`) unless what is left of the budget can absorb that:
# its own limit again, and at least this much.
PIPELINE_OVERSHOOT_S = 2.0
# The share of one file's budget (``check --timeout``) left for what follows its verification:
# the text report, the JSON document and the trace. Reading, lowering and the costs come before
# the verification inside the budget, so that the whole check answers within it at any load.
REPORT_FRACTION = 0.05


class BudgetExhausted(PlaceverifyError):
    """The verification's time budget ran out; what was not decided is *unknown*."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"{TIME_BUDGET}: the {seconds:g} s budget of the check ran out")
        self.seconds = seconds


class TooLarge(Unmodelled):
    """An encoding that would pass its size limit is not built: the verdict is *unknown* ("too
    large to encode") instead of growing without bound in memory (a memory ceiling by
    construction, not by ``setrlimit``, which would bound a library's caller too)."""

    def __init__(self, message: str, span: Span | None = None) -> None:
        super().__init__(f"too large to encode: {message}", span)


@dataclass(frozen=True, slots=True)
class Budget:
    """A deadline (``time.monotonic``) and a cap on each solver query."""

    seconds: float
    deadline: float
    query_cap_ms: int = DEFAULT_QUERY_CAP_MS

    @staticmethod
    def start(seconds: float, query_cap_ms: int = DEFAULT_QUERY_CAP_MS) -> Budget:
        """A budget of ``seconds`` from now; inside an :func:`active` budget that ends sooner
        (a prove run verifying many cases), the enclosing deadline still holds."""
        budget = Budget(seconds, time.monotonic() + seconds, query_cap_ms)
        outer = _ACTIVE.get()
        if outer is not None and outer.deadline < budget.deadline:
            return Budget(outer.seconds, outer.deadline, min(query_cap_ms, outer.query_cap_ms))
        return budget

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def exhausted(self) -> bool:
        return self.remaining_s() <= 0

    def checkpoint(self) -> None:
        raise_if_pending()
        if self.exhausted():
            raise BudgetExhausted(self.seconds)

    def query_ms(self, requested_ms: int) -> int:
        """The time limit of the next solver query: what is left, capped by the request and the
        per-query cap, less the reserve; raises once nothing is left."""
        return self.query_limit(requested_ms)[0]

    def query_limit(self, requested_ms: int) -> tuple[int, bool]:
        """:meth:`query_ms`, and whether the budget bounds the query: what is left is its limit,
        or could not absorb an overshoot of its own limit (:data:`PIPELINE_OVERSHOOT_S`), so the
        query must not overshoot."""
        left = self.remaining_s() - self.seconds * RESERVE_FRACTION
        if left <= 0:
            raise BudgetExhausted(self.seconds)
        own = min(int(requested_ms), self.query_cap_ms)
        left_ms = int(left * 1000)
        overshoot_ms = max(own, int(PIPELINE_OVERSHOOT_S * 1000))
        return max(1, min(own, left_ms)), left_ms < own + overshoot_ms


_ACTIVE: ContextVar[Budget | None] = ContextVar("placeverify_budget", default=None)


def current() -> Budget | None:
    return _ACTIVE.get()


@contextmanager
def active(budget: Budget) -> Iterator[Budget]:
    """Run a block under ``budget`` (an enclosing budget with an earlier deadline still holds)."""
    outer = _ACTIVE.get()
    if outer is not None and outer.deadline < budget.deadline:
        budget = Budget(outer.seconds, outer.deadline, min(budget.query_cap_ms, outer.query_cap_ms))
    token = _ACTIVE.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE.reset(token)


@contextmanager
def whole_check(seconds: float | None) -> Iterator[None]:
    """Check one file under a budget of ``seconds`` from now (``None``: none): it is read,
    lowered, costed and verified inside it, and the verification ends :data:`REPORT_FRACTION`
    of it early for the report that follows."""
    if seconds is None:
        yield
        return
    deadline = time.monotonic() + seconds * (1 - REPORT_FRACTION)
    with active(Budget(seconds, deadline)):
        yield


def checkpoint() -> None:
    """Raise :class:`BudgetExhausted` if the active budget has run out (a no-op without one), and
    KeyboardInterrupt if a Ctrl-C was lost where it was raised (:mod:`~placeverify.verify.
    interrupt`)."""
    raise_if_pending()
    budget = _ACTIVE.get()
    if budget is not None:
        budget.checkpoint()


T = TypeVar("T")


def each(items: Iterable[T]) -> Iterator[T]:
    """``items``, with a :func:`checkpoint` before each: for a loop over every rank or key of an
    encoding, whose body builds solver terms (4,096 ranks of DDP over 12 axes ran 0.9 s past a 2 s
    budget at load 2.5 per core in one such loop without it)."""
    for item in items:
        checkpoint()
        yield item


def query_ms(requested_ms: int) -> int:
    """A solver query's time limit under the active budget (the request itself without one)."""
    return query_limit(requested_ms)[0]


def query_limit(requested_ms: int) -> tuple[int, bool]:
    """A solver query's time limit under the active budget, and whether the budget sets it."""
    budget = _ACTIVE.get()
    return (int(requested_ms), False) if budget is None else budget.query_limit(requested_ms)
