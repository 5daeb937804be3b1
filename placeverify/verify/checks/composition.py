"""Composition safety: strategies combined over several axes still make sense together.

Three kinds of obligations:

- *reduction groups*: every collective on gradients or parameters runs only over axes where the
  targeted groups are partial (summing parts), replicated (identical copies) or, for the
  parameter all-gather, sharded by the optimizer; an axis where ranks hold different parameters
  (a tensor-parallel shard, another pipeline stage, another expert) would mix them;
- *realisable modes*: each axis's (Θ, Ω, G, A) is one its role can realise, e.g. a data-parallel
  rank needs its layers' full parameters (R, S* or O, not S), an optimizer step on a shard needs
  only that shard's gradient but a replicated one needs all of it;
- *ordering hazards*: a synchronisation decided on a micro-batch before the last leaves later
  micro-batches unreduced; a pipeline that frees gradients reduced per micro-batch loses what it
  accumulates. (A tied-embedding sum after a reduce-scatter is not one: each parameter group has
  its own gradient buffer, so the first and last stage shard the embedding alike. Megatron-LM's
  single contiguous buffer per stage, where they do not — Megatron-LM#844 — is not modelled.)

These are decided by rules over the placement relations (:mod:`placeverify.roles.relations`), not
by a solver; each refutation names the statement and the axis. The family ends with the
placement-step obligations (:mod:`placeverify.verify.placement_step`).
"""

from __future__ import annotations

from collections.abc import Iterator

from placeverify.diagnostics import Code, Diagnostic, Severity, Span
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, State
from placeverify.ir.relations import Relation
from placeverify.ir.step import Collective, CollectiveKind, Free, ReduceOp, TargetKind
from placeverify.ir.strategy import Strategy
from placeverify.roles import ROLES
from placeverify.roles.queries import partitions, replicates_model
from placeverify.roles.relations import relation, routed_axes
from placeverify.semantics.groups import ends_match, group_view
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.check import Check, Context, Finding
from placeverify.verify.placement_step import placement_step_obligations

METHOD = "rules over the placement relations"


def findings(strategy: Strategy, ctx: Context) -> Iterator[Finding]:
    """The obligations in order; the warnings (cost notes) ride on the first, since every one
    is found beside an obligation."""
    obligations, warnings = composition_obligations(strategy)
    for index, obligation in enumerate(obligations):
        yield Finding(obligation, warnings=tuple(warnings) if index == 0 else ())


CHECK = Check(Condition.COMPOSITION_SAFETY, "composition safety", findings)


def composition_obligations(strategy: Strategy) -> tuple[list[Obligation], list[Diagnostic]]:
    obligations: list[Obligation] = []
    warnings: list[Diagnostic] = []
    obligations.extend(_realisable(strategy))
    obligations.extend(_groups(strategy, warnings))
    obligations.extend(_ordering(strategy, warnings))
    obligations.extend(placement_step_obligations(strategy))
    return obligations, warnings


def _ok(claim: str, span: Span | None, kind: ObligationKind) -> Obligation:
    return Obligation(Condition.COMPOSITION_SAFETY, claim, Verdict.PROVED, span, kind, method=METHOD)


def _bad(claim: str, span: Span | None, kind: ObligationKind, reason: str,
         fix: str | None = None) -> Obligation:
    return Obligation(Condition.COMPOSITION_SAFETY, claim, Verdict.REFUTED, span, kind,
                      reason=reason, fix=fix, method=METHOD)


