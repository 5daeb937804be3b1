"""What each collective of a step is: what it may act on, the options it takes, its ring cost.

One entry per :class:`~placeverify.ir.step.CollectiveKind`, read by the lowering (targets and
options), the cost model (bytes on the wire) and the semantics table's exhaustiveness test. What a
collective *does* to a parameter group's buffers is :mod:`placeverify.semantics.buffers`; how the
torch replay runs it is :mod:`placeverify.replay.collectives` (a kind the replay has no rule for
is refused there, never skipped).

Ring costs per device for a payload of S bytes over n ranks (Thakur, Rabenseifner and Gropp,
"Optimization of collective communication operations in MPICH", 2005; REFERENCE §2.2): all-reduce
2(n-1)/n·S, reduce-scatter, all-gather, broadcast (pipelined) and all-to-all (n-1)/n·S; a
point-to-point send or receive moves S.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.ir.step import CollectiveKind, ReduceOp, TargetKind


@dataclass(frozen=True, slots=True)
class CollectiveSpec:
    targets: tuple[TargetKind, ...]  # what it may act on in a step (each pair is in semantics)
    reduces: bool  # takes a reduction op: sum, mean, max (default sum)
    positional: tuple[str, ...] = ()  # words it takes besides the reduction op
    keywords: tuple[str, ...] = ()  # keyword options besides op and order
    ring_steps: Fraction | None = Fraction(1)  # bytes per payload byte are ring_steps·(n-1)/n;
    # None for point-to-point (S bytes whatever n)


REDUCE_OPS: tuple[ReduceOp, ...] = (ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.MAX)

COLLECTIVES: dict[CollectiveKind, CollectiveSpec] = {
    CollectiveKind.ALL_REDUCE: CollectiveSpec(
        (TargetKind.GRADS, TargetKind.TOKENS, TargetKind.OVERFLOW), reduces=True,
        positional=("async",), ring_steps=Fraction(2)),
    CollectiveKind.REDUCE_SCATTER: CollectiveSpec((TargetKind.GRADS,), reduces=True,
                                                  positional=("accumulate", "async")),
    CollectiveKind.ALL_GATHER: CollectiveSpec((TargetKind.PARAMS, TargetKind.GRADS), reduces=False,
                                              positional=("async",)),  # async: of params only
    # the overflow flag: every rank of the group takes rank k's flag (placeverify.semantics.skip)
    CollectiveKind.BROADCAST: CollectiveSpec((TargetKind.PARAMS, TargetKind.OVERFLOW),
                                             reduces=False, positional=("async",),
                                             keywords=("from",)),
    CollectiveKind.ALL_TO_ALL: CollectiveSpec((TargetKind.TOKENS,), reduces=False),
    CollectiveKind.SEND: CollectiveSpec((TargetKind.ACTIVATIONS,), reduces=False, ring_steps=None),
    CollectiveKind.RECV: CollectiveSpec((TargetKind.ACTIVATIONS,), reduces=False, ring_steps=None),
}
