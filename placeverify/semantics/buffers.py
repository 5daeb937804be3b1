"""What each statement does to one parameter group's gradient buffers: the rules, written once.

A device holds a *full* gradient buffer and, after a ``reduce_scatter``, a *shard*. ``grads``
denotes the full buffer until a reduce-scatter runs, and the shard from then until the next
``backward`` (or an ``all_gather`` of it):

- ``backward L`` adds the micro-batch's local gradient (weighted by L) into the full buffer and
  makes ``grads`` denote it again (``backward t: L`` of a loss term that does not reach the group
  adds nothing, :mod:`placeverify.semantics.terms`);
- ``all_reduce(op) grads over G`` replaces the denoted buffer by its reduction over G; on a shard,
  a group that crosses an axis the shard was scattered over sums different elements (*mixes*);
- ``reduce_scatter(op[, accumulate]) grads over G`` reduces the full buffer and keeps this
  device's part as the shard (assigned, or added to the previous shard of the same layout);
- ``all_gather grads`` makes the gathered shards the full buffer again;
- ``scale grads by f`` multiplies the denoted buffer, ``free grads`` zeroes the full buffer,
  ``zero grads`` the full buffer and the shard (the optimizer's zero_grad);
- ``clip`` and ``update`` read the denoted buffer: the machine records what each one saw (its
  value, whether it was a shard and over which axes, whether the update had already run), and the
  obligations judge it;
- token and overflow reductions, overflow broadcasts, parameter gathers and activation send/recv
  leave the gradient as it is (counts in a loss are all-reduced by definition; the overflow flag
  and the gathers are judged from their recorded positions, the skip they decide as
  :mod:`placeverify.semantics.skip` says);
- a step without ``update`` consumes nothing (:mod:`placeverify.semantics.skip`);
- an asynchronous collective (``async``, completed at a ``wait``) is judged on the two synchronous
  steps :mod:`placeverify.semantics.asynchrony` reduces it to; one that reaches the machine as it
  is raises :class:`Unmodelled`. An asynchronous parameter gather leaves the gradient as it is, as
  a synchronous one does (the forwards it overlaps: :mod:`placeverify.semantics.param_flights`).

A :class:`GradDomain` gives the arithmetic: exact rationals per device
(:mod:`placeverify.semantics.interpreter`), Z3 terms per relation class
(:mod:`placeverify.verify.z3.integrity`), sets of axes along which the buffer is identical
(:mod:`placeverify.verify.agreement`). A statement outside the table raises :class:`Unmodelled`:
no backend ever skips a statement silently.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Free,
    Op,
    Scale,
    Step,
    TargetKind,
    Update,
)
from placeverify.semantics.empty import check_backward
from placeverify.semantics.participation import idle_at, skips
from placeverify.semantics.schedule import MicroBatch, Phase, Unmodelled, events, last_indexed

V = TypeVar("V")


class GradDomain(Protocol[V]):
    """The arithmetic of one backend: what a buffer is and how it adds, reduces and scales."""

    def zero(self) -> V: ...

    def backward(self, buffer: V, op: Backward, k: MicroBatch) -> V:
        """``buffer`` plus the micro-batch's local gradients under the loss ``op.loss``."""
        ...

    def reduce(self, buffer: V, op: Collective) -> V | None:
        """The buffer reduced over ``op.group``; None when the group sums different parameters."""
        ...

    def accumulate(self, shard: V, value: V) -> V: ...

    def scale(self, buffer: V, op: Scale, k: MicroBatch) -> V: ...


@dataclass(frozen=True, slots=True)
class Seen(Generic[V]):
    """What a statement that reads the gradient (``clip``, ``update``) saw where it stands."""

    op: Op
    k: MicroBatch
    phase: Phase
    value: V
    sharded: bool
    scattered: frozenset[str]  # axes the shard was reduce-scattered over (ranks > 1)
    after_update: bool
    after_last_backward: bool


@dataclass(frozen=True, slots=True)
class Position:
    """Where a statement that does not touch the gradient ran (overflow flag, parameter gather)."""

    op: Collective
    k: MicroBatch
    phase: Phase
    after_update: bool
    after_last_backward: bool


# (collective, target) pairs, and what they do to a parameter group's gradient
GRADIENT_COLLECTIVES = {
    (CollectiveKind.ALL_REDUCE, TargetKind.GRADS): "reduce",
    (CollectiveKind.REDUCE_SCATTER, TargetKind.GRADS): "scatter",
    (CollectiveKind.ALL_GATHER, TargetKind.GRADS): "gather",
}
POSITIONAL_COLLECTIVES = {
    (CollectiveKind.ALL_REDUCE, TargetKind.OVERFLOW),
    (CollectiveKind.BROADCAST, TargetKind.OVERFLOW),  # the skip decision: semantics/skip.py
    (CollectiveKind.ALL_GATHER, TargetKind.PARAMS),
    (CollectiveKind.BROADCAST, TargetKind.PARAMS),
}
NEUTRAL_COLLECTIVES = {
    (CollectiveKind.ALL_REDUCE, TargetKind.TOKENS),  # counts in a loss are all-reduced anyway
    (CollectiveKind.ALL_TO_ALL, TargetKind.TOKENS),  # part of the experts' forward and backward
    (CollectiveKind.SEND, TargetKind.ACTIVATIONS),  # part of the pipeline's forward and backward
    (CollectiveKind.RECV, TargetKind.ACTIVATIONS),
}
MODELLED_COLLECTIVES = frozenset(GRADIENT_COLLECTIVES) | POSITIONAL_COLLECTIVES | NEUTRAL_COLLECTIVES


