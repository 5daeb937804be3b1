"""The late outcome of a parameter gather in flight, on real tensors
(:mod:`placeverify.semantics.param_flights`): ``all_gather(async) params`` after the update runs
nothing where it starts; the gather runs, for real, at the first ``wait params`` after it (in the
next step when the wait stands before the forward), so every forward in between computes on this
rank's own shard updated and the other ranks' shards from before the update. A gather still in
flight when the run ends completes then, before the states are compared (the wait that would
follow). The synchronous outcome is the step without ``async``, which the replay runs as ZeRO-1.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from placeverify.ir.flights import entries, groups_of, starts_param_flight
from placeverify.ir.step import Collective, Op, Step, TargetKind, Wait


def param_events(step: Step) -> Iterator[tuple[Op | Wait, int]]:
    """The step in execution order with its parameter waits in place, each with the micro-batch
    current when it runs (before the loop: 0; after it: the last)."""
    last = step.microbatches - 1
    for e in entries(step, unroll=True):
        if isinstance(e.item, Wait) and e.item.target.kind is not TargetKind.PARAMS:
            raise AssertionError("a gradient wait reached the replay (it runs an outcome)")
        k = e.k if e.k is not None else (0 if e.phase == "pre" else last)
        yield e.item, k


class Pending:
    """This rank's parameter gathers in flight."""

    def __init__(self) -> None:
        self.flying: list[Collective] = []

    def start(self, op: Collective) -> None:
        assert starts_param_flight(op)
        self.flying.append(op)

    def complete(self, wait: Wait | None) -> list[Collective]:
        """The gathers ``wait`` completes (every one when None: the end of the run), to run now
        as synchronous gathers."""
        done = [op for op in self.flying
                if wait is None or groups_of(op.target) & groups_of(wait.target)]
        self.flying = [op for op in self.flying if op not in done]
        return [replace(op, asynchronous=False) for op in done]
