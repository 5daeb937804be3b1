"""Verdicts over every participation pattern a file's ``unused`` declarations allow.

:func:`placeverify.semantics.participation.patterns` lists the patterns that decide every verdict
(one, the empty pattern, for a file without ``unused`` groups or ``only = used`` collectives: then
this module runs the families once, exactly as without it). Each pattern's step is verified by
every family; an obligation (condition and claim) is refuted when it is refuted under some
pattern — its reason then names the pattern — unknown when it is unknown under some pattern and
refuted under none, and proved only when every pattern proves it. The counterexample trace is the
first refuting pattern's, so the replay realises that pattern.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from placeverify.ir.strategy import Strategy
from placeverify.semantics.participation import Pattern, patterns, selective, with_pattern
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import (
    CONDITIONS,
    Obligation,
    ObligationKind,
    Verdict,
    Verification,
)
from placeverify.verify.fixes import UNUSED_GROUPS

RANK = {Verdict.PROVED: 0, Verdict.UNKNOWN: 1, Verdict.REFUTED: 2}


def over_patterns(strategy: Strategy,
                  verify_one: Callable[[Strategy], Verification]) -> Verification:
    """The verification that holds for every pattern (module docstring)."""
    try:
        found = patterns(strategy)
    except Unmodelled as err:
        span = err.span or strategy.step.span
        return Verification(tuple(
            Obligation(c, "every participation pattern is judged", Verdict.UNKNOWN, span,
                       ObligationKind.NOT_MODELLED, reason=f"not modelled: {err}")
            for c in CONDITIONS))
    if len(found) == 1 and not found[0].idle:
        return verify_one(strategy)
    merged: dict[tuple[object, str], Obligation] = {}
    everyone = {}  # the obligations with every group used everywhere (the first pattern)
    trace = None
    notes: list[str] = []
    seconds = 0.0
    for pattern in found:
        result = verify_one(with_pattern(strategy, pattern))
        seconds += result.seconds
        notes.extend(n for n in result.notes if n not in notes)
        if trace is None and result.trace is not None:
            trace = result.trace
        for obligation in result.obligations:
            key = (obligation.condition, obligation.claim)
            if not pattern.idle or not any(ks for _g, ks in pattern.idle):
                everyone[key] = obligation.verdict
            before = merged.get(key)
            if before is None or RANK[obligation.verdict] > RANK[before.verdict]:
                merged[key] = _named(strategy, obligation, pattern,
                                     everyone.get(key) is Verdict.PROVED)
    return Verification(tuple(merged.values()), trace, seconds, tuple(notes))


def _named(strategy: Strategy, obligation: Obligation, pattern: Pattern,
           holds_when_used: bool) -> Obligation:
    """The obligation as decided under ``pattern``: its reason names the pattern, and one that
    holds when every group is used is wrong at the ``only = used`` collective that skipped."""
    if obligation.verdict is Verdict.PROVED or not any(ks for _g, ks in pattern.idle):
        return obligation
    named = replace(obligation, reason=f"{obligation.reason} (with {pattern.describe()})")
    if obligation.verdict is not Verdict.REFUTED or not holds_when_used:
        return named
    idle = {g for g, ks in pattern.idle if ks}
    for op in selective(strategy):
        if any(op.target.applies_to(g) for g in idle):
            return replace(named, span=op.span, fix=UNUSED_GROUPS.text())
    return named
