"""The single-device gradient under a participation pattern (:mod:`placeverify.replay.participation`).

Each parameter group's gradient comes from the sequences of the micro-batches that use it: a
micro-batch that leaves a group idle adds nothing to it, as on the ranks.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from placeverify.replay.batch import Setup, global_batch
from placeverify.replay.terms import term_loss
from placeverify.semantics.terms import TermView, projection, term_views


def idle_grads(setup: Setup, t: int, params: dict[str, torch.Tensor], losses: torch.Tensor,
               weights: torch.Tensor, rows: list[tuple[tuple[int, ...], int, int]]
               ) -> dict[str, torch.Tensor]:
    """The single-device gradient of training step ``t`` under the setup's pattern: each group's
    gradient from the sequences of the micro-batches that use it (with named loss terms, each
    term weighted as its projection says and kept on the groups it reaches, as
    :func:`placeverify.replay.terms.reference_grads` does)."""
    step = setup.strategy.step
    groups = {sp.name: sp.group for sp in setup.specs}
    names = list(params)
    out = {n: torch.zeros_like(v) for n, v in params.items()}
    sets = sorted({step.idle_in(groups[n]) for n in names}, key=sorted)
    terms = _weighted_terms(setup, t, losses, weights)
    jobs = [(idle, loss, view) for idle in sets for loss, view in terms]
    for j, (idle, loss, view) in enumerate(jobs):
        keep = torch.cat([torch.full((samples, 1), 0.0 if k in idle else 1.0, dtype=weights.dtype,
                                     device=weights.device) for _unit, k, samples in rows])
        grads = torch.autograd.grad((loss * keep).sum(), [params[n] for n in names],
                                    retain_graph=j + 1 < len(jobs), allow_unused=True)
        for n, g in zip(names, grads, strict=True):
            reached = view is None or view.reaches_group(groups[n])
            if g is not None and step.idle_in(groups[n]) == idle and reached:
                out[n] = out[n] + g
    return out


def _weighted_terms(setup: Setup, t: int, losses: torch.Tensor, weights: torch.Tensor
                    ) -> list[tuple[torch.Tensor, TermView | None]]:
    """Each loss term's weighted per-position losses (the main loss alone without terms)."""
    if not setup.strategy.terms:
        return [(losses * weights, None)]
    out: list[tuple[torch.Tensor, TermView | None]] = []
    for i, view in enumerate(term_views(setup.strategy)):
        projected = replace(setup, strategy=projection(setup.strategy, view))
        out.append((term_loss(losses, i) * global_batch(projected, t)[3], view))
    return out
