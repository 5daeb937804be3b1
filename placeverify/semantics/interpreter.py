"""The exact interpreter: run one step for one parameter group on a concrete small mesh.

Every device is simulated with exact rationals: micro-batch token counts and per-atom gradient
sums go in, each device's gradient buffer after each statement comes out, along with the value
the optimizer consumes and the single-device reference. It is the ground truth behind every
counterexample the Z3 encoding reports (a Z3 model is only shown after this interpreter confirms
it) and the differential oracle the Z3 encoding is tested against.

The order of statements is :mod:`placeverify.semantics.schedule`'s and what each does to the
buffers is :mod:`placeverify.semantics.buffers`' (shared with the Z3 encoding, the agreement
analysis and the torch replay); this module is the exact domain of those rules: ``backward L``
adds, for every atom the device computes this micro-batch, ``factor(L) * S`` into the full
buffer, with the counts in ``L`` those of the atom's home device, and a reduction sums (or
averages, or takes the maximum of) the buffers of the group's devices.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction

from placeverify.ir.mesh import Group
from placeverify.ir.render import op_label
from placeverify.ir.step import (
    Backward,
    Collective,
    CountKind,
    Monomial,
    Op,
    ReduceOp,
    Scale,
    Scope,
    Update,
)
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.semantics.buffers import GradMachine, Seen
from placeverify.semantics.gather import gathered_loss
from placeverify.semantics.groups import GroupView, ends_match
from placeverify.semantics.participation import idle_at
from placeverify.semantics.schedule import MicroBatch
from placeverify.semantics.surd import Real, sqrt_of

Coords = tuple[int, ...]
AtomKey = tuple[Coords, int]  # (batch coordinates, micro-batch)
ChunkKey = tuple[Coords, int, Coords]  # (batch coordinates, micro-batch, extra coordinates)
LOSS_SCALE = Fraction(8)  # the loss-scale factor S on concrete instances (any S != 1 shows it)


@dataclass(frozen=True, slots=True)
class Instance:
    """Concrete inputs: mesh sizes, micro-batch count, counts per atom, gradient per chunk."""

    sizes: dict[str, int]
    microbatches: int
    tokens: dict[AtomKey, int]
    samples: dict[AtomKey, int]  # the samples of the atom's micro-batch (same along context axes)
    grads: dict[ChunkKey, Fraction]
    # the tokens (samples) the other optimizer steps' micro-batches hold, per count kind, scope
    # and batch coordinates: what a count over the run (the earlier steps) or over the batch
    # (every other step listed) adds to its step's (semantics/counters.py)
    before: dict[tuple[CountKind, Scope, Coords], int] = field(default_factory=dict)


@dataclass
class DeviceTrace:
    coords: dict[str, int]
    rows: list[tuple[str, int | None, int | None, Real, Real | None]] = field(
        default_factory=list)  # (statement, line, micro-batch, full buffer, shard)
    consumed: Real | None = None


@dataclass
class Run:
    devices: list[DeviceTrace]
    reference: Fraction
    mixes_shards: list[Op]  # collectives over axes where the group holds different parameters
    consumed_at_line: int | None
    clips: list[Seen[list[Real]]] = field(default_factory=list)  # what each clip saw

    def mismatches(self, observe: int | None = None) -> list[tuple[int, DeviceTrace]]:
        """Devices (index, trace) whose consumed gradient, or with ``observe`` the gradient
        clip number ``observe`` saw, differs from the single-device reference."""
        if observe is None:
            return [(i, d) for i, d in enumerate(self.devices) if d.consumed != self.reference]
        seen = self.clips[observe].value
        return [(i, d) for i, d in enumerate(self.devices) if seen[i] != self.reference]


def batch_coords(view: GroupView, sizes: dict[str, int]) -> list[Coords]:
    return [tuple(c) for c in itertools.product(*(range(sizes[a]) for a in view.batch))]


def extra_coords(view: GroupView, sizes: dict[str, int]) -> list[Coords]:
    return [tuple(c) for c in itertools.product(*(range(view.size(a, sizes)) for a in view.extra))]


def atoms(view: GroupView, sizes: dict[str, int], m: int) -> list[AtomKey]:
    return [(b, k) for b in batch_coords(view, sizes) for k in range(m)]


class _Exact:
    """The exact domain: one exact number per device, each device's gradient buffer (a rational,
    or with ``|g| ^ 0.5`` factors an exact sum of square roots, :mod:`placeverify.semantics.surd`)."""

    def __init__(self, strategy: Strategy, view: GroupView, instance: Instance) -> None:
        self.s = strategy
        self.view = view
        self.inst = instance
        self.sizes = instance.sizes
        self.m = instance.microbatches
        self.axes = (*view.batch, *view.extra, *view.complete)
        ranges = [range(self._size(a)) for a in self.axes]
        self.devices = [tuple(c) for c in itertools.product(*ranges)]
        self.index = {d: i for i, d in enumerate(self.devices)}
        self._counts: dict[tuple[object, ...], Fraction] = {}

    def _size(self, axis: str) -> int:
        return self.view.size(axis, self.sizes)

    def live(self, axis: str) -> bool:
        return self.sizes[axis] > 1

    # ---- coordinates ----------------------------------------------------------------------

    def batch_of(self, device: Coords) -> Coords:
        return device[:len(self.view.batch)]

    def extra_of(self, device: Coords) -> Coords:
        nb = len(self.view.batch)
        return device[nb:nb + len(self.view.extra)]

    def members(self, device: Coords, group: Group) -> list[Coords] | None:
        """The devices of ``device``'s group, or None when the group mixes different parameters."""
        free: list[int] = []
        for axis in group.axes:
            if not ends_match(self.view, group, axis, self.sizes[axis]):
                return None  # the whole pipeline axis: stages without the tied embedding
            if axis in self.view.routed and self.sizes[axis] > 1:
                return None  # experts on other ranks are different parameters
            if axis not in self.axes:
                if self.sizes[axis] == 1:
                    continue
                return None  # an owned (or routed) axis
            free.append(self.axes.index(axis))
        out = []
        for combo in itertools.product(*(range(self._size(self.axes[i])) for i in free)):
            d = list(device)
            for i, c in zip(free, combo, strict=True):
                d[i] = c
            out.append(tuple(d))
        return out

    # ---- counts -----------------------------------------------------------------------------

    def count(self, kind: CountKind, axes: tuple[str, ...], scope: Scope, home: Coords,
              k: int) -> Fraction:
        """A count summed over ``axes`` (an all-reduce) for the device with batch coords ``home``."""
        key = (kind, axes, scope, home, k if scope is Scope.MICROBATCH else None)
        cached = self._counts.get(key)
        if cached is None:
            cached = self._counts[key] = self._count(kind, axes, scope, home, k)
        return cached

    def _count(self, kind: CountKind, axes: tuple[str, ...], scope: Scope, home: Coords,
               k: int) -> Fraction:
        total = 0
        batch = self.view.batch
        for b, kk in atoms(self.view, self.sizes, self.m):
            if scope is Scope.MICROBATCH and kk != k:
                continue
            if any(b[i] != home[i] for i, a in enumerate(batch) if a not in axes):
                continue
            total += (self.inst.tokens if kind is CountKind.TOKENS else self.inst.samples)[(b, kk)]
        if scope in (Scope.RUN, Scope.BATCH):  # across steps: the other steps' micro-batches
            total += sum(n for (kk_, sc, b), n in self.inst.before.items()
                         if kk_ is kind and sc is scope
                         and all(b[i] == home[i] for i, a in enumerate(batch) if a not in axes))
        replicated = math.prod(self.sizes[a] for a in axes if a not in batch)
        return Fraction(total * replicated)

    def factor(self, monomial: Monomial, home: Coords, k: MicroBatch) -> Real:
        assert isinstance(k, int)
        value: Real = monomial.evaluate(
            one=Fraction(1), number=Fraction, microbatches=Fraction(self.m),
            size=lambda group: Fraction(group.size_of(self.sizes)),
            count=lambda c: self.count(c.kind, c.axes, c.scope, home, k),
            loss_scale=LOSS_SCALE, root=lambda group: sqrt_of(group.size_of(self.sizes)))
        return value

    def reference_weight(self, b: Coords, k: int) -> Fraction:
        """The atom's weight in the single-device loss: the sum over the loss terms that reach
        this group (one gradient value per atom stands for every term's, so the instance is one
        where the terms' gradients are equal; judging terms apart is
        :mod:`placeverify.semantics.terms`' projection). An atom of a micro-batch that leaves the
        group unused on every rank weighs nothing (:mod:`placeverify.semantics.participation`)."""
        if idle_at(self.s.step.idle_in(self.view.group), k):
            return Fraction(0)
        if not self.s.terms:
            return self._weight(self.s.loss.kind, b, k)
        total = self._weight(self.s.loss.kind, b, k)
        for term in self.s.terms:
            if term.reaches is None or self.view.group in term.reaches:
                total += self._weight(term.loss.kind, b, k)
        return total

    def _weight(self, kind: LossKind, b: Coords, k: int) -> Fraction:
        everything = tuple(self.view.batch)
        if kind is LossKind.TOKEN_MEAN:
            return 1 / self.count(CountKind.TOKENS, everything, Scope.STEP, b, k)
        if kind is LossKind.SAMPLE_MEAN:
            samples = Fraction(sum(self.inst.samples[(bb, kk)] for bb, kk in self._units()))
            return 1 / samples
        if kind is LossKind.MICROBATCH_MEAN:
            units = len(self._units())
            context = tuple(a for a in self.view.batch if a not in self.view.samples)
            return 1 / (units * self.count(CountKind.TOKENS, context, Scope.MICROBATCH, b, k))
        return Fraction(1)

    def _units(self) -> list[AtomKey]:
        """One atom per micro-batch unit (context coordinate 0)."""
        batch = self.view.batch
        context = [i for i, a in enumerate(batch) if a not in self.view.samples]
        return [(b, k) for b, k in atoms(self.view, self.sizes, self.m)
                if all(b[i] == 0 for i in context)]

    def reference(self) -> Fraction:
        total = Fraction(0)
        for (b, k, _e), g in self.inst.grads.items():
            total += self.reference_weight(b, k) * g
        return total

    # ---- the domain (placeverify.semantics.buffers.GradDomain) -------------------------------

    def zero(self) -> list[Real]:
        return [Fraction(0)] * len(self.devices)

    def backward(self, buffer: list[Real], op: Backward, k: MicroBatch) -> list[Real]:
        assert isinstance(k, int)
        view = self.view
        routed = [i for i, a in enumerate(view.batch) if a in view.routed]
        out = list(buffer)
        for d in self.devices:
            mine = self.batch_of(d)
            chunk = self.extra_of(d)
            add: Real = Fraction(0)
            for b in batch_coords(view, self.sizes):
                if any(b[i] != mine[i] for i in range(len(b)) if i not in routed):
                    continue
                add += self.factor(gathered_loss(op), b, k) * self.inst.grads[(b, k, chunk)]
            out[self.index[d]] += add
        return out

    def reduce(self, buffer: list[Real], op: Collective) -> list[Real] | None:
        result: list[Real] = []
        for d in self.devices:
            group = self.members(d, op.group)
            if group is None:
                return None
            values = [buffer[self.index[y]] for y in group]
            value: Real
            if op.op is ReduceOp.MAX:
                value = max(values)
            else:
                value = sum(values, Fraction(0))
                if op.op is ReduceOp.MEAN:
                    value = value / len(group)
            result.append(value)
        return result

    def accumulate(self, shard: list[Real], value: list[Real]) -> list[Real]:
        return [a + b for a, b in zip(shard, value, strict=True)]

    def scale(self, buffer: list[Real], op: Scale, k: MicroBatch) -> list[Real]:
        return [v * self.factor(op.factor, self.batch_of(d), k)
                for v, d in zip(buffer, self.devices, strict=True)]


