"""Integrity obligations about what the optimizer finally applies, beyond the gradient's value.

- *clipping*: the clip factor min(1, c / ||g||) must use the global norm of the single-device
  gradient. Per parameter group, the squared norm summed over the clip group counts each element
  once iff the group covers every axis where ranks hold different elements and, where ranks hold
  the same elements, they are counted once. Z3 (real arithmetic) is asked for squared norms where
  the computed and the true norm differ. A clip by the inf norm or by per-rank norms combined
  (``norm = inf``, ``reduce = mean | max``) is judged by :mod:`placeverify.verify.checks.clip_norms`,
  and a clip by another norm than the declared policy's is refuted where it stands;
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
from collections.abc import Iterator, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

import z3

from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import State
from placeverify.ir.precision import LossScale
from placeverify.ir.relations import Relation
from placeverify.ir.render import op_label
from placeverify.ir.step import (
    DEFAULT_NORM_REDUCE,
    Clip,
    Collective,
    CollectiveKind,
    NormKind,
    ReduceOp,
    TargetKind,
    Update,
)
from placeverify.ir.strategy import RecomputeKind, Strategy
from placeverify.roles.queries import optimizer_axes, partitions
from placeverify.semantics.buffers import Seen
from placeverify.semantics.groups import GroupView, group_view
from placeverify.semantics.skip import shares_decision, skips_on_overflow
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.agreement import (
    Agreement,
    agreement,
    overflow_reductions,
    same_gradient_everywhere,
)
from placeverify.verify.check import Check, Context, Finding
from placeverify.verify.z3 import solve
from placeverify.verify.z3.solve import SolverStatus

# Each refutation below imports its fix from placeverify.verify.fixes where it is built: a file
# whose obligations are proved never loads the fix table (check start-up time).

METHOD_RULES = "rules over the step's statement positions and the placement"


def findings(strategy: Strategy, ctx: Context) -> Iterator[Finding]:
    for obligation in update_obligations(strategy, ctx.timeout_ms):
        yield Finding(obligation)


CHECK = Check(Condition.GRADIENT_INTEGRITY, "what the update applies", findings)


def update_obligations(strategy: Strategy, timeout_ms: int) -> list[Obligation]:
    out: list[Obligation] = []
    out.extend(_clipping(strategy, timeout_ms))
    out.extend(_recompute(strategy, timeout_ms))
    out.extend(_overflow(strategy, timeout_ms))
    out.extend(_shards(strategy))
    return out


def clip_policy(strategy: Strategy) -> Fraction | None:
    """The max_norm single-device training clips at: the declared ``clip``, else the step's."""
    if strategy.clip is not None:
        return strategy.clip.max_norm
    clips = [op for op in strategy.step.ops() if isinstance(op, Clip)]
    return clips[0].max_norm if clips else None


def clip_policy_norm(strategy: Strategy) -> NormKind:
    """The norm single-device training clips by: the declared ``clip``'s, else the step's."""
    if strategy.clip is not None:
        return strategy.clip.norm
    clips = [op for op in strategy.step.ops() if isinstance(op, Clip)]
    return clips[0].norm if clips else NormKind.L2


def _clipping(strategy: Strategy, timeout_ms: int) -> list[Obligation]:
    clips = [op for op in strategy.step.ops() if isinstance(op, Clip)]
    declared = strategy.clip
    max_norm = clip_policy(strategy)
    if max_norm is None:
        return []
    policy = clip_policy_norm(strategy)
    if policy is NormKind.L2:
        claim = (f"clipping scales the update by min(1, {float(max_norm):g} / ||g||) with the "
                 "global norm of the single-device gradient")
    else:
        from placeverify.verify.checks.clip_norms import claim as norm_claim

        claim = norm_claim(max_norm, policy)
    if not clips:
        assert declared is not None
        from placeverify.verify.fixes import CLIP_MISSING

        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, declared.span,
                           ObligationKind.CLIP,
                           reason=f"'clip max_norm = {float(max_norm):g}' is declared but the step "
                                  "has no clip statement, so the update is never clipped",
                           fix=CLIP_MISSING.text(max_norm=float(max_norm)),
                           method=METHOD_RULES)]
    groups = strategy.model.groups_present()
    views = {g: group_view(strategy, g) for g in groups}
    agreed = {g: agreement(strategy, views[g]) for g in groups}
    out = []
    for clip in dict.fromkeys(clips):
        problems = _clip_position(strategy, clip, max_norm, groups, agreed)
        if problems:
            from placeverify.verify.fixes import CLIP_POSITION

            out.append(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, clip.span,
                                  ObligationKind.CLIP, reason="; ".join(problems), method=METHOD_RULES,
                                  fix=CLIP_POSITION.text()))
            continue
        if clip.norm is not policy:
            from placeverify.verify.checks.clip_norms import norm_name
            from placeverify.verify.fixes import CLIP_POLICY_NORM

            right = replace(clip, norm=policy, reduce=DEFAULT_NORM_REDUCE[policy], measured=None)
            out.append(Obligation(
                Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, clip.span, ObligationKind.CLIP,
                reason=f"it clips by the {norm_name(clip.norm)} where the declared policy clips by "
                       f"the {norm_name(policy)}", method=METHOD_RULES,
                fix=CLIP_POLICY_NORM.text(clip=op_label(right))))
            continue
        if clip.norm is NormKind.L2 and clip.reduce is ReduceOp.SUM:
            out.append(_clip_norm(strategy, clip, groups, views, agreed, timeout_ms))
        else:  # another norm, or per-rank norms combined (placeverify.semantics.norms)
            from placeverify.verify.checks.clip_norms import norm_obligation

            out.append(norm_obligation(strategy, clip, policy, groups, views, agreed, timeout_ms))
    return out


