"""The canonical (correct) step of a placement, used when a file does not write its own.

It normalises the loss by the global count the declared loss needs (obtained by an all-reduce of
the counts), accumulates every micro-batch locally, and after the last micro-batch reduces each
parameter group's gradient with SUM over exactly the axes where it is partial:

- the tied embedding first over ``ends(pp)`` (before any reduce-scatter, whose shard boundaries
  would not line up across stages),
- the sequence-parallel replicated parameters over ``tp``,
- then the batch axes: reduce-scatter where the optimizer state or gradients are sharded
  (ZeRO-1/2/3, FSDP, the shard axis of HSDP), all-reduce elsewhere (DDP, HSDP's replicas).

Sharded gradients (ZeRO-2/3, FSDP) are reduce-scattered inside the loop, each micro-batch, and the
full buffer freed, unless the data axis says ``reduce = step``: then the unsharded gradient
accumulates and is reduce-scattered once, after the loop.

Then clipping by the global norm (summed where the gradient is sharded, replicated elements
counted once), the overflow flag's all-reduce for dynamic loss scaling, the update, and the
all-gather of parameters that are replicated but updated on shards (ZeRO-1/2, ZeRO-Offload).
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Reduce, Role
from placeverify.ir.precision import LossScale
from placeverify.ir.step import (
    DEFAULT_NORM_REDUCE,
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Count,
    CountKind,
    Free,
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
from placeverify.ir.strategy import Config, LossKind
from placeverify.roles import ROLES
from placeverify.roles.queries import gathered_after_update, gradients_sharded, sharded_update
from placeverify.roles.relations import batch_axes, reduction_axes, sample_axes
from placeverify.roles.spec import Phase


def canonical_loss(config: Config) -> Monomial:
    """The per-micro-batch loss whose gradients sum to the declared single-device loss."""
    loss = config.loss.kind
    factors: list[tuple[Term, int]] = [(Term(TermKind.LOSS_SUM), 1)]
    mesh = config.mesh
    if loss is LossKind.TOKEN_MEAN:
        count = Count(CountKind.TOKENS, batch_axes(config), Scope.STEP)
        factors.append((Term(TermKind.COUNT, count=count), -1))
    elif loss is LossKind.SAMPLE_MEAN:
        count = Count(CountKind.SAMPLES, sample_axes(config), Scope.STEP)
        factors.append((Term(TermKind.COUNT, count=count), -1))
    elif loss is LossKind.MICROBATCH_MEAN:
        count = Count(CountKind.TOKENS, config.axes(Role.CONTEXT), Scope.MICROBATCH)
        factors.append((Term(TermKind.COUNT, count=count), -1))
        factors.append((Term(TermKind.MICROBATCHES), -1))
        if sample_axes(config):
            factors.append((Term(TermKind.SIZE, group=mesh.group(*sample_axes(config))), -1))
    text = " ".join(_render(factors))
    return Monomial(tuple(factors), text)


def _render(factors: list[tuple[Term, int]]) -> list[str]:
    out: list[str] = []
    for index, (term, exponent) in enumerate(factors):
        if index:
            out.append("*" if exponent > 0 else "/")
        out.append(term.label())
    return out


def derive(config: Config) -> Step:
    loop: list[LoopOp] = [LoopOp(Backward(canonical_loss(config), config.model_span))]
    for term in config.terms:  # each named loss term normalised as its own loss says
        own = canonical_loss(replace(config, loss=term.loss))
        loop.append(LoopOp(Backward(own, term.span, term.name, term.reaches)))
    post = _post(config)
    if config.microbatches > 1:
        # Sharded gradients (ZeRO-2/3, FSDP) cannot hold the full accumulated gradient: reduce
        # each micro-batch into the shard and free the full buffer, as DeepSpeed and FSDP do.
        groups = config.model.groups_present()
        # 'reduce = step' keeps the reduce-scatter after the loop (the gradient accumulates
        # unsharded, FSDP2's set_requires_gradient_sync(False) before the last micro-batch)
        per_microbatch = [op for op in post if isinstance(op, Collective)
                          and op.kind is CollectiveKind.REDUCE_SCATTER
                          and all(gradients_sharded(config, a, g) for a in op.group.axes
                                  for g in groups if op.target.applies_to(g))
                          and all(config.placement(a).reduce is Reduce.MICROBATCH
                                  for a in op.group.axes)]
        if per_microbatch:
            span = config.placements[0].span
            for op in per_microbatch:
                post.remove(op)
                loop.append(LoopOp(replace(op, accumulate=True)))
            freed = frozenset(g for op in per_microbatch for g in groups
                              if op.target.applies_to(g))
            selector = None if len(freed) == len(groups) else freed  # per-group meshes
            loop.append(LoopOp(Free(Target(TargetKind.GRADS, selector, None), span)))
    return Step(config.microbatches, (), tuple(loop), tuple(post), tuple(_seeds(config)),
                True, None)


def _phase(config: Config, axis: str) -> Phase:
    return ROLES[config.placement(axis).role].canonical_phase


def _post(config: Config) -> list[Op]:
    mesh = config.mesh
    span = config.placements[0].span
    groups = config.model.groups_present()
    # Phases in order: the tied embedding first, then sequence-parallel norms, then the batch
    # axes (reduce-scatter before all-reduce, as HSDP does). Groups sharing a reduction share a
    # statement.
    phases: dict[str, dict[ParamGroup, Group]] = {"tie": {}, "sp": {}, "reduce_scatter": {},
                                                   "all_reduce": {}}
    for group in groups:
        needed = reduction_axes(config, group)
        tie = [a for a, ends in needed if ends]
        if tie:
            phases["tie"][group] = Group(tuple(tie), frozenset(tie))
        sp = [a for a, _ in needed if _phase(config, a) is Phase.SEQUENCE_PARALLEL]
        if sp:
            phases["sp"][group] = mesh.group(*sp)
        batch = [a for a, _ in needed if _phase(config, a) is Phase.BATCH]
        scatter = [a for a in batch if sharded_update(config, a, group)]
        rest = [a for a in batch if a not in scatter]
        if scatter:
            phases["reduce_scatter"][group] = mesh.group(*scatter)
        if rest:
            phases["all_reduce"][group] = mesh.group(*rest)

    ops: list[Op] = []
    for phase, plan in phases.items():
        for g in dict.fromkeys(plan.values()):
            members = frozenset(p for p, other in plan.items() if other == g)
            selector = None if len(members) == len(groups) else members
            kind = CollectiveKind.REDUCE_SCATTER if phase == "reduce_scatter" else \
                CollectiveKind.ALL_REDUCE
            ops.append(Collective(kind, ReduceOp.SUM, Target(TargetKind.GRADS, selector, None), g,
                                  span))

    if config.clip is not None:
        norm_axes = [p.axis for p in config.placements
                     if any(sharded_update(config, p.axis, g) for g in groups)
                     or ROLES[p.role].sums_norm(groups)]
        norm = config.clip.norm
        ops.append(Clip(config.clip.max_norm, mesh.group(*norm_axes), True, config.clip.span,
                        norm=norm, reduce=DEFAULT_NORM_REDUCE[norm]))
    if config.loss_scale == LossScale.DYNAMIC:
        ops.append(Collective(CollectiveKind.ALL_REDUCE, ReduceOp.MAX,
                              Target(TargetKind.OVERFLOW), mesh.group(*mesh.names), span))
    ops.append(Update(span))
    gathers: dict[tuple[str, ...], frozenset[ParamGroup]] = {}  # groups alike share a gather
    for group in groups:
        axes = gathered_after_update(config, group)
        gathers[axes] = gathers.get(axes, frozenset()) | {group}
    for gather, members in gathers.items():
        if gather:
            selector = None if len(members) == len(groups) else members
            ops.append(Collective(CollectiveKind.ALL_GATHER, None,
                                  Target(TargetKind.PARAMS, selector, None), mesh.group(*gather),
                                  span))
    return ops


def _seeds(config: Config) -> list[Seed]:
    arch = config.model.arch
    if arch is None or not arch.dropout:
        return []
    mesh = config.mesh
    seeds: list[Seed] = []
    for p in config.placements:
        spec = ROLES[p.role]
        if not spec.seeded_alone:
            continue
        group = mesh.group(p.axis)
        seeds.append(Seed(Region.SHARDED, False, group, p.span))
        if Region.REPLICATED in spec.dropout_regions(p):
            seeds.append(Seed(Region.REPLICATED, True, group, p.span))
    data = list(batch_axes(config))
    if data:
        seeds.append(Seed(Region.SHARDED, False, mesh.group(*data), config.placements[0].span))
    return seeds
