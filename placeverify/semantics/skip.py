"""Whether the optimizer step runs on a rank: the skip decision, written once.

- A step without ``update params`` never runs the optimizer: on every rank the parameters and the
  optimizer state keep their values, as a step whose update every rank skips. Every gradient
  domain takes what the optimizer consumes as nothing (each coefficient 0, the exact interpreter's
  consumed value 0, identical along every axis in the agreement analysis), while single-device
  training applies the gradient.
- ``update params unless overflow`` — and ``update params`` under dynamic loss scaling, which
  skips without saying so — skips the step on every rank whose *view* of the overflow flag is set.
  A rank's view is its own check of the gradient it consumes (a non-finite element) until a flag
  statement runs between the last backward and the update:
  ``all_reduce(max) overflow over G`` ORs the checks of G's ranks (the rank still skips on its own
  check as well), and ``broadcast(from = k) overflow over G`` gives every rank of G the view of
  G's k-th rank, on which the rank then decides alone (it ignores its own check) — except under
  dynamic loss scaling, whose loss scaler still skips on the rank's own check.
- Single-device training skips exactly when the global gradient holds a non-finite element, that
  is when some rank's gradients overflowed. So the skip must (a) be the same on every rank
  (:mod:`placeverify.verify.checks.update`, :mod:`placeverify.verify.checks.consistency`) and
  (b) reflect every rank's overflow: without a broadcast a rank's view ORs checks that include its
  own, so (a) implies (b); a broadcast replaces the other ranks' checks by its source's, and (b)
  is judged on its own (:mod:`placeverify.verify.checks.decisions`).

The gradient domains record where the flag statements run (``Position`` in
:mod:`placeverify.semantics.buffers`); the torch replay runs them on real flags
(:mod:`placeverify.replay.collectives`, :mod:`placeverify.replay.step`).
"""

from __future__ import annotations

from placeverify.ir.precision import LossScale
from placeverify.ir.step import Collective, CollectiveKind, Step, TargetKind, Update
from placeverify.ir.strategy import Strategy


def update_of(step: Step) -> Update | None:
    """The step's optimizer step (None: the step never updates the parameters)."""
    return next((op for op in step.post if isinstance(op, Update)), None)


def skips_on_overflow(strategy: Strategy) -> bool:
    """Does the update skip on the overflow flag: ``unless overflow``, or dynamic loss scaling?"""
    update = update_of(strategy.step)
    if update is None:
        return False
    return update.unless_overflow or strategy.loss_scale == LossScale.DYNAMIC


def flag_broadcasts(step: Step) -> list[Collective]:
    """The ``broadcast(from = k) overflow`` statements of the step, in order."""
    return [op for op in step.ops() if isinstance(op, Collective)
            and op.kind is CollectiveKind.BROADCAST and op.target.kind is TargetKind.OVERFLOW]


def shares_decision(strategy: Strategy, op: Collective) -> bool:
    """Does this deciding flag statement give the ranks of its group one skip decision? A
    reduction does (each rank ORs the same checks, its own among them); a broadcast does where
    the ranks decide on the flag alone ('unless overflow'), not under dynamic loss scaling,
    whose loss scaler still skips on the rank's own check."""
    return op.kind is CollectiveKind.ALL_REDUCE or strategy.loss_scale != LossScale.DYNAMIC
