"""State consistency in Z3: replicated states stay bitwise identical across their axis.

For each mesh axis and each parameter group replicated along it, two ranks x and x' that differ
only along the axis are compared after the step. The parameters start identical (θ0); the
optimizer update is an uninterpreted function ``upd(θ, g, ω)`` (equal inputs give equal outputs,
and nothing else is assumed); the gradient each rank consumes is one shared term when the step
makes it identical along the axis (:mod:`placeverify.verify.agreement`), two terms otherwise, and two
IEEE float32 sums in different orders when the reduction order is rank-dependent. Dynamic loss
scaling adds the skip decision (a shared flag only if the overflow flag is reduced over the
axis), clipping a shared or per-rank clip factor. A sharded update (ZeRO-1/2) compares the owner's
updated element with the other rank's copy: the owner's value after an all-gather, the stale θ0
otherwise. Dropout in a replicated activation region compares ``rng(seed, offset)`` on both
ranks (:mod:`placeverify.verify.dropout`). Z3 is asked for a model where the two ranks differ.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import z3

from placeverify.evidence import Cause, Divergence, small_mesh
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Mode, Role, State
from placeverify.ir.precision import LossScale
from placeverify.ir.relations import Relation
from placeverify.ir.step import Clip, Collective, CollectiveKind, TargetKind, Update
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import partitions
from placeverify.semantics.groups import GroupView, group_view
from placeverify.semantics.skip import shares_decision, skips_on_overflow, update_of
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.agreement import (
    Agreement,
    agreement,
    overflow_reductions,
    same_gradient_everywhere,
    split_axes,
)
from placeverify.verify.check import Check, Context, Finding
from placeverify.verify.dropout import rng_obligations
from placeverify.verify.z3 import solve
from placeverify.verify.z3.solve import SolverStatus

METHOD_UF = "z3 (uninterpreted update, real arithmetic)"
METHOD_FP = "z3 (IEEE float32 sums)"


def findings(strategy: Strategy, ctx: Context) -> Iterator[Finding]:
    for obligation, divergence in consistency_obligations(strategy, ctx.timeout_ms):
        if obligation.verdict is Verdict.REFUTED and obligation.fix is None:
            # Deferred, as the float32 helpers below: refutations only (check start-up time).
            from placeverify.verify.fix_matchers import FixCase
            from placeverify.verify.fixes import suggest

            obligation = replace(obligation, fix=suggest(FixCase(strategy, divergence)))
        yield Finding(obligation, divergence)


CHECK = Check(Condition.STATE_CONSISTENCY, "state consistency", findings)


def consistency_obligations(strategy: Strategy,
                            timeout_ms: int) -> list[tuple[Obligation, Divergence | None]]:
    out: list[tuple[Obligation, Divergence | None]] = []
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        agree = agreement(strategy, view)
        for placement in strategy.placements:
            axis = placement.axis
            if view.size(axis, sizes) < 2 or view.relation(axis) is Relation.OWNED:
                continue
            if placement.role is not Role.TENSOR and placement.role is not Role.PIPELINE \
                    and placement.mode_of(State.PARAMS, group) in (Mode.S_STAR, Mode.O):
                continue  # each element has one owner; gathered copies are that owner's
            out.append(_params_obligation(strategy, view, agree, axis, timeout_ms))
    out.extend(rng_obligations(strategy, timeout_ms))
    return out


def _sharded_update(strategy: Strategy, axis: str, group: ParamGroup) -> bool:
    return partitions(strategy, axis, State.OPTIMIZER, group)


def _gathered_after_update(strategy: Strategy, axis: str, group: ParamGroup) -> Collective | None:
    seen_update = False
    for op in strategy.step.post:
        if isinstance(op, Update):
            seen_update = True
        elif (seen_update and isinstance(op, Collective) and op.target.kind is TargetKind.PARAMS
              and op.kind in (CollectiveKind.ALL_GATHER, CollectiveKind.BROADCAST)
              and op.group.covers(axis) and op.target.applies_to(group)):
            return op
    return None


def _params_obligation(strategy: Strategy, view: GroupView, agree: Agreement, axis: str,
                       timeout_ms: int) -> tuple[Obligation, Divergence | None]:
    group = view.group
    where = "stage copies" if axis in view.ends else "replicas"
    claim = f"{group.value} parameters and optimizer state stay identical across {axis} ({where})"
    span = strategy.placement(axis).span
    theta0, omega0 = z3.Real("theta0"), z3.Real("omega0")
    upd = z3.Function("upd", z3.RealSort(), z3.RealSort(), z3.RealSort(), z3.RealSort())
    sizes = {a.name: a.size for a in strategy.mesh.axes}

    if _sharded_update(strategy, axis, group):
        return _sharded_obligation(strategy, group, axis, claim, span, upd, theta0, omega0,
                                   timeout_ms)

    same_gradient = axis in agree.identical
    fp_op = agree.bitwise_breaks.get(axis)
    skip_shared = not skips_on_overflow(strategy) or _overflow_covers(strategy, axis) or \
        same_gradient_everywhere(strategy, axis)
    never = update_of(strategy.step) is None  # no update: every rank keeps θ0 (semantics/skip)
    clip_shared = _clip_identical(strategy, axis, sizes)
    if fp_op is not None and same_gradient:
        return _bitwise_obligation(strategy, view, axis, claim, fp_op, timeout_ms)
    gx = z3.Real("g_x")
    gy = gx if same_gradient else z3.Real("g_y")
    sx = z3.BoolVal(True) if never else z3.Bool("skip_x")
    sy = sx if skip_shared or never else z3.Bool("skip_y")
    cx = z3.Real("clip_x")
    cy = cx if clip_shared else z3.Real("clip_y")
    theta_x = z3.If(sx, theta0, upd(theta0, cx * gx, omega0))
    theta_y = z3.If(sy, theta0, upd(theta0, cy * gy, omega0))
    outcome = solve.check(theta_x != theta_y, timeout_ms)
    method = METHOD_UF
    if outcome.status is SolverStatus.UNSAT:
        return Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.PROVED, span,
                          ObligationKind.REPLICA_AGREEMENT, seconds=outcome.seconds, method=method), None
    if outcome.status is SolverStatus.UNKNOWN:
        return Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.UNKNOWN, span,
                          ObligationKind.REPLICA_AGREEMENT, reason="the solver timed out",
                          method=method), None
    model = outcome.model
    causes: list[Cause] = []
    if not same_gradient:
        causes.append(Cause.GRADIENT)
    if not skip_shared and solve.truthy(model, sx != sy):
        causes.append(Cause.SKIP)
    if not clip_shared:
        causes.append(Cause.CLIP)
    cause = causes[0] if causes else Cause.GRADIENT
    divergence = _witness(strategy, view, axis) if cause is Cause.GRADIENT else None
    reason = _reason(strategy, view, axis, cause, divergence)
    span_at = span
    if cause is Cause.GRADIENT:
        span_at = next((op.span for op in strategy.step.post if isinstance(op, Update)), span)
    elif cause is Cause.SKIP:
        span_at = _overflow_span(strategy) or span
    elif cause is Cause.CLIP:
        span_at = next((op.span for op in strategy.step.ops() if isinstance(op, Clip)), span)
    counter = None
    if divergence is not None and divergence.run is not None:
        counter = {"mesh": divergence.sizes, "microbatches": divergence.microbatches,
                   "consumed": {", ".join(f"{k}={v}" for k, v in d.coords.items()): str(d.consumed)
                                for d in divergence.run.devices}}
    return (Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.REFUTED, span_at,
                       ObligationKind.REPLICA_AGREEMENT, reason=reason, counterexample=counter,
                       seconds=outcome.seconds, method=method),
            divergence or Divergence(axis, group, cause, small_mesh(strategy, axis, 2),
                                     min(2, strategy.step.microbatches)))


def _sharded_obligation(strategy: Strategy, group: ParamGroup, axis: str, claim: str, span: Any,
                        upd: Any, theta0: Any, omega0: Any,
                        timeout_ms: int) -> tuple[Obligation, Divergence | None]:
    """Replicas agree after an update of optimizer shards over ``axis`` only if the updated
    shards are gathered from their owners afterwards."""
    gather = _gathered_after_update(strategy, axis, group)
    g = z3.Real("g")
    owner = upd(theta0, g, omega0)
    other = owner if gather is not None and gather.from_owner else theta0
    if gather is not None and not gather.from_owner:
        other = theta0  # every rank takes rank `source`'s copy, stale for others' shards
        owner = theta0
    outcome = solve.check(owner != other, timeout_ms)
    if outcome.status is SolverStatus.UNSAT:
        return Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.PROVED,
                          gather.span if gather else span, ObligationKind.REPLICA_AGREEMENT,
                          seconds=outcome.seconds, method=METHOD_UF), None
    if outcome.status is SolverStatus.UNKNOWN:
        return Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.UNKNOWN, span,
                          ObligationKind.REPLICA_AGREEMENT, reason="the solver timed out",
                          method=METHOD_UF), None
    model = outcome.model
    old, new = str(solve.value(model, theta0)), str(solve.value(model, owner))
    values = {"theta0": old, "updated": new, "devices": [
        {"coords": {axis: 0}, "parameter element": new,
         "note": "owns the element: updated it with its optimizer shard"},
        {"coords": {axis: 1}, "parameter element": old,
         "note": "does not own it: keeps the value from before the step"}]}
    update_span = next((op.span for op in strategy.step.post if isinstance(op, Update)), span)
    reason = (f"the optimizer state is sharded over {axis}, so each rank updates only its "
              f"shard, and no 'all_gather params over {axis}' follows the update: the owner of "
              f"an element holds {values['updated']}, the other ranks keep {values['theta0']}")
    return (Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.REFUTED, update_span,
                       ObligationKind.STALE_SHARD, reason=reason, counterexample=values,
                       seconds=outcome.seconds, method=METHOD_UF),
            Divergence(axis, group, Cause.STALE_SHARD, small_mesh(strategy, axis, 2),
                       min(2, strategy.step.microbatches), values=values))


def _bitwise_obligation(strategy: Strategy, view: GroupView, axis: str, claim: str,
                        op: Collective, timeout_ms: int) -> tuple[Obligation, Divergence | None]:
    """Two ranks sum the same three float32 gradients in their own orders; the update, an
    uninterpreted function of the float32 sum, then sees bitwise-different inputs or not.

    A witness is searched among short decimals and Z3 confirms it under IEEE float32 semantics
    (a blind float32 search can take seconds on a loaded machine)."""
    from placeverify.verify.z3.float32 import float32_text, float32_witness, fp_value

    f32 = z3.Float32()
    rne = z3.RNE()
    a, b, c = (z3.FP(n, f32) for n in ("g_rank0", "g_rank1", "g_rank2"))
    sum_x = z3.fpAdd(rne, z3.fpAdd(rne, a, b), c)  # rank 0 starts from its own gradient
    sum_y = z3.fpAdd(rne, z3.fpAdd(rne, b, c), a)  # rank 1 from its own
    upd = z3.Function("upd", f32, z3.RealSort())
    witness = float32_witness()
    pinned = [v == z3.FPVal(w, f32) for v, w in zip((a, b, c), witness, strict=True)]
    outcome = solve.check(z3.And(*pinned, upd(sum_x) != upd(sum_y)), timeout_ms)
    method = "z3 (IEEE float32 sums; witness from a search over short decimals)"
    span = op.span
    if outcome.status is not SolverStatus.SAT:
        return Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.UNKNOWN, span, ObligationKind.FP_ORDER,
                          reason="Z3 did not confirm the float32 witness", seconds=outcome.seconds,
                          method=method), None
    g0, g1, g2, s0, s1 = (float32_text(fp_value(outcome.model, t)) for t in (a, b, c, sum_x, sum_y))
    values = {"gradients": [g0, g1, g2], "devices": [
        {"coords": {axis: 0}, "local gradient": g0, "sum (float32)": s0,
         "note": f"({g0} + {g1}) + {g2}"},
        {"coords": {axis: 1}, "local gradient": g1, "sum (float32)": s1,
         "note": f"({g1} + {g2}) + {g0}"},
        {"coords": {axis: 2}, "local gradient": g2, "sum (float32)": "", "note": ""}]}
    reason = (f"'{op.label()}' sums in a rank-dependent order: in float32, "
              f"({g0} + {g1}) + {g2} = {s0} on one rank but ({g1} + {g2}) + {g0} = {s1} on "
              "another, so the replicas differ bitwise after the update")
    return (Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.REFUTED, span, ObligationKind.FP_ORDER,
                       reason=reason, counterexample=values, seconds=outcome.seconds,
                       method=method),
            Divergence(axis, view.group, Cause.BITWISE, small_mesh(strategy, axis, 3),
                       min(2, strategy.step.microbatches), values=values))


def _overflow_ops(strategy: Strategy) -> list[Collective]:
    return [op for op in strategy.step.ops() if isinstance(op, Collective)
            and op.target.kind is TargetKind.OVERFLOW]


def _overflow_covers(strategy: Strategy, axis: str) -> bool:
    """Is the skip decision shared along ``axis``: an overflow reduction over it runs after the
    last backward and before the update?"""
    deciding, _ = overflow_reductions(strategy)
    return any(p.op.group.covers(axis) and shares_decision(strategy, p.op) for p in deciding)


def _overflow_span(strategy: Strategy) -> Any:
    ops = _overflow_ops(strategy)
    return ops[0].span if ops else None


def _clip_identical(strategy: Strategy, axis: str, sizes: dict[str, int]) -> bool:
    """Is the clip factor identical along ``axis``? (True when the step does not clip.)"""
    clips = [op for op in strategy.step.ops() if isinstance(op, Clip)]
    if not clips or all(axis in clip.group.axes for clip in clips):
        return True
    for group in strategy.model.groups_present():
        if axis in split_axes(strategy, group, sizes):
            return False
        if axis not in agreement(strategy, group_view(strategy, group)).identical and \
                group_view(strategy, group).relation(axis) is not Relation.OWNED:
            return False
    return True


def _witness(strategy: Strategy, view: GroupView, axis: str) -> Divergence | None:
    """Two ranks along ``axis`` consuming different gradients, on the smallest mesh found."""
    from placeverify.semantics.interpreter import atoms, run, uniform_instance  # refutations only

    declared = strategy.step.microbatches
    indexed = any(lo.microbatch is not None for lo in strategy.step.loop)
    if indexed and declared > 16:
        return None  # the step names micro-batch indices; a witness this long is not shown
    for m in ([declared] if indexed else sorted({1, min(2, declared)})):
        sizes = small_mesh(strategy, axis, 2)
        rng = random.Random(1)
        keys = atoms(view, sizes, m)
        for attempt in range(32):
            tokens = {k: (1 + (i % 3) if attempt == 0 else rng.randint(1, 4))
                      for i, k in enumerate(keys)}
            instance = uniform_instance(strategy, view, sizes, m, tokens)
            result = run(strategy, view, instance)
            for d1, d2 in itertools.combinations(result.devices, 2):
                differ = [a for a in d1.coords if d1.coords[a] != d2.coords[a]]
                if differ == [axis] and d1.consumed != d2.consumed:
                    return Divergence(axis, view.group, Cause.GRADIENT, sizes, m, run=result,
                                      instance=instance)
    return None


def _reason(strategy: Strategy, view: GroupView, axis: str, cause: Cause,
            divergence: Divergence | None) -> str:
    if cause is Cause.SKIP:
        skipping = "dynamic loss scaling" if strategy.loss_scale == LossScale.DYNAMIC else \
            "'update params unless overflow'"
        return (f"{skipping}: the overflow flag is not reduced over {axis}, so one rank "
                f"can skip the step (its gradients overflowed) while the other updates")
    if cause is Cause.CLIP:
        return (f"the clipping norm is not summed over {axis} while ranks along {axis} hold "
                f"different gradients, so each rank scales its update by a different factor")
    if divergence is not None and divergence.run is not None:
        d = [dev for dev in divergence.run.devices if all(
            v == 0 for a, v in dev.coords.items() if a != axis)]
        shown = "; ".join(f"{axis} {dev.coords[axis]} consumes {dev.consumed}" for d_ in [d]
                          for dev in d_[:3])
        return (f"the gradient the optimizer consumes is not identical across {axis} "
                f"(no reduction over {axis} after the last backward): {shown}; with identical "
                f"inputs elsewhere the replicas drift apart")
    return f"the gradient the optimizer consumes is not identical across {axis}"
