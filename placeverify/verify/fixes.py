"""One-line fixes for refutations that match a known bug pattern (REFERENCE §3)."""

from __future__ import annotations

import math
from fractions import Fraction

from placeverify.evidence import Cause, Counterexample, Divergence
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role
from placeverify.ir.presets import hybrid
from placeverify.ir.step import CollectiveKind, Free
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.roles.relations import batch_axes
from placeverify.semantics.groups import GroupView
from placeverify.verdicts import Obligation
from placeverify.verify.explain import has_local_count, ratio_pattern, reductions_of


def integrity_fix(strategy: Strategy, view: GroupView, found: Counterexample) -> str | None:
    group = view.group
    sizes = found.sizes
    reduced = {a for op in reductions_of(strategy, group)
               if op.kind is not CollectiveKind.ALL_GATHER for a in op.group.axes}
    missing = [a for a in view.coordinates if a not in reduced and a not in view.routed
               and view.size(a, sizes) > 1]
    if group is ParamGroup.EMBEDDING and any(a in view.ends for a in missing):
        axis = next(a for a in missing if a in view.ends)
        return (f"all_reduce(sum) grads[embedding] over ends({axis}) before the data-parallel "
                "reduction: both stages hold the tied embedding (Megatron's embedding group; "
                "Megatron-LM#656)")
    sp_axes = [a for a in missing if a in view.extra and strategy.placement(a).role is Role.TENSOR]
    if group is ParamGroup.NORMS and sp_axes:
        return (f"all_reduce(sum) grads[norms] over {sp_axes[0]}: under sequence parallelism each "
                "rank sees part of the sequence, so LayerNorm gradients are partial "
                "(gpt-neox#1257, TransformerEngine#441)")
    if strategy.loss.kind is LossKind.TOKEN_MEAN and has_local_count(strategy) and \
            found.microbatches > 1:
        axes = ", ".join([*batch_axes(strategy), "step"])
        return (f"normalise by the global token count: 'backward sum / tokens({axes})' with "
                "sum reductions and no division by the number of micro-batches "
                "(transformers#34191)")
    if missing:
        data = [a for a in missing if a in view.batch]
        if data:
            hsdp = [p for p in strategy.placements if hybrid(p.preset)]
            if hsdp and data[0] == hsdp[-1].axis:
                shard = hsdp[0].axis
                return (f"all_reduce(sum) grads over {data[0]} after the reduce-scatter over "
                        f"{shard}: HSDP must synchronise replicas even when the shard group has "
                        f"{sizes.get(shard, 1)} rank (verl#7493)")
            return (f"all_reduce(sum) grads over {' * '.join(data)} after the last micro-batch: "
                    "without it each replica trains on its own data and they drift")
    ratio = ratio_pattern(strategy, view, found)
    if ratio == 0:
        freed = [op for op in strategy.step.ops() if isinstance(op, Free)
                 and op.target.applies_to(group)]
        if freed:
            return (f"'free {freed[0].target.label()}' (line {freed[0].span.line}) drops the "
                    "gradient before the update consumes it: free after 'update params', or "
                    "reduce-scatter into the shard first")
        return None
    if ratio is not None and ratio != 1:
        named = _size_product(strategy, sizes, ratio)
        if named is not None and ratio > 1:
            cp = strategy.axes(Role.CONTEXT)
            if cp and named == cp[0]:
                return (f"gradients are |{named}|x too large: the loss is multiplied by |{named}| "
                        "while the reduction over the data and context axes is scaled by the "
                        "data-parallel size only (Megatron-LM#673)")
            return (f"gradients are |{named}|x too large: a sum reduction over {named} without "
                    f"dividing by |{named}|; use all_reduce(mean) or divide the loss by the global "
                    "count")
        if named is not None and ratio < 1:
            return (f"gradients are |{named}|x too small: the division by |{named}| happens twice "
                    "(the loss is already divided by the global count and the all-reduce "
                    "averages); use all_reduce(sum) or drop one division")
    return None


def _size_product(strategy: Strategy, sizes: dict[str, int], ratio: Fraction) -> str | None:
    target = ratio if ratio > 1 else 1 / ratio
    axes = [p.axis for p in strategy.placements if sizes[p.axis] > 1]
    for r in range(1, len(axes) + 1):
        for combo in _combinations(axes, r):
            if math.prod(sizes[a] for a in combo) == target:
                return " * ".join(combo)
    return None


def _combinations(items: list[str], r: int) -> list[tuple[str, ...]]:
    from itertools import combinations

    return list(combinations(items, r))


def consistency_fix(strategy: Strategy, obligation: Obligation,
                     divergence: Divergence | None) -> str | None:
    if divergence is None:
        return None
    axis = divergence.axis
    if divergence.cause is Cause.STALE_SHARD:
        return (f"all_gather params over {axis} after the update: each rank updated only its "
                "optimizer shard (ZeRO-1/2)")
    if divergence.cause is Cause.RNG:
        return (f"seed dropout(replicated) same over {axis}: replicated regions need one random "
                "stream across tensor-parallel ranks (Megatron's model-parallel RNG tracker; "
                "Megatron-DeepSpeed#276)")
    if divergence.cause is Cause.BITWISE:
        return ("reduce in one fixed order on every rank (a ring or tree all-reduce gives every "
                "rank the same bits)")
    if divergence.cause is Cause.SKIP:
        return "all_reduce(max) overflow over world"
    if divergence.cause is Cause.CLIP:
        return "sum the squared gradient norm over every axis where ranks hold different gradients"
    if divergence.cause is Cause.GRADIENT:
        if divergence.group.value == "embedding" and axis in strategy.axes():
            return (f"all_reduce(sum) grads[embedding] over ends({axis}): the first and last stage "
                    "hold copies of the tied embedding (Megatron-LM#656)")
        return f"reduce the gradients over {axis} after the last backward"
    return None
