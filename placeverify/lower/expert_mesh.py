"""Lower ``place expert over tp * ep``: the experts' own mesh, regrouped over a tensor axis.

Megatron-core builds two rank meshes over the same world (NVIDIA/Megatron-LM at d98e8a64dd,
``megatron/core/parallel_state.py:859-893``, ``initialize_model_parallel``): the dense layers'
``RankGenerator(tp=TP, cp=CP, dp=DP, pp=PP)`` and the experts' ``RankGenerator(tp=ETP, ep=EP,
dp=world / (ETP x EP x PP), pp=PP)``, both in the order tp-cp-ep-dp-pp, first fastest. With ETP
below TP the ranks of one dense tensor-parallel group hold different whole experts: for the experts
those ranks are part of the expert-parallel group. A mesh that refines both factorisations writes
it with one axis per factor: ``mesh { dp = 4, ep = 4, tp = 2 }`` (outermost first) with ``place
megatron(sequence_parallel) over tp`` and ``place expert over tp * ep`` is Megatron's TP 2, ETP 1,
EP 8 on 32 ranks: the dense layers split over tp and data-parallel over ep x dp, the experts split
whole over tp x ep (8 ranks) and data-parallel over dp (the expert data-parallel group, 32 / (1 x 8
x 1) = 4).

The tensor axes a statement names keep their role and modes (each rank holds 1/|tp| of every
group's elements either way) and are marked ``experts_split``; the others become expert axes.
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.diagnostics import Code
from placeverify.ir.mesh import Group
from placeverify.ir.placement import AxisPlacement, Role
from placeverify.ir.presets import PRESETS
from placeverify.lower.values import Context, at
from placeverify.syntax import ast


def is_expert_product(stmt: ast.PlaceStmt, group: Group) -> bool:
    """Is this an ``expert`` statement over a product of axes?"""
    p = stmt.placement
    return (isinstance(p, ast.PresetPlacement | ast.CallPlacement) and p.name.text in PRESETS
            and PRESETS[p.name.text].role is Role.EXPERT and len(group.axes) > 1)


def place_expert_products(ctx: Context, products: list[tuple[ast.PlaceStmt, Group]],
                          by_axis: dict[str, AxisPlacement]) -> None:
    """Apply each ``place expert over tp * ep``: the tensor axes named are split by whole experts
    for the experts (``experts_split``), every other axis named becomes an expert axis."""
    for stmt, group in products:
        p = stmt.placement
        name = p.name.text if isinstance(p, ast.PresetPlacement | ast.CallPlacement) else "expert"
        if isinstance(p, ast.CallPlacement) and p.args:
            ctx.error(f"'{name}' takes no options", Code.BAD_VALUE, p.args[0].span)
            continue
        tensor = [a for a in group.axes if a in by_axis and by_axis[a].role is Role.TENSOR]
        others = [a for a in group.axes if a not in tensor]
        placed = [a for a in others if a in by_axis]
        if placed:
            role = by_axis[placed[0]].role.value
            ctx.error(f"'{name}' over {group.label()}: axis '{placed[0]}' is already a {role} axis "
                      f"(placed at {at(by_axis[placed[0]].span)}); an expert group over a product "
                      "names tensor axes and axes of its own", Code.DUPLICATE, stmt.group.span)
            continue
        if not tensor or not others:
            ctx.error(f"'{name}' is placed over one axis, or over tensor axes and axes of its own "
                      f"('place expert over tp * ep': the experts split whole over tp x ep), got "
                      f"{group.label()}", Code.BAD_VALUE, stmt.group.span)
            continue
        twice = [a for a in tensor if by_axis[a].experts_split]
        if twice:
            ctx.error(f"axis '{twice[0]}' is placed in the expert group twice", Code.DUPLICATE,
                      stmt.span)
            continue
        plain = [a for a in tensor if not by_axis[a].sequence_parallel]
        if plain:
            # megatron/core/transformer/moe/moe_layer.py:636-640 (MoELayer.forward, at
            # d98e8a64dd) raises in training for MoE with tensor parallelism without sequence
            # parallelism; without it the ranks of tp would dispatch the same tokens
            ctx.error(f"the experts split whole over the tensor axis '{plain[0]}' need sequence "
                      "parallelism on it (Megatron-core's MoE layer refuses tensor parallelism "
                      "without it in training)", Code.CONFLICT, stmt.span,
                      f"write 'place megatron(sequence_parallel) over {plain[0]}'")
            continue
        for axis in tensor:
            by_axis[axis] = replace(by_axis[axis], experts_split=True)
        preset = PRESETS[name]
        for axis in others:
            by_axis[axis] = AxisPlacement(axis, Role.EXPERT, preset.modes, name, stmt.span)
