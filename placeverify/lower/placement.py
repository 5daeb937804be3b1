"""Lower ``place`` statements: presets with their options, and the paper's mode tuples.

Each ``place ... over axis`` fills one column of the state x axis mode matrix. Presets come from
the data table :mod:`placeverify.ir.presets`, whose options one generic reader reads here.
"""

from __future__ import annotations

from collections.abc import Sequence

from placeverify.diagnostics import Code, Span, did_you_mean
from placeverify.ir.mesh import Group, Mesh
from placeverify.ir.model import Model
from placeverify.ir.placement import (
    STATES,
    AxisPlacement,
    Mode,
    Overlap,
    Reduce,
    Role,
    Schedule,
    State,
    TensorOverlap,
)
from placeverify.ir.presets import PRESETS, OptionKind, PresetSpec
from placeverify.lower.expert_mesh import is_expert_product, place_expert_products
from placeverify.lower.groups import merge, product_placements, read_group_placements
from placeverify.lower.mesh import read_group
from placeverify.lower.values import Context, at, value_text
from placeverify.syntax import ast

R, S = Mode.R, Mode.S
ROLE_NAMES = {r.value: r for r in Role}
MODE_NAMES = {m.value: m for m in Mode}


def read_placements(ctx: Context, statements: Sequence[ast.PlaceStmt], mesh: Mesh,
                    model: Model) -> tuple[AxisPlacement, ...]:
    by_axis: dict[str, AxisPlacement] = {}
    products: list[AxisPlacement] = []  # data presets over a product group, merged below
    experts: list[tuple[ast.PlaceStmt, Group]] = []  # expert over tp * ep (lower/expert_mesh.py)
    for stmt in statements:
        if stmt.groups is not None:
            continue  # for some parameter groups: read_group_placements, below
        group = read_group(ctx, stmt.group, mesh)
        if group is None:
            continue
        if group.ends:
            ctx.error("a placement is over whole axes, not ends(...)", Code.BAD_VALUE,
                      stmt.group.span)
            continue
        if is_expert_product(stmt, group):
            experts.append((stmt, group))
            continue
        for placement in read_placement(ctx, stmt, group, mesh, products):
            if any(placement is column for column in products):
                continue
            if placement.axis in by_axis and hsdp_with_experts(placement, by_axis[placement.axis]):
                ctx.error(f"'hsdp' over the expert axis '{placement.axis}': not modelled",
                          Code.BAD_VALUE, stmt.span,
                          "shard over a product with the expert axis ('place fsdp over ep * dp') "
                          "and keep hsdp's replica axis a data axis of its own")
            elif placement.axis in by_axis:
                first = by_axis[placement.axis].span
                ctx.error(f"axis '{placement.axis}' is placed twice", Code.DUPLICATE,
                          stmt.span, f"first placed at {at(first)}")
            else:
                by_axis[placement.axis] = placement
    place_expert_products(ctx, experts, by_axis)
    merged_from: dict[str, AxisPlacement] = {}
    for placement in products:
        if placement.axis in merged_from:
            ctx.error(f"axis '{placement.axis}' is placed twice", Code.DUPLICATE, placement.span,
                      f"first placed at {at(merged_from[placement.axis].span)}")
            continue
        merged_from[placement.axis] = placement
        other = by_axis.get(placement.axis)
        merged = (placement if other is None
                  else merge(ctx, placement, other, model.groups_present()))
        if merged is not None:
            by_axis[placement.axis] = merged
    read_group_placements(ctx, [s for s in statements if s.groups is not None], by_axis, mesh,
                          model, read_placement)
    for axis in mesh.axes:
        if axis.name not in by_axis and not ctx.diag.errors:
            ctx.error(f"axis '{axis.name}' has no placement; add e.g. 'place ddp over "
                      f"{axis.name}'", Code.MISSING, axis.span)
    return tuple(by_axis[a.name] for a in mesh.axes if a.name in by_axis)


def hsdp_with_experts(a: AxisPlacement, b: AxisPlacement) -> bool:
    """An ``hsdp`` statement and an ``expert`` statement over one axis (``docs/language/place.md``,
    per-group meshes: HSDP with expert parallelism is not modelled)."""
    return {a.preset, b.preset} == {"hsdp", "expert"}


