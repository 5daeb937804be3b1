"""Shape checks: every dimension a role splits must divide evenly over the product of its axes.

The rules are the ones Megatron-LM asserts; each check cites where. What one role splits is the
role's (its ``shape_checks`` in :mod:`placeverify.roles`); what two roles split together (the
sequence under sequence parallelism inside context parallelism) is here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from placeverify.diagnostics import Code
from placeverify.ir.mesh import Mesh
from placeverify.ir.model import Model, Transformer
from placeverify.ir.placement import AxisPlacement, Role
from placeverify.lower.values import Context
from placeverify.roles import ROLES
from placeverify.roles.shapes import need


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
            if ROLES[p.role].needs_arch:
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
        layer_kind_limits(ctx, arch, mesh, p)
        if ROLES[p.role].needs_moe and not arch.moe:
            ctx.error(f"expert parallelism over {p.axis} needs a mixture-of-experts model "
                      "(experts, top_k)", Code.CONFLICT, p.span)
        if p is by_role[p.role][-1]:
            # the experts split whole over the tensor axes an expert statement names too
            # (lower/expert_mesh.py): the expert count divides by their product with the ep axes
            split = [q for q in by_role.get(Role.TENSOR, []) if q.experts_split]
            check_role_shapes(ctx, arch, mesh, [*split, *by_role[p.role]]
                              if p.role is Role.EXPERT else by_role[p.role], microbatches)
        if sequence_parallel and p is sequence_parallel[-1]:
            check_sequence_parallel(ctx, arch, p, factors(mesh, sequence_parallel), context)


def layer_kind_limits(ctx: Context, arch: Transformer, mesh: Mesh, p: AxisPlacement) -> None:
    """What the costs do not model for layers other than Llama's (ir/latent.py, shared experts,
    dense and MoE layers mixed): tensor parallelism's collectives of such layers, context
    parallelism's gathers of latent attention's keys and values, and pipeline stages whose
    layers differ."""
    if mesh.size(p.axis) == 1:
        return
    latent, shared, mixed = arch.latent is not None, arch.shared_experts > 0, arch.mixed_layers
    what = None
    if p.role is Role.TENSOR and (latent or shared or mixed):
        what = ("tensor parallelism of " + ("multi-head latent attention" if latent else
                "shared experts" if shared else "a mix of dense and MoE layers")
                + " (the tensor-parallel collectives are modelled on Llama's layers)")
    elif p.role is Role.CONTEXT and latent:
        what = "context parallelism of multi-head latent attention (its K and V gathers)"
    elif p.role is Role.PIPELINE and mixed:
        what = ("pipeline stages of a model whose dense and MoE layers differ (dense_layers, "
                "moe_every): each stage is costed as L / p mean layers")
    if what is not None:
        ctx.error(f"not modelled: {what}", Code.NOT_MODELLED, p.span)


def check_role_shapes(ctx: Context, arch: Transformer, mesh: Mesh,
                      role_placements: list[AxisPlacement], microbatches: int) -> None:
    """The dimensions one role splits, over the product of all of its axes."""
    p = role_placements[-1]
    by = factors(mesh, role_placements)
    checks = ROLES[p.role].shape_checks
    if checks is not None:
        checks(ctx, arch, by, role_placements, microbatches)


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
