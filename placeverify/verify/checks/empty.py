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
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict, Verification
from placeverify.verify.cases import not_modelled, over_cases


def over_empty(strategy: Strategy, verify_one: Callable[[Strategy], Verification]) -> Verification:
    """The verification that holds for every pattern (module docstring)."""
    try:
        found = patterns(strategy)
    except Unmodelled as err:
        return not_modelled(strategy, "every pattern of micro-batches without tokens is judged",
                            err)
    if len(found) == 1:
        return verify_one(with_empty(strategy, found[0]))
    return over_cases(strategy, found, with_empty, verify_one, lambda empty: not empty, _named)


def _named(obligation: Obligation, empty: frozenset[int], _holds: bool) -> Obligation:
    """The obligation as decided with the micro-batches ``empty`` holding no tokens."""
    if empty and obligation.verdict is not Verdict.PROVED:
        return replace(obligation, reason=f"{obligation.reason} (with {describe(empty)})")
    return obligation


def undefined_obligation(err: Undefined, claim: str) -> Obligation:
    """The gradient-integrity obligation of a step whose backward is NaN under the pattern."""
    from placeverify.verify.fixes import EMPTY_MICROBATCH  # loaded where a proof failed only

    assert err.span is not None
    return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, err.span,
                      ObligationKind.COEFFICIENT, reason=str(err),
                      method="semantics/empty (a count of a micro-batch without tokens is 0)",
                      fix=EMPTY_MICROBATCH.text())
