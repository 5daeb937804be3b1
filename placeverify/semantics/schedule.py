"""The order in which a step's statements run, written once for every backend.

A step runs ``pre`` once, then the loop body once per micro-batch (a statement under ``on
microbatch k`` only on micro-batch k), then ``post`` with the last micro-batch current. The exact
interpreter, the Z3 coefficient machine, the agreement analysis and the torch replay all walk the
step through :func:`events` (or :func:`microbatch_ops` where they iterate the loop themselves), so
the order, the micro-batch filter and the "last" index cannot drift between them.

When the loop does nothing but back-propagate (:func:`is_uniform`), every micro-batch behaves
alike and a symbolic backend may run the body once for a *generic* micro-batch (``GENERIC``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from placeverify.diagnostics import Span
from placeverify.errors import PlaceverifyError
from placeverify.ir.step import Backward, Clip, Op, Step, Update

GENERIC = "g"  # the micro-batch index of a generic micro-batch (every one alike)
MicroBatch = int | str


class Phase(StrEnum):
    PRE = "pre"
    LOOP = "loop"
    POST = "post"


@dataclass(frozen=True, slots=True)
class Event:
    phase: Phase
    k: MicroBatch  # the current micro-batch (the last one after the loop)
    op: Op


class Unmodelled(PlaceverifyError):
    """A statement a backend does not model exactly: the verdict that needed it is *unknown*.

    Raised instead of ignoring the statement, so that nothing is ever proved by skipping it."""

    def __init__(self, message: str, span: Span | None = None) -> None:
        super().__init__(message)
        self.span = span


def is_uniform(step: Step) -> bool:
    """True when the loop only runs backward: every micro-batch then behaves the same (not under a
    participation pattern with idle micro-batches, placeverify.semantics.participation)."""
    return not step.idle and not step.empty and \
        all(isinstance(lo.op, Backward) and lo.microbatch is None for lo in step.loop)


def microbatch_ops(step: Step, k: int) -> list[Op]:
    """The loop body as it runs on micro-batch ``k``."""
    return [lo.op for lo in step.loop if lo.microbatch is None or lo.microbatch == k]


def last_indexed(step: Step) -> int:
    """The largest micro-batch index an ``on microbatch`` block names (-1 if none)."""
    return max((lo.microbatch for lo in step.loop if lo.microbatch is not None), default=-1)


def events(step: Step, microbatches: int, *, generic: bool = False,
           indices: Sequence[int] | None = None) -> Iterator[Event]:
    """Every statement of the step in execution order, with the micro-batch current when it runs.

    With ``generic`` (only for a uniform loop) the body runs once for the generic micro-batch.
    With ``indices`` the loop runs only those micro-batches, in that order (a summarised loop,
    :func:`summary_indices`: the ones left out behave as the one before the last)."""
    if generic and not is_uniform(step):
        raise ValueError("a generic micro-batch stands for all only when the loop is uniform")
    first: MicroBatch = GENERIC if generic else 0
    for op in step.pre:
        yield Event(Phase.PRE, first, op)
    if generic:
        for lo in step.loop:
            yield Event(Phase.LOOP, GENERIC, lo.op)
    else:
        for k in range(microbatches) if indices is None else indices:
            for op in microbatch_ops(step, k):
                yield Event(Phase.LOOP, k, op)
    last: MicroBatch = GENERIC if generic else microbatches - 1
    for op in step.post:
        yield Event(Phase.POST, last, op)


# Micro-batches run before the loop may be summarised: those up to the last indexed one, and then
# enough alike ones to see the steady state twice (placeverify.verify.z3.integrity).
STEADY_WINDOW = 4


def summary_indices(step: Step, microbatches: int) -> list[int] | None:
    """The micro-batches a summarised loop runs: 0 .. last indexed + STEADY_WINDOW, then the last
    one; None when that would leave none out (or the loop reads the gradient: a clip or update
    inside the loop sees a buffer that grows with every micro-batch)."""
    if any(isinstance(lo.op, Clip | Update) for lo in step.loop) or step.idle \
            or step.empty:
        return None
    middle = last_indexed(step) + 1 + STEADY_WINDOW
    if microbatches <= middle + 1:
        return None
    return [*range(middle), microbatches - 1]
