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
from placeverify.verdicts import Obligation, Verdict, Verification
from placeverify.verify.cases import not_modelled, over_cases
from placeverify.verify.fixes import UNUSED_GROUPS


def over_patterns(strategy: Strategy,
                  verify_one: Callable[[Strategy], Verification]) -> Verification:
    """The verification that holds for every pattern (module docstring)."""
    try:
        found = patterns(strategy)
    except Unmodelled as err:
        return not_modelled(strategy, "every participation pattern is judged", err)
    if len(found) == 1 and not found[0].idle:
        return verify_one(strategy)
    return over_cases(strategy, found, with_pattern, verify_one,
                      lambda p: not any(ks for _g, ks in p.idle),
                      lambda o, p, holds: _named(strategy, o, p, holds))


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