def _clip_position(strategy: Strategy, clip: Clip, max_norm: Fraction, groups: Sequence[ParamGroup],
                   agreed: dict[ParamGroup, Agreement]) -> list[str]:
    """What makes a clip statement differ from single-device clipping whatever the norm."""
    problems = []
    if clip.max_norm != max_norm:
        problems.append(f"it clips at max_norm = {float(clip.max_norm):g} while the declared "
                        f"policy clips at {float(max_norm):g}")
    left_out = [g.value for g in groups if not clip.target.applies_to(g)]
    if left_out:
        problems.append(f"it clips {clip.target.label()} by their own norm and leaves out "
                        f"{', '.join(left_out)}: per-group clipping, where single-device training "
                        "clips by the global norm of all parameters")
    if clip.measured is not None:
        unmeasured = [g.value for g in groups if not clip.measures(g)]
        if unmeasured:
            scaled = [g for g in unmeasured if clip.target.applies_to(ParamGroup(g))]
            measured = ", ".join(g.value for g in groups if clip.measures(g))
            problems.append(f"its norm is computed over {measured} only "
                            f"and leaves out {', '.join(unmeasured)}"
                            + (", whose gradients it scales" if scaled else "")
                            + ": per-group norms, where single-device training clips by the "
                              "global norm of all parameters")
    seen = [s for g in groups for s in agreed[g].clips if s.op is clip]
    if any(s.after_update for s in seen):
        problems.append("it runs after 'update params', which already consumed the unclipped "
                        "gradient")
    elif any(not s.after_last_backward for s in seen):
        problems.append("it runs inside the micro-batch loop before the last backward, on a "
                        "partial accumulation of the gradient")
    else:
        again = [g.value for g in groups if any(
            s.op is not clip and not s.after_update for s in _before(agreed[g].clips, clip))]
        if again:
            problems.append(f"it clips the {', '.join(again)} gradients a second time: "
                            "clip_grad_norm_ divides by ||g|| + 1e-6, so clipping an already "
                            "clipped gradient scales it again (by about 1 - 1e-6 / max_norm), "
                            "where single-device training clips once")
    return problems


def _before(seen: Sequence[Seen[Any]], clip: Clip) -> list[Seen[Any]]:
    """The clips a group saw before the first time ``clip`` ran."""
    out = []
    for s in seen:
        if s.op is clip:
            break
        out.append(s)
    return out


