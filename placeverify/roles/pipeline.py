"""Pipeline parallelism: each rank (stage) holds a contiguous part of the layer stack (GPipe,
1F1B, Megatron-LM's interleaved schedule); a tied embedding lives on the first and last stage."""

from __future__ import annotations

import math
from fractions import Fraction

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


def stage_layers(strategy: Layout) -> tuple[int, ...] | None:
    """Layers held by each stage of the pipeline (all of its model chunks), when the placement
    lists them (``layers = [7, 8, ..., 8, 7]``); None when the layers split evenly.

    Virtual stage k of an interleaved pipeline is chunk k // p of stage k % p, Megatron-LM's
    layout (``get_transformer_layer_offset``: chunks round-robin over the stages)."""
    pipe = strategy.pipeline
    if pipe is None or pipe.layers is None:
        return None
    n = strategy.size(pipe.axis)
    chunks = len(pipe.layers) // n if n and len(pipe.layers) % n == 0 else 0
    if chunks == 0:
        return None  # a mesh resized past the list (replay, counterexample search): layers unused
    return tuple(sum(pipe.layers[c * n + s] for c in range(chunks)) for s in range(n))


def chunk_ordered(strategy: Layout) -> bool:
    """Does each stage finish one model chunk's backward before it starts the next one's?

    Megatron-LM's interleaved schedule runs the micro-batches in groups of p per chunk
    (``get_model_chunk_id``: virtual micro-batch k is chunk (k // p) mod v), forward and backward
    alike; with m ≤ p there is a single group, so the backward goes chunk by chunk, the
    breadth-first order of Lamy-Poirier (arXiv 2211.05953) and Llama 3's schedule at one
    micro-batch group (arXiv 2407.21783 §3.3.2). With m > p every chunk's backward is under way
    at once; without interleaving a stage is one chunk."""
    pipe = strategy.pipeline
    if pipe is None or pipe.schedule is not Schedule.INTERLEAVED or pipe.chunks < 2:
        return False
    p = strategy.size(pipe.axis)
    return p > 1 and strategy.microbatches <= p


def chunk_layers(strategy: Layout, arch: Transformer, stages: tuple[int, ...]) -> Fraction:
    """The most layers one model chunk of these stages holds: the largest listed count of their
    virtual stages, or L / (p v) when the layers split evenly."""
    pipe = strategy.pipeline
    assert pipe is not None
    p, v = strategy.size(pipe.axis), pipe.chunks
    if pipe.layers is not None and len(pipe.layers) == p * v:
        return Fraction(max(pipe.layers[c * p + s] for c in range(v) for s in stages))
    return Fraction(arch.layers, p * v)


def pipeline_shapes(ctx: Reporter, arch: Transformer, by: list[tuple[str, int]],
                    role_placements: list[AxisPlacement], microbatches: int) -> None:
    """Layers split over the stages (and chunks); an interleaved schedule's stage count."""
    p = role_placements[-1]
    n = math.prod(size for _, size in by)
    # megatron/training/arguments.py (validate_args): num_layers % pp == 0, and with
    # --num-layers-per-virtual-pipeline-stage (num_layers / pp) % layers_per_chunk == 0:
    # together, layers % (pp * chunks) == 0
    chunks = math.prod(q.chunks for q in role_placements)
    listed = [q for q in role_placements if q.layers is not None]
    if listed:
        check_stage_layers(ctx, arch, by, role_placements, listed[0], chunks)
    elif chunks > 1:
        need(ctx, "layers", arch.layers, [*by, ("chunks", chunks)], p.span,
             f"{n} stages of {chunks} chunks each hold the same number of layers")
    else:
        need(ctx, "layers", arch.layers, by, p.span,
             "each pipeline stage holds the same number of layers")
    if any(q.schedule is Schedule.INTERLEAVED for q in role_placements):
        check_interleaved(ctx, p, " x ".join(name for name, _ in by), n, microbatches)


def check_stage_layers(ctx: Reporter, arch: Transformer, by: list[tuple[str, int]],
                       role_placements: list[AxisPlacement], q: AxisPlacement, chunks: int) -> None:
    """A written list of layers per stage: one positive entry per (virtual) stage, adding up to
    the model's layers. Megatron-LM's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers`` (``TransformerConfig.num_layers_in_first_pipeline_stage``,
    ``..._last_...``) give the same uneven split with the other stages even."""
    at = q.layers_span or q.span
    layers = q.layers or ()
    if len(role_placements) > 1:
        ctx.error("a list of layers per stage is not modelled for a pipeline over several axes",
                  Code.BAD_VALUE, at)
        return
    n = math.prod(size for _, size in by)
    stages = f"{by[0][0]} ({n:,})" if chunks == 1 else \
        f"{by[0][0]} x chunks ({n:,} x {chunks:,} = {n * chunks:,} virtual stages)"
    if len(layers) != n * chunks:
        ctx.error(f"layers lists {len(layers):,} stages, but {stages} has {n * chunks:,}",
                  Code.BAD_VALUE, at,
                  "one entry per stage in stage order" if chunks == 1 else
                  "one entry per virtual stage: chunk 0 of every stage, then chunk 1, ...")
        return
    total = sum(layers)
    if total != arch.layers:
        ctx.error(f"layers per stage add up to {total:,}, but the model has {arch.layers:,} layers",
                  Code.BAD_VALUE, at)


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
