"""One gradient-integrity obligation per parameter group across optimizer steps: the shape the
checks of state across steps (:mod:`.carried_state`) and of counts across steps
(:mod:`.run_counts`) share. Each group's judgement is unknown where its domain cannot model the
step (asynchronous collectives across steps, or an :class:`Unmodelled` it raises), proved where it
finds nothing, and refuted at the first step where it finds something, with that step's window."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from placeverify.diagnostics import Span
from placeverify.ir.flights import has_async
from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict


@dataclass(frozen=True, slots=True)
class Found:
    """A refutation at optimizer step ``step`` (1-based), of window ``window`` micro-batches."""

    step: int
    span: Span | None
    reason: str
    fix: str
    window: int


def per_group(strategy: Strategy, steps: int, claim: Callable[[ParamGroup], str],
              judge: Callable[[ParamGroup], Found | None], asynchronous: str, span: Span | None,
              method: str) -> list[tuple[Obligation, int | None]]:
    """Per parameter group: the obligation ``claim(group)``, judged by ``judge(group)`` (None:
    proved), and the window of the refuted step (None otherwise). ``asynchronous`` says what is
    not modelled when the step has asynchronous collectives; ``span`` is where a proof or an
    unknown without a span of its own points."""
    out: list[tuple[Obligation, int | None]] = []
    for group in strategy.model.groups_present():
        said = claim(group)
        try:
            if has_async(strategy.step):
                raise Unmodelled(asynchronous, strategy.step.span)
            found = judge(group)
        except Unmodelled as err:
            out.append((Obligation(Condition.GRADIENT_INTEGRITY, said, Verdict.UNKNOWN,
                                   err.span or span, ObligationKind.NOT_MODELLED,
                                   reason=f"not modelled: {err}", method=method), None))
            continue
        if found is None:
            out.append((Obligation(Condition.GRADIENT_INTEGRITY, said, Verdict.PROVED, span,
                                   ObligationKind.COEFFICIENT, method=method), None))
            continue
        out.append((Obligation(Condition.GRADIENT_INTEGRITY, f"{said}, at step {found.step} "
                               f"of {steps}", Verdict.REFUTED, found.span,
                               ObligationKind.COEFFICIENT, reason=found.reason, fix=found.fix,
                               method=method), found.window))
    return out
