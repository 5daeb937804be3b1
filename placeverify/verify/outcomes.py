"""A step with asynchronous collectives, judged on both extreme outcomes.

:mod:`placeverify.semantics.asynchrony` reduces an asynchronous step to two synchronous ones (the
collective completed where it starts; completed only at its wait). Every family runs on each, and
an obligation takes the worse verdict of the two (refuted over unknown over proved): refuted when
either allowed outcome diverges, proved only when both are proved. A refutation found only in the
late outcome says so in its reason. A combination the construct does not model makes every
family *unknown* at its line (:func:`placeverify.verify.check.run_check`).
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.ir.strategy import Strategy
from placeverify.semantics.asynchrony import worlds
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import Obligation, Verdict
from placeverify.verify.check import Check, Context, Finding, run_check

RANK = {Verdict.PROVED: 0, Verdict.UNKNOWN: 1, Verdict.REFUTED: 2}


def _key(o: Obligation) -> tuple[object, ...]:
    return (o.condition, o.kind, o.claim, o.span.line if o.span is not None else None)


def outcomes(check: Check, strategy: Strategy, ctx: Context) -> list[Finding]:
    """The family's findings over both outcomes of ``strategy``'s asynchronous collectives."""
    try:
        both = worlds(strategy)
    except Unmodelled as err:
        def unmodelled(_s: Strategy, _c: Context) -> list[Finding]:
            raise err

        return run_check(replace(check, run=unmodelled), strategy, ctx)
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
        if other is None or RANK[other.obligation.verdict] <= RANK[found.obligation.verdict]:
            out.append(found)
            continue
        out.append(_noted(other, late.note))
    for rest in matched.values():
        out.extend(_noted(f, late.note) for f in rest)
    return out


def _noted(found: Finding, note: str) -> Finding:
    o = found.obligation
    if o.verdict is Verdict.PROVED:
        return found
    return replace(found, obligation=replace(o, reason=f"{o.reason} ({note})" if o.reason
                                             else note))
