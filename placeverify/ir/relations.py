"""How each parameter group's gradient relates to each mesh axis.

This is the one place that says, for a parameter group and an axis, whether ranks along the axis
hold *partial* gradients that must be summed (different data or a different part of the
sequence), *complete* identical copies (a replicated parameter fed replicated activations), or
*owned* disjoint shards (different parameters). The canonical step, the Z3 encoding, the exact
interpreter and the torch replay all read it from here.
"""

from __future__ import annotations

from enum import StrEnum

from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role
from placeverify.ir.strategy import Layout


class Relation(StrEnum):
    PARTIAL = "partial"  # ranks hold parts of the gradient: a sum over the axis completes it
    COMPLETE = "complete"  # ranks hold identical full copies: a sum multiplies by the size
    OWNED = "owned"  # ranks hold different parameters: reducing over the axis mixes them


BATCH_ROLES = (Role.DATA, Role.CONTEXT, Role.EXPERT)  # axes that split the tokens
SAMPLE_ROLES = (Role.DATA, Role.EXPERT)  # axes that split the samples (context splits sequences)


def relation(strategy: Layout, group: ParamGroup, axis: str) -> Relation:
    placement = strategy.placement(axis)
    role = placement.role
    if role in (Role.DATA, Role.CONTEXT):
        return Relation.PARTIAL
    if role is Role.EXPERT:
        return Relation.OWNED if group is ParamGroup.EXPERTS else Relation.PARTIAL
    if role is Role.TENSOR:
        if group is ParamGroup.NORMS:
            return Relation.PARTIAL if placement.sequence_parallel else Relation.COMPLETE
        return Relation.OWNED
    assert role is Role.PIPELINE
    if group is ParamGroup.EMBEDDING and tied_across_stages(strategy, axis):
        return Relation.PARTIAL  # over ends(pp): the first and the last stage
    return Relation.OWNED


def tied_across_stages(strategy: Layout, axis: str) -> bool:
    """Is the embedding held by the first and the last stage of this pipeline axis?"""
    arch = strategy.model.arch
    return (arch is not None and arch.tied_embeddings and strategy.placement(axis).role is Role.PIPELINE
            and strategy.size(axis) > 1)


def batch_axes(strategy: Layout) -> tuple[str, ...]:
    return strategy.axes(*BATCH_ROLES)


def sample_axes(strategy: Layout) -> tuple[str, ...]:
    return strategy.axes(*SAMPLE_ROLES)


def routed_axes(strategy: Layout, group: ParamGroup) -> tuple[str, ...]:
    """Batch axes whose tokens already reach this group locally (experts: through all-to-all)."""
    return strategy.axes(Role.EXPERT) if group is ParamGroup.EXPERTS else ()


def reduction_axes(strategy: Layout, group: ParamGroup) -> tuple[tuple[str, bool], ...]:
    """The axes a correct step must sum this group's gradient over, as (axis, only_ends)."""
    out: list[tuple[str, bool]] = []
    routed = routed_axes(strategy, group)
    for p in strategy.placements:
        if p.axis in routed or relation(strategy, group, p.axis) is not Relation.PARTIAL:
            continue
        out.append((p.axis, p.role is Role.PIPELINE))
    return tuple(out)
