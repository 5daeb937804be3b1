"""Context parallelism: every rank holds the same layers and runs them on a different part of
each sequence (ring attention; Megatron-LM's context_parallel_size)."""

from __future__ import annotations

import math

from placeverify.ir.model import ParamGroup, Transformer
from placeverify.ir.placement import AxisPlacement, Mode, Role, State
from placeverify.ir.relations import Relation
from placeverify.ir.strategy import Layout
from placeverify.roles.shapes import Reporter, need
from placeverify.roles.spec import Phase, RoleSpec, modes, never, no_group


def relation(strategy: Layout, group: ParamGroup, placement: AxisPlacement) -> Relation:
    """Different parts of the sequence: every gradient is partial."""
    return Relation.PARTIAL


def context_shapes(ctx: Reporter, arch: Transformer, by: list[tuple[str, int]],
                   role_placements: list[AxisPlacement], microbatches: int) -> None:
    """The sequence split into 2 x cp load-balanced chunks."""
    p = role_placements[-1]
    if math.prod(size for _, size in by) > 1:
        # megatron/training/arguments.py (validate_args): with context_parallel_size > 1,
        # seq_length % (2 * context_parallel_size) == 0 (causal load balancing: 2 x cp
        # chunks, two per rank)
        need(ctx, "seq", arch.seq, [("2", 2), *by], p.span,
             "context parallelism splits the sequence into 2 x cp load-balanced chunks")


CONTEXT = RoleSpec(
    Role.CONTEXT,
    allowed_modes=modes({Mode.R, Mode.S_STAR}, {Mode.R, Mode.S}, {Mode.R, Mode.S}, {Mode.S, Mode.M, Mode.O}),
    why={State.PARAMS: "context-parallel ranks run the same layers on different "
                       "parts of the sequence (R)"},
    relation=relation,
    splits_tokens=True,
    splits_samples=False,
    replicates_model=True,
    splits_model=no_group,
    sums_norm=never,
    canonical_phase=Phase.BATCH,
    needs_arch=True,
    shape_checks=context_shapes,
)
