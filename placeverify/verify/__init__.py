"""Verification: gradient integrity, state consistency and composition safety.

``verify(strategy)`` runs every family of :data:`placeverify.verify.checks.CHECKS` in order and
returns plain data (:class:`placeverify.verdicts.Verification`); no Z3 object leaves this package
(the solver helpers live in :mod:`placeverify.verify.z3`). The first refutation becomes a
counterexample trace (:mod:`placeverify.trace`) the torch replay backend can run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from placeverify.ir.flights import has_async
from placeverify.ir.strategy import Strategy
from placeverify.verdicts import Verdict, Verification
from placeverify.verify import interrupt
from placeverify.verify.budget import DEFAULT_BUDGET_S, DEFAULT_QUERY_CAP_MS, Budget
from placeverify.verify.cases import sharing_budget
from placeverify.verify.check import Context, Finding, out_of_time, run_check
from placeverify.verify.checks import CHECKS
from placeverify.verify.heap import callers_heap_frozen

if TYPE_CHECKING:
    from placeverify.trace import Trace


def verify(strategy: Strategy, timeout_ms: int = DEFAULT_QUERY_CAP_MS,
           budget_s: float | None = DEFAULT_BUDGET_S) -> Verification:
    """Every family's obligations; ``budget_s`` bounds the whole verification (``None``: no
    bound) and ``timeout_ms`` each solver query. Families the budget leaves no time for are
    *unknown* ("time budget"). A file with ``unused`` groups is verified under every
    participation pattern they allow (:mod:`placeverify.verify.checks.participation`), and a file
    declaring ``empty microbatches`` under every pattern of micro-batches without tokens
    (:mod:`placeverify.verify.checks.empty`). A Ctrl-C during it is never lost
    (:mod:`placeverify.verify.interrupt`), and the caller's heap is left out of garbage
    collection until it ends (:mod:`placeverify.verify.heap`)."""
    with interrupt.handling(), callers_heap_frozen():
        return _verify(strategy, timeout_ms, budget_s)


def _verify(strategy: Strategy, timeout_ms: int, budget_s: float | None) -> Verification:
    if strategy.config.empty:
        from placeverify.verify.checks.empty import over_empty

        return over_empty(strategy, sharing_budget(
            budget_s, lambda s, left: _participation(s, timeout_ms, left)))
    return _participation(strategy, timeout_ms, budget_s)


def _participation(strategy: Strategy, timeout_ms: int, budget_s: float | None) -> Verification:
    if strategy.config.unused:
        from placeverify.verify.checks.participation import over_patterns

        return over_patterns(strategy, sharing_budget(
            budget_s, lambda s, left: _verify_one(s, timeout_ms, left)))
    return _verify_one(strategy, timeout_ms, budget_s)


def _verify_one(strategy: Strategy, timeout_ms: int, budget_s: float | None) -> Verification:
    budget = None if budget_s is None else Budget.start(budget_s, timeout_ms)
    ctx = Context(timeout_ms, budget)
    if strategy.step.windows:  # several steps, or one window of them (semantics/steps.py)
        return _verify_steps(strategy, ctx)
    findings = _findings(strategy, ctx)
    notes = tuple(w.render(strategy.source) for f in findings for w in f.warnings)
    return Verification(tuple(f.obligation for f in findings), _trace(strategy, findings), 0.0,
                        notes)


def _findings(strategy: Strategy, ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for check in CHECKS:
        if ctx.budget is not None and ctx.budget.exhausted():
            findings.append(out_of_time(check, strategy))
            continue
        if has_async(strategy.step):
            # Deferred: only an asynchronous step is judged on its outcomes (check start-up time).
            from placeverify.verify.outcomes import outcomes

            findings.extend(outcomes(check, strategy, ctx))
            continue
        findings.extend(run_check(check, strategy, ctx))
    return findings


def _verify_steps(strategy: Strategy, ctx: Context) -> Verification:
    """k consecutive optimizer steps: every obligation of every distinct window's step, its claim
    naming the steps it is about; the trace is the first refuted step's."""
    from dataclasses import replace

    from placeverify.semantics.steps import projection, windows
    from placeverify.verify.checks.carried_state import carried_obligations

    obligations = []
    notes: list[str] = []
    trace = None
    for carry, m in carried_obligations(strategy):
        obligations.append(carry)
        if trace is None and m is not None:
            trace = _trace(projection(strategy, m), [Finding(carry)])
    from placeverify.semantics.counters import per_step_strategy, uses_run

    if uses_run(strategy.step):  # counts never reset (semantics/counters.py)
        from placeverify.verify.checks.run_counts import run_count_obligations

        for counter, m in run_count_obligations(strategy):
            obligations.append(counter)
            if trace is None and m is not None:
                trace = _trace(per_step_strategy(projection(strategy, m)), [Finding(counter)])
    for window in windows(strategy):
        projected = per_step_strategy(projection(strategy, window.microbatches))
        findings = _findings(projected, ctx)
        found = [replace(f, obligation=replace(
            f.obligation, claim=f"{f.obligation.claim}, at {window.label()}")) for f in findings]
        obligations.extend(f.obligation for f in found)
        notes.extend(w.render(strategy.source) for f in found for w in f.warnings)
        if trace is None:
            trace = _trace(projected, found)
    return Verification(tuple(obligations), trace, 0.0, tuple(dict.fromkeys(notes)))


def _trace(strategy: Strategy, findings: list[Finding]) -> Trace | None:
    for found in findings:
        if found.obligation.verdict is Verdict.REFUTED:
            # Deferred: only a refutation builds a trace (check start-up time).
            from placeverify.trace import build

            return build(strategy, found.obligation, found.evidence)
    return None
