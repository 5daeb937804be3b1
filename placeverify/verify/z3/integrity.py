"""Gradient integrity in Z3, by a symmetry reduction that does not grow with the mesh.

Every rank runs the same step, so the coefficient that an atom's gradient sum S carries in the
gradient consumed by a device x depends only on the atom's *relation* to x: on each coordinate
axis, the same coordinate as x or a different one (plus its micro-batch). Each relation class is
one solver term, whatever the axis sizes. A sum over an axis of size n maps

    c'(same) = c'(different) = c(same) + (n - 1) * c(different),

because exactly one rank of x's group shares the atom's coordinate and the n - 1 others hold it
as a different-coordinate atom. A mean divides by n; a sum over an axis where ranks hold
identical full copies multiplies by n. Counts in loss normalisers and scale factors are variables
(see :mod:`placeverify.verify.z3.counts`). Integrity holds iff for every class the consumed coefficient
equals the single-device reference weight (1/N for a token mean ...), for all counts: the solver
is asked for a class and counts where they differ.

Sizes are constants, so the formula is the same size at dp = 8 and dp = 4096. The micro-batch
loop is unrolled only when it contains collectives or scales (otherwise every micro-batch is
alike and one generic micro-batch stands for all), and then only up to a steady state: when the
micro-batches after the indexed ones leave every earlier micro-batch's coefficients as they were
and end in the same buffer layout, the ones after them are renamings of the one before the last
and are not encoded (:func:`encode`, :func:`_steady`), so an FSDP step that reduce-scatters in
each of 128 or 512 micro-batches encodes five.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import z3

from placeverify.evidence import Key
from placeverify.ir.mesh import Group
from placeverify.ir.step import (
    Backward,
    Collective,
    CountKind,
    Monomial,
    Op,
    ReduceOp,
    Scale,
    Scope,
    TermKind,
    Update,
)
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.semantics.buffers import GradMachine, Seen
from placeverify.semantics.gather import gathered_loss
from placeverify.semantics.groups import GroupView, ends_match
from placeverify.semantics.participation import idle_at
from placeverify.semantics.schedule import (
    GENERIC,
    MicroBatch,
    Unmodelled,
    is_uniform,
    summary_indices,
)
from placeverify.verify.budget import TooLarge, checkpoint, each
from placeverify.verify.z3.counts import CountVars, KSpec, Label, Size, more_than_one, product

SAME, DIFF = "same", "different"
MAX_UNROLL = 256
# Relation classes times statements run: past it the encoding is not built ("too large to
# encode", unknown). 16 data axes of size 2 with one micro-batch are 65,536 classes x 4 statements.
MAX_ENCODING_TERMS = 1_000_000


@dataclass(frozen=True, slots=True)
class Coeffs:
    """A gradient buffer in the coefficient domain: one solver term per relation class, and the
    batch axes along which a scale applied to it differs between ranks."""

    values: dict[Key, Any]
    vary: frozenset[str] = frozenset()


@dataclass
class Encoded:
    consumed: dict[Key, Any]
    reference: dict[Key, Any]
    counts: CountVars
    mixing: list[Op] = field(default_factory=list)
    consumed_line: int | None = None
    clips: list[Seen[Coeffs]] = field(default_factory=list)
    constraints: list[Any] = field(default_factory=list)


def loop_is_uniform(strategy: Strategy) -> bool:
    """True when the loop only runs backward: every micro-batch then behaves the same."""
    return is_uniform(strategy.step)


class _Coefficients:
    """The coefficient domain (:class:`placeverify.semantics.buffers.GradDomain`)."""

    def __init__(self, strategy: Strategy, view: GroupView, sizes: dict[str, Size], m: Size,
                 counts: CountVars, indices: list[int] | None = None) -> None:
        self.s = strategy
        self.view = view
        self.sizes = sizes
        self.m = m
        self.counts = counts
        self.loss_scale = z3.Real(f"{counts.prefix}loss_scale")
        self.roots: dict[str, Any] = {}  # square roots of sizes, by size (|g| ^ 0.5)
        self.root_facts: list[Any] = []
        self.generic = loop_is_uniform(strategy)
        if not self.generic and not isinstance(m, int):
            raise Unmodelled("the micro-batch loop has collectives, so it is unrolled, which needs "
                             "a concrete micro-batch count")
        if not self.generic and indices is None and m > MAX_UNROLL:
            raise Unmodelled(f"the micro-batch loop has collectives and {m} micro-batches, and "
                             "its micro-batches do not reach a steady state that can be "
                             f"summarised; the encoding unrolls at most {MAX_UNROLL}")
        self.axes = view.coordinates
        choices = [(SAME, DIFF) if more_than_one(self.size(a)) else (SAME,) for a in self.axes]
        ks: list[int | str] = ([GENERIC] if self.generic
                               else list(range(m)) if indices is None else list(indices))
        classes = 1
        for c in choices:
            classes *= len(c)
        step = strategy.step
        statements = len(step.pre) + len(step.post) + len(step.loop) * len(ks)
        if classes * len(ks) * max(1, statements) > MAX_ENCODING_TERMS:
            raise TooLarge(f"{classes} relation classes x {len(ks)} micro-batches x {statements} "
                           f"statements pass the encoding limit of {MAX_ENCODING_TERMS:,} terms",
                           step.span)
        self.keys = [Key(tuple(c), k) for c in itertools.product(*choices) for k in ks]

    def size(self, axis: str) -> Size:
        """An axis's size as this group sees it: ends(pp) has two members when pp has two."""
        n = self.sizes[axis]
        if axis in self.view.ends:
            return 2 if more_than_one(n) else 1
        return n

    def live(self, axis: str) -> bool:
        return more_than_one(self.sizes[axis])

    # ---- evaluation of factors ---------------------------------------------------------------

    def anchor(self, key: Key, at_atom: bool) -> dict[str, Label]:
        out = {}
        for axis, rel in zip(self.axes, key.cls, strict=True):
            out[axis] = Label.ATOM if (at_atom and rel == DIFF) else Label.CONSUMER
        for axis in self.view.batch:
            out.setdefault(axis, Label.CONSUMER)
        return out

    def factor(self, monomial: Monomial, key: Key, at_atom: bool, k_now: KSpec) -> Any:
        k: KSpec = key.k if at_atom else k_now
        for term, _ in monomial.factors:
            if term.count is not None and term.count.scope in (Scope.RUN, Scope.BATCH):
                # judged on the per-step projection and in semantics/counters.py, never here
                raise Unmodelled(f"'{term.count.label()}' (a count across optimizer steps) in "
                                 "the Z3 encoding", monomial.span)
        anchor = self.anchor(key, at_atom)
        return monomial.evaluate(
            one=z3.RealVal(1), number=lambda n: z3.RealVal(str(n)), microbatches=_real(self.m),
            size=lambda group: _real(_group_size(group, self.sizes)),
            count=lambda c: self.counts.get(c.kind, c.axes, c.scope is Scope.STEP, anchor,
                                            k),
            loss_scale=self.loss_scale, root=self.root)

    def root(self, group: Group) -> Any:
        """The square root of a group's size: a numeral when the size is a perfect square, else
        a positive real r with r·r = size (one per size; nonlinear real arithmetic decides it
        exactly)."""
        n = _group_size(group, self.sizes)
        if isinstance(n, int) and math.isqrt(n) ** 2 == n:
            return z3.RealVal(math.isqrt(n))
        key = str(n)
        r = self.roots.get(key)
        if r is None:
            r = self.roots[key] = z3.Real(f"{self.counts.prefix}sqrt_{len(self.roots)}")
            self.root_facts += [r * r == _real(n), r > 0]
        return r

    def varying(self, monomial: Monomial) -> frozenset[str]:
        """Batch axes along which a factor evaluated on the holding device varies."""
        out: set[str] = set()
        for term, _ in monomial.factors:
            if term.kind is TermKind.COUNT and term.count is not None:
                family = self.view.batch if term.count.kind is CountKind.TOKENS else self.view.samples
                out.update(a for a in family if a not in term.count.axes)
        return frozenset(out)

    # ---- the domain --------------------------------------------------------------------------

    def zero(self) -> Coeffs:
        zero = z3.RealVal(0)
        return Coeffs({key: zero for key in self.keys})

    def backward(self, buffer: Coeffs, op: Backward, k: MicroBatch) -> Coeffs:
        checkpoint()
        values = dict(buffer.values)
        for key in self.keys:
            if key.k != k:
                continue
            local = all(rel == SAME or axis in self.view.routed
                        for axis, rel in zip(self.axes, key.cls, strict=True))
            if local:
                values[key] = values[key] + self.factor(gathered_loss(op), key, True, k)
        return Coeffs(values, buffer.vary)

    def reduce(self, buffer: Coeffs, op: Collective) -> Coeffs | None:
        """The reduction of a buffer over a group, or None when the group mixes parameters."""
        view = self.view
        plan: list[tuple[str, str]] = []
        for axis in op.group.axes:
            size = self.sizes[axis]
            if axis in view.routed and more_than_one(size):
                return None
            if not ends_match(view, op.group, axis, size):
                return None
            if axis in self.axes:
                plan.append(("coordinate", axis))
            elif axis in view.complete:
                plan.append(("copies", axis))
            elif more_than_one(size):
                return None  # ranks along it hold different parameters; one rank is a no-op
        if op.op is ReduceOp.MAX:
            # over identical copies, or ranks of size-1 axes, the maximum is the value itself
            if any(kind == "coordinate" and more_than_one(self.size(axis)) for kind, axis in plan):
                raise Unmodelled("gradients reduced with max are not a gradient", op.span)
            return buffer
        out = dict(buffer.values)
        divisor: Any = 1
        for kind, axis in plan:
            checkpoint()
            n = self.size(axis)
            divisor = divisor * n
            if kind == "copies":
                out = {key: v if _is_zero(v) else v * _real(n) for key, v in out.items()}
                continue
            if not more_than_one(n):
                continue
            if axis in buffer.vary:
                raise Unmodelled(f"a scale that differs between ranks of {axis} is applied before "
                                 f"a reduction over {axis}", op.span)
            # The rank holding the atom sees it as same-coordinate: in x's frame, where the atom
            # is different-coordinate, that rank's "x" anchors on this axis are the atom's.
            i = self.axes.index(axis)
            new: dict[Key, Any] = {}
            others = _real(n) - 1
            for key in self.keys:
                checkpoint()  # each relabelling traverses its expression, which grows with k
                same = Key((*key.cls[:i], SAME, *key.cls[i + 1:]), key.k)
                diff = Key((*key.cls[:i], DIFF, *key.cls[i + 1:]), key.k)
                if _is_zero(out[same]) and _is_zero(out[diff]):
                    new[key] = out[same]  # micro-batches not yet run, or freed: nothing to carry
                elif key.cls[i] == SAME:
                    new[key] = out[same] + others * self.counts.relabel(out[diff], axis, Label.ATOM,
                                                                        Label.CONSUMER)
                else:
                    new[key] = (self.counts.relabel(out[same], axis, Label.CONSUMER, Label.ATOM)
                                + others * out[diff])
            out = new
        if op.op is ReduceOp.MEAN and not (isinstance(divisor, int) and divisor == 1):
            out = {key: v if _is_zero(v) else v / _real(divisor) for key, v in out.items()}
        return Coeffs(out, buffer.vary)

    def accumulate(self, shard: Coeffs, value: Coeffs) -> Coeffs:
        return Coeffs({key: shard.values[key] if _is_zero(value.values[key])
                       else shard.values[key] + value.values[key] for key in self.keys},
                      shard.vary | value.vary)

    def scale(self, buffer: Coeffs, op: Scale, k: MicroBatch) -> Coeffs:
        checkpoint()
        k_now: KSpec = k if isinstance(k, int) else None
        return Coeffs({key: v if _is_zero(v) else v * self.factor(op.factor, key, False, k_now)
                       for key, v in buffer.values.items()}, buffer.vary | self.varying(op.factor))

    # ---- the reference -----------------------------------------------------------------------

    def reference(self, key: Key) -> Any:
        if idle_at(self.s.step.idle_in(self.view.group), key.k):
            return z3.RealVal(0)  # the group unused in this micro-batch (semantics/participation)
        loss = self.s.loss.kind
        view = self.view
        anchor = self.anchor(key, True)
        if loss is LossKind.TOKEN_MEAN:
            return 1 / self.counts.get(CountKind.TOKENS, view.batch, True, anchor, None)
        if loss is LossKind.SAMPLE_MEAN:
            return 1 / self.counts.get(CountKind.SAMPLES, view.samples, True, anchor, None)
        if loss is LossKind.MICROBATCH_MEAN:
            units = _real(self.m) * _real(product(self.sizes[a] for a in view.samples))
            context = tuple(a for a in view.batch if a not in view.samples)
            return 1 / (units * self.counts.get(CountKind.TOKENS, context, False, anchor, key.k))
        return z3.RealVal(1)


