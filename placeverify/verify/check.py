"""The one interface every verification family meets, and how an unmodelled statement is handled.

A :class:`Check` is a family of obligations about one condition (xdsl's pass registry,
CrossHair's checker map): ``run(strategy, ctx)`` yields :class:`Finding` s, each an obligation
with the evidence behind it and the warnings found along the way. The families are listed, in
report order, in :data:`placeverify.verify.checks.CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from placeverify.diagnostics import Diagnostic
from placeverify.evidence import Evidence
from placeverify.ir.strategy import Strategy
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict


@dataclass(frozen=True, slots=True)
class Context:
    """What every check is run with."""

    timeout_ms: int  # per solver query; past it the obligation is 'unknown'


@dataclass(frozen=True, slots=True)
class Finding:
    """One obligation, its evidence (for the counterexample trace) and the warnings (cost notes)
    found while deciding it."""

    obligation: Obligation
    evidence: Evidence | None = None
    warnings: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True, slots=True)
class Check:
    condition: Condition
    name: str  # the family in words, e.g. "gradient integrity"
    run: Callable[[Strategy, Context], Iterable[Finding]]


def run_check(check: Check, strategy: Strategy, ctx: Context) -> list[Finding]:
    """A family's findings, or one *unknown* obligation at the statement a backend does not
    model: an unmodelled statement is never skipped and never proved."""
    try:
        return list(check.run(strategy, ctx))
    except Unmodelled as err:
        return [Finding(Obligation(check.condition,
                                   f"{check.name}: every statement of the step is modelled",
                                   Verdict.UNKNOWN, err.span or strategy.step.span,
                                   ObligationKind.NOT_MODELLED,
                                   reason=f"not modelled: {err}"))]
