"""Lower a collective inside the loss: ``all_gather(differentiable | detached) embeddings over G``
or ``all_reduce(sum, differentiable | detached) embeddings over G`` before a backward.

The statement belongs in ``each microbatch`` (or the step's top level) before the backward whose
loss it feeds; every backward after it in the same block is computed from the gathered
embeddings (:class:`placeverify.ir.step.LossGather`, :mod:`placeverify.semantics.gather`).
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.diagnostics import Code, did_you_mean
from placeverify.ir.step import Backward, CollectiveKind, LossGather
from placeverify.ir.strategy import Config
from placeverify.lower.mesh import read_group
from placeverify.lower.values import Context, value_text
from placeverify.roles.relations import sample_axes
from placeverify.syntax import ast

TARGET = "embeddings"
KINDS = {"all_gather": CollectiveKind.ALL_GATHER, "all_reduce": CollectiveKind.ALL_REDUCE}
MODES = ("differentiable", "detached")


def is_loss_gather(item: ast.StepItem) -> bool:
    """A statement whose target is ``embeddings``: a collective inside the loss."""
    return isinstance(item, ast.OpStmt) and item.target.name.text == TARGET


def read_loss_gather(ctx: Context, item: ast.OpStmt, config: Config) -> LossGather | None:
    """The statement read against the configuration, or None after an error at the text."""
    name = item.name.text
    kind = KINDS.get(name)
    if kind is None:
        ctx.error(f"'{name}' does not act on embeddings; a collective inside the loss is "
                  f"'all_gather(differentiable | detached) embeddings over G' or "
                  f"'all_reduce(sum, differentiable | detached) embeddings over G'",
                  Code.BAD_VALUE, item.name.span)
        return None
    if item.target.selectors:
        ctx.error("'embeddings' has no parameter groups to select", Code.BAD_VALUE,
                  item.target.span)
        return None
    mode: str | None = None
    for arg in item.args:
        word = value_text(arg.value)
        if isinstance(arg, ast.PositionalArg) and word in MODES:
            if mode is not None:
                ctx.error("say once whether the collective is differentiable or detached",
                          Code.DUPLICATE, arg.span)
                return None
            mode = word
        elif isinstance(arg, ast.PositionalArg) and word == "sum" and kind is CollectiveKind.ALL_REDUCE:
            continue
        else:
            allowed = [*MODES, *(["sum"] if kind is CollectiveKind.ALL_REDUCE else [])]
            ctx.error(f"'{name}' of embeddings takes no option '{word}'"
                      f"{did_you_mean(word, allowed)}", Code.UNKNOWN_NAME, arg.span,
                      "embeddings are summed (all_reduce(sum, ...)) or gathered; say whether "
                      "the collective's backward carries the gradient: differentiable or detached")
            return None
    if mode is None:
        ctx.error(f"say whether the {name} of embeddings is differentiable (its backward sends "
                  f"every rank's gradient back to the rank that owns the slice, as "
                  f"torch.distributed.nn does) or detached (a plain torch.distributed {name})",
                  Code.MISSING, item.span,
                  f"e.g. '{name}({'sum, ' if kind is CollectiveKind.ALL_REDUCE else ''}"
                  f"differentiable) embeddings over dp'")
        return None
    if item.group is None:
        ctx.error(f"'{name}' of embeddings needs a group: '... embeddings over dp'", Code.MISSING,
                  item.span)
        return None
    group = read_group(ctx, item.group, config.mesh)
    if group is None:
        return None
    samples = sample_axes(config)
    outside = [a for a in group.axes if a not in samples]
    if outside or group.ends:
        axis = outside[0] if outside else sorted(group.ends)[0]
        ctx.error(f"the embeddings are gathered over axes whose ranks hold different samples "
                  f"({', '.join(samples) or 'none in this mesh'}); '{axis}' is not one",
                  Code.BAD_VALUE, item.group.span)
        return None
    return LossGather(kind, mode == "differentiable", group, item.span)


def with_gather(backward: Backward, gather: LossGather | None) -> Backward:
    """The backward computed from the gathered embeddings."""
    return backward if gather is None else replace(backward, gather=gather)


def unused_gather(ctx: Context, gather: LossGather | None) -> None:
    """A collective of embeddings with no backward after it in its block."""
    if gather is not None:
        ctx.error("no 'backward' follows this collective of embeddings in its block; it feeds "
                  "the loss of the backwards after it", Code.BAD_VALUE, gather.span)
