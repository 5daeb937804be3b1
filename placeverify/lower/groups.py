"""Per-group meshes: a data-parallel preset placed over a product group (``place zero1 over
dp * cp``), as Megatron-LM's distributed optimizer shards over data x context ranks.

A data preset (``ddp``, ``zero1``, ``zero2``, ``zero3``, ``fsdp``) over a product ``a * b`` says
that the preset's states are reduced and sharded over the whole product: each rank of the product
group holds 1/|a * b| of every sharded state. It lowers to one column of the mode matrix per axis,
so memory, traffic and every verdict read the same per-axis IR as before:

* an axis of the product that no other statement places becomes a data axis with the preset's
  modes (``place zero1 over dp * dp2`` is ``place zero1 over dp`` and ``place zero1 over dp2``);
* an axis that a ``context`` statement places keeps its role and its activations' mode and takes
  the preset's Ω and G modes (``place context over cp`` with ``place zero1 over dp * cp`` is
  ``place context(R, S, R, S) over cp``). A preset that shards the parameters (``zero3``,
  ``fsdp``) shards them over the context axis too (Θ S*: gathered over the product before use),
  as FSDP2 shards over the flattened ``dp_shard_cp`` mesh in accelerate
  (``parallelism_config.py``) and torchtitan (``distributed/parallel_dims.py``);
* an expert axis keeps its role and the experts' modes (they are split over it, so their states
  are sharded over the product's other axes only, the expert data-parallel group); every other
  parameter group is a copy along it and takes the preset's Θ, Ω and G as a per-group placement
  of that column (``zero1 over ep * dp``: the dense groups' Ω sharded over ep x dp, the experts'
  over dp, as Megatron-LM's distributed optimizer). A preset that shards the parameters does
  the same with Θ (``fsdp over ep * dp``: the dense groups' parameters S* over ep x dp, gathered
  over it before use, the experts' over dp), as torchtitan applies FSDP2 with expert parallelism
  (torchtitan/distributed/fsdp.py, ``apply_fsdp_to_decoder``: the dense parameters over
  dp_shard, the routed experts over dp_shard_mod_ep with the whole data-parallel size as their
  gradient divide factor, pytorch/torchtitan#1551);
* a tensor or pipeline axis in the product is an error: those ranks hold different parameters,
  not copies whose states a data preset could shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from placeverify.diagnostics import Code, Span, did_you_mean
from placeverify.ir.mesh import Group, Mesh
from placeverify.ir.model import Model, ParamGroup
from placeverify.ir.placement import AxisPlacement, Mode, Overlap, Reduce, Role
from placeverify.lower.mesh import read_group
from placeverify.lower.values import Context, at
from placeverify.syntax import ast


def merge(ctx: Context, product: AxisPlacement, other: AxisPlacement,
          groups: Sequence[ParamGroup] = ()) -> AxisPlacement | None:
    """The column of an axis that a data preset over a product and another statement both
    place; None (with an error) when the two do not combine."""
    where = f"'{product.preset}' over a product group (line {product.span.line})"
    if other.role is Role.CONTEXT:
        # a preset that shards the parameters (zero3, fsdp) shards them over the context axis
        # too: FSDP2 over the flattened dp_shard x cp mesh (accelerate parallelism_config.py,
        # torchtitan parallel_dims.py), each context rank gathering the whole layer before use
        modes = (product.modes[0], product.modes[1], product.modes[2], other.modes[3])
        return replace(other, modes=modes, reshard_after_forward=product.reshard_after_forward,
                       reduce=product.reduce)
    if other.role is Role.EXPERT:
        return expert_column(ctx, product, other, groups, where)
    if other.role is Role.DATA:
        ctx.error(f"axis '{other.axis}' is placed twice", Code.DUPLICATE, product.span,
                  f"first placed at {at(other.span)}")
        return None
    ctx.error(f"{where} includes '{other.axis}', a {other.role.value} axis", Code.BAD_VALUE,
              product.span, "a data preset shards copies of the same parameters: its product "
                            "group has data and context axes only")
    return None


def expert_column(ctx: Context, product: AxisPlacement, other: AxisPlacement,
                  groups: Sequence[ParamGroup], where: str) -> AxisPlacement | None:
    """The expert axis of a product (``place zero1 over ep * dp``): the experts keep the expert
    column's modes (split over the axis, their states sharded along the other axes only: the
    expert data-parallel group); every other group is a copy along the axis and takes the
    preset's Θ, Ω and G as a per-group placement, as Megatron-LM's distributed optimizer shards
    the dense parameters' state over the whole data-parallel group (data x expert ranks), and
    as torchtitan's FSDP2 shards the dense parameters themselves over dp_shard, which includes
    the ep ranks, and the routed experts over dp_shard_mod_ep (torchtitan/distributed/fsdp.py,
    ``apply_fsdp_to_decoder``; torchtitan/experiments/llama4/infra/parallelize.py before it,
    where pytorch/torchtitan#1551 set the experts' ``set_gradient_divide_factor`` to the whole
    data-parallel size). The dense groups' Θ is then S* along the expert axis: gathered over it
    before use (:func:`placeverify.roles.queries.gathers_copies`)."""
    if not any(m.sharded for m in product.modes[:3]):
        return other  # ddp: the dense groups are already data-parallel along an expert axis
    dense = tuple((g.value, product.modes) for g in groups if g is not ParamGroup.EXPERTS)
    return replace(other, group_modes=dense)


def product_placements(name: str, role: Role, modes: tuple[Mode, Mode, Mode, Mode],
                       axes: tuple[str, ...], span: Span,
                       options: dict[str, object]) -> list[AxisPlacement]:
    """One data column per axis of the product, each with the preset's modes and options."""
    return [AxisPlacement(axis, role, modes, name, span, **options)  # type: ignore[arg-type]
            for axis in axes]


