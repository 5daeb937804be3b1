"""Single-device training on the global batch: what every correct distributed run must match.

One device holds the whole model and, each step, every sequence of the global batch
(:func:`placeverify.replay.batch.global_batch`: all data, context and expert coordinates, all
micro-batches, each position weighted as the strategy's loss says).

Dropout draws one independent mask per element from the element's global identity (sample,
position, head, hidden index, layer, site; :mod:`placeverify.replay.data`), never from the ranks'
seed policy: a rank that seeds its dropout wrongly (the same stream for different samples or
positions, different streams for copies of one activation) gets other masks and diverges. The
optimizer, the clipping and the skipped step of dynamic loss scaling are those of the ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from placeverify.ir.step import NormKind
from placeverify.replay.batch import INF_NORM_WEIGHT as INF_NORM_WEIGHT
from placeverify.replay.batch import Setup, global_batch, overflow_step
from placeverify.replay.data import SITES, reference_nonces
from placeverify.replay.idle import idle_grads
from placeverify.replay.model import ReferenceMasks, init_params, reference_losses
from placeverify.replay.terms import reference_grads

LEARNING_RATE = 0.05
MOMENTUM = 0.9
CLIP_HEADROOM = 4.0  # with clipping, the loss is scaled so the first gradient norm is 4x max_norm
NORM_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6)


@dataclass
class ReferenceResult:
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    alpha: float  # the per-token loss scale the ranks must use too
    skipped: list[int]


def reference_masks(setup: Setup, step: int,
                    rows: list[tuple[tuple[int, ...], int, int]]) -> ReferenceMasks:
    """Each site's mask for the whole batch, every element from its global identity
    (:class:`placeverify.replay.data.Dropout`): what every element must get, whatever the ranks'
    seed policy says."""
    config, dropout = setup.config, setup.dropout
    if not dropout.active or not config.transformer:
        return ReferenceMasks({})
    masks: dict[tuple[str, int], torch.Tensor] = {}
    for i in range(config.layers):
        drawn: dict[str, list[torch.Tensor]] = {site: [] for site in SITES}
        for unit, k, samples in rows:
            n_hid, n_attn = reference_nonces(setup.seed, step, k, i)
            for site in SITES:
                nonce = n_attn if site == "attn" else n_hid
                drawn[site].append(dropout.reference_mask(site, i, nonce, unit, samples))
        for site, parts in drawn.items():
            masks[(site, i)] = torch.cat(parts)
    return ReferenceMasks(masks)


def _norm(grads: dict[str, torch.Tensor], norm: NormKind = NormKind.L2) -> float:
    if norm is NormKind.INF:
        return float(torch.stack([g.abs().max() if g.numel() else g.new_zeros(())
                                  for g in grads.values()]).max())
    return float(torch.sqrt(torch.stack([(g * g).sum() for g in grads.values()]).sum()))


def train(setup: Setup, steps: int, jitter: float = 0.0) -> ReferenceResult:
    """The single-device run. With ``jitter`` every gradient element is multiplied by
    ``1 ± jitter`` (a fixed sign pattern) in every step: a rounding-sized disturbance, to measure
    how much the training's own dynamics amplify one (:func:`sensitivity`)."""
    params = {n: v.clone().requires_grad_(True)
              for n, v in init_params(setup.specs, setup.seed, setup.dtype).items()}
    signs: dict[str, torch.Tensor] = {}
    if jitter:
        generator = torch.Generator().manual_seed(setup.seed + 1)
        signs = {n: 1.0 + jitter * (torch.randint(0, 2, v.shape, generator=generator) * 2 - 1)
                 .to(setup.dtype) for n, v in params.items()}
    momentum = {n: torch.zeros_like(v) for n, v in params.items()}
    groups = {spec.name: spec.group for spec in setup.specs}
    frozen = setup.strategy.model.frozen
    alpha = 1.0
    skipped = []
    for step in range(steps):
        ids, labels, features, weights, rows = global_batch(setup, step)
        losses = reference_losses(params, setup.config, ids, labels, features,
                                  reference_masks(setup, step, rows))
        if setup.strategy.step.idle:  # a participation pattern (replay/idle.py)
            grads = idle_grads(setup, step, params, losses, weights, rows)
        elif setup.strategy.terms:  # several loss terms: their weighted sum (replay/terms.py)
            grads = reference_grads(setup, step, params, losses)
        else:
            (losses * weights).sum().backward()
            grads = {n: (v.grad if v.grad is not None else torch.zeros_like(v))
                     for n, v in params.items()}
        if setup.grad_weights:
            grads = {n: g * setup.grad_weights.get(groups[n], 1.0) for n, g in grads.items()}
        if frozen:  # a frozen group has no gradient: the fine-tune leaves it as it is
            grads = {n: torch.zeros_like(g) if groups[n] in frozen else g for n, g in grads.items()}
        if signs:
            grads = {n: g * signs[n] for n, g in grads.items()}
        for v in params.values():
            v.grad = None
        max_norm = setup.max_norm
        if step == 0 and max_norm is not None:
            norm = _norm(grads, setup.norm)
            if norm > 0:
                alpha = CLIP_HEADROOM * max_norm / norm
        grads = {n: g * alpha for n, g in grads.items()}
        if setup.skips and step == overflow_step(steps):
            skipped.append(step)  # the ranks inject an overflow into this step's gradients
            continue
        if max_norm is not None:
            norm = _norm(grads, setup.norm)
            coef = min(1.0, max_norm / (norm + NORM_EPS))
            grads = {n: g * coef for n, g in grads.items()}
        with torch.no_grad():
            for n, v in params.items():
                momentum[n].mul_(MOMENTUM).add_(grads[n])
                v.sub_(LEARNING_RATE * momentum[n])
    return ReferenceResult({n: v.detach() for n, v in params.items()}, momentum, alpha, skipped)


def sensitivity(setup: Setup, steps: int, reference: ReferenceResult, unit: float) -> float:
    """How far the reference moves when every gradient is disturbed by one rounding unit
    (``unit``) in every step: the largest difference of a parameter or momentum element. A
    correct distributed run differs from the reference by such disturbances (sums associated
    differently), so where the dynamics amplify them past the replay's tolerance, or overflow,
    the comparison cannot tell a bug from rounding (nan when a state is not finite)."""
    disturbed = train(setup, steps, jitter=unit)
    worst = 0.0
    for mine, theirs in ((reference.params, disturbed.params),
                         (reference.momentum, disturbed.momentum)):
        for name, value in mine.items():
            if not (bool(torch.isfinite(value).all()) and bool(torch.isfinite(theirs[name]).all())):
                return math.nan
            if value.numel():
                worst = max(worst, float((value - theirs[name]).abs().max()))
    return worst
