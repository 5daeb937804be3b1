"""How each parameter group's gradient relates to each mesh axis.

This is the one place that says, for a parameter group and an axis, whether ranks along the axis
hold *partial* gradients that must be summed (different data or a different part of the
sequence), *complete* identical copies (a replicated parameter fed replicated activations), or
*owned* disjoint shards (different parameters). The canonical step, the Z3 encoding, the exact
interpreter and the torch replay all read it from here; each role's rule is in its module.
"""

from __future__ import annotations

from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role
from placeverify.ir.relations import Relation
from placeverify.ir.strategy import Layout
from placeverify.roles import ROLES


def relation(strategy: Layout, group: ParamGroup, axis: str) -> Relation:
    placement = strategy.placement(axis)
    return ROLES[placement.role].relation(strategy, group, placement)


def token_roles() -> tuple[Role, ...]:
    """The roles whose ranks see different tokens (data, context, expert)."""
    return tuple(role for role, spec in ROLES.items() if spec.splits_tokens)


def batch_axes(strategy: Layout) -> tuple[str, ...]:
    """The axes that split the tokens."""
    return strategy.axes(*token_roles())


def sample_axes(strategy: Layout) -> tuple[str, ...]:
    """The axes that split the samples (context splits sequences, not samples)."""
    return strategy.axes(*(role for role, spec in ROLES.items() if spec.splits_samples))


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
        out.append((p.axis, ROLES[p.role].partial_at_ends))
    return tuple(out)
