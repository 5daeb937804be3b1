"""Asynchronous collectives: started at one statement, completed at a later ``wait``.

``all_reduce(sum, async) grads over dp`` starts a reduction of the gradient buffer that completes
at the next ``wait grads`` (gradient reduction overlapped with backward: Megatron-LM's
``overlap_grad_reduce`` with ``start_grad_sync`` / ``finish_grad_sync``, DeepSpeed's
``overlap_comm``, a DDP bucket's ``async_op=True`` handle). Between the two the collective is *in
flight*, and the rules of :mod:`placeverify.semantics.buffers` are extended once, here:

- the collective takes its input where it starts;
- a statement that reads the buffer in flight (``clip``, ``update``) sees, on each rank and for
  each element, either the value before the collective or the value after it;
- a statement that writes the buffer in flight (``backward`` of a later micro-batch, ``scale``,
  a synchronous reduction of the same gradients) races with the collective: on each rank and
  element its effect either lands after the collective completed, or is overwritten by the
  collective's result, computed from the input the collective took where it started (an in-place
  collective that read its input early);
- at the ``wait`` the collective has completed on every rank.

So each rank and element has two extreme outcomes per flight: the *synchronous* one (the
collective completed where it starts: :func:`synchronous`) and the *late* one (it completed at its
wait, reads in flight saw the value before it, writes in flight were lost: :func:`late`). Both are
ordinary synchronous steps, and every backend judges both, so the construct holds in the exact,
Z3, agreement and torch domains without a rule of their own. The verdict of an obligation is the
worst over the two (:mod:`placeverify.verify`): refuted when either outcome diverges (each is an
allowed outcome), proved only when both are proved. Proved covers the mixed outcomes too (some
ranks or elements synchronous, others late). Sketch: a read in flight is judged on the rank that
reads, whose value depends on its own choice only. A write in flight changes the consumed gradient
by a term per rank, and every later statement is linear with nonnegative weights (loss factors,
scales and sizes are positive; reductions sum or average), so the all-late outcome differs from
the all-synchronous one by the sum of those terms, each of one sign pattern (a backward's term is
made of that rank's own gradients, a scale's or a reduction's weighs one shared value by a
nonnegative weight): when both extremes are right for every gradient value the sum vanishes, so
each term does, and any mix is right as well. A ``max`` reduction is not linear: ``async`` with
``max`` is not modelled. The torch replay realises the late outcome, deterministically, as a
stream that never synchronised with the collective would.

Not modelled (the verdict is *unknown* at the line, never proved): a second asynchronous
collective on a buffer already in flight, a ``free`` of the buffer in flight, a read in flight
after a write in the same flight (what the read sees then depends on the order inside the
race), a flight that spans more than :data:`MAX_UNROLLED` micro-batches. A collective never
waited before the step ends, and a ``wait`` with nothing in flight before it, are errors in the
file (:func:`flight_errors`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from placeverify.diagnostics import Span
from placeverify.ir.flights import (
    ALL_GROUPS,
    MAX_UNROLLED,
    entries,
    flight_errors,
    groups_of,
    has_async,
    starts_flight,
    starts_param_flight,
    touches_loop,
)
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import op_label
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    Free,
    LoopOp,
    Op,
    ReduceOp,
    Scale,
    Step,
    TargetKind,
    Update,
    Wait,
)
from placeverify.ir.strategy import Strategy
from placeverify.semantics.param_flights import has_param_flights, param_flights
from placeverify.semantics.schedule import Unmodelled

__all__ = ["MAX_UNROLLED", "World", "entries", "flight_errors", "has_async", "late",
           "late_outcome", "replayed", "synchronous", "worlds"]

def synchronous(step: Step) -> Step:
    """The outcome where every asynchronous collective completed where it starts."""
    def plain(op: Op) -> Op:
        return replace(op, asynchronous=False) if isinstance(op, Collective) else op

    return replace(step, pre=tuple(map(plain, step.pre)), post=tuple(map(plain, step.post)),
                   loop=tuple(LoopOp(plain(lo.op), lo.microbatch) for lo in step.loop), waits=())


@dataclass
class _Flight:
    op: Collective
    groups: frozenset[ParamGroup]
    wrote: Op | None = None  # the first write in flight


def late(step: Step) -> Step:
    return late_outcome(step)[0]


def late_outcome(step: Step, *, keep_params: bool = False) -> tuple[Step, list[Collective]]:
    """The outcome where every asynchronous collective completed at its wait: reads in flight see
    the buffer without it, writes in flight are overwritten by its result (they reach no group the
    collective reduces), and the collective itself runs where it is waited.

    Also returns the collectives whose flight lost a write (the statements a wrong consumed
    gradient is blamed on). Raises :class:`Unmodelled` for the combinations the module docstring
    lists. With ``keep_params`` the parameter gathers stay asynchronous and their waits stay in
    place (the step the replay runs, :func:`replayed`); otherwise they complete where they start
    (what the families judge: the forwards they overlap are param_flights')."""
    param_flights(step)  # raises Unmodelled for what a parameter gather in flight does not model
    unroll = touches_loop(step)
    if unroll and step.microbatches > MAX_UNROLLED:
        first = next(op for op in step.ops() if starts_flight(op))
        raise Unmodelled(f"an asynchronous collective through a loop of more than {MAX_UNROLLED} "
                         "micro-batches", first.span)
    out: list[tuple[str, int | None, Op | Wait]] = []
    flying: list[_Flight] = []
    blamed: list[Collective] = []
    for e in entries(step, unroll=unroll):
        item = e.item
        if isinstance(item, Wait) and item.target.kind is not TargetKind.GRADS:
            if keep_params:  # a parameter wait: its forwards in flight are param_flights'
                out.append((e.phase, e.k, item))
            continue
        if starts_param_flight(item):
            # the families judge the parameters after the step, once the gather has completed;
            # the forwards it overlaps are judged by verify/checks/param_flights.py
            assert isinstance(item, Collective)
            out.append((e.phase, e.k, item if keep_params else replace(item, asynchronous=False)))
            continue
        if isinstance(item, Wait):
            done = [f for f in flying if f.groups & groups_of(item.target)]
            for f in done:
                if not f.groups <= groups_of(item.target):
                    raise Unmodelled(f"'wait {item.target.label()}' completes part of "
                                     f"'{f.op.label()}' (line {f.op.span.line})", item.span)
                out.append((e.phase, e.k, replace(f.op, asynchronous=False)))
            flying = [f for f in flying if f not in done]
            continue
        hit = [f for f in flying if _overlaps(item, f.groups)]
        if starts_flight(item):
            assert isinstance(item, Collective)
            flying.append(_started(item, hit))
            continue
        landed = _beside_flights(item, hit, blamed) if hit else item
        if landed is not None:
            out.append((e.phase, e.k, landed))
    return _rebuilt(step, out), blamed


def _started(item: Collective, hit: list[_Flight]) -> _Flight:
    """The flight an asynchronous collective starts (``hit``: the flights on its gradients)."""
    if item.op is ReduceOp.MAX:
        raise Unmodelled(f"'{item.label()}': an asynchronous maximum (not linear in the "
                         "gradients, so the two extreme outcomes do not bound the mixed "
                         "ones)", item.span)
    if hit:
        raise Unmodelled(f"'{item.label()}' starts while '{hit[0].op.label()}' (line "
                         f"{hit[0].op.span.line}) is in flight on the same gradients",
                         item.span)
    return _Flight(item, groups_of(item.target))


def _beside_flights(item: Op, hit: list[_Flight], blamed: list[Collective]) -> Op | None:
    """``item`` in the late outcome of the flights ``hit`` on its gradients: a read sees the
    buffer without them, a write reaches no group they reduce (None: it reaches none); each
    flight that loses a write is added to ``blamed``."""
    lost = frozenset().union(*(f.groups for f in hit))
    if isinstance(item, Clip | Update):
        for f in hit:
            if f.wrote is not None:
                raise Unmodelled(f"'{_label(item)}' reads gradients in flight after "
                                 f"'{_label(f.wrote)}' wrote them in the same flight (line "
                                 f"{f.op.span.line})", item.span)
        return item
    for f in hit:
        if isinstance(item, Backward | Scale | Collective) and f.op not in blamed:
            blamed.append(f.op)
    if isinstance(item, Backward):
        for f in hit:
            f.wrote = f.wrote or item
        reaches = (ALL_GROUPS if item.reaches is None else item.reaches) - lost
        return replace(item, reaches=reaches)
    if isinstance(item, Scale | Collective) and item.target.kind is TargetKind.GRADS:
        # a scale, or a synchronous reduction of the same gradients (it reads them as they
        # were and writes its result): overwritten by the flight's result
        for f in hit:
            f.wrote = f.wrote or item
        kept = groups_of(item.target) - lost
        return replace(item, target=replace(item.target, groups=kept)) if kept else None
    raise Unmodelled(f"'{_label(item)}' while '{hit[0].op.label()}' (line "
                     f"{hit[0].op.span.line}) is in flight on the same gradients",
                     getattr(item, "span", None))


def _rebuilt(step: Step, out: list[tuple[str, int | None, Op | Wait]]) -> Step:
    """``step`` with the operations ``out`` lists (phase, micro-batch, operation), in order; a
    loop entry's micro-batch is its filter (None: every micro-batch). Never found by identity in
    the written loop: a step already unrolled (:func:`replayed`) holds one statement under
    several filters."""
    blocks: dict[str, list[Op | LoopOp]] = {"pre": [], "loop": [], "post": []}
    waits: list[Wait] = []  # the parameter waits kept, where they now stand
    for phase, k, op in out:
        if isinstance(op, Wait):
            waits.append(replace(op, phase=phase, index=len(blocks[phase]),
                                 microbatch=k if phase == "loop" else None))
        elif phase == "loop":
            blocks[phase].append(LoopOp(op, k))
        else:
            blocks[phase].append(op)
    pre = tuple(op for op in blocks["pre"] if not isinstance(op, LoopOp))
    post = tuple(op for op in blocks["post"] if not isinstance(op, LoopOp))
    loop = tuple(lo for lo in blocks["loop"] if isinstance(lo, LoopOp))
    return replace(step, pre=pre, loop=loop, post=post, waits=tuple(waits))


def _overlaps(op: Op, groups: frozenset[ParamGroup]) -> bool:
    """Does ``op`` read or write gradients of ``groups``?"""
    if isinstance(op, Backward):
        return bool((ALL_GROUPS if op.reaches is None else op.reaches) & groups)
    if isinstance(op, Update):
        return True
    if isinstance(op, Clip):
        return any(op.target.applies_to(g) or op.measures(g) for g in groups)
    if isinstance(op, Scale | Free):
        return bool(groups_of(op.target) & groups)
    if isinstance(op, Collective):
        return op.target.kind is TargetKind.GRADS and bool(groups_of(op.target) & groups)
    return False


def _label(op: Op) -> str:
    return op_label(op)


@dataclass(frozen=True, slots=True)
class World:
    name: str  # "synchronous" or "late"
    strategy: Strategy
    note: str  # how the outcome reads in a reason
    blamed: Collective | None = None  # a collective whose flight lost a write
    started: Collective | None = None  # the first asynchronous collective
    waited: Span | None = None  # the wait that completes it


def worlds(strategy: Strategy) -> list[World] | None:
    """The two extreme outcomes of a step with asynchronous collectives (None without them)."""
    step = strategy.step
    if not has_async(step):
        return None
    waits = ", ".join(f"line {w.span.line}" for w in step.waits)
    outcome, blamed = late_outcome(step)
    return [World("synchronous", replace(strategy, step=synchronous(step)),
                  "with every asynchronous collective completed where it starts"),
            World("late", replace(strategy, step=outcome),
                  f"with every asynchronous collective completed only at its wait ({waits}): "
                  "reads in flight see the gradients before it, writes in flight are lost",
                  blamed[0] if blamed else None, *_first_flight(step))]


def _first_flight(step: Step) -> tuple[Collective | None, Span | None]:
    """The first asynchronous collective of the gradients and the wait that completes it."""
    start: Collective | None = None
    for e in entries(step, unroll=False):
        if start is None and starts_flight(e.item):
            assert isinstance(e.item, Collective)
            start = e.item
        elif start is not None and isinstance(e.item, Wait) and \
                groups_of(start.target) & groups_of(e.item.target):
            return start, e.item.span
    return start, None


def replayed(strategy: Strategy) -> Strategy:
    """The strategy the torch replay runs: the late outcome, which a stream that never waited on
    the collective realises (the synchronous one is the step without ``async``)."""
    if not has_async(strategy.step):
        return strategy
    if has_param_flights(strategy.step):
        # the replay runs the gather itself where its wait completes it (replay/step.py)
        param_flights(strategy.step)  # raises Unmodelled for what is not modelled
        if not any(starts_flight(op) for op in strategy.step.ops()):
            return strategy
        return replace(strategy, step=late_outcome(strategy.step, keep_params=True)[0])
    return replace(strategy, step=late(strategy.step))
