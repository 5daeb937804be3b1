"""Verdicts over every pattern of micro-batches without tokens (:mod:`placeverify.semantics.empty`).

Each pattern's step is verified by every family (the gradient-integrity check judges a backward
that is NaN there refuted, :func:`undefined_obligation`); an obligation is refuted when some
pattern refutes it — its reason then names the pattern — unknown when some pattern leaves it
unknown and none refutes it, and proved only when every pattern proves it. The counterexample
trace is the first refuting pattern's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from placeverify.ir.strategy import Strategy
from placeverify.semantics.empty import Undefined, describe, patterns, with_empty
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import (
    CONDITIONS,
    Condition,
    Obligation,
    ObligationKind,
    Verdict,
    Verification,
)

RANK = {Verdict.PROVED: 0, Verdict.UNKNOWN: 1, Verdict.REFUTED: 2}


def over_empty(strategy: Strategy, verify_one: Callable[[Strategy], Verification]) -> Verification:
    """The verification that holds for every pattern (module docstring)."""
    try:
        found = patterns(strategy)
    except Unmodelled as err:
        span = err.span or strategy.step.span
        return Verification(tuple(
            Obligation(c, "every pattern of micro-batches without tokens is judged",
                       Verdict.UNKNOWN, span, ObligationKind.NOT_MODELLED,
                       reason=f"not modelled: {err}")
            for c in CONDITIONS))
    if len(found) == 1:
        return verify_one(with_empty(strategy, found[0]))
    merged: dict[tuple[object, str], Obligation] = {}
    trace = None
    notes: list[str] = []
    seconds = 0.0
    for empty in found:
        result = verify_one(with_empty(strategy, empty))
        seconds += result.seconds
        notes.extend(n for n in result.notes if n not in notes)
        if trace is None and result.trace is not None:
            trace = result.trace
        for obligation in result.obligations:
            key = (obligation.condition, obligation.claim)
            before = merged.get(key)
            if before is None or RANK[obligation.verdict] > RANK[before.verdict]:
                if empty and obligation.verdict is not Verdict.PROVED:
                    obligation = replace(obligation,
                                         reason=f"{obligation.reason} (with {describe(empty)})")
                merged[key] = obligation
    return Verification(tuple(merged.values()), trace, seconds, tuple(notes))


def undefined_obligation(err: Undefined, claim: str) -> Obligation:
    """The gradient-integrity obligation of a step whose backward is NaN under the pattern."""
    from placeverify.verify.fixes import EMPTY_MICROBATCH  # loaded where a proof failed only

    assert err.span is not None
    return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, err.span,
                      ObligationKind.COEFFICIENT, reason=str(err),
                      method="semantics/empty (a count of a micro-batch without tokens is 0)",
                      fix=EMPTY_MICROBATCH.text())
