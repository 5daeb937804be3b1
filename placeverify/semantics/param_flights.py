"""Parameter gathers in flight: an asynchronous all-gather of the updated parameters overlapped
with the next step's forward.

``all_gather(async) params over dp`` after ``update params`` starts gathering the parameters each
rank updated in its optimizer shard (ZeRO-1, Megatron-LM's distributed optimizer with
``overlap_param_gather``: ``start_param_sync`` after the optimizer step, ``finish_param_sync`` in a
module's forward pre-hook). It completes at the first ``wait params`` of
its groups after it, in the same step or, as the step repeats, in the next one: a ``wait params``
before the step's ``backward`` (its forward) completes the gather the step before started. Until
then a rank holds the value it updated itself for the elements it owns, and the value from before
the update for the others (its *stale* shards). What the gather in flight does is defined here,
once:

- a ``backward`` (the micro-batch's forward and backward) run while it is in flight reads the
  parameters with the other ranks' shards stale: the gradient it adds is computed at the wrong
  parameters;
- an ``update params`` while it is in flight (the gather's input rewritten) and a second gather of
  the same parameters started while it is in flight are not modelled (*unknown* at the line, never
  proved); asynchronous gradient collectives in the same step are independent of it (they neither
  read nor write the parameters) and keep their own two outcomes;
- at its ``wait`` the gather has completed on every rank.

As with :mod:`placeverify.semantics.asynchrony`, the step has two extreme outcomes: the gather
completed where it starts (:func:`placeverify.semantics.asynchrony.synchronous`, the ZeRO-1 step
every family already judges), and completed only at its wait (:func:`stale_reads`: the forwards
between the two read stale shards). A forward reads the whole parameter vector, so a forward in
flight is wrong as soon as one element it reads is stale; the mixed outcomes (some ranks or
buckets late) lie between the two, and proved, where no forward is in flight, covers them all.
The first step of a run reads the initial parameters, identical everywhere; a gather that wraps
around is judged on every later step.

The domains: the exact one (:func:`simulate`, every rank's copy of every shard over two steps in
rationals), Z3 (:mod:`placeverify.verify.checks.param_flights`, the update an uninterpreted
function), the agreement one (:func:`identical_along`, the axes along which the parameters a
forward reads are the same on every rank) and the torch replay
(:mod:`placeverify.replay.step`, which defers the real gather to its wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.ir.flights import (
    MAX_UNROLLED,
    entries,
    groups_of,
    starts_param_flight,
)
from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Backward, Collective, Op, Step, TargetKind, Update, Wait
from placeverify.semantics.schedule import Unmodelled

__all__ = ["ParamFlight", "has_param_flights", "identical_along", "param_flights",
           "simulate", "stale_reads"]


@dataclass(frozen=True, slots=True)
class ParamFlight:
    """One asynchronous parameter gather, the wait that completes it, and the forwards in flight
    (the micro-batch of each ``backward`` that runs before the wait, in the step that follows
    when the wait is in it)."""

    start: Collective
    wait: Wait
    wraps: bool  # completed in the next step (the wait stands before the gather)
    reads: tuple[tuple[Backward, int], ...]

    @property
    def groups(self) -> frozenset[ParamGroup]:
        return groups_of(self.start.target)


def has_param_flights(step: Step) -> bool:
    return any(starts_param_flight(op) for op in step.ops())


def param_flights(step: Step) -> list[ParamFlight]:
    """Every asynchronous parameter gather of the step with its wait and the forwards in flight.
    Raises :class:`Unmodelled` for the combinations the module docstring lists."""
    if not has_param_flights(step):
        return []
    if step.microbatches > MAX_UNROLLED:
        first = next(op for op in step.ops() if starts_param_flight(op))
        raise Unmodelled(f"an asynchronous parameter gather in a step of more than "
                         f"{MAX_UNROLLED} micro-batches", first.span)
    order = list(entries(step, unroll=True))
    out: list[ParamFlight] = []
    for i, e in enumerate(order):
        if not starts_param_flight(e.item):
            continue
        start = e.item
        assert isinstance(start, Collective)
        groups = groups_of(start.target)
        after = order[i + 1:]
        cycle = [(False, x) for x in after] + [(True, x) for x in order[:i + 1]]
        reads: list[tuple[Backward, int]] = []
        wait: Wait | None = None
        wraps = False
        for wrapped, x in cycle:
            item = x.item
            if isinstance(item, Wait) and item.target.kind is TargetKind.PARAMS and \
                    groups & groups_of(item.target):
                if not groups <= groups_of(item.target):
                    raise Unmodelled(f"'wait {item.target.label()}' completes part of "
                                     f"'{start.label()}' (line {start.span.line})", item.span)
                wait, wraps = item, wrapped
                break
            if isinstance(item, Wait):
                continue
            _in_flight(item, start, groups)
            if isinstance(item, Backward):
                reads.append((item, x.k if x.k is not None else 0))
        assert wait is not None, "lowering rejects a parameter gather never waited"
        out.append(ParamFlight(start, wait, wraps, tuple(reads)))
    return out


def _in_flight(op: Op, start: Collective, groups: frozenset[ParamGroup]) -> None:
    """Refuse what the construct does not model while ``start`` is in flight."""
    if isinstance(op, Update):
        raise Unmodelled(f"'update params' while '{start.label()}' (line {start.span.line}) is "
                         "in flight (the gather's input rewritten before it completed)", op.span)
    if op is start or (starts_param_flight(op) and isinstance(op, Collective)
                       and groups & groups_of(op.target)):
        raise Unmodelled(f"'{start.label()}' starts again before its wait (a second gather of "
                         "the same parameters in flight)", op.span if op is not start else
                         start.span)


def stale_reads(step: Step) -> list[tuple[ParamFlight, Backward, int]]:
    """The forwards that read stale shards in the late outcome: (flight, backward, micro-batch)."""
    return [(f, op, k) for f in param_flights(step) for op, k in f.reads]


def identical_along(flight: ParamFlight, axes: tuple[str, ...], live: dict[str, bool],
                    k: int | None) -> frozenset[str]:
    """The agreement domain: the axes along which every rank reads the same parameters in the
    forward of micro-batch ``k`` of the step after ``flight`` started (``k`` None: a forward after
    its wait). In flight, ranks along an axis the gather spans (with more than one rank) each hold
    their own shard fresh and the others' stale, so they read different parameters."""
    reading = k is not None and any(kk == k for _, kk in flight.reads)
    spanned = {a for a in flight.start.group.axes if live.get(a, False)}
    return frozenset(a for a in axes if not (reading and a in spanned))


