"""One parameter group's view of the mesh, shared by the exact interpreter and the Z3 encoding.

The global batch is a set of *atoms*: the tokens one device computes in one micro-batch, indexed
by the device's coordinates on the batch axes (data, context, expert) and the micro-batch. Each
atom has a token (and sample) count and contributes a gradient sum S. For a parameter group, an
atom may further be split into *chunks* along extra axes where the group's gradient is partial
but the loss is shared (tensor-parallel ranks under sequence parallelism for the norms; the first
and last pipeline stage for a tied embedding). Along *routed* axes (expert parallelism, for the
experts) a device's local gradient already covers every coordinate. Along *complete* axes ranks
hold identical full copies; along *owned* axes they hold different parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.relations import Relation
from placeverify.ir.strategy import Strategy
from placeverify.roles import ROLES
from placeverify.roles.relations import batch_axes, relation, routed_axes, sample_axes


@dataclass(frozen=True, slots=True)
class GroupView:
    group: ParamGroup
    batch: tuple[str, ...]  # axes with their own tokens (and counts)
    samples: tuple[str, ...]  # batch axes that split samples (data, expert); context splits tokens
    extra: tuple[str, ...]  # partial axes without separate counts (chunks of an atom)
    ends: frozenset[str]  # extra axes that count only their first and last coordinate
    routed: tuple[str, ...]  # batch axes whose atoms reach this group locally
    complete: tuple[str, ...]
    owned: tuple[str, ...]

    @property
    def coordinates(self) -> tuple[str, ...]:
        """Axes along which atoms (and chunks) of this group are told apart."""
        return (*self.batch, *self.extra)

    def size(self, axis: str, sizes: dict[str, int]) -> int:
        """An axis's size as this group sees it (ends(pp) has at most two members)."""
        return min(2, sizes[axis]) if axis in self.ends else sizes[axis]

    def relation(self, axis: str) -> Relation:
        if axis in self.routed or axis in self.owned:
            return Relation.OWNED
        if axis in self.complete:
            return Relation.COMPLETE
        return Relation.PARTIAL


def group_view(strategy: Strategy, group: ParamGroup) -> GroupView:
    batch = batch_axes(strategy)
    extra: list[str] = []
    ends: set[str] = set()
    complete: list[str] = []
    owned: list[str] = []
    routed = routed_axes(strategy, group)
    for p in strategy.placements:
        if p.axis in batch:
            if p.axis in routed:
                owned.append(p.axis)
            continue
        rel = relation(strategy, group, p.axis)
        if rel is Relation.PARTIAL:
            extra.append(p.axis)
            if ROLES[p.role].partial_at_ends:
                ends.add(p.axis)
        elif rel is Relation.COMPLETE:
            complete.append(p.axis)
        else:
            owned.append(p.axis)
    return GroupView(group, batch, sample_axes(strategy), tuple(extra), frozenset(ends),
                     tuple(routed), tuple(complete), tuple(owned))


def ends_match(view: GroupView, group: Group, axis: str, size: object) -> bool:
    """Does a reduction over ``group`` along ``axis`` treat the pipeline ends as this parameter
    group needs? ``ends(pp)`` names the first and last stage, which hold the tied embedding; for
    that group it is the whole axis when the axis has at most two stages, so ``over pp`` is
    then the same group. For a group not tied across stages, ``ends(pp)`` spans stages holding
    different parameters whenever the axis has more than one. A symbolic size stands for every
    size >= 2, so it is taken as large."""
    small = isinstance(size, int)
    if (axis in view.ends) == (axis in group.ends):
        return True
    if axis in view.ends:
        return small and size <= 2  # type: ignore[operator]
    return small and size <= 1  # type: ignore[operator]
