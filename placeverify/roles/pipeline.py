"""Pipeline parallelism: each rank (stage) holds a contiguous part of the layer stack (GPipe,
1F1B, Megatron-LM's interleaved schedule); a tied embedding lives on the first and last stage."""

from __future__ import annotations

import math

from placeverify.diagnostics import Code
from placeverify.ir.model import ParamGroup, Transformer
from placeverify.ir.placement import AxisPlacement, Mode, Role, Schedule, State
from placeverify.ir.relations import Relation
from placeverify.ir.strategy import Layout
from placeverify.roles.shapes import Reporter, need
from placeverify.roles.spec import Phase, RoleSpec, always, every_group, modes


def relation(strategy: Layout, group: ParamGroup, placement: AxisPlacement) -> Relation:
    """Stages own their layers; the tied embedding is partial over the end stages."""
    if group is ParamGroup.EMBEDDING and tied_across_stages(strategy, placement.axis):
        return Relation.PARTIAL  # over ends(pp): the first and the last stage
    return Relation.OWNED


def tied_across_stages(strategy: Layout, axis: str) -> bool:
    """Is the embedding held by the first and the last stage of this pipeline axis?"""
    arch = strategy.model.arch
    return (arch is not None and arch.tied_embeddings and strategy.placement(axis).role is Role.PIPELINE
            and strategy.size(axis) > 1)


def pipeline_shapes(ctx: Reporter, arch: Transformer, by: list[tuple[str, int]],
                    role_placements: list[AxisPlacement], microbatches: int) -> None:
    """Layers split over the stages (and chunks); an interleaved schedule's stage count."""
    p = role_placements[-1]
    n = math.prod(size for _, size in by)
    # megatron/training/arguments.py (validate_args): num_layers % pp == 0, and with
    # --num-layers-per-virtual-pipeline-stage (num_layers / pp) % layers_per_chunk == 0:
    # together, layers % (pp * chunks) == 0
    chunks = math.prod(q.chunks for q in role_placements)
    if chunks > 1:
        need(ctx, "layers", arch.layers, [*by, ("chunks", chunks)], p.span,
             f"{n} stages of {chunks} chunks each hold the same number of layers")
    else:
        need(ctx, "layers", arch.layers, by, p.span,
             "each pipeline stage holds the same number of layers")
    if any(q.schedule is Schedule.INTERLEAVED for q in role_placements):
        check_interleaved(ctx, p, " x ".join(name for name, _ in by), n, microbatches)


def check_interleaved(ctx: Reporter, p: AxisPlacement, label: str, n: int, microbatches: int) -> None:
    # megatron/training/arguments.py: a virtual pipeline needs pipeline-model-parallel size
    # > 1 (> 2 without --overlap-p2p-comm); schedules.py runs micro-batches in groups of
    # microbatch_group_size_per_vp_stage (default pp) and raises when the last group is
    # smaller than pp: microbatches % pp == 0
    if n < 2:
        ctx.error(f"the interleaved schedule needs at least 2 pipeline stages, but {label} = "
                  f"{n}", Code.BAD_VALUE, p.span,
                  "Megatron-LM asserts pipeline-model-parallel size > 1 for a virtual "
                  "pipeline (> 2 without --overlap-p2p-comm)")
    elif microbatches % n:
        ctx.error(f"the interleaved schedule needs microbatches ({microbatches:,}) "
                  f"divisible by {label} ({n:,})", Code.NOT_DIVISIBLE, p.span,
                  "Megatron-LM runs micro-batches in groups of pp on each model chunk and "
                  "rejects a last group smaller than pp")


PIPELINE = RoleSpec(
    Role.PIPELINE,
    allowed_modes=modes({Mode.S}, {Mode.S}, {Mode.S}, {Mode.S, Mode.M, Mode.O}),
    why={State.PARAMS: "a pipeline axis splits the layer stack (S)"},
    relation=relation,
    splits_tokens=False,
    splits_samples=False,
    replicates_model=False,
    splits_model=every_group,
    sums_norm=always,
    canonical_phase=Phase.TIE,
    partial_at_ends=True,
    needs_arch=True,
    shape_checks=pipeline_shapes,
    reported_options=("schedule", "microbatches", "chunks"),
)
