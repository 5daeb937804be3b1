"""State across steps: k consecutive optimizer steps, each over its own accumulation window.

``microbatches = [4, 4, 2]`` in a step says that the step runs three times in a row, the j-th
time over a window of that many micro-batches (an epoch of ten batches with gradient
accumulation 4 ends with a tail window of 2). Single-device training runs k ordinary optimizer
steps: each starts from zeroed gradients and normalises its loss over its own window (its own
tokens, samples and micro-batch count). The distributed step, as written, starts every step from
empty buffers too (the optimizer zeroes them after each update, as the step's ``update`` does),
and inside step j ``microbatches`` is that step's own window, ``tokens(..., step)`` counts that
window's tokens, and ``on microbatch last`` is the window's last micro-batch; ``on microbatch k``
runs in the windows that have a micro-batch k.

So nothing carries from one step to the next, and step j is an ordinary single step over its
window: its :func:`projection`. Every domain judges the k steps by judging each projection (the
exact interpreter, Z3, the agreement analysis and the replay run it as they run any step); steps
with the same window are the same projection and are judged once. A verdict is over all k steps:
a refutation names the step it is about (:func:`step_label`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from placeverify.ir.step import LoopOp, Step
from placeverify.ir.strategy import Strategy

MAX_STEPS = 16  # consecutive optimizer steps verified together


@dataclass(frozen=True, slots=True)
class Window:
    """One distinct accumulation window: its micro-batches and the steps (1-based) that use it."""

    microbatches: int
    steps: tuple[int, ...]
    total: int  # k, the number of steps verified

    def label(self) -> str:
        return step_label(self.steps, self.total, self.microbatches)


def step_label(steps: tuple[int, ...], total: int, microbatches: int) -> str:
    """``step 3 of 3 (2 micro-batches)`` or ``steps 1, 2 of 3 (4 micro-batches each)``."""
    each = " each" if len(steps) > 1 else ""
    word = "steps" if len(steps) > 1 else "step"
    plural = "es" if microbatches != 1 else ""
    return (f"{word} {', '.join(map(str, steps))} of {total} "
            f"({microbatches} micro-batch{plural}{each})")


def fixed_microbatches(step: Step) -> bool:
    """True for one window of several steps: its micro-batch count is the window's."""
    return bool(step.windows)


def windows(strategy: Strategy) -> list[Window]:
    """The distinct windows of a several-step strategy, in the order their first step runs; one
    window (the step itself) for an ordinary strategy."""
    sizes = strategy.step.windows if several(strategy) else (strategy.step.microbatches,)
    out: dict[int, list[int]] = {}
    for j, m in enumerate(sizes, start=1):
        out.setdefault(m, []).append(j)
    return [Window(m, tuple(steps), len(sizes)) for m, steps in out.items()]


def several(strategy: Strategy) -> bool:
    """True when the step is verified over several consecutive optimizer steps."""
    return len(strategy.step.windows) > 1


def projection_step(step: Step, m: int) -> Step:
    """The step as it runs over a window of ``m`` micro-batches: 'on microbatch last' on the
    window's last, 'on microbatch k' only where the window has a micro-batch k."""
    lasts = set(step.last_ops)
    loop: list[LoopOp] = []
    for i, lo in enumerate(step.loop):
        if i in lasts:
            loop.append(LoopOp(lo.op, m - 1))
        elif lo.microbatch is None or lo.microbatch < m:
            loop.append(lo)
    # windows = (m,): a window of several steps, whose micro-batch count is fixed (a search for
    # the smallest counterexample keeps it: fewer micro-batches would be another step)
    return replace(step, microbatches=m, loop=tuple(loop), windows=(m,), last_ops=())


def projection(strategy: Strategy, m: int) -> Strategy:
    """The single step a window of ``m`` micro-batches runs (the strategy itself when it is an
    ordinary one-step strategy)."""
    if not strategy.step.windows:
        return strategy
    config = replace(strategy.config, microbatches=m)
    return replace(strategy, config=config, step=projection_step(strategy.step, m))
