"""Shape checks: every dimension a role splits must divide evenly over the product of its axes.

The rules are the ones Megatron-LM asserts; each check cites where.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from placeverify.diagnostics import Code, Span
from placeverify.ir.mesh import Mesh
from placeverify.ir.model import Model, Transformer
from placeverify.ir.placement import AxisPlacement, Role, Schedule
from placeverify.lower.values import Context


def check_shapes(ctx: Context, model: Model, mesh: Mesh, placements: tuple[AxisPlacement, ...],
                 microbatches: int) -> None:
    """Every dimension a role shards must split evenly over the product of its axes.

    The rules are the ones Megatron-LM asserts (each check cites where). A dimension split
    over several axes (two tensor axes; the sequence under sequence parallelism inside context
    parallelism) must divide by their product, not only by each. An error points at the
    placement of the last axis of the product, so errors come in file order.
    """
    arch = model.arch
    if arch is None:
        for p in placements:
            if p.role in (Role.TENSOR, Role.CONTEXT, Role.EXPERT, Role.PIPELINE):
                ctx.error(f"{p.role.value} parallelism over {p.axis} needs the architecture "
                          "(layers, hidden, heads, seq); this model is a bare parameter "
                          "count", Code.CONFLICT, p.span)
        return
    by_role: dict[Role, list[AxisPlacement]] = {}
    for p in placements:
        by_role.setdefault(p.role, []).append(p)
    sequence_parallel = [p for p in by_role.get(Role.TENSOR, []) if p.sequence_parallel]
    context = factors(mesh, by_role.get(Role.CONTEXT, []))
    for p in placements:
        if p.role is Role.EXPERT and not arch.moe:
            ctx.error(f"expert parallelism over {p.axis} needs a mixture-of-experts model "
                      "(experts, top_k)", Code.CONFLICT, p.span)
        if p is by_role[p.role][-1]:
            check_role_shapes(ctx, arch, mesh, by_role[p.role], microbatches)
        if sequence_parallel and p is sequence_parallel[-1]:
            check_sequence_parallel(ctx, arch, p, factors(mesh, sequence_parallel), context)


def need(ctx: Context, what: str, value: int, by: Sequence[tuple[str, int]], at: Span,
         *notes: str) -> None:
    """``value`` must be divisible by the product of the named factors ``by``; say so if not."""
    divisor = math.prod(size for _, size in by)
    if value % divisor == 0:
        return
    if len(by) == 1:
        shown = f"{by[0][0]} ({divisor:,})"
    else:
        shown = (" x ".join(name for name, _ in by) + " ("
                 + " x ".join(f"{size:,}" for _, size in by) + f" = {divisor:,})")
    ctx.error(f"{shown} does not divide {what} ({value:,})", Code.NOT_DIVISIBLE, at, *notes)


def check_role_shapes(ctx: Context, arch: Transformer, mesh: Mesh,
                      role_placements: list[AxisPlacement], microbatches: int) -> None:
    """The dimensions one role splits, over the product of all of its axes."""
    p = role_placements[-1]
    by = factors(mesh, role_placements)
    if p.role is Role.TENSOR:
        tensor_shapes(ctx, arch, by, p)
    elif p.role is Role.PIPELINE:
        pipeline_shapes(ctx, arch, by, role_placements, microbatches)
    elif p.role is Role.CONTEXT:
        context_shapes(ctx, arch, by, p)
    elif p.role is Role.EXPERT:
        expert_shapes(ctx, arch, by, p)


def tensor_shapes(ctx: Context, arch: Transformer, by: list[tuple[str, int]],
                  p: AxisPlacement) -> None:
    """Heads, kv_heads, ffn and the padded vocabulary split over the tensor axes ``by``."""
    n = math.prod(size for _, size in by)
    label = " x ".join(name for name, _ in by)
    # megatron/core/transformer/transformer_config.py (__post_init__):
    # num_attention_heads % tensor_model_parallel_size == 0
    need(ctx, "heads", arch.heads, by, p.span)
    if arch.kv_heads != arch.heads and arch.kv_heads % n:
        # ibid.: num_query_groups must be a multiple or a divisor of the TP size. For a
        # divisor, attention.py all-gathers the fused QKV output over tp and each rank
        # slices out one key/value head: a collective, and K and V per rank, that the cost
        # model (K, V split over tp) does not describe.
        why = ("Megatron-LM shards whole key/value head groups over tp; with "
               f"{label} a multiple of kv_heads it instead all-gathers the fused QKV "
               "output over tp and each rank slices out its head, which placeverify does "
               "not model" if n % arch.kv_heads == 0 else
               "Megatron-LM shards whole key/value head groups over tp, and rejects "
               "kv_heads that is neither a multiple nor a divisor of the tensor-parallel "
               "size")
        need(ctx, "kv_heads", arch.kv_heads, by, p.span, why)
    # megatron/core/tensor_parallel/layers.py: Column/RowParallelLinear divide() the
    # split dimension by the TP size
    need(ctx, "ffn", arch.expert_ffn or arch.ffn, by, p.span)
    padded = arch.padded_vocab(n)
    need(ctx, "the vocabulary" + (f" padded to {padded:,}" if padded != arch.vocab else ""),
         padded, by, p.span,
         "set vocab_divisible_by (Megatron pads to a multiple of 128 * tp)")


def pipeline_shapes(ctx: Context, arch: Transformer, by: list[tuple[str, int]],
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


def context_shapes(ctx: Context, arch: Transformer, by: list[tuple[str, int]],
                   p: AxisPlacement) -> None:
    """The sequence split into 2 x cp load-balanced chunks."""
    if math.prod(size for _, size in by) > 1:
        # megatron/training/arguments.py (validate_args): with context_parallel_size > 1,
        # seq_length % (2 * context_parallel_size) == 0 (causal load balancing: 2 x cp
        # chunks, two per rank)
        need(ctx, "seq", arch.seq, [("2", 2), *by], p.span,
             "context parallelism splits the sequence into 2 x cp load-balanced chunks")


def expert_shapes(ctx: Context, arch: Transformer, by: list[tuple[str, int]],
                  p: AxisPlacement) -> None:
    """The experts split over the expert axes."""
    if arch.moe:
        # megatron/core/transformer/moe/moe_layer.py: num_moe_experts % ep_size == 0
        need(ctx, "experts", arch.experts, by, p.span)


def check_interleaved(ctx: Context, p: AxisPlacement, label: str, n: int, microbatches: int) -> None:
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


def check_sequence_parallel(ctx: Context, arch: Transformer, p: AxisPlacement,
                            sp: list[tuple[str, int]], cp: list[tuple[str, int]]) -> None:
    sp_label = " x ".join(name for name, _ in sp)
    if math.prod(size for _, size in cp) > 1:
        # Each context-parallel rank holds seq / cp tokens (two chunks of seq / (2 cp));
        # sequence parallelism scatters them along the first dimension over tp, and
        # megatron/core/tensor_parallel/mappings.py (_split_along_first_dim) asserts that
        # the split is even: (seq / cp) % tp == 0. (megatron/core/models/multimodal/
        # context_parallel.py pads to tp * cp * 2 under CP + SP for the same reason.)
        cp_label = " x ".join(name for name, _ in cp)
        need(ctx, "seq", arch.seq, [*sp, *cp], p.span,
             f"sequence parallelism splits the seq / {cp_label} tokens of each "
             f"context-parallel rank again over {sp_label}")
    else:
        # mappings.py (_split_along_first_dim): seq % tp == 0
        need(ctx, "seq", arch.seq, sp, p.span,
             f"sequence parallelism splits the sequence over {sp_label}")


def factors(mesh: Mesh, placements: Sequence[AxisPlacement]) -> list[tuple[str, int]]:
    """The axes of ``placements`` with their sizes, for a divisibility message."""
    return [(p.axis, mesh.size(p.axis)) for p in placements]
