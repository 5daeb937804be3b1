"""One verification out of several cases of the same step: the verdict that holds in every case.

Participation patterns (:mod:`placeverify.verify.checks.participation`) and micro-batches
without tokens (:mod:`placeverify.verify.checks.empty`) each verify a step once per case the
declarations allow. An obligation (condition and claim) is refuted when some case refutes it,
unknown when some case leaves it unknown and none refutes it, and proved only when every case
proves it; the counterexample trace is the first refuting case's, so the replay realises that
case. Cases share one time budget: what is left of it when each starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from placeverify.ir.strategy import Strategy
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import CONDITIONS, Obligation, ObligationKind, Verdict, Verification

Case = TypeVar("Case")
RANK = {Verdict.PROVED: 0, Verdict.UNKNOWN: 1, Verdict.REFUTED: 2}

# an obligation as decided in a case, given whether it holds in the plain case (nothing left out)
Name = Callable[[Obligation, Case, bool], Obligation]


def not_modelled(strategy: Strategy, claim: str, err: Unmodelled) -> Verification:
    """Every condition unknown at the construct the cases could not be listed for."""
    span = err.span or strategy.step.span
    return Verification(tuple(
        Obligation(c, claim, Verdict.UNKNOWN, span, ObligationKind.NOT_MODELLED,
                   reason=f"not modelled: {err}")
        for c in CONDITIONS))


def over_cases(strategy: Strategy, cases: Sequence[Case],
               realise: Callable[[Strategy, Case], Strategy],
               verify_one: Callable[[Strategy], Verification],
               plain: Callable[[Case], bool], name: Name[Case]) -> Verification:
    """The verification that holds in every case (module docstring); ``plain`` tells the case
    that leaves nothing out, ``name`` words an obligation decided in a case."""
    merged: dict[tuple[object, str], Obligation] = {}
    in_plain: dict[tuple[object, str], Verdict] = {}
    trace = None
    notes: list[str] = []
    seconds = 0.0
    for case in cases:
        result = verify_one(realise(strategy, case))
        seconds += result.seconds
        notes.extend(n for n in result.notes if n not in notes)
        if trace is None and result.trace is not None:
            trace = result.trace
        for obligation in result.obligations:
            key = (obligation.condition, obligation.claim)
            if plain(case):
                in_plain[key] = obligation.verdict
            before = merged.get(key)
            if before is None or RANK[obligation.verdict] > RANK[before.verdict]:
                merged[key] = name(obligation, case, in_plain.get(key) is Verdict.PROVED)
    return Verification(tuple(merged.values()), trace, seconds, tuple(notes))


def sharing_budget(budget_s: float | None,
                   verify: Callable[[Strategy, float | None], Verification]
                   ) -> Callable[[Strategy], Verification]:
    """``verify`` for one case at a time, each given what is left of ``budget_s`` (None: no
    bound) when it starts."""
    began = time.monotonic()

    def one(strategy: Strategy) -> Verification:
        left = None if budget_s is None else max(0.0, budget_s - (time.monotonic() - began))
        return verify(strategy, left)

    return one