def encode(strategy: Strategy, view: GroupView, sizes: dict[str, Size], m: Size, prefix: str,
           integer: bool) -> Encoded:
    """The coefficients the update consumes, per relation class and micro-batch.

    A loop with collectives is unrolled; past its indexed micro-batches, it is summarised when
    its micro-batches reach a steady state (:func:`_steady`): then only the first ones and the
    last are encoded, and every micro-batch left out is a renaming of the one before the last.
    A strategy with named loss terms is encoded term by term, on each term's projection
    (:mod:`placeverify.semantics.terms`): one coefficient per atom cannot tell the terms apart."""
    if strategy.terms:
        raise Unmodelled("several loss terms in one encoding (each is judged on its own "
                         "projection)", strategy.step.span)
    indices = None
    if isinstance(m, int) and not loop_is_uniform(strategy):
        indices = summary_indices(strategy.step, m)
    if indices is not None:
        snapshots: list[_Snapshot] = []
        encoded = _encode(strategy, view, sizes, m, prefix, integer, indices, snapshots)
        if _steady(snapshots):
            return encoded
    return _encode(strategy, view, sizes, m, prefix, integer, None, None)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The machine at the end of one micro-batch: what does not depend on coefficients, and the
    coefficients of the full buffer and the shard."""

    k: MicroBatch
    flags: tuple[Any, ...]
    full: dict[Key, Any]
    shard: dict[Key, Any] | None


def _snapshot(machine: GradMachine[Coeffs], k: MicroBatch) -> _Snapshot:
    shard = machine.shard
    flags = (machine.sharded, machine.scattered, machine.scatter_group, machine.full.vary,
             None if shard is None else shard.vary, len(machine.mixes), len(machine.clips),
             machine.update is None)
    return _Snapshot(k, flags, dict(machine.full.values),
                     None if shard is None else dict(shard.values))


def _steady(snapshots: list[_Snapshot]) -> bool:
    """Do the last three alike micro-batches before the last one show a steady state?

    Steady: the same flags at the end of each (so the micro-batches after them start alike), and
    the last two leave the coefficients of every earlier micro-batch's atoms untouched (the same
    solver terms). Each micro-batch's atoms evolve apart from the others' (a reduction relabels
    relation classes, never micro-batches), and a statement maps a term and the fresh count
    variables of the running micro-batch to a term without looking at which variables they are;
    so by renaming micro-batches every later one also leaves the earlier atoms untouched, and its
    own atoms end as the renaming of the previous one's. The counts' constraints are symmetric in
    the micro-batches, so a mismatch at a micro-batch left out is one at the one encoded, and the
    constraints stated between the encoded ones are a subset of the full set: an unsatisfiable
    summarised query proves the unrolled one."""
    middle = snapshots[:-1]  # the last snapshot is the last micro-batch
    if len(middle) < 3:
        return False
    a, b, c = middle[-3:]
    if not (a.flags == b.flags == c.flags):
        return False
    return _untouched(a, b) and _untouched(b, c)


def _untouched(before: _Snapshot, after: _Snapshot) -> bool:
    """Every atom of a micro-batch before ``after.k`` has the same terms in both snapshots."""
    for old, new in ((before.full, after.full), (before.shard, after.shard)):
        if (old is None) != (new is None):
            return False
        if old is None or new is None:
            continue
        for key, term in new.items():
            if isinstance(key.k, int) and isinstance(after.k, int) and key.k < after.k:
                checkpoint()
                if not term.eq(old[key]):
                    return False
    return True


def _encode(strategy: Strategy, view: GroupView, sizes: dict[str, Size], m: Size, prefix: str,
            integer: bool, indices: list[int] | None,
            snapshots: list[_Snapshot] | None) -> Encoded:
    equal_samples = not strategy.loss.uneven_samples
    counts = CountVars(view, sizes, m, prefix, integer, equal_samples)
    domain = _Coefficients(strategy, view, sizes, m, counts, indices)
    machine = GradMachine(domain, view.group, domain.live)
    record = None if snapshots is None else (lambda mach, k: snapshots.append(_snapshot(mach, k)))
    machine.run(strategy.step, m if isinstance(m, int) else 1, generic=domain.generic,
                indices=indices, after_microbatch=record)
    reference = {key: domain.reference(key) for key in each(domain.keys)}
    update = machine.update
    if update is None:  # no 'update params': every coefficient consumed is 0 (semantics/skip)
        return Encoded({key: _REAL_ZERO for key in reference}, reference, counts, machine.mixes,
                       None, machine.clips, [domain.loss_scale > 0, *domain.root_facts])
    return Encoded(update.value.values, reference, counts, machine.mixes,
                   update.op.span.line if isinstance(update.op, Update) else None,
                   machine.clips, [domain.loss_scale > 0, *domain.root_facts])


def mismatch_formula(encoded: Encoded, observed: dict[Key, Any] | None = None) -> Any:
    """Satisfiable iff some atom's coefficient in what the update consumed (or ``observed``, what
    a clip saw) differs from its reference weight."""
    values = encoded.consumed if observed is None else observed
    differs = [values[key] != encoded.reference[key] for key in each(values)]
    return z3.And(*encoded.counts.constraints(), *encoded.constraints, z3.Or(*differs))


_REAL_ZERO = z3.RealVal(0)


def _is_zero(term: Any) -> bool:
    """Is ``term`` the real numeral 0? Z3 shares equal terms, so this is one pointer comparison
    (reading the numeral's value instead costs a conversion per call)."""
    return bool(z3.is_expr(term) and term.eq(_REAL_ZERO))


def _group_size(group: Group, sizes: dict[str, Size]) -> Any:
    return group.size_of(sizes)


def _real(value: Any) -> Any:
    """A size or count as a real-valued solver term."""
    if isinstance(value, int):
        return z3.RealVal(value)
    return z3.ToReal(value) if z3.is_int(value) else value
