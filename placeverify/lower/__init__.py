"""AST -> IR: resolve names, check values and sizes, expand presets, compose placements.

Lowering collects every error it can find in one pass and raises them together; each points at
the text it is about. Each section has its module: :mod:`.model`, :mod:`.precision`, :mod:`.mesh`
(and groups), :mod:`.placement` (presets from :mod:`placeverify.ir.presets`), :mod:`.settings`
(offload and recompute compose through :mod:`placeverify.lower.compose`; loss, microbatches, clip),
:mod:`.shapes`, and :mod:`.step` with :mod:`.step_ops`; all read values through one
:class:`~placeverify.lower.values.Context`. The configuration is built first; the step is the
written one or :func:`placeverify.lower.canonical.derive` of the configuration.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from placeverify.diagnostics import Code, PlaceError, Source
from placeverify.ir.strategy import Config, Strategy
from placeverify.lower import canonical
from placeverify.lower.compose import with_recompute
from placeverify.lower.fine_tune import check_fine_tune
from placeverify.lower.groups import check_offload
from placeverify.lower.mesh import read_mesh
from placeverify.lower.model import read_model
from placeverify.lower.overrides import Settings, apply
from placeverify.lower.participation import read_empty, read_unused
from placeverify.lower.placement import read_placements
from placeverify.lower.precision import check_compute, read_precision
from placeverify.lower.settings import (
    read_clip,
    read_loss,
    read_loss_scale,
    read_microbatches,
    read_offload,
    read_recompute,
)
from placeverify.lower.shapes import check_shapes
from placeverify.lower.step import lower_step
from placeverify.lower.terms import read_terms
from placeverify.lower.values import Context
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_source, read_source

T = TypeVar("T")


def load(path: str, settings: Settings | None = None) -> Strategy:
    """Read, parse and lower a ``.place`` file (under ``settings``, its ``--set`` overrides)."""
    source = read_source(path)
    if settings:
        return lower_overridden(source, settings)
    return lower(parse_source(source), source)


def load_text(text: str, path: str = "<text>", settings: Settings | None = None) -> Strategy:
    source = Source(path, text)
    if settings:
        return lower_overridden(source, settings)
    return lower(parse_source(source), source)


def lower_overridden(source: Source, settings: Settings) -> Strategy:
    """Parse ``source``, apply its overrides to the text (:mod:`placeverify.lower.overrides`)
    and lower the result; every diagnostic points at the file or at the override it is in."""
    parse_source(source)  # the file's own syntax errors, as without overrides
    edited = apply(source, settings)
    try:
        strategy = lower(parse_source(edited.source), edited.source)
    except PlaceError as error:
        raise edited.error(error) from None
    warnings = tuple(edited.diagnostic(w, own_source=True) for w in strategy.warnings)
    return replace(strategy, warnings=warnings, overrides=edited.overrides)


def lower(file: ast.File, source: Source) -> Strategy:
    """Lower a parsed file, or raise :class:`~placeverify.diagnostics.PlaceError` with every
    error found."""
    ctx = Context(source)
    by_type: dict[type, list[ast.Statement]] = {}
    for statement in file.statements:
        by_type.setdefault(type(statement), []).append(statement)

    def of(kind: type[T]) -> list[T]:
        return by_type.get(kind, [])  # type: ignore[return-value]

    name_stmt = ctx.single(of(ast.StrategyStmt), "strategy")
    model_stmt = ctx.single(of(ast.ModelStmt), "model")
    precision_stmt = ctx.single(of(ast.PrecisionStmt), "precision")
    mesh_stmt = ctx.single(of(ast.MeshStmt), "mesh")
    recompute_stmt = ctx.single(of(ast.RecomputeStmt), "recompute")
    loss_stmt = ctx.single([s for s in of(ast.LossStmt) if s.term is None], "loss")
    microbatch_stmt = ctx.single(of(ast.MicrobatchesStmt), "microbatches")
    clip_stmt = ctx.single(of(ast.ClipStmt), "clip")
    scale_stmt = ctx.single(of(ast.LossScaleStmt), "loss_scale")
    step_stmt = ctx.single(of(ast.StepStmt), "step")

    end = source.end_span()
    if model_stmt is None:
        ctx.error("no 'model' statement: say what is trained, e.g. 'model llama3_8b' or "
                  "'model { params = 7.5e9 }'", Code.MISSING, end)
    if mesh_stmt is None:
        ctx.error("no 'mesh' statement: name the axes and their sizes, e.g. "
                  "'mesh { dp = 8 }'", Code.MISSING, end)
    if not of(ast.PlaceStmt):
        ctx.error("no 'place' statement: place the states over each axis, e.g. "
                  "'place zero3 over dp'", Code.MISSING, end)

    model = read_model(ctx, model_stmt) if model_stmt else None
    precision = read_precision(ctx, precision_stmt)
    mesh = read_mesh(ctx, mesh_stmt) if mesh_stmt else None
    if mesh is not None and precision_stmt is not None:
        check_compute(ctx, precision_stmt, precision, mesh)
    ctx.diag.raise_if_errors()
    assert model is not None and mesh is not None and model_stmt is not None

    placements = read_placements(ctx, of(ast.PlaceStmt), mesh, model)
    check_fine_tune(ctx, model, placements, {a.name: a.size for a in mesh.axes}, model_stmt.span)
    placements = read_offload(ctx, of(ast.OffloadStmt), placements)
    check_offload(ctx, placements, of(ast.OffloadStmt))  # per-group meshes (lower/groups.py)
    recompute = read_recompute(ctx, recompute_stmt, model)
    placements = with_recompute(placements, recompute.kind)
    loss = read_loss(ctx, loss_stmt)
    named = [s for s in of(ast.LossStmt) if s.term is not None]
    terms = read_terms(ctx, named, model) if named else ()
    unused = read_unused(ctx, of(ast.UnusedStmt), model) if of(ast.UnusedStmt) else frozenset()
    kinds = [loss.kind, *(t.loss.kind for t in terms)]
    empty = read_empty(ctx, of(ast.EmptyStmt), kinds) if of(ast.EmptyStmt) else False
    microbatches = read_microbatches(ctx, microbatch_stmt, placements)
    clip = read_clip(ctx, clip_stmt)
    loss_scale = read_loss_scale(ctx, scale_stmt, precision.loss_scale)
    ctx.diag.raise_if_errors()
    check_shapes(ctx, model, mesh, placements, microbatches)
    ctx.diag.raise_if_errors()

    config = Config(
        name=name_stmt.name.value if name_stmt else source.path, source=source, model=model,
        model_span=model_stmt.span, precision=precision,
        precision_span=precision_stmt.span if precision_stmt else None, mesh=mesh,
        placements=placements, recompute=recompute, loss=loss, microbatches=microbatches,
        clip=clip, loss_scale=loss_scale, terms=terms, unused=unused, empty=empty)
    step = lower_step(ctx, step_stmt, config) if step_stmt is not None else canonical.derive(config)
    ctx.diag.raise_if_errors()
    if step.microbatches != config.microbatches:  # the written step declares its own count
        config = replace(config, microbatches=step.microbatches)
    return Strategy(config, step, tuple(ctx.diag.warnings))
