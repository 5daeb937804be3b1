"""The canonical (correct) step of a placement, used when a file does not write its own.

It normalises the loss by the global count the declared loss needs (obtained by an all-reduce of
the counts), accumulates every micro-batch locally, and after the last micro-batch reduces each
parameter group's gradient with SUM over exactly the axes where it is partial:

- the tied embedding first over ``ends(pp)`` (before any reduce-scatter, whose shard boundaries
  would not line up across stages),
- the sequence-parallel replicated parameters over ``tp``,
- then the batch axes: reduce-scatter where the optimizer state or gradients are sharded
  (ZeRO-1/2/3, FSDP, the shard axis of HSDP), all-reduce elsewhere (DDP, HSDP's replicas).

Then clipping by the global norm (summed where the gradient is sharded, replicated elements
counted once), the overflow flag's all-reduce for dynamic loss scaling, the update, and the
all-gather of parameters that are replicated but updated on shards (ZeRO-1/2, ZeRO-Offload).
"""

from __future__ import annotations

from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Mode, Role, State
from placeverify.ir.relations import batch_axes, reduction_axes, sample_axes
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Count,
    CountKind,
    LoopOp,
    Monomial,
    Op,
    ReduceOp,
    Region,
    Scope,
    Seed,
    Step,
    Target,
    TargetKind,
    Term,
    TermKind,
    Update,
)
from placeverify.ir.strategy import LossKind, Strategy


def canonical_loss(strategy: Strategy) -> Monomial:
    """The per-micro-batch loss whose gradients sum to the declared single-device loss."""
    loss = strategy.loss.kind
    factors: list[tuple[Term, int]] = [(Term(TermKind.LOSS_SUM), 1)]
    mesh = strategy.mesh
    if loss is LossKind.TOKEN_MEAN:
        count = Count(CountKind.TOKENS, batch_axes(strategy), Scope.STEP)
        factors.append((Term(TermKind.COUNT, count=count), -1))
    elif loss is LossKind.SAMPLE_MEAN:
        count = Count(CountKind.SAMPLES, sample_axes(strategy), Scope.STEP)
        factors.append((Term(TermKind.COUNT, count=count), -1))
    elif loss is LossKind.MICROBATCH_MEAN:
        count = Count(CountKind.TOKENS, strategy.axes(Role.CONTEXT), Scope.MICROBATCH)
        factors.append((Term(TermKind.COUNT, count=count), -1))
        factors.append((Term(TermKind.MICROBATCHES), -1))
        if sample_axes(strategy):
            factors.append((Term(TermKind.SIZE, group=mesh.group(*sample_axes(strategy))), -1))
    text = " ".join(_render(factors))
    return Monomial(tuple(factors), text)


def _render(factors: list[tuple[Term, int]]) -> list[str]:
    out: list[str] = []
    for index, (term, exponent) in enumerate(factors):
        if index:
            out.append("*" if exponent > 0 else "/")
        out.append(term.label())
    return out


def derive(strategy: Strategy) -> Step:
    loop = (LoopOp(Backward(canonical_loss(strategy), strategy.model_span)),)
    return Step(strategy.microbatches, (), loop, tuple(_post(strategy)), tuple(_seeds(strategy)),
                True, None)


def _post(strategy: Strategy) -> list[Op]:
    mesh = strategy.mesh
    span = strategy.placements[0].span
    groups = strategy.model.groups_present()
    plans: dict[ParamGroup, list[tuple[str, Group]]] = {}
    for group in groups:
        plan: list[tuple[str, Group]] = []
        needed = reduction_axes(strategy, group)
        tie = [a for a, ends in needed if ends]
        if tie:
            plan.append(("tie", Group(tuple(tie), frozenset(tie))))
        sp = [a for a, _ in needed if strategy.placement(a).role is Role.TENSOR]
        if sp:
            plan.append(("all_reduce", mesh.group(*sp)))
        batch = [a for a, _ in needed if strategy.placement(a).role is not Role.TENSOR
                 and strategy.placement(a).role is not Role.PIPELINE]
        scatter = [a for a in batch if _sharded_update(strategy, a)]
        rest = [a for a in batch if a not in scatter]
        if scatter:
            plan.append(("reduce_scatter", mesh.group(*scatter)))
        if rest:
            plan.append(("all_reduce", mesh.group(*rest)))
        plans[group] = plan

    ops: list[Op] = []
    emitted: set[tuple[ParamGroup, int]] = set()
    for group in groups:
        for index, (kind, g) in enumerate(plans[group]):
            if (group, index) in emitted:
                continue
            same = [other for other in groups
                    if index < len(plans[other]) and plans[other][index] == (kind, g)
                    and (other, index) not in emitted]
            for other in same:
                emitted.add((other, index))
            selector = None if len(same) == len(groups) else frozenset(same)
            target = Target(TargetKind.GRADS, selector, None)
            collective = CollectiveKind.REDUCE_SCATTER if kind == "reduce_scatter" else \
                CollectiveKind.ALL_REDUCE
            ops.append(Collective(collective, ReduceOp.SUM, target, g, span))

    if strategy.clip is not None:
        norm_axes = [p.axis for p in strategy.placements
                     if (p.role is Role.DATA and _sharded_update(strategy, p.axis))
                     or p.role in (Role.TENSOR, Role.PIPELINE)
                     or (p.role is Role.EXPERT and ParamGroup.EXPERTS in groups)]
        ops.append(Clip(strategy.clip.max_norm, mesh.group(*norm_axes), True, strategy.clip.span))
    if strategy.loss_scale == "dynamic":
        ops.append(Collective(CollectiveKind.ALL_REDUCE, ReduceOp.MAX,
                              Target(TargetKind.OVERFLOW), mesh.group(*mesh.names), span))
    ops.append(Update(span))
    gather = [p.axis for p in strategy.placements
              if p.role is Role.DATA and p.mode(State.PARAMS) is Mode.R
              and p.mode(State.OPTIMIZER).sharded]
    if gather:
        ops.append(Collective(CollectiveKind.ALL_GATHER, None, Target(TargetKind.PARAMS),
                              mesh.group(*gather), span))
    return ops


def _sharded_update(strategy: Strategy, axis: str) -> bool:
    """Is the optimizer step along this data axis done on shards (ZeRO-1/2/3, FSDP, offload)?"""
    p = strategy.placement(axis)
    return p.role is Role.DATA and (p.mode(State.OPTIMIZER).sharded or p.mode(State.GRADIENTS).sharded)


def _seeds(strategy: Strategy) -> list[Seed]:
    arch = strategy.model.arch
    if arch is None or not arch.dropout:
        return []
    mesh = strategy.mesh
    seeds: list[Seed] = []
    for p in strategy.placements:
        if p.role is not Role.TENSOR:
            continue
        group = mesh.group(p.axis)
        seeds.append(Seed(Region.SHARDED, False, group, p.span))
        if not p.sequence_parallel:
            seeds.append(Seed(Region.REPLICATED, True, group, p.span))
    data = list(batch_axes(strategy))
    if data:
        seeds.append(Seed(Region.SHARDED, False, mesh.group(*data), strategy.placements[0].span))
    return seeds
