"""Integrity obligations about what the optimizer finally applies, beyond the gradient's value.

- *clipping*: the clip factor min(1, c / ||g||) must use the global norm of the single-device
  gradient. Per parameter group, the squared norm summed over the clip group counts each element
  once iff the group covers every axis where ranks hold different elements and, where ranks hold
  the same elements, they are counted once. Z3 (real arithmetic) is asked for squared norms where
  the computed and the true norm differ;
- *recomputation*: a recomputed dropout mask must equal the forward one; the random stream is an
  uninterpreted function of (seed, offset), and without restoring the RNG state the recompute
  reads the stream at a later offset;
- *loss scaling*: with dynamic loss scaling every rank must take the same skip decision, so the
  overflow flag must be reduced over every axis (an unreduced axis where ranks hold different
  parameters lets one part of the model step while the other skips);
- *shards*: an optimizer step replicated over an axis must read a gradient that was not
  reduce-scattered over it, and a sharded step's updates must reach every rank from its owner.
"""

from __future__ import annotations

import math
from typing import Any

import z3

from placeverify.ir.placement import Role, State
from placeverify.ir.step import Clip, Collective, CollectiveKind, TargetKind, Update
from placeverify.ir.strategy import RecomputeKind, Strategy
from placeverify.semantics.groups import group_view
from placeverify.smt import solve
from placeverify.smt.agreement import agreement
from placeverify.smt.consistency import split_axes
from placeverify.verdicts import Condition, Obligation, Verdict


def update_obligations(strategy: Strategy, timeout_ms: int) -> list[Obligation]:
    out: list[Obligation] = []
    out.extend(_clipping(strategy, timeout_ms))
    out.extend(_recompute(strategy, timeout_ms))
    out.extend(_overflow(strategy, timeout_ms))
    out.extend(_shards(strategy))
    return out


def _clipping(strategy: Strategy, timeout_ms: int) -> list[Obligation]:
    clips = [op for op in strategy.step.ops() if isinstance(op, Clip)]
    if not clips:
        return []
    clip = clips[0]
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    claim = (f"clipping scales the update by min(1, {float(clip.max_norm):g} / ||g||) with the "
             "global norm of the single-device gradient")
    true_total: Any = z3.RealVal(0)
    computed: Any = z3.RealVal(0)
    constraints = []
    notes = []
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        t = z3.Real(f"norm2_{group.value}")
        constraints.append(t >= 0)
        true_total = true_total + t
        split = split_axes(strategy, group, sizes)
        missing = sorted(a for a in split if a not in clip.group.axes)
        identical = agreement(strategy, view).identical
        repeated = [a for a in clip.group.axes if a not in split and sizes[a] > 1
                    and (a in identical or view.relation(a).value == "complete")]
        multiplicity = 1 if clip.replicated_once else math.prod(sizes[a] for a in repeated)
        if missing:
            part = z3.Real(f"local_norm2_{group.value}")
            constraints += [part >= 0, part <= t]
            computed = computed + multiplicity * part
            notes.append(f"{group.value}: the norm is not summed over {', '.join(missing)}, where "
                         "ranks hold different elements, so each rank sees only its part")
        else:
            computed = computed + multiplicity * t
            if multiplicity != 1:
                notes.append(f"{group.value}: replicated over {', '.join(repeated)} and counted on "
                             f"every rank ({multiplicity}x)")
    outcome = solve.check(z3.And(*constraints, computed != true_total), timeout_ms)
    method = "z3 (real arithmetic over squared norms)"
    if outcome.status == "unsat":
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, clip.span, "clip",
                           seconds=outcome.seconds, method=method)]
    if outcome.status == "unknown":
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, clip.span, "clip",
                           reason="the solver timed out", method=method)]
    model = outcome.model
    true_value = float(solve.value(model, true_total))
    seen = float(solve.value(model, computed))
    values = {"true_norm": math.sqrt(true_value), "computed_norm": math.sqrt(seen)}
    def factor(norm: float) -> float:
        return min(1.0, float(clip.max_norm) / norm) if norm > 0 else 1.0

    reason = ("; ".join(notes) + f". E.g. a true norm {values['true_norm']:.4g} is computed as "
              f"{values['computed_norm']:.4g}: the update is scaled by "
              f"{factor(values['computed_norm']):.4g} instead of {factor(values['true_norm']):.4g}"
              " whenever either exceeds max_norm")
    return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, clip.span, "clip",
                       reason=reason, counterexample=values, seconds=outcome.seconds,
                       method=method,
                       fix="sum the squared norm over every axis where gradients are sharded "
                           "(tp, pp, and dp under ZeRO-2/3) and count replicated parameters once")]