# ---- a parameter group over its own data-parallel group: place ddp over dp for norms ----------
#
# Along an expert axis too (``place zero1 over ep for dense``): the groups the axis copies (every
# group but the experts) take the preset's Θ, Ω and G there, exactly as a product with the axis
# gives them; the others it copies stay replicas (R) along it; naming the experts is an error.

Reader = Callable[[Context, ast.PlaceStmt, Group, Mesh, "list[AxisPlacement] | None"],
                  list[AxisPlacement]]


# options of a data placement that a per-group placement cannot carry: (as written, IR field,
# the IR's default)
_GROUP_OPTIONS = (("reshard_after_forward", "reshard_after_forward", True),
                  ("reduce", "reduce", Reduce.MICROBATCH),
                  ("overlap", "data_overlap", Overlap.ALL))


def read_group_placements(ctx: Context, statements: Sequence[ast.PlaceStmt],
                          columns: dict[str, AxisPlacement], mesh: Mesh, model: Model,
                          read: Reader) -> None:
    """Apply each ``place P over G for g1, g2`` to the columns of G's axes: along each of them
    the named groups' Θ, Ω and G take P's modes (their activations stay the axis's). Each axis
    is placed for every group by a statement of its own first; only data axes take per-group
    placements, and an expert axis for the groups it copies (a context, tensor or pipeline axis
    is not modelled)."""
    names = {g.value: g for g in ParamGroup}
    present = model.groups_present()
    for stmt in statements:
        _read_group_placement(ctx, stmt, columns, mesh, read, names, present)
    _expert_replicas(columns, present)