# ---- the exact domain ------------------------------------------------------------------------------

LEARNING_RATE = Fraction(1, 2)  # the exact domain's update: theta - lr * g (any lr != 0 shows it)


@dataclass(frozen=True, slots=True)
class Read:
    """What one rank's forward reads, element by element (one element per shard owner)."""

    rank: int
    microbatch: int
    values: tuple[Fraction, ...]


@dataclass(frozen=True, slots=True)
class Simulation:
    initial: tuple[Fraction, ...]
    gradient: tuple[Fraction, ...]
    reference: tuple[Fraction, ...]  # what every forward of step 2 reads on one device
    reads: tuple[Read, ...]  # every rank's forwards of step 2

    def mismatches(self) -> list[Read]:
        return [r for r in self.reads if r.values != self.reference]


def simulate(flight: ParamFlight, ranks: int, microbatches: int) -> Simulation:
    """Two steps of ZeRO-1 along one axis of ``ranks`` ranks, exactly: element e (the shard rank e
    owns) starts at ``1 + e`` and its gradient is ``1 / (e + 2)``; step 1's update changes it on
    its owner only (``theta - lr * g``), the gather copies every owner's value to every rank where
    it completes. Step 2's forwards read, on each rank, the element it owns updated and the others
    updated where the gather has completed before them (always in the synchronous outcome; in the
    late one, only after the wait) and stale otherwise."""
    initial = tuple(Fraction(1 + e) for e in range(ranks))
    gradient = tuple(Fraction(1, e + 2) for e in range(ranks))
    updated = tuple(t - LEARNING_RATE * g for t, g in zip(initial, gradient, strict=True))
    stale_at = {k for _, k in flight.reads}
    reads: list[Read] = []
    for r in range(ranks):
        for k in range(microbatches):
            values = tuple(updated[e] if e == r or k not in stale_at else initial[e]
                           for e in range(ranks))
            reads.append(Read(r, k, values))
    return Simulation(initial, gradient, updated, tuple(reads))
