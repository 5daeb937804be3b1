"""Which axes a parameter group's gradient buffer is identical along, statement by statement.

This follows the semantics of :mod:`placeverify.verify.z3.integrity` with a coarser question: is the
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

from placeverify.ir.model import ParamGroup
from placeverify.ir.relations import Relation
from placeverify.ir.step import (
    Backward,
    Collective,
    CountKind,
    Op,
    Order,
    Scale,
    TargetKind,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.semantics.buffers import GradMachine, Position, Seen
from placeverify.semantics.groups import GroupView, ends_match, group_view
from placeverify.semantics.schedule import MicroBatch


@dataclass(frozen=True)
class Agreement:
    identical: frozenset[str]  # axes along which the consumed gradient is identical
    bitwise_breaks: dict[str, Collective] = field(default_factory=dict)  # axis -> the reduction
    mixing: tuple[Op, ...] = ()
    update_line: int | None = None
    scattered: frozenset[str] = frozenset()  # axes the consumed gradient is a shard over
    clips: tuple[Seen[Same], ...] = ()  # what each clip of this group saw, in order
    positions: tuple[Position, ...] = ()  # overflow reductions and parameter gathers


@dataclass(frozen=True)
class Same:
    """A buffer in the agreement domain: the axes along which it is identical, and for each axis
    where a rank-dependent summation order breaks bitwise equality, the reduction that did."""

    identical: frozenset[str]
    fp: dict[str, Collective] = field(default_factory=dict)

    def key(self) -> tuple[object, ...]:
        return (self.identical, tuple(sorted(self.fp)))


class _Agreement:
    """The agreement domain (:class:`placeverify.semantics.buffers.GradDomain`)."""

    def __init__(self, view: GroupView, sizes: dict[str, int]) -> None:
        self.view = view
        self.sizes = sizes
        self.every = frozenset(view.coordinates) | frozenset(view.complete)
        self.complete = frozenset(view.complete)

    def live(self, axis: str) -> bool:
        return self.sizes[axis] > 1

    def covered(self, op: Collective) -> frozenset[str] | None:
        view, sizes = self.view, self.sizes
        axes = set()
        for axis in op.group.axes:
            size = sizes[axis]
            if axis in view.routed and size > 1:
                return None
            if not ends_match(view, op.group, axis, size):
                return None
            if axis in view.coordinates or axis in view.complete:
                axes.add(axis)
            elif size > 1:
                return None
        return frozenset(axes)

    def zero(self) -> Same:
        return Same(self.every)

    def backward(self, buffer: Same, op: Backward, k: MicroBatch) -> Same:
        return Same(buffer.identical & self.complete,
                    {a: c for a, c in buffer.fp.items() if a in self.complete})

    def reduce(self, buffer: Same, op: Collective) -> Same | None:
        axes = self.covered(op)
        if axes is None:
            return None
        fp = {a: c for a, c in buffer.fp.items() if a not in axes}
        # Two ranks sum a + b and b + a: IEEE addition commutes, so order matters from three.
        if op.order is Order.RANK_DEPENDENT and _group_size(op, self.view, self.sizes) >= 3:
            fp.update({a: op for a in axes if self.view.size(a, self.sizes) >= 2})
        return Same(buffer.identical | axes, fp)

    def accumulate(self, shard: Same, value: Same) -> Same:
        return Same(shard.identical & value.identical, {**shard.fp, **value.fp})

    def scale(self, buffer: Same, op: Scale, k: MicroBatch) -> Same:
        return Same(buffer.identical - _varying(op, self.view), buffer.fp)


def agreement(strategy: Strategy, view: GroupView, sizes: dict[str, int] | None = None) -> Agreement:
    sizes = sizes or {a.name: a.size for a in strategy.mesh.axes}
    domain = _Agreement(view, sizes)

    def state(m: GradMachine[Same]) -> tuple[object, ...]:
        shard = m.shard.key() if m.shard is not None else None
        return (m.full.key(), shard, m.sharded, m.scattered)

    machine = GradMachine(domain, view.group, domain.live, judges_values=False)
    machine.run(strategy.step, strategy.step.microbatches, fixpoint=state)
    update = machine.update
    if update is None:  # no 'update params': nothing consumed, the same on every rank (semantics/skip)
        return Agreement(domain.every, {}, tuple(machine.mixes), None, frozenset(),
                         tuple(machine.clips), tuple(machine.positions))
    line = update.op.span.line if isinstance(update.op, Update) else None
    scattered = update.scattered if update.sharded else frozenset()
    return Agreement(update.value.identical, dict(update.value.fp), tuple(machine.mixes), line,
                     scattered, tuple(machine.clips), tuple(machine.positions))


def _group_size(op: Collective, view: GroupView, sizes: dict[str, int]) -> int:
    size = 1
    for axis in op.group.axes:
        size *= min(2, sizes[axis]) if axis in op.group.ends else sizes[axis]
    return size


def _varying(op: Scale, view: GroupView) -> frozenset[str]:
    out: set[str] = set()
    for term, _ in op.factor.factors:
        if term.kind is TermKind.COUNT and term.count is not None:
            family = view.batch if term.count.kind is CountKind.TOKENS else view.samples
            out.update(a for a in family if a not in term.count.axes)
    return frozenset(out)


# ---- questions the update and consistency families share ---------------------------------------


def split_axes(strategy: Strategy, group: ParamGroup, sizes: dict[str, int]) -> set[str]:
    """Axes along which ranks consume different elements of this group's gradient: those where
    they hold different parameters, and those the consumed gradient is a shard over."""
    view = group_view(strategy, group)
    out = {a for a in view.owned if sizes[a] > 1}
    out.update(a for a in agreement(strategy, view, sizes).scattered if sizes[a] > 1)
    return out


def same_gradient_everywhere(strategy: Strategy, axis: str) -> bool:
    """Do the ranks along ``axis`` consume the same gradient elements with the same values?"""
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        if view.relation(axis) is Relation.OWNED or axis in split_axes(strategy, group, sizes):
            return False
        if axis not in agreement(strategy, view).identical:
            return False
    return True


def overflow_reductions(strategy: Strategy) -> tuple[list[Position], list[Position]]:
    """The overflow-flag statements (reductions and broadcasts) that decide the skip (after the
    last backward, before the update), and those that run too early or too late to decide it."""
    group = strategy.model.groups_present()[0]
    positions = [p for p in agreement(strategy, group_view(strategy, group)).positions
                 if p.op.target.kind is TargetKind.OVERFLOW]
    deciding = [p for p in positions if p.after_last_backward and not p.after_update]
    return deciding, [p for p in positions if p not in deciding]