def _clip_norm(strategy: Strategy, clip: Clip, groups: Sequence[ParamGroup],
               views: dict[ParamGroup, GroupView], agreed: dict[ParamGroup, Agreement],
               timeout_ms: int) -> Obligation:
    """Is the squared norm the clip computes, summed over its group, the global one?"""
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    claim = (f"clipping scales the update by min(1, {float(clip.max_norm):g} / ||g||) with the "
             "global norm of the single-device gradient")
    true_total: Any = z3.RealVal(0)
    computed: Any = z3.RealVal(0)
    constraints = []
    notes = []
    for group in groups:
        view = views[group]
        t = z3.Real(f"norm2_{group.value}")
        constraints.append(t >= 0)
        true_total = true_total + t
        seen = next(s for s in agreed[group].clips if s.op is clip)
        split = {a for a in view.owned if sizes[a] > 1}
        if seen.sharded:
            split |= {a for a in seen.scattered if sizes[a] > 1}
        missing = sorted(a for a in split if a not in clip.group.axes)
        identical = seen.value.identical
        repeated = [a for a in clip.group.axes if a not in split and sizes[a] > 1
                    and (a in identical or view.relation(a) is Relation.COMPLETE)]
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
    if outcome.status is SolverStatus.UNSAT:
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, clip.span, ObligationKind.CLIP,
                          seconds=outcome.seconds, method=method)
    if outcome.status is SolverStatus.UNKNOWN:
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, clip.span,
                          ObligationKind.CLIP,
                          reason="the solver timed out", method=method)
    model = outcome.model
    true_value = float(solve.value(model, true_total))
    seen_value = float(solve.value(model, computed))
    values = {"true_norm": math.sqrt(true_value), "computed_norm": math.sqrt(seen_value)}

    def factor(norm: float) -> float:
        return min(1.0, float(clip.max_norm) / norm) if norm > 0 else 1.0

    reason = ("; ".join(notes) + f". E.g. a true norm {values['true_norm']:.4g} is computed as "
              f"{values['computed_norm']:.4g}: the update is scaled by "
              f"{factor(values['computed_norm']):.4g} instead of {factor(values['true_norm']):.4g}"
              " whenever either exceeds max_norm")
    from placeverify.verify.fixes import CLIP_NORM

    return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, clip.span, ObligationKind.CLIP,
                      reason=reason, counterexample=values, seconds=outcome.seconds,
                      method=method,
                      fix=CLIP_NORM.text())


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
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span,
                           ObligationKind.RECOMPUTE,
                           reason=why, method="no random stream in the recomputed region")]
    rng = z3.Function("rng", z3.IntSort(), z3.IntSort(), z3.RealSort())
    seed, offset, advance = z3.Int("seed"), z3.Int("offset"), z3.Int("advance")
    replay_offset = offset if recompute.restore_rng else offset + advance
    outcome = solve.check(z3.And(advance >= 1, rng(seed, offset) != rng(seed, replay_offset)),
                          timeout_ms)
    if outcome.status is SolverStatus.UNSAT:
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span,
                           ObligationKind.RECOMPUTE,
                           seconds=outcome.seconds, method=method)]
    if outcome.status is SolverStatus.UNKNOWN:
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, span,
                           ObligationKind.RECOMPUTE,
                           reason="the solver timed out", method=method)]
    model = outcome.model
    values = {"seed": int(solve.value(model, seed)), "forward_offset": int(solve.value(model, offset)),
              "recompute_offset": int(solve.value(model, replay_offset)),
              "forward_mask": str(solve.value(model, rng(seed, offset))),
              "recompute_mask": str(solve.value(model, rng(seed, replay_offset)))}
    reason = (f"recomputation draws dropout masks at RNG offset {values['recompute_offset']} "
              f"instead of {values['forward_offset']} (the state is not restored): the backward "
              "differentiates a different function than the forward computed")
    from placeverify.verify.fixes import RECOMPUTE_RNG

    return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, span, ObligationKind.RECOMPUTE,
                       reason=reason, counterexample=values, seconds=outcome.seconds,
                       method=method,
                       fix=RECOMPUTE_RNG.text())]


def _overflow(strategy: Strategy, timeout_ms: int) -> list[Obligation]:
    if not skips_on_overflow(strategy):  # dynamic loss scaling or 'unless overflow'
        return []
    deciding, misplaced = overflow_reductions(strategy)
    from placeverify.verify.checks.decisions import broadcast_obligations

    return _agreed_skip(strategy, deciding, misplaced, timeout_ms) + \
        broadcast_obligations(strategy, deciding, timeout_ms)


