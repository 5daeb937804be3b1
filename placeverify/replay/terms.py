"""Named loss terms on real tensors: each term a loss of its own, the reference their sum.

The replay model has one per-position loss ``L`` (cross-entropy). Term ``i`` of
:func:`placeverify.semantics.terms.term_views` (0: the main loss) has the per-position loss
``L ^ (i + 1) / (i + 1)``, whose gradient ``L ^ i * dL`` weights positions differently from the
main loss's, so a term normalised wrongly moves the parameters in a direction the other terms do
not cancel. A term's gradient goes only to the parameter groups it reaches, on the ranks (the
buffers of other groups get nothing from its backward) and in the single-device reference
(:func:`reference_grads`), whose loss is the sum of every term under its own normalisation.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from placeverify.ir.strategy import Strategy
from placeverify.replay.batch import Setup, global_batch
from placeverify.semantics.terms import TermView, projection, term_views


def term_view(strategy: Strategy, name: str) -> TermView | None:
    """The main loss (name "") or the named term."""
    for view in term_views(strategy):
        if view.name == name:
            return view
    return None


def index_of(strategy: Strategy, name: str) -> int:
    """The term's position in :func:`term_views` (0: the main loss)."""
    return [v.name for v in term_views(strategy)].index(name)


def term_loss(losses: torch.Tensor, index: int) -> torch.Tensor:
    """Term ``index``'s per-position losses from the model's (index 0: the main loss itself)."""
    if index == 0:
        return losses
    return losses.pow(index + 1) / (index + 1)


def reference_grads(setup: Setup, step: int, params: dict[str, torch.Tensor],
                    losses: torch.Tensor) -> dict[str, torch.Tensor]:
    """The single-device gradient of the summed loss: each term weighted as its normalisation
    says (:func:`placeverify.replay.batch.global_batch` on the term's projection), its
    gradient kept on the parameter groups it reaches."""
    groups = {sp.name: sp.group for sp in setup.specs}
    names = list(params)
    out = {n: torch.zeros_like(v) for n, v in params.items()}
    views = term_views(setup.strategy)
    for i, view in enumerate(views):
        projected = replace(setup, strategy=projection(setup.strategy, view))
        weights = global_batch(projected, step)[3]
        total = (term_loss(losses, i) * weights).sum()
        grads = torch.autograd.grad(total, [params[n] for n in names],
                                    retain_graph=i + 1 < len(views), allow_unused=True)
        for n, g in zip(names, grads, strict=True):
            if g is not None and view.reaches_group(groups[n]):
                out[n] = out[n] + g
    return out