def read_placement(ctx: Context, stmt: ast.PlaceStmt, group: Group, mesh: Mesh,
                   products: list[AxisPlacement] | None = None) -> list[AxisPlacement]:
    p = stmt.placement
    span = stmt.span
    if isinstance(p, ast.TuplePlacement):
        return tuple_placement(ctx, Role.DATA, "tuple", p.args, group, span)
    name = p.name.text
    args = p.args if isinstance(p, ast.CallPlacement) else ()
    if name in ROLE_NAMES and args and all(_is_mode_arg(a) for a in args[:4]):
        return tuple_placement(ctx, ROLE_NAMES[name], name, args, group, span)
    if name not in PRESETS:
        ctx.error(f"unknown placement preset '{name}'{did_you_mean(name, PRESETS)}",
                  Code.UNKNOWN_NAME, p.name.span,
                  "presets: " + ", ".join(sorted(PRESETS)) + "; or a tuple (Θ, Ω, G, A)")
        return []
    preset = PRESETS[name]
    options = read_options(ctx, name, preset, args)
    if options is None:
        return []
    if preset.rewrite_option is not None and preset.rewrite_option in options:
        rewrite = preset.rewrite.get(str(options.pop(preset.rewrite_option)))
        if rewrite is not None:
            preset, name = PRESETS[rewrite.preset], rewrite.label
            options.update(rewrite.options)
    product = (products is not None and preset.axes == 1 and preset.role is Role.DATA
               and len(group.axes) > 1)
    if len(group.axes) != preset.axes and not product:
        want = "two axes: 'over shard_axis * replicate_axis'" if preset.axes == 2 else "one axis"
        ctx.error(f"'{name}' is placed over {want}, got {group.label()}", Code.BAD_VALUE,
                  stmt.group.span)
        return []
    modes = preset.modes
    if preset.role is Role.DATA and "overlap" in options:  # the IR keeps it apart from tensor's
        options["data_overlap"] = options.pop("overlap")
    if preset.axes == 2:
        written = written_axes(stmt.group)
        if written is None or sorted(written) != sorted(group.axes):
            ctx.error(f"'{name}' needs its two axes named in order, shard axis first: "
                      f"'over shard_axis * replicate_axis', got {group.label()}",
                      Code.BAD_VALUE, stmt.group.span,
                      "a named group, a tuple or 'world' does not say which axis shards")
            return []
        shard, replica = written
        return [AxisPlacement(shard, preset.role, modes, name, span, **options),  # type: ignore[arg-type]
                AxisPlacement(replica, Role.DATA, (R, R, R, R), name, span,
                              reduce=options.get("reduce", Reduce.MICROBATCH),  # type: ignore[arg-type]
                              data_overlap=options.get("data_overlap", Overlap.ALL))]  # type: ignore[arg-type]
    options.update(preset.implied)
    for key, option in preset.options.items():
        if option.default is not None:
            options.setdefault(key, option.default)
    if options.get("sequence_parallel"):
        modes = (S, S, S, S)  # sequence parallelism shards the activations too
    elif options.get("overlap") is TensorOverlap.ALL:
        # megatron/training/arguments.py (validate_args): "Tensor parallel communication/GEMM
        # overlap can happen only when sequence parallelism is enabled"
        ctx.error(f"'{name}(overlap = true)' needs sequence parallelism: overlapping the "
                  "tensor-parallel collectives with the GEMMs splits the all-gathers and "
                  "reduce-scatters of sequence parallelism", Code.BAD_VALUE, span,
                  f"write '{name}(sequence_parallel, overlap = true)' (Megatron-LM asserts "
                  "--sequence-parallel with --tp-comm-overlap)")
    if preset.role is Role.PIPELINE:
        if options["schedule"] is Schedule.INTERLEAVED and "chunks" not in options:
            ctx.error("an interleaved pipeline needs 'chunks' (model chunks per stage)",
                      Code.MISSING, span)
        if "microbatches" not in options:
            ctx.error("a pipeline needs 'microbatches', e.g. 'pipeline(1f1b, microbatches = "
                      "8)'", Code.MISSING, span)
    if product and products is not None:  # lower/groups.py: one column per axis of the product
        columns = product_placements(name, preset.role, modes, group.axes, span, options)
        products.extend(columns)
        return columns
    return [AxisPlacement(group.axes[0], preset.role, modes, name, span, **options)]  # type: ignore[arg-type]


def written_axes(group: ast.Group) -> tuple[str, ...] | None:
    """The axes of a group in the order the text names them, when it names each one directly
    (``shard * replica``); None for named groups, tuples and ``world``, whose order the group
    resolution sorts into mesh order."""
    names: list[str] = []
    for term in group.terms:
        if not isinstance(term, ast.AxisRef):
            return None
        names.append(term.name.text)
    return tuple(names)