def _agreed_skip(strategy: Strategy, deciding: list[Any], misplaced: list[Any],
                 timeout_ms: int) -> list[Obligation]:
    """Every rank takes the same skip decision (a broadcast flag too: it is shared along its
    group); whether the decision reflects every rank's overflow is the decisions family's."""
    axes = [a.name for a in strategy.mesh.axes if a.size > 1]
    covered = {a for p in deciding for a in p.op.group.axes if p.op.group.covers(a)
               and shares_decision(strategy, p.op)}
    # Ranks that consume an identical (already reduced) gradient see the same inf/NaN, since a
    # sum carries it to every rank; only axes where they consume different elements or different
    # values need the flag reduced (Megatron reduces found_inf over the model-parallel group).
    missing = [a for a in axes if a not in covered and not same_gradient_everywhere(strategy, a)]
    skipping = "dynamic loss scaling" if strategy.loss_scale == LossScale.DYNAMIC else \
        "'update params unless overflow'"
    claim = f"with {skipping} every rank takes the same skip decision"
    ops = [p.op for p in deciding + misplaced]
    span = ops[0].span if ops else strategy.step.span or strategy.placements[0].span
    flags = {a: z3.Bool(f"overflow_{a}") for a in axes}
    # Each rank skips iff a rank in its reduction group overflowed; ranks along a missing axis see
    # different flags.
    skip_x = z3.Or(*[flags[a] for a in covered if a in flags], z3.Bool("overflow_here"))
    skip_y = z3.Or(*[flags[a] for a in covered if a in flags],
                   z3.Bool("overflow_there") if missing else z3.Bool("overflow_here"))
    outcome = solve.check(skip_x != skip_y, timeout_ms)
    method = "z3 (propositional)"
    if outcome.status is SolverStatus.UNSAT:
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span, ObligationKind.OVERFLOW,
                           seconds=outcome.seconds, method=method)]
    late = [p for p in misplaced if p.after_update]
    early = [p for p in misplaced if not p.after_update]
    where = ""
    if late:
        span = late[0].op.span
        where = (f" before the update: '{late[0].op.label()}' runs after 'update params', when "
                 "each rank has already decided on its own whether to skip")
    elif early:
        span = early[0].op.span
        where = (f" after the last backward: '{early[0].op.label()}' runs before the last "
                 "micro-batch's gradients exist, so their overflow is never shared")
    reason = (f"the overflow flag is not reduced over {', '.join(missing)}{where}, where ranks "
              "consume different gradients: a rank whose gradients overflowed skips the step "
              "while ranks holding other parts of the model apply it")
    from placeverify.verify.fixes import OVERFLOW

    return [Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, span, ObligationKind.OVERFLOW,
                       reason=reason, counterexample={"unreduced_axes": missing},
                       seconds=outcome.seconds, method=method,
                       fix=OVERFLOW.text())]


def _shards(strategy: Strategy) -> list[Obligation]:
    out = []
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for group in strategy.model.groups_present():
        agree = agreement(strategy, group_view(strategy, group))
        scattered = {a for a in agree.scattered if sizes[a] > 1}
        layout = set(optimizer_axes(strategy, group))
        if not scattered or scattered == layout:
            continue
        scatter = next((op for op in reversed(strategy.step.ops()) if isinstance(op, Collective)
                        and op.kind is CollectiveKind.REDUCE_SCATTER
                        and op.target.kind is TargetKind.GRADS and op.target.applies_to(group)),
                       None)
        span = scatter.span if scatter is not None else strategy.step.span
        shard = " * ".join(a for a in strategy.mesh.names if a in scattered)
        if layout:
            state = f"the optimizer state is sharded over {' * '.join(sorted(layout))} only"
        else:
            state = "the optimizer state is replicated (Ω = R)"
        from placeverify.verify.fixes import SHARD_MISMATCH

        out.append(Obligation(
            Condition.GRADIENT_INTEGRITY,
            f"the optimizer step on the {group.value} parameters reads only gradient elements "
            "that were reduced",
            Verdict.REFUTED, span, ObligationKind.SHARD_MISMATCH,
            reason=f"the update consumes a gradient shard laid out over {shard} (1/"
                   f"{math.prod(sizes[a] for a in scattered)} per rank, each rank's own part), "
                   f"but {state}, so the step updates elements of its optimizer slice from "
                   "gradients that were never reduced",
            fix=SHARD_MISMATCH.text(),
            method=METHOD_RULES))
    update = next((op for op in strategy.step.post if isinstance(op, Update)), None)
    for p in strategy.placements:
        if sizes[p.axis] < 2 or update is None or not any(
                partitions(strategy, p.axis, State.OPTIMIZER, g)
                for g in strategy.model.groups_present()):
            continue
        for op in strategy.step.post:
            if (isinstance(op, Collective) and op.kind is CollectiveKind.BROADCAST
                    and op.target.kind is TargetKind.PARAMS and not op.from_owner
                    and op.group.covers(p.axis)):
                from placeverify.verify.fixes import LOST_UPDATE

                out.append(Obligation(
                    Condition.GRADIENT_INTEGRITY,
                    f"every shard's update over {p.axis} reaches all ranks",
                    Verdict.REFUTED, op.span, ObligationKind.LOST_UPDATE,
                    reason=f"the optimizer state is sharded over {p.axis}, so rank {op.source} "
                           "updated only its own shard; broadcasting its copy overwrites the "
                           "other shards' updates on every rank",
                    fix=LOST_UPDATE.text(),
                    method=METHOD_RULES))
    return out