def _realisable(strategy: Strategy) -> list[Obligation]:
    out = []
    for p in strategy.placements:
        claim = f"the modes {p.tuple_text()} over {p.axis} ({p.role.value}) can be realised"
        problems = []
        spec = ROLES[p.role]
        allowed = spec.allowed_modes
        for index, state in enumerate((State.PARAMS, State.OPTIMIZER, State.GRADIENTS,
                                       State.ACTIVATIONS)):
            mode = p.modes[index]
            if mode not in allowed[index]:
                why = spec.why.get(state, "")
                problems.append(f"{state.symbol} = {mode.value} is not a mode of a "
                                f"{p.role.value} axis" + (f" ({why})" if why else ""))
        if spec.replicates_model and p.mode(State.GRADIENTS).sharded and \
                not p.mode(State.OPTIMIZER).sharded:
            problems.append(f"G is sharded over {p.axis} but Ω is replicated: a replicated "
                            "optimizer step needs the full gradient of every element it updates")
        if problems:
            out.append(_bad(claim, p.span, ObligationKind.REALISABLE, "; ".join(problems)))
        else:
            out.append(_ok(claim, p.span, ObligationKind.REALISABLE))
    return out


def _groups(strategy: Strategy, warnings: list[Diagnostic]) -> list[Obligation]:
    out = []
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for op in strategy.step.ops():
        if not isinstance(op, Collective):
            continue
        kind = op.target.kind
        if kind in (TargetKind.TOKENS, TargetKind.OVERFLOW, TargetKind.ACTIVATIONS):
            continue
        claim = f"'{op.label()}' runs over a group that matches the placement"
        problems = []
        if kind is TargetKind.GRADS and op.op is ReduceOp.MAX and op.group.size_of(sizes) > 1:
            problems.append("gradients are reduced with sum or mean, not max")
        idle = [a for a in op.group.axes if sizes[a] > 1 and kind is TargetKind.PARAMS
                and (replicates_model(strategy.placement(a))
                     or any(replicates_model(strategy.placement(a), g)
                            for g in strategy.model.groups_present() if op.target.applies_to(g)))
                and not any(partitions(strategy, a, State.OPTIMIZER, g)
                            for g in strategy.model.groups_present() if op.target.applies_to(g))]
        if idle:
            warnings.append(Diagnostic(
                Severity.WARNING,
                f"'{op.label()}': every rank along {', '.join(idle)} updates whole parameters "
                "(the optimizer state is not sharded there), so this gather moves bytes and "
                "changes nothing", Code.COST, op.span))
        for group in strategy.model.groups_present():
            if not op.target.applies_to(group):
                continue
            for axis in op.group.axes:
                if sizes[axis] < 2:
                    continue
                problem = _axis_problem(strategy, op, group, axis)
                if problem:
                    problems.append(problem)
        if problems:
            out.append(_bad(claim, op.span, ObligationKind.REDUCTION_GROUP,
                            "; ".join(dict.fromkeys(problems))))
        else:
            out.append(_ok(claim, op.span, ObligationKind.REDUCTION_GROUP))
    for op in strategy.step.ops():
        if isinstance(op, Collective) and op.kind is CollectiveKind.ALL_TO_ALL:
            # with the tensor axes the experts split whole over (place expert over tp * ep)
            experts = set(strategy.axes(Role.EXPERT)) | {
                q.axis for q in strategy.placements if q.experts_split}
            claim = f"'{op.label()}' routes tokens over the expert-parallel axes"
            if set(op.group.axes) != experts:
                want = " * ".join(sorted(experts)) or "(no expert axis)"
                out.append(_bad(claim, op.span, ObligationKind.ROUTING,
                                f"the experts are sharded over {want}, so tokens must be routed "
                                f"over exactly that group, not {op.group.label()}"))
            else:
                out.append(_ok(claim, op.span, ObligationKind.ROUTING))
    return out