def read_options(ctx: Context, name: str, preset: PresetSpec,
                 args: Sequence[ast.Arg]) -> dict[str, object] | None:
    """The options of one preset, by keyword or by a bare word, as :mod:`ir.presets` lists them."""
    allowed = preset.options
    out: dict[str, object] = {}
    ok = True
    for arg in args:
        if isinstance(arg, ast.PositionalArg):
            word = value_text(arg.value)
            if word in preset.positional:
                key, value = preset.positional[word]
                out[key] = value
            elif word in MODE_NAMES:
                role = preset.role.value
                note = (f"to give the modes, write a tuple of four: {role}(S, S, S, R) or "
                        "(S, S, S, R)") if role != "pipeline" else (
                        "a pipeline is written 'pipeline(1f1b, microbatches = m)'")
                ctx.error(f"'{name}' takes options, not modes", Code.BAD_VALUE, arg.span, note)
                return None
            else:
                hint = did_you_mean(word, [*allowed, *preset.positional])
                ctx.error(f"'{name}' takes no option '{word}'{hint}", Code.UNKNOWN_NAME,
                          arg.span)
                ok = False
            continue
        key = arg.key.text
        option = allowed.get(key)
        if option is None:
            ctx.error(f"'{name}' takes no option '{key}'{did_you_mean(key, allowed)}",
                      Code.UNKNOWN_NAME, arg.key.span)
            ok = False
        elif option.kind is OptionKind.BOOL:
            out[key] = ctx.boolean(arg.value, key)
        elif option.kind is OptionKind.CHOICE:
            choice = ctx.word(arg.value, option.what, list(option.choices))
            out[key] = None if choice is None else option.choices[choice]
        elif option.kind is OptionKind.INTS:
            out[key] = read_ints(ctx, arg.value, key, option.bounds)
            out[f"{key}_span"] = arg.value.span
        else:
            out[key] = ctx.integer(arg.value, key, *option.bounds)
    if not ok or any(v is None for v in out.values()):
        return None
    return out


def read_ints(ctx: Context, value: ast.Value, what: str,
              bounds: tuple[int, int]) -> tuple[int, ...] | None:
    """A bracketed list of whole numbers, each within bounds (``layers = [7, 8, 8, 7]``)."""
    if not isinstance(value, ast.ListValue):
        ctx.error(f"{what} is a list of whole numbers in brackets, e.g. '{what} = [7, 8, 8, 7]'",
                  Code.BAD_VALUE, value.span)
        return None
    items = [ctx.integer(item, f"each entry of {what}", *bounds) for item in value.items]
    return None if any(n is None for n in items) else tuple(n for n in items if n is not None)


def tuple_placement(ctx: Context, role: Role, preset: str, args: Sequence[ast.Arg], group: Group,
                    span: Span) -> list[AxisPlacement]:
    modes: list[Mode] = []
    options: dict[str, object] = {}
    for index, arg in enumerate(args):
        if index < 4:
            mode = read_mode(ctx, arg, STATES[index])
            if mode is not None:
                modes.append(mode)
            continue
        if isinstance(arg, ast.KeywordArg) and arg.key.text == "sequence_parallel":
            options["sequence_parallel"] = ctx.boolean(arg.value, "sequence_parallel")
        else:
            ctx.error("a placement tuple has four modes: (Θ params, Ω optimizer, G gradients, "
                      "A activations)", Code.BAD_VALUE, arg.span)
            return []
    if len(args) < 4:
        ctx.error(f"a placement tuple has four modes (Θ, Ω, G, A), got {len(args)}",
                  Code.BAD_VALUE, span)
        return []
    if len(modes) != 4:
        return []
    if len(group.axes) != 1:
        ctx.error(f"a tuple is placed over one axis, got {group.label()}", Code.BAD_VALUE,
                  group.span)
        return []
    if role is Role.PIPELINE:
        ctx.error("write a pipeline as 'pipeline(1f1b, microbatches = m)', not a tuple",
                  Code.BAD_VALUE, span)
        return []
    if role is Role.TENSOR:
        options.setdefault("sequence_parallel", modes[3] is S)
    return [AxisPlacement(group.axes[0], role, (modes[0], modes[1], modes[2], modes[3]),
                          preset, span, **options)]  # type: ignore[arg-type]


def read_mode(ctx: Context, arg: ast.Arg, state: State) -> Mode | None:
    value = arg.value if isinstance(arg, ast.PositionalArg) else None
    if value is None or not isinstance(value, ast.NameValue | ast.StarredValue):
        ctx.error(f"expected a mode for {state.symbol} ({state.value}): R, S, S*, M or O",
                  Code.BAD_VALUE, arg.span)
        return None
    text = value.name.text + ("*" if isinstance(value, ast.StarredValue) else "")
    if text not in MODE_NAMES:
        hint = did_you_mean(text, MODE_NAMES)
        hint = hint if hint.startswith("; did you mean") else ""  # the note lists the modes
        ctx.error(f"unknown mode '{text}' for {state.symbol} ({state.value}){hint}",
                  Code.UNKNOWN_NAME, value.span,
                  "modes: R replicated, S sharded, S* sharded-with-gather, M materialized, "
                  "O offloaded")
        return None
    mode = MODE_NAMES[text]
    if mode is Mode.M and state is not State.ACTIVATIONS:
        ctx.error(f"mode M (materialized, recomputed) applies to activations, not to "
                  f"{state.symbol} ({state.value})", Code.BAD_VALUE, value.span)
        return None
    if mode is Mode.S_STAR and state is not State.PARAMS:
        ctx.error(f"mode S* (gathered before each use) applies to parameters, not to "
                  f"{state.symbol} ({state.value}); use S", Code.BAD_VALUE, value.span)
        return None
    return mode


def _is_mode_arg(arg: ast.Arg) -> bool:
    return isinstance(arg, ast.PositionalArg) and isinstance(arg.value, ast.NameValue | ast.StarredValue)
