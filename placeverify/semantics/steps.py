"""State across steps: k consecutive optimizer steps, each over its own accumulation window.

``microbatches = [4, 4, 2]`` in a step says that the step runs three times in a row, the j-th
time over a window of that many micro-batches (an epoch of ten batches with gradient
accumulation 4 ends with a tail window of 2). Single-device training runs k ordinary optimizer
steps: each starts from zeroed gradients and normalises its loss over its own window (its own
tokens, samples and micro-batch count). The distributed step, as written, carries its buffers from
one step to the next unless it empties them ('zero grads', the optimizer's zero_grad; see
:func:`carried` below), and inside step j ``microbatches`` is that step's own window,
``tokens(..., step)`` counts that window's tokens, and ``on microbatch last`` is the window's last
micro-batch; ``on microbatch k``
runs in the windows that have a micro-batch k.

Where nothing carries from one step to the next, step j is an ordinary single step over its
window: its :func:`projection`. Every domain judges the k steps by judging each projection (the
exact interpreter, Z3, the agreement analysis and the replay run it as they run any step); steps
with the same window are the same projection and are judged once. A verdict is over all k steps:
a refutation names the step it is about (:func:`step_label`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    LoopOp,
    ReduceOp,
    Scale,
    Step,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.semantics.buffers import GradMachine
from placeverify.semantics.schedule import MicroBatch, Unmodelled


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


# ---- what carries from one step to the next ---------------------------------------------------------
#
# The buffers are not emptied between steps unless the step says so: 'zero grads' (the optimizer's
# zero_grad) empties the full buffer and the shard where it stands, 'free grads' the full buffer.
# What step j's update consumes is then a function of the micro-batches of steps 1..j, run one
# after the other (:func:`unrolled`). Single-device training consumes step j's window only, so
# step j is right exactly when (a) nothing of an earlier window reaches what its update reads and
# (b) its window's step (:func:`projection`, started from empty buffers) is right: once nothing
# earlier reaches the buffer, the statements that read it see what the projection sees. (a) is
# decided on the buffer rules themselves (placeverify.semantics.buffers) in the *provenance*
# domain: a buffer is the set of windows whose micro-batches it holds a part of. Every factor of a
# loss or a scale is a positive number, count or size, and sums of positive multiples of a
# window's gradients never cancel, so a window in the set has a non-zero coefficient in what the
# update reads; a maximum is not a sum, and is not modelled here.


def unrolled(step: Step, j: int) -> tuple[Step, list[int]]:
    """Steps 1..j of a several-step strategy as one loop over their micro-batches, and the window
    (0-based step) of each micro-batch. An earlier step's statements after its loop run on its
    last micro-batch, except 'update' and 'clip', which read the buffer (a clip scales it by a
    positive factor: the windows it holds stay the same); a later step's statements before its
    loop ('zero grads', token counts) run on its first micro-batch, before its backward."""
    sizes = step.windows[:j]
    loop: list[LoopOp] = []
    owner: list[int] = []
    start = 0
    for i, m in enumerate(sizes):
        body = projection_step(step, m).loop
        if i > 0:
            loop.extend(LoopOp(op, start) for op in step.pre)
        for idx in range(m):
            loop.extend(LoopOp(lo.op, start + idx) for lo in body
                        if lo.microbatch is None or lo.microbatch == idx)
            owner.append(i)
        if i < len(sizes) - 1:
            loop.extend(LoopOp(op, start + m - 1) for op in step.post
                        if not isinstance(op, Update | Clip))
        start += m
    return replace(step, microbatches=start, loop=tuple(loop), windows=(), last_ops=()), owner


class Provenance:
    """The provenance domain (a :class:`placeverify.semantics.buffers.GradDomain`): one value for
    every device, the set of windows whose gradients the buffer holds a part of."""

    def __init__(self, owner: list[int]) -> None:
        self.owner = owner

    def zero(self) -> frozenset[int]:
        return frozenset()

    def backward(self, buffer: frozenset[int], op: Backward, k: MicroBatch) -> frozenset[int]:
        assert isinstance(k, int)
        return buffer | {self.owner[k]}

    def reduce(self, buffer: frozenset[int], op: Collective) -> frozenset[int] | None:
        if op.op is ReduceOp.MAX:
            raise Unmodelled(f"'{op.label()}' over several steps (a maximum of gradients can "
                             "hide what an earlier step left in the buffer)", op.span)
        return buffer

    def accumulate(self, shard: frozenset[int], value: frozenset[int]) -> frozenset[int]:
        return shard | value

    def scale(self, buffer: frozenset[int], op: Scale, k: MicroBatch) -> frozenset[int]:
        zero = any(t.kind is TermKind.NUMBER and t.number == 0 for t, _ in op.factor.factors)
        return frozenset() if zero else buffer


@dataclass(frozen=True, slots=True)
class Carried:
    """Step ``step`` (1-based) consumes, for ``group``, gradients of the earlier ``steps``."""

    step: int
    group: ParamGroup
    steps: tuple[int, ...]
    update: Update


def carried(strategy: Strategy, group: ParamGroup) -> Carried | None:
    """The first step whose update reads a part of an earlier step's gradients, or None."""
    if not several(strategy):
        return None
    live = {a.name: a.size > 1 for a in strategy.mesh.axes}
    for j in range(2, len(strategy.step.windows) + 1):
        step, owner = unrolled(strategy.step, j)
        machine: GradMachine[frozenset[int]] = GradMachine(Provenance(owner), group,
                                                          lambda a: live.get(a, False))
        machine.run(step, step.microbatches)
        if machine.update is None:
            return None  # no step updates, so no update reads anything (semantics/skip.py)
        assert isinstance(machine.update.op, Update)
        earlier = sorted(w + 1 for w in machine.update.value if w != j - 1)
        if earlier:
            return Carried(j, group, tuple(earlier), machine.update.op)
    return None
