"""What a parallelism role means, as one record per role.

A mesh axis has a role (:class:`placeverify.ir.placement.Role`): what its ranks split. Every
question the backends ask about a role (which modes it can realise, how a gradient relates to
its ranks, which dimensions it must divide, what memory divides by it, where the canonical step
reduces over it) is answered by the role's :class:`RoleSpec`, one module per role in this
package and one registry (:data:`placeverify.roles.ROLES`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

from placeverify.ir.model import ParamGroup, Transformer
from placeverify.ir.placement import AxisPlacement, Mode, Role, State
from placeverify.ir.relations import Relation
from placeverify.ir.step import Region
from placeverify.ir.strategy import Layout
from placeverify.roles.shapes import Reporter

Modes = tuple[frozenset[Mode], frozenset[Mode], frozenset[Mode], frozenset[Mode]]  # Θ, Ω, G, A
RelationRule = Callable[[Layout, ParamGroup, AxisPlacement], Relation]
ShapeChecks = Callable[[Reporter, Transformer, list[tuple[str, int]], list[AxisPlacement], int], None]


class Phase(StrEnum):
    """Where the canonical step sums a gradient that is partial along an axis of the role."""

    TIE = "tie"  # the tied embedding, over the end stages, first
    SEQUENCE_PARALLEL = "sp"  # the sequence-parallel replicated parameters
    BATCH = "batch"  # the batch axes: reduce-scatter where updated on shards, else all-reduce


def modes(*columns: set[Mode]) -> Modes:
    """The allowed modes of (Θ, Ω, G, A), one set each."""
    theta, omega, grads, acts = (frozenset(c) for c in columns)
    return theta, omega, grads, acts


def sharded_only(placement: AxisPlacement) -> tuple[Region, ...]:
    """The dropout regions of an axis whose ranks see different activations: sharded only."""
    return (Region.SHARDED,)


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """What one role means, to every backend."""

    role: Role
    allowed_modes: Modes  # the modes of (Θ, Ω, G, A) the role can realise
    why: Mapping[State, str]  # why a state's mode is restricted, for the refutation
    relation: RelationRule  # how a group's gradient relates to the axis's ranks
    splits_tokens: bool  # do the ranks see different tokens (a token count sums over them)?
    splits_samples: bool  # ... different samples (context splits sequences, not samples)?
    replicates_model: bool  # do the ranks hold the same parameters, so S is a ZeRO partition?
    splits_model: Callable[[ParamGroup], bool]  # does a sharded state hold a part of this group?
    sums_norm: Callable[[Collection[ParamGroup]], bool]  # do ranks hold different parameters?
    canonical_phase: Phase
    partial_at_ends: bool = False  # is a partial gradient held only by the end ranks?
    needs_arch: bool = False  # does the role split a dimension of the architecture?
    needs_moe: bool = False  # does the role split the experts of a mixture-of-experts model?
    shape_checks: ShapeChecks | None = None  # what it must divide, over all of its axes
    dropout_regions: Callable[[AxisPlacement], tuple[Region, ...]] = sharded_only
    seeded_alone: bool = False  # does the canonical step seed each axis of the role by itself?
    reported_options: tuple[str, ...] = ()  # the AxisPlacement options a JSON report shows


def never(groups: Collection[ParamGroup]) -> bool:
    return False


def always(groups: Collection[ParamGroup]) -> bool:
    return True


def no_group(group: ParamGroup) -> bool:
    return False


def every_group(group: ParamGroup) -> bool:
    return True