@dataclass
class GradMachine(Generic[V]):
    """One parameter group's buffers on every device, driven statement by statement."""

    domain: GradDomain[V]
    group: ParamGroup
    live: Callable[[str], bool]  # does this axis have more than one rank?
    observe: Callable[[GradMachine[V], Op, MicroBatch], None] | None = None
    # a domain of values (exact numbers, solver terms) has no value for 0/0 (semantics/empty);
    # one of which ranks hold the same value (agreement, placement) takes NaN as any other
    judges_values: bool = True
    full: V = field(init=False)
    shard: V | None = None
    sharded: bool = False
    scattered: frozenset[str] = frozenset()
    scatter_group: tuple[str, ...] | None = None
    mixes: list[Op] = field(default_factory=list)
    update: Seen[V] | None = None
    clips: list[Seen[V]] = field(default_factory=list)
    positions: list[Position] = field(default_factory=list)
    phase: Phase = Phase.PRE  # the phase of the statement running now
    scatter_op: Collective | None = None  # the reduce-scatter that left the current shard
    _backwards_left: int = 0
    _idle: frozenset[int] = frozenset()  # micro-batches no rank uses the group in (participation)
    _empty: frozenset[int] = frozenset()  # micro-batches holding no tokens (semantics/empty)
    # a reduce-scatter that mixed and whose shard nothing has read yet (dead_mix), and the mixes
    # something read: a fresh reduce-scatter that overwrites the shard first leaves no trace
    _pending_mix: Op | None = None
    _read_mixes: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.full = self.domain.zero()

    # ---- the denoted buffer ----------------------------------------------------------------

    def denoted(self) -> V:
        if self.sharded:
            assert self.shard is not None
            return self.shard
        return self.full

    def set_denoted(self, value: V) -> None:
        if self.sharded:
            self.shard = value
        else:
            self.full = value

    # ---- driving -----------------------------------------------------------------------------

    def run(self, step: Step, microbatches: int, *, generic: bool = False,
            fixpoint: Callable[[GradMachine[V]], Hashable] | None = None,
            indices: Sequence[int] | None = None,
            after_microbatch: Callable[[GradMachine[V], MicroBatch], None] | None = None
            ) -> GradMachine[V]:
        """Run the whole step. With ``fixpoint`` (a key of the machine's state), the loop stops
        once a micro-batch past every indexed one leaves the key unchanged: the same body then
        maps the state to itself, so later micro-batches change nothing the key describes.
        With ``indices`` only those micro-batches run (:func:`events`); ``after_microbatch`` is
        called at the end of each one that runs."""
        schedule = list(events(step, microbatches, generic=generic, indices=indices))
        self._idle = step.idle_in(self.group)
        self._empty = step.empty
        self._backwards_left = sum(isinstance(e.op, Backward) for e in schedule)
        indexed = last_indexed(step)
        previous: Hashable | None = None
        converged = False
        for i, event in enumerate(schedule):
            if converged and event.phase is Phase.LOOP:
                continue
            self.phase = event.phase
            self.apply(event.op, event.k)
            if event.phase is not Phase.LOOP:
                continue
            after = schedule[i + 1] if i + 1 < len(schedule) else None
            if after is not None and after.phase is Phase.LOOP and after.k == event.k:
                continue  # the micro-batch is not over
            if after_microbatch is not None:
                after_microbatch(self, event.k)
            if fixpoint is None:
                continue
            key = fixpoint(self)
            if isinstance(event.k, int) and event.k > indexed and key == previous:
                converged = True
                self._backwards_left = 0
            previous = key
        return self

    def apply(self, op: Op, k: MicroBatch) -> None:
        if self._pending_mix is not None:
            self._settle_mix(op)
        if isinstance(op, Backward):
            self._backward(op, k)
        elif isinstance(op, Collective):
            self._collective(op, k)
        elif isinstance(op, Scale):
            if op.target.applies_to(self.group):
                self.set_denoted(self.domain.scale(self.denoted(), op, k))
        elif isinstance(op, Free):
            if op.target.applies_to(self.group):
                self.full = self.domain.zero()
                if op.zero and self.shard is not None:  # zero grads: the shard too
                    self.shard = self.domain.zero()
        elif isinstance(op, Clip):
            if op.target.applies_to(self.group):
                self.clips.append(self._seen(op, k))
        elif isinstance(op, Update):
            if self.update is not None:
                raise Unmodelled("a second 'update' in one step", op.span)
            self.update = self._seen(op, k)
        else:
            raise Unmodelled(f"the statement {type(op).__name__} is not modelled",
                             getattr(op, "span", None))
        if self.observe is not None:
            self.observe(self, op, k)

    def _seen(self, op: Op, k: MicroBatch) -> Seen[V]:
        return Seen(op, k, self.phase, self.denoted(), self.sharded, self.scattered,
                    self.update is not None, self._backwards_left == 0)

    # ---- the rules -------------------------------------------------------------------------

    def _backward(self, op: Backward, k: MicroBatch) -> None:
        self._backwards_left -= 1
        self.sharded = False
        if self.judges_values:  # 0/0 in a micro-batch without tokens (semantics/empty)
            check_backward(op, k, self._empty)
        if op.adds_to(self.group) and not idle_at(self._idle, k):
            # a loss term that does not reach the group adds nothing, nor does a micro-batch that
            # leaves the group unused on every rank (placeverify.semantics.participation)
            self.full = self.domain.backward(self.full, op, k)

    def _collective(self, op: Collective, k: MicroBatch) -> None:
        if op.asynchronous and op.target.kind is not TargetKind.PARAMS:
            # judged on its outcomes (placeverify.semantics.asynchrony), never here; a parameter
            # gather leaves the gradient as it is wherever it completes (the forwards it overlaps
            # are placeverify.semantics.param_flights')
            raise Unmodelled(f"'{op.label()}' outside its outcomes", op.span)
        pair = (op.kind, op.target.kind)
        if pair in NEUTRAL_COLLECTIVES:
            return
        if pair in POSITIONAL_COLLECTIVES:
            if op.target.applies_to(self.group):
                self.positions.append(Position(op, k, self.phase, self.update is not None,
                                               self._backwards_left == 0))
            return
        rule = GRADIENT_COLLECTIVES.get(pair)
        if rule is None:
            raise Unmodelled(f"'{op.label()}' is not modelled", op.span)
        if not op.target.applies_to(self.group):
            return
        if skips(op, self._idle, k):
            return  # 'only = used': no rank of the group used it in this micro-batch
        if rule == "gather":
            if self.sharded:
                assert self.shard is not None
                self.full, self.sharded, self.scattered = self.shard, False, frozenset()
                self.scatter_op = None
            return
        axes = frozenset(a for a in op.group.axes if self.live(a))
        if rule == "reduce":
            if self.sharded and axes & self.scattered:
                self._mix(op)  # ranks of a scattered axis hold different elements
                return
            result = self.domain.reduce(self.denoted(), op)
            if result is None:
                self._mix(op)
                return
            self.set_denoted(result)
            return
        result = self.domain.reduce(self.full, op)
        if result is None:
            self._mix(op)
            self._pending_mix = op
            return
        layout = tuple(sorted(axes))
        if op.accumulate and self.shard is not None:
            if self.scatter_group is not None and layout != self.scatter_group:
                raise Unmodelled(f"'{op.label()}' accumulates into a shard laid out over another "
                                 "group", op.span)
            result = self.domain.accumulate(self.shard, result)
        self.shard, self.sharded, self.scattered, self.scatter_group = result, True, axes, layout
        self.scatter_op = op

    def _settle_mix(self, op: Op) -> None:
        """A reduce-scatter that mixed different parameters' gradients leaves a shard of sums of
        different elements; it counts as a mix once a statement of this group runs on the
        gradients (reads or extends that shard). Overwritten first by a reduce-scatter of the full
        buffer (not accumulating), the mixed shard is never read: the collective wastes bytes and
        changes no value (composition safety judges its group; found by the soundness harness:
        the experts' gradients reduce-scattered over dp * ep with the dense groups, then over dp
        on their own, were refuted here while the replay, reading the second shard, matched)."""
        pending = self._pending_mix
        assert pending is not None
        if isinstance(op, Collective):
            if not op.target.applies_to(self.group) or op.target.kind is not TargetKind.GRADS:
                return  # another group's or another kind's: the shard stays unread
            if GRADIENT_COLLECTIVES.get((op.kind, op.target.kind)) == "scatter" \
                    and not op.accumulate:
                self._pending_mix = None
                if id(pending) not in self._read_mixes and pending in self.mixes:
                    self.mixes.remove(pending)
                return
        elif not self._touches(op):
            return
        self._pending_mix = None
        self._read_mixes.add(id(pending))

    def _touches(self, op: Op) -> bool:
        """Does a statement other than a collective run on this group's gradients?"""
        if isinstance(op, Scale | Free | Clip):
            return op.target.applies_to(self.group)
        if isinstance(op, Backward):
            return op.adds_to(self.group)
        return True

    def _mix(self, op: Op) -> None:
        if op not in self.mixes:
            self.mixes.append(op)
