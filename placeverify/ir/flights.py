"""Where a step's asynchronous collectives start and complete: the step in execution order with
its ``wait`` statements in place, and the errors a file can make with them (a collective never
waited, a wait with nothing in flight). What a flight does to the buffers is
:mod:`placeverify.semantics.asynchrony`'s."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from placeverify.diagnostics import Code, Span
from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Collective, Op, Step, Target, TargetKind, Wait

MAX_UNROLLED = 64  # micro-batches a flight through the loop is unrolled over, at most

ALL_GROUPS = frozenset(ParamGroup)


@dataclass(frozen=True, slots=True)
class Entry:
    """One statement (or ``wait``) of the step in execution order."""

    phase: str  # "pre", "loop", "post"
    k: int | None  # the micro-batch of a loop entry
    item: Op | Wait


def has_async(step: Step) -> bool:
    return bool(step.waits) or any(isinstance(op, Collective) and op.asynchronous
                                   for op in step.ops())


def groups_of(target: Target) -> frozenset[ParamGroup]:
    return ALL_GROUPS if target.groups is None else target.groups


def starts_flight(op: Op | Wait) -> bool:
    """An asynchronous collective of the gradients."""
    return isinstance(op, Collective) and op.asynchronous and op.target.kind is TargetKind.GRADS


def starts_param_flight(op: Op | Wait) -> bool:
    """An asynchronous gather of the parameters (completed at a later ``wait params``, in this
    step or the next one: :mod:`placeverify.semantics.param_flights`)."""
    return isinstance(op, Collective) and op.asynchronous and op.target.kind is TargetKind.PARAMS


def waits_on(w: Wait, kind: TargetKind) -> bool:
    return w.target.kind is kind


def touches_loop(step: Step) -> bool:
    """Does a flight of the gradients start or complete in the loop? (A parameter wait there is
    placed without unrolling it.)"""
    return any(w.phase == "loop" and w.target.kind is TargetKind.GRADS for w in step.waits) or \
        any(starts_flight(lo.op) for lo in step.loop)


def entries(step: Step, *, unroll: bool) -> Iterator[Entry]:
    """The step in execution order with its waits in place; the loop once per micro-batch
    (``unroll``) or once for every micro-batch alike (an entry's ``k`` is then its statement's
    micro-batch filter, None for every micro-batch)."""
    def block(phase: str, ops: tuple[Op, ...]) -> Iterator[Entry]:
        for index in range(len(ops) + 1):
            for w in step.waits:
                if w.phase == phase and w.index == index:
                    yield Entry(phase, None, w)
            if index < len(ops):
                yield Entry(phase, None, ops[index])

    yield from block("pre", step.pre)
    for k in range(step.microbatches) if unroll else [None]:
        for index in range(len(step.loop) + 1):
            for w in step.waits:
                if w.phase == "loop" and w.index == index and (
                        k is None or w.microbatch in (None, k)):
                    yield Entry("loop", k if w.microbatch is None else w.microbatch, w)
            if index < len(step.loop):
                lo = step.loop[index]
                if k is None or lo.microbatch in (None, k):
                    yield Entry("loop", k if lo.microbatch is None else lo.microbatch, lo.op)
    yield from block("post", step.post)


def flight_errors(step: Step) -> list[tuple[str, Code, Span]]:
    """Errors in the file: an asynchronous collective never waited before the step ends, a wait
    with nothing in flight before it."""
    if not has_async(step):
        return []
    out: list[tuple[str, Code, Span]] = []
    flying: list[Collective] = []
    useful: set[int] = set()
    reported: set[int] = set()
    unroll = touches_loop(step) and step.microbatches <= MAX_UNROLLED
    for e in entries(step, unroll=unroll):
        if isinstance(e.item, Wait) and not waits_on(e.item, TargetKind.GRADS):
            continue  # parameter waits: _param_errors
        if isinstance(e.item, Wait):
            done = [c for c in flying if groups_of(c.target) & groups_of(e.item.target)]
            if done:
                useful.add(id(e.item))
            flying = [c for c in flying if c not in done]
        elif starts_flight(e.item):
            assert isinstance(e.item, Collective)
            flying.append(e.item)
    for c in flying:
        if id(c) not in reported:
            reported.add(id(c))
            out.append((f"the asynchronous '{c.label()}' is never waited: write 'wait "
                        f"{c.target.label()}' before the step ends", Code.MISSING, c.span))
    for w in step.waits:
        if id(w) not in useful and waits_on(w, TargetKind.GRADS):
            out.append((f"nothing is in flight on {w.target.label()} here: 'wait' completes an "
                        "asynchronous collective started before it (all_reduce(sum, async) ...)",
                        Code.BAD_VALUE, w.span))
    return out + _param_errors(step)


def _param_errors(step: Step) -> list[tuple[str, Code, Span]]:
    """A parameter gather is waited in the same step or the next one (the step repeats), so only
    a gather with no ``wait params`` of its groups anywhere, and a ``wait params`` with no
    asynchronous gather of its groups anywhere, are errors."""
    gathers = [op for op in step.ops() if isinstance(op, Collective) and starts_param_flight(op)]
    waits = [w for w in step.waits if waits_on(w, TargetKind.PARAMS)]
    out: list[tuple[str, Code, Span]] = []
    for c in gathers:
        if not any(groups_of(c.target) & groups_of(w.target) for w in waits):
            out.append((f"the asynchronous '{c.label()}' is never waited: write 'wait "
                        f"{c.target.label()}' before the forward that reads them", Code.MISSING,
                        c.span))
    for w in waits:
        if not any(groups_of(c.target) & groups_of(w.target) for c in gathers):
            out.append((f"nothing is in flight on {w.target.label()} here: 'wait params' completes "
                        "an asynchronous parameter gather (all_gather(async) params ...)",
                        Code.BAD_VALUE, w.span))
    return out