def run(strategy: Strategy, view: GroupView, instance: Instance) -> Run:
    """Execute the step on every device of a concrete instance."""
    exact = _Exact(strategy, view, instance)
    traces = [DeviceTrace(dict(zip(exact.axes, d, strict=True))) for d in exact.devices]

    def record(machine: GradMachine[list[Real]], op: Op, k: MicroBatch) -> None:
        line = getattr(op, "span", None)
        shard = machine.shard if machine.sharded else None
        for i, trace in enumerate(traces):
            trace.rows.append((op_label(op), line.line if line else None,
                               k if isinstance(k, int) else None, machine.full[i],
                               shard[i] if shard is not None else None))

    machine = GradMachine(exact, view.group, exact.live, record)
    machine.run(strategy.step, instance.microbatches)
    consumed_line = None
    if machine.update is None:  # no 'update params': the optimizer consumes nothing (semantics/skip)
        for trace in traces:
            trace.consumed = Fraction(0)
    else:
        consumed_line = machine.update.op.span.line if isinstance(machine.update.op, Update) \
            else None
        for trace, value in zip(traces, machine.update.value, strict=True):
            trace.consumed = value
    return Run(traces, exact.reference(), machine.mixes, consumed_line, machine.clips)


def uniform_instance(strategy: Strategy, view: GroupView, sizes: dict[str, int], m: int,
                     tokens: dict[AtomKey, int] | None = None,
                     samples: dict[AtomKey, int] | None = None) -> Instance:
    """An instance with the given counts (default 1 each) and distinct per-chunk gradients.

    Gradient sums are distinct small integers, so that a wrong coefficient on any one atom
    changes the consumed value (equal values could hide a wrong normalisation).
    """
    keys = atoms(view, sizes, m)
    tokens = tokens or {key: 1 for key in keys}
    samples = samples or {key: 1 for key in keys}
    grads: dict[ChunkKey, Fraction] = {}
    chunks = extra_coords(view, sizes)
    for n, ((b, k), e) in enumerate(itertools.product(keys, chunks)):
        grads[(b, k, e)] = Fraction(tokens[(b, k)] * (n + 1))
    return Instance(dict(sizes), m, tokens, samples, grads)


