"""Gradient integrity in Z3, by a symmetry reduction that does not grow with the mesh.

Every rank runs the same step, so the coefficient that an atom's gradient sum S carries in the
gradient consumed by a device x depends only on the atom's *relation* to x: on each coordinate
axis, the same coordinate as x or a different one (plus its micro-batch). Each relation class is
one solver term, whatever the axis sizes. A sum over an axis of size n maps

    c'(same) = c'(different) = c(same) + (n - 1) * c(different),

because exactly one rank of x's group shares the atom's coordinate and the n - 1 others hold it
as a different-coordinate atom. A mean divides by n; a sum over an axis where ranks hold
identical full copies multiplies by n. Counts in loss normalisers and scale factors are variables
(see :mod:`placeverify.smt.counts`). Integrity holds iff for every class the consumed coefficient
equals the single-device reference weight (1/N for a token mean ...), for all counts: the solver
is asked for a class and counts where they differ.

Sizes are constants, so the formula is the same size at dp = 8 and dp = 4096. The micro-batch
loop is unrolled only when it contains collectives or scales (otherwise every micro-batch is
alike and one generic micro-batch stands for all).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import z3

from placeverify.ir.mesh import Group
from placeverify.ir.step import (
    Backward,
    Collective,
    CollectiveKind,
    Free,
    Monomial,
    Op,
    ReduceOp,
    Scale,
    Scope,
    TargetKind,
    TermKind,
    Update,
)
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.semantics.groups import GroupView
from placeverify.smt.counts import CountVars, KSpec, Size, more_than_one, product

SAME, DIFF = "same", "different"
MAX_UNROLL = 256


class Unmodelled(Exception):
    """A construct the encoding does not model exactly: the verdict must be 'unknown'."""


@dataclass(frozen=True, slots=True)
class Key:
    cls: tuple[str, ...]  # per coordinate axis of the view: SAME or DIFF
    k: int | str  # the atom's micro-batch ("g": any one, when all are alike)


@dataclass
class Encoded:
    consumed: dict[Key, Any]
    reference: dict[Key, Any]
    counts: CountVars
    mixing: list[Op] = field(default_factory=list)
    consumed_line: int | None = None


def loop_is_uniform(strategy: Strategy) -> bool:
    """True when the loop only runs backward: every micro-batch then behaves the same."""
    return all(isinstance(lo.op, Backward) and lo.microbatch is None for lo in strategy.step.loop)


class _Machine:
    def __init__(self, strategy: Strategy, view: GroupView, sizes: dict[str, Size], m: Size,
                 counts: CountVars) -> None:
        self.s = strategy
        self.view = view
        self.sizes = sizes
        self.m = m
        self.counts = counts
        self.generic = loop_is_uniform(strategy)
        if not self.generic and not isinstance(m, int):
            raise Unmodelled("the micro-batch loop has collectives, so it is unrolled, which needs "
                             "a concrete micro-batch count")
        if not self.generic and m > MAX_UNROLL:
            raise Unmodelled(f"the micro-batch loop has collectives and {m} micro-batches; "
                             f"the encoding unrolls at most {MAX_UNROLL}")
        self.axes = view.coordinates
        choices = [(SAME, DIFF) if more_than_one(self.size(a)) else (SAME,) for a in self.axes]
        ks: list[int | str] = ["g"] if self.generic else list(range(m))
        self.keys = [Key(tuple(c), k) for c in itertools.product(*choices) for k in ks]
        zero = z3.RealVal(0)
        self.full: dict[Key, Any] = {key: zero for key in self.keys}
        self.shard: dict[Key, Any] | None = None
        self.sharded = False
        self.scattered: set[str] = set()
        self.vary_full: set[str] = set()
        self.vary_shard: set[str] = set()
        self.consumed: dict[Key, Any] | None = None
        self.consumed_line: int | None = None
        self.mixing: list[Op] = []

    def size(self, axis: str) -> Size:
        """An axis's size as this group sees it: ends(pp) has two members when pp has two."""
        n = self.sizes[axis]
        if axis in self.view.ends:
            return 2 if more_than_one(n) else 1
        return n

    # ---- evaluation of factors ---------------------------------------------------------------

    def anchor(self, key: Key, at_atom: bool) -> dict[str, str]:
        out = {}
        for axis, rel in zip(self.axes, key.cls, strict=True):
            out[axis] = "a" if (at_atom and rel == DIFF) else "x"
        for axis in self.view.batch:
            out.setdefault(axis, "x")
        return out

    def factor(self, monomial: Monomial, key: Key, at_atom: bool, k_now: KSpec) -> Any:
        k: KSpec = key.k if at_atom else k_now
        anchor = self.anchor(key, at_atom)
        return monomial.evaluate(
            one=z3.RealVal(1), number=lambda n: z3.RealVal(str(n)), microbatches=_real(self.m),
            size=lambda group: _real(_group_size(group, self.sizes)),
            count=lambda c: self.counts.get(c.kind.value, c.axes, c.scope is Scope.STEP, anchor,
                                            k))

    def varying(self, monomial: Monomial) -> set[str]:
        """Batch axes along which a factor evaluated on the holding device varies."""
        out: set[str] = set()
        for term, _ in monomial.factors:
            if term.kind is TermKind.COUNT and term.count is not None:
                family = self.view.batch if term.count.kind.value == "tokens" else self.view.samples
                out.update(a for a in family if a not in term.count.axes)
        return out

    # ---- ops ---------------------------------------------------------------------------------

    def backward(self, op: Backward, k: int | str) -> None:
        self.sharded = False
        for key in self.keys:
            if key.k != k:
                continue
            local = all(rel == SAME or axis in self.view.routed
                        for axis, rel in zip(self.axes, key.cls, strict=True))
            if local:
                self.full[key] = self.full[key] + self.factor(op.loss, key, True, k)

    def reduce(self, values: dict[Key, Any], vary: set[str], group: Group,
               op: ReduceOp | None) -> dict[Key, Any] | None:
        """The reduction of a buffer over a group, or None when the group mixes parameters."""
        view = self.view
        plan: list[tuple[str, str]] = []
        for axis in group.axes:
            size = self.sizes[axis]
            if axis in view.routed and more_than_one(size):
                return None
            if axis in self.axes:
                if (axis in view.ends) != (axis in group.ends):
                    return None
                plan.append(("coordinate", axis))
            elif axis in view.complete:
                plan.append(("copies", axis))
            elif more_than_one(size):
                return None  # ranks along it hold different parameters; one rank is a no-op
        if op is ReduceOp.MAX:
            raise Unmodelled("gradients reduced with max are not a gradient")
        out = dict(values)
        divisor: Any = 1
        for kind, axis in plan:
            n = self.size(axis)
            divisor = divisor * n
            if kind == "copies":
                out = {key: v * _real(n) for key, v in out.items()}
                continue
            if not more_than_one(n):
                continue
            if axis in vary:
                raise Unmodelled(f"a scale that differs between ranks of {axis} is applied before "
                                 f"a reduction over {axis}")
            # The rank holding the atom sees it as same-coordinate: in x's frame, where the atom
            # is different-coordinate, that rank's "x" anchors on this axis are the atom's.
            i = self.axes.index(axis)
            new: dict[Key, Any] = {}
            for key in self.keys:
                same = Key((*key.cls[:i], SAME, *key.cls[i + 1:]), key.k)
                diff = Key((*key.cls[:i], DIFF, *key.cls[i + 1:]), key.k)
                others = _real(n) - 1
                if key.cls[i] == SAME:
                    new[key] = out[same] + others * self.counts.relabel(out[diff], axis, "a", "x")
                else:
                    new[key] = self.counts.relabel(out[same], axis, "x", "a") + others * out[diff]
            out = new
        if op is ReduceOp.MEAN and not (isinstance(divisor, int) and divisor == 1):
            out = {key: v / _real(divisor) for key, v in out.items()}
        return out

    def collective(self, op: Collective) -> None:
        if op.target.kind is not TargetKind.GRADS or not op.target.applies_to(self.view.group):
            return
        if op.kind is CollectiveKind.ALL_GATHER:
            if self.sharded and self.shard is not None:
                self.full, self.vary_full = dict(self.shard), set(self.vary_shard)
                self.sharded = False
            return
        if op.kind not in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER):
            return
        scatter = op.kind is CollectiveKind.REDUCE_SCATTER
        on_shard = self.sharded and not scatter and self.shard is not None
        if on_shard and self.scattered & set(op.group.axes):
            self.mixing.append(op)  # ranks of a scattered axis hold different elements
            return
        source = self.shard if on_shard else self.full
        vary = self.vary_shard if on_shard else self.vary_full
        assert source is not None
        result = self.reduce(source, vary, op.group, op.op)
        if result is None:
            self.mixing.append(op)
            return
        if scatter:
            if op.accumulate and self.shard is not None:
                result = {key: self.shard[key] + result[key] for key in self.keys}
                self.vary_shard |= vary
            else:
                self.vary_shard = set(vary)
            self.shard = result
            self.sharded = True
            self.scattered |= {a for a in op.group.axes if a in self.axes}
        elif on_shard:
            self.shard = result
        else:
            self.full = result

    def scale(self, op: Scale, k: KSpec) -> None:
        if not op.target.applies_to(self.view.group):
            return
        vary = self.varying(op.factor)
        if self.sharded and self.shard is not None:
            self.shard = {key: v * self.factor(op.factor, key, False, k)
                          for key, v in self.shard.items()}
            self.vary_shard |= vary
        else:
            self.full = {key: v * self.factor(op.factor, key, False, k)
                         for key, v in self.full.items()}
            self.vary_full |= vary

    def apply(self, op: Op, k: int | str) -> None:
        if isinstance(op, Backward):
            self.backward(op, k)
        elif isinstance(op, Collective):
            self.collective(op)
        elif isinstance(op, Scale):
            self.scale(op, k if isinstance(k, int) else None)
        elif isinstance(op, Free):
            if op.target.applies_to(self.view.group):
                self.full = {key: z3.RealVal(0) for key in self.keys}
                self.vary_full = set()
        elif isinstance(op, Update):
            source = self.shard if self.sharded and self.shard is not None else self.full
            self.consumed = dict(source)
            self.consumed_line = op.span.line

    def run(self) -> None:
        step = self.s.step
        if self.generic:
            for lo in step.loop:
                self.apply(lo.op, "g")
        else:
            for k in range(self.m):
                for lo in step.loop:
                    if lo.microbatch is None or lo.microbatch == k:
                        self.apply(lo.op, k)
        last: int | str = "g" if self.generic else self.m - 1
        for op in step.post:
            self.apply(op, last)

    # ---- the reference -----------------------------------------------------------------------

    def reference(self, key: Key) -> Any:
        loss = self.s.loss.kind
        view = self.view
        anchor = self.anchor(key, True)
        if loss is LossKind.TOKEN_MEAN:
            return 1 / self.counts.get("tokens", view.batch, True, anchor, None)
        if loss is LossKind.SAMPLE_MEAN:
            return 1 / self.counts.get("samples", view.samples, True, anchor, None)
        if loss is LossKind.MICROBATCH_MEAN:
            units = _real(self.m) * _real(product(self.sizes[a] for a in view.samples))
            context = tuple(a for a in view.batch if a not in view.samples)
            return 1 / (units * self.counts.get("tokens", context, False, anchor, key.k))
        return z3.RealVal(1)


def encode(strategy: Strategy, view: GroupView, sizes: dict[str, Size], m: Size, prefix: str,
           integer: bool) -> Encoded:
    equal_samples = not strategy.loss.uneven_samples
    counts = CountVars(view, sizes, m, prefix, integer, equal_samples)
    machine = _Machine(strategy, view, sizes, m, counts)
    machine.run()
    if machine.consumed is None:
        raise Unmodelled("the step never updates the parameters")
    reference = {key: machine.reference(key) for key in machine.keys}
    return Encoded(machine.consumed, reference, counts, machine.mixing, machine.consumed_line)


def mismatch_formula(encoded: Encoded) -> Any:
    """Satisfiable iff some atom's consumed coefficient differs from its reference weight."""
    differs = [encoded.consumed[key] != encoded.reference[key] for key in encoded.consumed]
    return z3.And(*encoded.counts.constraints(), z3.Or(*differs))


def _group_size(group: Group, sizes: dict[str, Size]) -> Any:
    return group.size_of(sizes)


def _real(value: Any) -> Any:
    """A size or count as a real-valued solver term."""
    if isinstance(value, int):
        return z3.RealVal(value)
    return z3.ToReal(value) if z3.is_int(value) else value
