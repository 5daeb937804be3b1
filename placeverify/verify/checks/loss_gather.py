"""Where a refutation of a step with a detached collective inside the loss points.

A detached ``all_gather`` / ``all_reduce(sum)`` of embeddings gives each rank only its own
samples' share of the group's loss gradient, |G| times less than a differentiable one
(:mod:`placeverify.semantics.gather`). When a gradient-integrity obligation is refuted and the
same step with every such collective made differentiable is proved for that parameter group,
the collective is where the step goes wrong: the refutation names its line and says so. Only
files with a detached collective inside the loss pay for the second judgement.
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Backward, LoopOp, LossGather, Step
from placeverify.ir.strategy import Strategy
from placeverify.verdicts import Obligation, ObligationKind, Verdict
from placeverify.verify.checks.coefficients import group_obligation


def detached_gathers(strategy: Strategy) -> list[LossGather]:
    return [op.gather for op in strategy.step.ops()
            if isinstance(op, Backward) and op.gather is not None and not op.gather.differentiable]


def made_differentiable(step: Step) -> Step:
    """The step with every collective inside the loss differentiable."""
    def fixed(lo: LoopOp) -> LoopOp:
        op = lo.op
        if isinstance(op, Backward) and op.gather is not None:
            return replace(lo, op=replace(op, gather=replace(op.gather, differentiable=True)))
        return lo

    return replace(step, loop=tuple(fixed(lo) for lo in step.loop))


def blame_gather(strategy: Strategy, group: ParamGroup, obligation: Obligation,
                 timeout_ms: int) -> Obligation:
    """The obligation pointed at the detached collective when making it differentiable is
    enough for this group; otherwise unchanged."""
    gathers = detached_gathers(strategy)
    if (not gathers or obligation.verdict is not Verdict.REFUTED
            or obligation.kind is not ObligationKind.COEFFICIENT):
        return obligation
    fixed = replace(strategy, step=made_differentiable(strategy.step))
    if group_obligation(fixed, group, timeout_ms)[0].verdict is not Verdict.PROVED:
        return obligation
    gather = gathers[0]
    return replace(obligation, span=gather.span,
                   fix=f"'{gather.label()}' is detached: each rank's backward reaches only its "
                       f"own samples' share of the group's loss, |{gather.group.label()}|x too "
                       f"little; make it differentiable (torch.distributed.nn) or multiply the "
                       f"loss by |{gather.group.label()}|")
