"""Tensor parallelism: each rank holds a slice of every weight matrix (Megatron-LM's column and
row parallel layers), optionally with sequence parallelism for the replicated regions."""

from __future__ import annotations

import math

from placeverify.ir.model import ParamGroup, Transformer
from placeverify.ir.placement import AxisPlacement, Mode, Role, State
from placeverify.ir.relations import Relation
from placeverify.ir.step import Region
from placeverify.ir.strategy import Layout
from placeverify.roles.shapes import Reporter, need
from placeverify.roles.spec import Phase, RoleSpec, always, modes


def relation(strategy: Layout, group: ParamGroup, placement: AxisPlacement) -> Relation:
    """The matrices are owned; the replicated norms see the same activations (complete) or,
    under sequence parallelism, different parts of the sequence (partial)."""
    if group is ParamGroup.NORMS:
        return Relation.PARTIAL if placement.sequence_parallel else Relation.COMPLETE
    return Relation.OWNED


def splits_matrices(group: ParamGroup) -> bool:
    """Along a tensor axis the replicated parameters (norms, row-parallel biases, the router)
    stay whole."""
    return group is not ParamGroup.NORMS


def dropout_regions(placement: AxisPlacement) -> tuple[Region, ...]:
    """Replicated and sharded without sequence parallelism, sharded only with it."""
    if not placement.sequence_parallel:
        return (Region.REPLICATED, Region.SHARDED)
    return (Region.SHARDED,)


def tensor_shapes(ctx: Reporter, arch: Transformer, by: list[tuple[str, int]],
                  role_placements: list[AxisPlacement], microbatches: int) -> None:
    """Heads, kv_heads, ffn and the padded vocabulary split over the tensor axes ``by``."""
    p = role_placements[-1]
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
    # An MoE layer's MLP is its experts: those split whole over the tensor axes the expert
    # group names (experts_split, lower/expert_mesh.py) divide ffn over the others only
    # (Megatron-core's expert linears divide by the expert tensor-parallel size)
    ffn_by = [f for f, q in zip(by, role_placements, strict=True)
              if not (arch.moe and q.experts_split)]
    if ffn_by:
        need(ctx, "ffn", arch.expert_ffn or arch.ffn, ffn_by, p.span)
    padded = arch.padded_vocab(n)
    need(ctx, "the vocabulary" + (f" padded to {padded:,}" if padded != arch.vocab else ""),
         padded, by, p.span,
         "set vocab_divisible_by (Megatron pads to a multiple of 128 * tp)")


TENSOR = RoleSpec(
    Role.TENSOR,
    allowed_modes=modes({Mode.S}, {Mode.S}, {Mode.S}, {Mode.R, Mode.S, Mode.M, Mode.O}),
    why={State.PARAMS: "a tensor axis splits the weight matrices (S)"},
    relation=relation,
    splits_tokens=False,
    splits_samples=False,
    replicates_model=False,
    splits_model=splits_matrices,
    sums_norm=always,
    canonical_phase=Phase.SEQUENCE_PARALLEL,
    needs_arch=True,
    shape_checks=tensor_shapes,
    dropout_regions=dropout_regions,
    seeded_alone=True,
    reported_options=("sequence_parallel",),
)
