"""Which axes a parameter group's gradient buffer is identical along, statement by statement.

This follows the semantics of :mod:`placeverify.smt.integrity` with a coarser question: is the
coefficient of every atom the same on two ranks that differ only along an axis? A reduction over
the axis makes it so (both ranks compute the same sum); a backward adds rank-local gradients and
undoes it along every axis except those where ranks hold identical copies; a scale by a count
that differs between the axis's ranks undoes it; a reduction summed in a rank-dependent order over
three or more ranks leaves values that agree as reals but not bitwise. Because loss factors are
positive and counts are free, "not identical" here always has a witness, which the exact
interpreter exhibits on a small mesh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placeverify.ir.step import (
    Backward,
    Collective,
    CollectiveKind,
    Free,
    Op,
    Order,
    Scale,
    TargetKind,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import GroupView


@dataclass(frozen=True)
class Agreement:
    identical: frozenset[str]  # axes along which the consumed gradient is identical
    bitwise_breaks: dict[str, Collective] = field(default_factory=dict)  # axis -> the reduction
    mixing: tuple[Op, ...] = ()
    update_line: int | None = None


@dataclass
class _State:
    full: frozenset[str]
    shard: frozenset[str]
    sharded: bool
    scattered: frozenset[str]  # axes the shard was reduce-scattered over
    fp_full: dict[str, Collective]
    fp_shard: dict[str, Collective]

    def key(self) -> tuple[object, ...]:
        return (self.full, self.shard, self.sharded, self.scattered,
                tuple(sorted(self.fp_full)), tuple(sorted(self.fp_shard)))


def agreement(strategy: Strategy, view: GroupView, sizes: dict[str, int] | None = None) -> Agreement:
    sizes = sizes or {a.name: a.size for a in strategy.mesh.axes}
    every = frozenset(view.coordinates) | frozenset(view.complete)
    state = _State(every, every, False, frozenset(), {}, {})
    mixing: list[Op] = []
    consumed: list[tuple[frozenset[str], dict[str, Collective]]] = []
    update_line: list[int] = []

    def covered(op: Collective) -> frozenset[str] | None:
        axes = set()
        for axis in op.group.axes:
            size = sizes[axis]
            if axis in view.routed and size > 1:
                return None
            if axis in view.coordinates:
                if (axis in view.ends) != (axis in op.group.ends) and size > 1:
                    return None
                axes.add(axis)
            elif axis in view.complete:
                axes.add(axis)
            elif size > 1:
                return None
        return frozenset(axes)

    def apply(op: Op) -> None:
        nonlocal state
        s = state
        if isinstance(op, Backward):
            state = _State(s.full & frozenset(view.complete), s.shard, False, s.scattered,
                           {a: c for a, c in s.fp_full.items() if a in view.complete}, s.fp_shard)
        elif isinstance(op, Collective):
            if op.target.kind is not TargetKind.GRADS or not op.target.applies_to(view.group):
                return
            if op.kind is CollectiveKind.ALL_GATHER:
                if s.sharded:
                    state = _State(s.shard, s.shard, False, frozenset(), dict(s.fp_shard), s.fp_shard)
                return
            if op.kind not in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER):
                return
            axes = covered(op)
            scatter = op.kind is CollectiveKind.REDUCE_SCATTER
            on_shard = s.sharded and not scatter
            if axes is None or (on_shard and axes & s.scattered):
                mixing.append(op)
                return
            source, fp = (s.shard, s.fp_shard) if on_shard else (s.full, s.fp_full)
            result = source | axes
            fp_new = {a: c for a, c in fp.items() if a not in axes}
            # Two ranks sum a + b and b + a: IEEE addition commutes, so order matters from three.
            if op.order is Order.RANK_DEPENDENT and _group_size(op, view, sizes) >= 3:
                fp_new.update({a: op for a in axes if view.size(a, sizes) >= 2})
            if scatter:
                shard = (s.shard & result) if op.accumulate and s.scattered else result
                fp_shard = {**(s.fp_shard if op.accumulate else {}), **fp_new}
                state = _State(s.full, shard, True, s.scattered | (axes - frozenset(view.complete)),
                               s.fp_full, fp_shard)
            elif on_shard:
                state = _State(s.full, result, True, s.scattered, s.fp_full, fp_new)
            else:
                state = _State(result, s.shard, s.sharded, s.scattered, fp_new, s.fp_shard)
        elif isinstance(op, Scale):
            if not op.target.applies_to(view.group):
                return
            vary = _varying(op, view)
            if s.sharded:
                state = _State(s.full, s.shard - vary, True, s.scattered, s.fp_full, s.fp_shard)
            else:
                state = _State(s.full - vary, s.shard, s.sharded, s.scattered, s.fp_full, s.fp_shard)
        elif isinstance(op, Free):
            if op.target.applies_to(view.group):
                state = _State(every, s.shard, s.sharded, s.scattered, {}, s.fp_shard)
        elif isinstance(op, Update):
            identical = s.shard if s.sharded else s.full
            consumed.append((identical, dict(s.fp_shard if s.sharded else s.fp_full)))
            update_line.append(op.span.line)

    step = strategy.step
    m = step.microbatches
    indexed = max((lo.microbatch for lo in step.loop if lo.microbatch is not None), default=-1)
    previous: tuple[object, ...] | None = None
    for k in range(m):
        for lo in step.loop:
            if lo.microbatch is None or lo.microbatch == k:
                apply(lo.op)
        current = state.key()
        if k > indexed and current == previous:
            break  # the same body maps this state to itself: later micro-batches change nothing
        previous = current
    for op in step.post:
        apply(op)
    identical, fp = consumed[0] if consumed else (frozenset(), {})
    return Agreement(identical, fp, tuple(mixing), update_line[0] if update_line else None)


def _group_size(op: Collective, view: GroupView, sizes: dict[str, int]) -> int:
    size = 1
    for axis in op.group.axes:
        size *= min(2, sizes[axis]) if axis in op.group.ends else sizes[axis]
    return size


def _varying(op: Scale, view: GroupView) -> frozenset[str]:
    out: set[str] = set()
    for term, _ in op.factor.factors:
        if term.kind is TermKind.COUNT and term.count is not None:
            family = view.batch if term.count.kind.value == "tokens" else view.samples
            out.update(a for a in family if a not in term.count.axes)
    return frozenset(out)