def _recompute(strategy: Strategy, timeout_ms: int) -> list[Obligation]:
    arch = strategy.model.arch
    recompute = strategy.recompute
    if arch is None or recompute.kind is RecomputeKind.NONE:
        return []
    span = recompute.span
    claim = "recomputed activations equal the forward ones (the same dropout masks)"
    method = "z3 (uninterpreted random stream)"
    uses_rng = arch.dropout and (recompute.kind is RecomputeKind.FULL or arch.attention != "flash")
    if not uses_rng:
        why = "the model has no dropout" if not arch.dropout else \
            "selective recomputation with flash attention regenerates masks from the saved seed"
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span, "recompute",
                           reason=why, method="no random stream in the recomputed region")]
    rng = z3.Function("rng", z3.IntSort(), z3.IntSort(), z3.RealSort())
    seed, offset, advance = z3.Int("seed"), z3.Int("offset"), z3.Int("advance")
    replay_offset = offset if recompute.restore_rng else offset + advance
    outcome = solve.check(z3.And(advance >= 1, rng(seed, offset) != rng(seed, replay_offset)),
                          timeout_ms)
    if outcome.status == "unsat":
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span, "recompute",
                           seconds=outcome.seconds, method=method)]
    if outcome.status == "unknown":
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, span, "recompute",
                           reason="the solver timed out", method=method)]
    model = outcome.model
    values = {"seed": int(solve.value(model, seed)), "forward_offset": int(solve.value(model, offset)),
              "recompute_offset": int(solve.value(model, replay_offset)),
              "forward_mask": str(solve.value(model, rng(seed, offset))),
              "recompute_mask": str(solve.value(model, rng(seed, replay_offset)))}
    reason = (f"recomputation draws dropout masks at RNG offset {values['recompute_offset']} "
              f"instead of {values['forward_offset']} (the state is not restored): the backward "
              "differentiates a different function than the forward computed")
    return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, span, "recompute",
                       reason=reason, counterexample=values, seconds=outcome.seconds,
                       method=method,
                       fix="restore the RNG state before recomputing (recompute full(restore_rng "
                           "= true); torch.utils.checkpoint's preserve_rng_state; OLMo-core#828)")]


def _overflow(strategy: Strategy, timeout_ms: int) -> list[Obligation]:
    if strategy.loss_scale != "dynamic":
        return []
    ops = [op for op in strategy.step.ops() if isinstance(op, Collective)
           and op.target.kind is TargetKind.OVERFLOW]
    axes = [a.name for a in strategy.mesh.axes if a.size > 1]
    covered = {a for op in ops for a in op.group.axes if op.group.covers(a)}
    # Ranks that consume an identical (already reduced) gradient see the same inf/NaN, since a
    # sum carries it to every rank; only axes where they consume different elements or different
    # values need the flag reduced (Megatron reduces found_inf over the model-parallel group).
    missing = [a for a in axes if a not in covered and not same_gradient_everywhere(strategy, a)]
    claim = "with dynamic loss scaling every rank takes the same skip decision"
    span = ops[0].span if ops else strategy.step.span or strategy.placements[0].span
    flags = {a: z3.Bool(f"overflow_{a}") for a in axes}
    # Each rank skips iff a rank in its reduction group overflowed; ranks along a missing axis see
    # different flags.
    skip_x = z3.Or(*[flags[a] for a in covered if a in flags], z3.Bool("overflow_here"))
    skip_y = z3.Or(*[flags[a] for a in covered if a in flags],
                   z3.Bool("overflow_there") if missing else z3.Bool("overflow_here"))
    outcome = solve.check(skip_x != skip_y, timeout_ms)
    method = "z3 (propositional)"
    if outcome.status == "unsat":
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span, "overflow",
                           seconds=outcome.seconds, method=method)]
    reason = (f"the overflow flag is not reduced over {', '.join(missing)}, where ranks consume "
              "different gradients: a rank whose gradients overflowed skips the step while ranks "
              "holding other parts of the model apply it")
    return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, span, "overflow",
                       reason=reason, counterexample={"unreduced_axes": missing},
                       seconds=outcome.seconds, method=method,
                       fix="all_reduce(max) overflow over world")]


def same_gradient_everywhere(strategy: Strategy, axis: str) -> bool:
    """Do the ranks along ``axis`` consume the same gradient elements with the same values?"""
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        if view.relation(axis).value == "owned" or axis in split_axes(strategy, group, sizes):
            return False
        if axis not in agreement(strategy, view).identical:
            return False
    return True


def _shards(strategy: Strategy) -> list[Obligation]:
    out = []
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    update = next((op for op in strategy.step.post if isinstance(op, Update)), None)
    for p in strategy.placements:
        if p.role is not Role.DATA or sizes[p.axis] < 2:
            continue
        scattered = [op for op in strategy.step.ops() if isinstance(op, Collective)
                     and op.kind is CollectiveKind.REDUCE_SCATTER and op.group.covers(p.axis)
                     and op.target.kind is TargetKind.GRADS]
        if scattered and not p.mode(State.OPTIMIZER).sharded:
            out.append(Obligation(
                Condition.GRADIENT_INTEGRITY,
                f"the optimizer step over {p.axis} reads only gradient elements that were reduced",
                Verdict.REFUTED, scattered[0].span, "shard-mismatch",
                reason=f"'{scattered[0].label()}' leaves each rank with a reduced 1/{sizes[p.axis]} "
                       f"of the gradient, but the optimizer state is replicated over {p.axis} "
                       "(Ω = R), so the step updates every element, most of them from unreduced "
                       "local gradients",
                fix=f"all_reduce the gradients over {p.axis}, or shard the optimizer (zero1)",
                method="rules over the placement relations"))
        if p.mode(State.OPTIMIZER).sharded and update is not None:
            for op in strategy.step.post:
                if (isinstance(op, Collective) and op.kind is CollectiveKind.BROADCAST
                        and op.target.kind is TargetKind.PARAMS and op.source != "owner"
                        and op.group.covers(p.axis)):
                    out.append(Obligation(
                        Condition.GRADIENT_INTEGRITY,
                        f"every shard's update over {p.axis} reaches all ranks",
                        Verdict.REFUTED, op.span, "lost-update",
                        reason=f"the optimizer state is sharded over {p.axis}, so rank {op.source} "
                               "updated only its own shard; broadcasting its copy overwrites the "
                               "other shards' updates on every rank",
                        fix="broadcast each shard from its owner (from = owner) or all_gather",
                        method="rules over the placement relations"))
    return out
