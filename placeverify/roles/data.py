"""Data parallelism: every rank holds the same layers and sees different samples (DDP, ZeRO 1-3,
FSDP, HSDP). A state placed S along a data axis is a ZeRO-style partition of one copy."""

from __future__ import annotations

from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import AxisPlacement, Mode, Role, State
from placeverify.ir.relations import Relation
from placeverify.ir.strategy import Layout
from placeverify.roles.spec import Phase, RoleSpec, modes, never, no_group


def relation(strategy: Layout, group: ParamGroup, placement: AxisPlacement) -> Relation:
    """Different samples: every gradient is partial."""
    return Relation.PARTIAL


DATA = RoleSpec(
    Role.DATA,
    allowed_modes=modes({Mode.R, Mode.S_STAR, Mode.O}, {Mode.R, Mode.S, Mode.O},
                        {Mode.R, Mode.S, Mode.O}, {Mode.R, Mode.M, Mode.O}),
    why={State.PARAMS: "a data-parallel rank computes whole layers, so it needs their "
                       "full parameters: R, gathered before use (S*) or streamed (O)"},
    relation=relation,
    splits_tokens=True,
    splits_samples=True,
    replicates_model=True,
    splits_model=no_group,
    sums_norm=never,
    canonical_phase=Phase.BATCH,
)
