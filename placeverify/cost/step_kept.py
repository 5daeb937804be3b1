"""What the step as written keeps beyond the placement's modes, read from its statements: the
axes over which a full gradient accumulates although G is sharded, and those over which the
parameters stay gathered after the update (:mod:`placeverify.cost.memory`)."""

from __future__ import annotations

from placeverify.ir.placement import State
from placeverify.ir.step import Collective, CollectiveKind, Free, TargetKind
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import gathered_axes, offloaded, partitions


def unsharded_gradient_axes(strategy: Strategy) -> tuple[str, ...]:
    """Data axes along which the step as written holds a whole gradient although G is sharded.

    With one micro-batch the gradient is reduce-scattered as backward produces it (FSDP's
    post-backward hook, ZeRO-2's buckets), wherever the ``reduce_scatter`` is written. With m > 1
    the shard is all that stays only if, every micro-batch, a ``reduce_scatter grads`` over the
    axis is followed by ``free grads`` (the canonical ZeRO-2/3 and FSDP step); a reduce-scatter
    after the loop (FSDP's ``no_sync`` / ``set_requires_gradient_sync(False)``) lets the full
    unsharded gradient accumulate, and one in the loop without ``free grads`` keeps the full
    buffer beside the shard.
    """
    step = strategy.step
    if step.microbatches == 1 or offloaded(strategy, State.GRADIENTS):
        return ()
    each = [lo.op for lo in step.loop if lo.microbatch is None]
    out = []
    for p in strategy.placements:
        if strategy.size(p.axis) == 1 or not partitions(strategy, p.axis, State.GRADIENTS):
            continue
        scatters = [i for i, op in enumerate(each)
                    if isinstance(op, Collective) and op.kind is CollectiveKind.REDUCE_SCATTER
                    and op.target.kind is TargetKind.GRADS and p.axis in op.group.axes]
        freed = bool(scatters) and any(isinstance(op, Free) and op.target.kind is TargetKind.GRADS
                                       for op in each[scatters[0] + 1:])
        if not freed:
            out.append(p.axis)
    return tuple(out)


def kept_parameter_axes(strategy: Strategy) -> tuple[str, ...]:
    """S* axes over which the step as written gathers the parameters after the update
    (``all_gather params`` after the loop): the whole parameters stay until the next step."""
    post = strategy.step.post
    return tuple(a for a in gathered_axes(strategy)
                 if any(isinstance(op, Collective) and op.kind is CollectiveKind.ALL_GATHER
                        and op.target.kind is TargetKind.PARAMS and a in op.group.axes
                        for op in post))
