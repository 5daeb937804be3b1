"""A step with asynchronous collectives, judged on both extreme outcomes.

:mod:`placeverify.semantics.asynchrony` reduces an asynchronous step to two synchronous ones (the
collective completed where it starts; completed only at its wait). Every family runs on each, and
an obligation takes the worse verdict of the two (refuted over unknown over proved): refuted when
either allowed outcome diverges, proved only when both are proved. A refutation in the late
outcome (alone, or in both) is the one reported, and its reason says so. A combination the
construct does not model makes every family *unknown* at its line
(:func:`placeverify.verify.check.run_check`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from placeverify.ir.strategy import Strategy
from placeverify.semantics.asynchrony import World, worlds
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.check import Check, Context, Finding, run_check

RANK = {Verdict.PROVED: 0, Verdict.UNKNOWN: 1, Verdict.REFUTED: 2}


def _key(o: Obligation) -> tuple[object, ...]:
    return (o.condition, o.kind, o.claim)  # the line may differ: a statement moved to its wait


def outcomes(check: Check, strategy: Strategy, ctx: Context) -> list[Finding]:
    """The family's findings over both outcomes of ``strategy``'s asynchronous collectives."""
    try:
        both = worlds(strategy)
    except Unmodelled as err:
        return run_check(replace(check, run=_raising(err)), strategy, ctx)
    assert both is not None
    sync, late = both
    first = run_check(check, sync.strategy, ctx)
    second = run_check(check, late.strategy, ctx)
    matched: dict[tuple[object, ...], list[Finding]] = {}
    for found in second:
        matched.setdefault(_key(found.obligation), []).append(found)
    out: list[Finding] = []
    for found in first:
        peers = matched.get(_key(found.obligation))
        other = peers.pop(0) if peers else None
        if other is None or RANK[other.obligation.verdict] < RANK[found.obligation.verdict] or \
                other.obligation.verdict is found.obligation.verdict is not Verdict.REFUTED:
            out.append(found)
            continue
        # worse, or refuted in both: the race's own outcome
        out.append(_noted(other, late, alone=found.obligation.verdict is not Verdict.REFUTED))
    for rest in matched.values():
        out.extend(_noted(f, late, alone=True) for f in rest)
    if check.condition is Condition.STATE_CONSISTENCY:
        out.extend(_param_flights(strategy, ctx))
    return out


def _param_flights(strategy: Strategy, ctx: Context) -> list[Finding]:
    """The forwards a parameter gather in flight overlaps (semantics/param_flights.py), judged
    once on the written step: the outcomes above judge the parameters after it completes."""
    from placeverify.semantics.param_flights import has_param_flights

    if not has_param_flights(strategy.step):
        return []
    from placeverify.verify.checks.param_flights import CHECK

    return run_check(CHECK, strategy, ctx)


def _raising(err: Unmodelled) -> Callable[[Strategy, Context], list[Finding]]:
    """A family that stops at the combination the construct does not model (unknown there)."""
    def run(_strategy: Strategy, _ctx: Context) -> list[Finding]:
        raise err

    return run


def _noted(found: Finding, late: World, *, alone: bool) -> Finding:
    """The late outcome's finding, its reason saying so. A flight that lost a write is what a
    wrong consumed gradient is blamed on (its start, as a loss term's error on its backward), with
    the fix that orders the writes first; a refutation of the late outcome alone otherwise comes
    from a read in flight, and its fix is the wait."""
    from placeverify.verify.fixes import ASYNC_READ, ASYNC_WRITE  # deferred, as every fix is

    o = found.obligation
    if o.verdict is Verdict.PROVED:
        return found
    span, fix = o.span, o.fix
    if late.blamed is not None:
        fix = ASYNC_WRITE.text(collective=late.blamed.label(), line=late.blamed.span.line)
        if o.kind is ObligationKind.COEFFICIENT:
            span = late.blamed.span
    elif alone and late.started is not None:
        fix = ASYNC_READ.text(collective=late.started.label(), line=late.started.span.line,
                              target=late.started.target.label(),
                              wait=late.waited.line if late.waited is not None else "?")
    return replace(found, obligation=replace(
        o, span=span, fix=fix, reason=f"{o.reason} ({late.note})" if o.reason else late.note))
