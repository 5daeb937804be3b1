"""State across steps: does each optimizer step consume the gradients of its own window only?

Judged in the provenance domain of :mod:`placeverify.semantics.steps` (the buffer rules run on
steps 1..j one after the other, a buffer being the set of windows it holds a part of): one
obligation per parameter group, refuted at the first step whose update reads a part of an earlier
step's gradients, the stale buffer never emptied by 'zero grads'. That each window's own
micro-batches are consumed right is judged on the window's step (its projection) by the other
obligations.
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.ir.flights import has_async
from placeverify.ir.strategy import Strategy
from placeverify.semantics.schedule import Unmodelled
from placeverify.semantics.steps import carried
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict

METHOD = "provenance of the buffers over consecutive steps (semantics/steps.py)"


def carried_obligations(strategy: Strategy) -> list[tuple[Obligation, int | None]]:
    """Per parameter group: the obligation, and the window (micro-batches) of the refuted step.
    One window of several steps (the step a replay runs again and again) is judged as two
    consecutive steps of that window."""
    if len(strategy.step.windows) == 1:
        m = strategy.step.windows[0]
        strategy = replace(strategy, step=replace(strategy.step, windows=(m, m)))
    k = len(strategy.step.windows)
    out: list[tuple[Obligation, int | None]] = []
    for group in strategy.model.groups_present():
        claim = (f"each of the {k} optimizer steps consumes the gradients of its own "
                 f"micro-batches only for the {group.value} parameters (nothing carries from "
                 "one step to the next)")
        try:
            if has_async(strategy.step):
                raise Unmodelled("asynchronous collectives across several optimizer steps (each "
                                 "window's step is judged on its outcomes; what carries between "
                                 "steps is not)", strategy.step.span)
            found = carried(strategy, group)
        except Unmodelled as err:
            out.append((Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN,
                                   err.span or strategy.step.span, ObligationKind.NOT_MODELLED,
                                   reason=f"not modelled: {err}", method=METHOD), None))
            continue
        if found is None:
            out.append((Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED,
                                   strategy.step.span, ObligationKind.COEFFICIENT,
                                   method=METHOD), None))
            continue
        earlier = ", ".join(map(str, found.steps))
        word = "steps" if len(found.steps) > 1 else "step"
        reason = (f"the update of step {found.step} reads the gradients of {word} {earlier} as "
                  f"well: nothing empties the buffers between the steps, so step "
                  f"{found.step} consumes them on top of its own window's")
        out.append((Obligation(Condition.GRADIENT_INTEGRITY, f"{claim}, at step {found.step} "
                               f"of {k}", Verdict.REFUTED, found.update.span,
                               ObligationKind.COEFFICIENT, reason=reason,
                               fix="write 'zero grads' after 'update params' (the optimizer's "
                                   "zero_grad), or before the first 'backward'",
                               method=METHOD),
                    strategy.step.windows[found.step - 1]))
    return out
