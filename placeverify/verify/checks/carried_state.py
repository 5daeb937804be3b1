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

from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.semantics.steps import carried
from placeverify.verdicts import Obligation
from placeverify.verify.checks.across_steps import Found, per_group

METHOD = "provenance of the buffers over consecutive steps (semantics/steps.py)"


def carried_obligations(strategy: Strategy) -> list[tuple[Obligation, int | None]]:
    """Per parameter group: the obligation, and the window (micro-batches) of the refuted step.
    One window of several steps (the step a replay runs again and again) is judged as two
    consecutive steps of that window."""
    if len(strategy.step.windows) == 1:
        m = strategy.step.windows[0]
        strategy = replace(strategy, step=replace(strategy.step, windows=(m, m)))
    k = len(strategy.step.windows)

    def judge(group: ParamGroup) -> Found | None:
        found = carried(strategy, group)
        if found is None:
            return None
        earlier = ", ".join(map(str, found.steps))
        word = "steps" if len(found.steps) > 1 else "step"
        reason = (f"the update of step {found.step} reads the gradients of {word} {earlier} as "
                  f"well: nothing empties the buffers between the steps, so step "
                  f"{found.step} consumes them on top of its own window's")
        return Found(found.step, found.update.span, reason, "write 'zero grads' after 'update "
                     "params' (the optimizer's zero_grad), or before the first 'backward'",
                     strategy.step.windows[found.step - 1])

    return per_group(
        strategy, k,
        lambda group: (f"each of the {k} optimizer steps consumes the gradients of its own "
                       f"micro-batches only for the {group.value} parameters (nothing carries "
                       "from one step to the next)"),
        judge, "asynchronous collectives across several optimizer steps (each window's step is "
        "judged on its outcomes; what carries between steps is not)", strategy.step.span, METHOD)
