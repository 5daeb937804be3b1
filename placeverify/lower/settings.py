"""Lower the statements that set how a step trains: offload, recompute, loss, microbatches, clip.

The modes ``offload`` and ``recompute`` give are :mod:`placeverify.lower.compose`'s; this module reads
the statements and reports what does not compose at the statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from placeverify.diagnostics import Code, Span, did_you_mean
from placeverify.ir.model import Model
from placeverify.ir.placement import STATE_NAMES, AxisPlacement, State
from placeverify.ir.presets import MAX_MICROBATCHES
from placeverify.ir.step import NormKind
from placeverify.ir.strategy import ClipConfig, Loss, LossKind, Recompute, RecomputeKind
from placeverify.lower.compose import with_offload
from placeverify.lower.values import Context, value_text
from placeverify.syntax import ast


def read_offload(ctx: Context, statements: Sequence[ast.OffloadStmt],
                 placements: tuple[AxisPlacement, ...]) -> tuple[AxisPlacement, ...]:
    seen: set[State] = set()
    for stmt in statements:
        if stmt.device is not None and stmt.device.text not in ("cpu", "host", "nvme"):
            ctx.error(f"unknown offload target '{stmt.device.text}'"
                      f"{did_you_mean(stmt.device.text, ['cpu', 'host', 'nvme'])}",
                      Code.UNKNOWN_NAME, stmt.device.span)
        for name in stmt.states:
            state = STATE_NAMES.get(name.text)
            if state is None:
                ctx.error(f"unknown state '{name.text}'"
                          f"{did_you_mean(name.text, ['params', 'optimizer', 'grads', 'activations'])}",
                          Code.UNKNOWN_NAME, name.span)
                continue
            if state in seen:
                ctx.error(f"'{name.text}' is offloaded twice", Code.DUPLICATE, name.span)
                continue
            seen.add(state)
            placements, problems = with_offload(placements, state)
            for problem in problems:
                ctx.error(problem.message, problem.code, name.span)
    return placements


def read_recompute(ctx: Context, stmt: ast.RecomputeStmt | None, model: Model) -> Recompute:
    if stmt is None:
        return Recompute(RecomputeKind.NONE, True, None)
    name = stmt.call.name.text
    kinds = [k.value for k in RecomputeKind]
    if name not in kinds:
        ctx.error(f"unknown recomputation '{name}'{did_you_mean(name, kinds)}",
                  Code.UNKNOWN_NAME, stmt.call.name.span)
        return Recompute(RecomputeKind.NONE, True, stmt.span)
    restore = True
    every = 1
    for arg in stmt.call.args:
        if isinstance(arg, ast.KeywordArg) and arg.key.text == "restore_rng":
            restore = bool(ctx.boolean(arg.value, "restore_rng"))
        elif isinstance(arg, ast.KeywordArg) and arg.key.text == "every" and name == "full":
            every = ctx.integer(arg.value, "every") or 1
        else:
            ctx.error("recompute full takes 'restore_rng = true|false' and 'every = N'"
                      if name == "full" else
                      "recompute takes one option, 'restore_rng = true|false' ('every = N' "
                      "is recompute full's)", Code.UNKNOWN_NAME, arg.span)
    if model.arch is None and name != "none":
        ctx.error("recomputation changes activation memory, which needs the architecture; "
                  "this model is a bare parameter count", Code.CONFLICT, stmt.span)
    elif model.arch is not None and model.arch.moe and name == RecomputeKind.SELECTIVE_OP:
        ctx.error("not modelled: selective_op recomputation of mixture-of-experts layers "
                  "(its policy is modelled on a dense layer)", Code.NOT_MODELLED, stmt.span)
    elif model.arch is not None and model.arch.latent is not None \
            and name == RecomputeKind.SELECTIVE_OP:
        ctx.error("not modelled: selective_op recomputation of multi-head latent attention "
                  "(its policy is modelled on Llama's attention)", Code.NOT_MODELLED, stmt.span)
    elif model.arch is not None and model.arch.mixed_layers and every > 1:
        ctx.error("not modelled: recompute full every = N of a model whose dense and MoE layers "
                  "differ (which kinds the recomputed layers are)", Code.NOT_MODELLED, stmt.span)
    return Recompute(RecomputeKind(name), restore, stmt.span, every)


def read_loss(ctx: Context, stmt: ast.LossStmt | None) -> Loss:
    if stmt is None:
        return Loss(LossKind.TOKEN_MEAN, None)
    name = stmt.call.name.text
    kinds = [k.value for k in LossKind]
    if name not in kinds:
        ctx.error(f"unknown loss normalisation '{name}'{did_you_mean(name, kinds)}",
                  Code.UNKNOWN_NAME, stmt.call.name.span,
                  "token_mean: mean over all tokens of the global batch; sample_mean; "
                  "microbatch_mean; sum")
        return Loss(LossKind.TOKEN_MEAN, stmt.span)
    uneven = False
    for arg in stmt.call.args:
        if (name == "sample_mean" and isinstance(arg, ast.PositionalArg)
                and value_text(arg.value) == "uneven"):
            uneven = True
        else:
            ctx.error(f"'{name}' takes no option here" + ("; sample_mean(uneven) says "
                      "micro-batches hold different sample counts" if name == "sample_mean"
                      else ""), Code.UNKNOWN_NAME, arg.span)
    return Loss(LossKind(name), stmt.span, uneven)


def read_microbatches(ctx: Context, stmt: ast.MicrobatchesStmt | None,
                       placements: tuple[AxisPlacement, ...]) -> int:
    declared = ctx.integer(stmt.value, "microbatches", 1, MAX_MICROBATCHES) if stmt else None
    for p in placements:
        if p.microbatches is None:
            continue
        if declared is not None and stmt is not None:
            check_microbatches(ctx, declared, stmt.span, p)
        declared = p.microbatches
    return declared or 1


def check_microbatches(ctx: Context, n: int, span: Span, pipeline: AxisPlacement | None,
                       declared: int | None = None) -> None:
    """A micro-batch count ``n`` must be the pipeline's, or else the one ``declared`` outside the
    step (1 when none is)."""
    if pipeline is not None and pipeline.microbatches is not None:
        if pipeline.microbatches != n:
            ctx.error(f"microbatches = {n} disagrees with the pipeline's microbatches = "
                      f"{pipeline.microbatches}", Code.CONFLICT, span,
                      f"the pipeline is placed at line {pipeline.span.line}")
    elif declared not in (None, 1, n):
        ctx.error(f"microbatches = {n} disagrees with microbatches = {declared} declared "
                  "outside the step", Code.CONFLICT, span)


def read_loss_scale(ctx: Context, stmt: ast.LossScaleStmt | None, default: str) -> str:
    if stmt is None:
        return default
    return ctx.word(ast.NameValue(stmt.kind), "loss scaling", ["dynamic", "static", "none"]) or default


def read_clip(ctx: Context, stmt: ast.ClipStmt | None) -> ClipConfig | None:
    if stmt is None:
        return None
    max_norm: Fraction | None = None
    norm = NormKind.L2
    for entry in stmt.entries:
        if entry.key.text == "norm":
            norm = read_norm(ctx, entry.value) or norm
            continue
        if entry.key.text != "max_norm":
            ctx.error(f"unknown clip key '{entry.key.text}'"
                      f"{did_you_mean(entry.key.text, ['max_norm', 'norm'])}", Code.UNKNOWN_NAME,
                      entry.key.span)
            continue
        max_norm = ctx.number(entry.value, "max_norm")
        if max_norm is not None and max_norm <= 0:
            ctx.error("max_norm must be positive", Code.BAD_VALUE, entry.value.span)
            max_norm = None
    return ClipConfig(max_norm, stmt.span, norm) if max_norm is not None else None


def read_norm(ctx: Context, value: ast.Value) -> NormKind | None:
    """``norm = 2`` or ``norm = inf``: the p of a clip's norm (another p is an error)."""
    if isinstance(value, ast.NumberValue) and value.value == 2:
        return NormKind.L2
    if isinstance(value, ast.NameValue) and value.name.text == "inf":
        return NormKind.INF
    ctx.error(f"a clip's norm is 2 or inf, not '{value_text(value)}'", Code.BAD_VALUE, value.span)
    return None
