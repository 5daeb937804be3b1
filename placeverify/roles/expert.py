"""Expert parallelism: each rank holds different experts of a mixture-of-experts layer, and
tokens are routed to them by all-to-all; the dense layers see different samples per rank."""

from __future__ import annotations

from collections.abc import Collection

from placeverify.ir.model import ParamGroup, Transformer
from placeverify.ir.placement import AxisPlacement, Mode, Role
from placeverify.ir.relations import Relation
from placeverify.ir.strategy import Layout
from placeverify.roles.shapes import Reporter, need
from placeverify.roles.spec import Phase, RoleSpec, modes


def relation(strategy: Layout, group: ParamGroup, placement: AxisPlacement) -> Relation:
    """The experts are owned; every other group sees different samples (partial)."""
    return Relation.OWNED if group is ParamGroup.EXPERTS else Relation.PARTIAL


def splits_experts(group: ParamGroup) -> bool:
    """Along an expert axis only the experts are split."""
    return group is ParamGroup.EXPERTS


def holds_experts(groups: Collection[ParamGroup]) -> bool:
    return ParamGroup.EXPERTS in groups


def expert_shapes(ctx: Reporter, arch: Transformer, by: list[tuple[str, int]],
                  role_placements: list[AxisPlacement], microbatches: int) -> None:
    """The experts split over the expert axes."""
    p = role_placements[-1]
    if arch.moe:
        # megatron/core/transformer/moe/moe_layer.py: num_moe_experts % ep_size == 0
        need(ctx, "experts", arch.experts, by, p.span)


EXPERT = RoleSpec(
    Role.EXPERT,
    allowed_modes=modes({Mode.S}, {Mode.S}, {Mode.S}, {Mode.R, Mode.M, Mode.O}),
    why={},
    relation=relation,
    splits_tokens=True,
    splits_samples=True,
    replicates_model=False,
    splits_model=splits_experts,
    sums_norm=holds_experts,
    canonical_phase=Phase.BATCH,
    needs_arch=True,
    needs_moe=True,
    shape_checks=expert_shapes,
)