def _axis_problem(strategy: Strategy, op: Collective, group: ParamGroup, axis: str) -> str:
    placement = strategy.placement(axis)
    view = group_view(strategy, group)
    if op.target.kind is TargetKind.PARAMS:
        if replicates_model(placement, group):
            return ""  # each element from its owner; with Ω whole there, every rank owns it
        return (f"{axis}: ranks along this {placement.role.value} axis hold different "
                f"{group.value} parameters; gathering them would assemble other ranks' shards")
    if not ends_match(view, op.group, axis, strategy.size(axis)):
        if axis in view.ends:
            return (f"{axis}: only the first and last stage hold the tied embedding; reduce over "
                    f"ends({axis})")
        return f"ends({axis}): the {group.value} parameters are not tied across stages"
    rel = relation(strategy, group, axis)
    if axis in routed_axes(strategy, group):
        return (f"{axis}: each rank of this expert axis holds different experts, and its expert "
                "gradients already include every rank's tokens (routed by all-to-all)")
    if rel is Relation.OWNED:
        return (f"{axis}: ranks along this {placement.role.value} axis hold different "
                f"{group.value} parameters, so a reduction over {axis} adds unrelated gradients")
    return ""


def _ordering(strategy: Strategy, warnings: list[Diagnostic]) -> list[Obligation]:
    out: list[Obligation] = []
    step = strategy.step
    # a synchronisation decided before the last micro-batch
    m = step.microbatches
    for lo in step.loop:
        op = lo.op
        if not (isinstance(op, Collective) and op.target.kind is TargetKind.GRADS
                and lo.microbatch is not None and lo.microbatch < m - 1):
            continue
        later = any(isinstance(o.op, Collective) and o.op.target.kind is TargetKind.GRADS
                    and o.op.kind is not CollectiveKind.ALL_GATHER
                    and (o.microbatch is None or o.microbatch > lo.microbatch)
                    for o in step.loop) or any(
            isinstance(o, Collective) and o.target.kind is TargetKind.GRADS for o in step.post)
        claim = "gradient synchronisation happens after the last micro-batch"
        if later:
            out.append(_ok(claim, op.span, ObligationKind.ORDERING))
        else:
            out.append(_bad(claim, op.span, ObligationKind.ORDERING,
                            f"'{op.label()}' runs on micro-batch {lo.microbatch} of {m}; the "
                            f"gradients of micro-batch{'es' if m - lo.microbatch > 2 else ''} "
                            f"{lo.microbatch + 1}..{m - 1} are accumulated after it and never "
                            "reduced",
                            "synchronise on the last micro-batch ('on microbatch last') or after "
                            "the loop"))
    # per-micro-batch reductions inside a pipeline's accumulation
    pipeline = strategy.pipeline
    per_mb = [lo.op for lo in step.loop if lo.microbatch is None and isinstance(lo.op, Collective)
              and lo.op.target.kind is TargetKind.GRADS]
    if pipeline is not None and strategy.size(pipeline.axis) > 1 and per_mb:
        frees = [lo.op for lo in step.loop if isinstance(lo.op, Free)]
        op = per_mb[0]
        claim = (f"gradients are reduced after the pipeline over {pipeline.axis} finishes "
                 "accumulating its micro-batches")
        assigning = [o for o in per_mb if o.kind is CollectiveKind.REDUCE_SCATTER
                     and not o.accumulate]
        if frees and assigning:
            out.append(_bad(claim, op.span, ObligationKind.ORDERING,
                            f"'{op.label()}' runs on every one of the {m} micro-batches and "
                            f"'free grads' (line {frees[0].span.line}) then drops the accumulated "
                            "gradient, while the shard is overwritten rather than accumulated: "
                            "ZeRO-2/3 with pipeline parallelism (DeepSpeed#1629); it also moves "
                            f"{m}x the gradient bytes of one reduction per step",
                            "reduce once after the last micro-batch (ZeRO-1 with pipelines), or "
                            "'reduce_scatter(sum, accumulate)' and accept the per-micro-batch "
                            "traffic"))
        else:
            out.append(_ok(claim, op.span, ObligationKind.ORDERING))
            warnings.append(Diagnostic(
                Severity.WARNING,
                f"'{op.label()}' runs on each of the {m} micro-batches of the pipeline: "
                f"{m}x the gradient traffic of one reduction after the last micro-batch",
                Code.COST, op.span))
    return out