def _read_group_placement(ctx: Context, stmt: ast.PlaceStmt, columns: dict[str, AxisPlacement],
                          mesh: Mesh, read: Reader, names: dict[str, ParamGroup],
                          present: Sequence[ParamGroup]) -> None:
    """One ``place P over G for g1, g2``."""
    assert stmt.groups is not None
    groups: list[ParamGroup] = []
    for sel in stmt.groups.groups:
        found = names.get(sel.text)
        if found is None:
            ctx.error(f"unknown parameter group '{sel.text}'{did_you_mean(sel.text, names)}",
                      Code.UNKNOWN_NAME, sel.span)
        elif found not in present:
            ctx.error(f"this model has no '{sel.text}' parameters (it has "
                      f"{', '.join(g.value for g in present)})", Code.BAD_VALUE, sel.span)
        else:
            groups.append(found)
    group = read_group(ctx, stmt.group, mesh)
    if group is None or len(groups) != len(stmt.groups.groups):
        return
    if group.ends:
        ctx.error("a placement is over whole axes, not ends(...)", Code.BAD_VALUE,
                  stmt.group.span)
        return
    for placement in read(ctx, stmt, group, mesh, []):
        column = columns.get(placement.axis)
        if placement.role is not Role.DATA:
            ctx.error(f"a placement for some parameter groups is a data preset (ddp, zero1, "
                      f"zero2, zero3, fsdp, hsdp), got '{placement.preset}'",
                      Code.BAD_VALUE, stmt.placement.span)
            break
        options = [name for name, field, default in _GROUP_OPTIONS
                   if getattr(placement, field) != default]
        if options:
            # only the modes are applied per group: the axis's own options hold for every
            # group, so a group's own would be silently dropped
            ctx.error(f"not modelled: {', '.join(options)} on a placement for some parameter "
                      "groups (the options of the axis's own placement apply to every group)",
                      Code.NOT_MODELLED, stmt.placement.span)
            break
        if column is None:
            ctx.error(f"axis '{placement.axis}' has no placement for every group; write "
                      f"e.g. 'place ddp over {placement.axis}' as well", Code.MISSING,
                      stmt.span)
            continue
        if column.role is Role.EXPERT and ParamGroup.EXPERTS in groups:
            ctx.error(f"the experts are split over the expert axis '{column.axis}': a data "
                      "preset cannot place them along it", Code.BAD_VALUE,
                      next(sel.span for sel in stmt.groups.groups
                           if sel.text == ParamGroup.EXPERTS.value),
                      "name the groups the expert axis copies (dense, norms, embedding); "
                      "the experts' states are sharded along the data axes")
            continue
        if column.role is not Role.DATA and column.role is not Role.EXPERT:
            ctx.error(f"a placement for some parameter groups over the {column.role.value} "
                      f"axis '{column.axis}': not modelled", Code.BAD_VALUE, stmt.group.span,
                      "per-group placements are along data and expert axes")
            continue
        placed = dict(column.group_modes)
        for g in groups:
            if g.value in placed:
                ctx.error(f"the {g.value} parameters are placed twice over "
                          f"'{placement.axis}'", Code.DUPLICATE, stmt.span)
                continue
            placed[g.value] = placement.modes
        columns[placement.axis] = replace(column, group_modes=tuple(placed.items()))


def _expert_replicas(columns: dict[str, AxisPlacement], present: Sequence[ParamGroup]) -> None:
    """The groups an expert axis copies and no statement placed along it stay replicas there
    (data-parallel: reduced over it, whole), not the experts' split modes."""
    for axis, column in list(columns.items()):
        if column.role is Role.EXPERT and column.group_modes:
            placed = dict(column.group_modes)
            for g in present:
                if g is not ParamGroup.EXPERTS and g.value not in placed:
                    placed[g.value] = (Mode.R, Mode.R, Mode.R, column.modes[3])
            columns[axis] = replace(column, group_modes=tuple(placed.items()))


def check_offload(ctx: Context, placements: Sequence[AxisPlacement],
                  statements: Sequence[ast.OffloadStmt]) -> None:
    """Offloading with per-group placements is not modelled (the offload turns an axis's
    sharded modes into O, not a group's)."""
    if statements and any(p.group_modes for p in placements):
        ctx.error("'offload' with placements for some parameter groups: not modelled",
                  Code.BAD_VALUE, statements[0].span)
