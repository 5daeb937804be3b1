"""Single-device training on the global batch: what every correct distributed run must match.

One device holds the whole model and, each step, every sequence of the global batch (all data,
context and expert coordinates, all micro-batches). Its loss is the one the strategy declares
(:class:`placeverify.ir.strategy.LossKind`), with every per-position weight an exact rational
(:class:`fractions.Fraction`) before it becomes a float:

- ``token_mean``: the sum of labelled positions' losses over the global token count;
- ``sample_mean``: the mean over all samples of each sample's loss;
- ``microbatch_mean``: the mean over micro-batch units (one per micro-batch and sample-axis
  coordinate) of each unit's token mean;
- ``sum``: the plain sum.

Dropout draws one independent mask per element from the element's global identity (sample,
position, head, hidden index, layer, site; :mod:`placeverify.replay.data`), never from the ranks'
seed policy: a rank that seeds its dropout wrongly (the same stream for different samples or
positions, different streams for copies of one activation) gets other masks and diverges. The
optimizer, the clipping and the skipped step of dynamic loss scaling are those of the ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import torch

from placeverify.ir.model import ParamGroup
from placeverify.ir.precision import LossScale
from placeverify.ir.relations import Relation
from placeverify.ir.step import Clip, NormKind
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.replay.data import SITES, Dropout, make_atom, reference_nonces
from placeverify.replay.layout import Layout, ModelConfig, ParamSpec
from placeverify.replay.model import ReferenceMasks, init_params, reference_losses
from placeverify.roles.relations import relation

LEARNING_RATE = 0.05
MOMENTUM = 0.9
INF_NORM_WEIGHT = 8.0  # Setup.grad_weights: the gradients of a group an inf-norm clip misses
CLIP_HEADROOM = 4.0  # with clipping, the loss is scaled so the first gradient norm is 4x max_norm
NORM_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6)

Counts = dict[tuple[tuple[int, ...], int], int]


@dataclass
class Setup:
    """What the ranks and the reference share: strategy, mesh layout, model, counts, seeds."""

    strategy: Strategy
    layout: Layout
    config: ModelConfig
    specs: list[ParamSpec]
    tokens: Counts
    samples: Counts
    microbatches: int
    seed: int
    dtype: torch.dtype
    dropout: Dropout

    @property
    def max_norm(self) -> float | None:
        if self.strategy.clip is not None:
            return float(self.strategy.clip.max_norm)
        clips = [op for op in self.strategy.step.ops() if isinstance(op, Clip)]
        return float(clips[0].max_norm) if clips else None

    @property
    def norm(self) -> NormKind:
        """The p of the norm single-device training clips by (the declared clip's, else the
        step's first clip's)."""
        if self.strategy.clip is not None:
            return self.strategy.clip.norm
        clips = [op for op in self.strategy.step.ops() if isinstance(op, Clip)]
        return clips[0].norm if clips else NormKind.L2

    @property
    def dynamic(self) -> bool:
        return self.strategy.loss_scale == LossScale.DYNAMIC

    @cached_property
    def grad_weights(self) -> dict[ParamGroup, float]:
        """A weight per parameter group on every gradient, the same in the reference and on the
        ranks: 1, except that a group an inf-norm clip misses — one it does not measure, or one
        whose ranks hold different parts along a live axis the clip does not reduce over — is
        weighted by INF_NORM_WEIGHT, so that the largest element lies where the clip does not
        look (the replay's model otherwise puts it in the dense copies). Both sides see the
        same weighted gradients, so a correct step matches either way."""
        strategy = self.strategy
        out: dict[ParamGroup, float] = {}
        for op in strategy.step.ops():
            if not isinstance(op, Clip) or op.norm is not NormKind.INF:
                continue
            for group in strategy.model.groups_present():
                missed = not op.measures(group) or any(
                    strategy.size(p.axis) > 1 and p.axis not in op.group.axes
                    and relation(strategy, group, p.axis) is Relation.OWNED
                    for p in strategy.placements)
                if missed:
                    out[group] = INF_NORM_WEIGHT
        return out


@dataclass
class ReferenceResult:
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    alpha: float  # the per-token loss scale the ranks must use too
    skipped: list[int]


def units(setup: Setup) -> list[tuple[tuple[int, ...], int]]:
    """Micro-batch units: (coordinates on the sample axes, micro-batch), in a fixed order."""
    layout = setup.layout
    out = sorted({(tuple(b[layout.batch.index(a)] for a in layout.samples), k)
                  for b, k in setup.tokens})
    return out


def _atom_coords(setup: Setup, unit: tuple[int, ...], context: int) -> tuple[int, ...]:
    layout = setup.layout
    values = dict(zip(layout.samples, unit, strict=True))
    if layout.cp is not None:
        values[layout.cp] = context
    return tuple(values.get(a, 0) for a in layout.batch)


def global_batch(setup: Setup, step: int) -> tuple[torch.Tensor, torch.Tensor,
                                                    torch.Tensor | None, torch.Tensor,
                                                    list[tuple[tuple[int, ...], int, int]]]:
    """ids, labels, features and per-position loss weights of every sequence, and the rows'
    (unit, micro-batch, samples) in order."""
    layout, config = setup.layout, setup.config
    kind = setup.strategy.loss.kind
    all_units = units(setup)
    total_tokens = sum(setup.tokens.values())
    total_samples = sum(n for (b, k), n in setup.samples.items()
                        if layout.cp is None or b[layout.batch.index(layout.cp)] == 0)
    ids, labels, features, weights, rows = [], [], [], [], []
    for unit, k in all_units:
        chunks = [make_atom(config, setup.seed, step, _atom_coords(setup, unit, c), k,
                            setup.samples[(_atom_coords(setup, unit, c), k)],
                            setup.tokens[(_atom_coords(setup, unit, c), k)], setup.dtype)
                  for c in range(layout.cp_size)]
        samples = chunks[0].samples
        if any(a.samples != samples for a in chunks):
            raise ValueError("context ranks of one micro-batch hold different sample counts")
        mask = torch.cat([a.mask for a in chunks], dim=1)
        unit_tokens = sum(a.tokens for a in chunks)
        if kind is LossKind.TOKEN_MEAN:
            w = mask * float(Fraction(1, total_tokens))
        elif kind is LossKind.SAMPLE_MEAN:
            w = torch.full_like(mask, float(Fraction(1, config.seq * total_samples)))
        elif kind is LossKind.MICROBATCH_MEAN:
            w = mask * float(Fraction(1, len(all_units) * unit_tokens))
        else:
            w = mask
        ids.append(torch.cat([a.ids for a in chunks], dim=1))
        labels.append(torch.cat([a.labels for a in chunks], dim=1))
        if not config.transformer:
            features.append(torch.cat([a.features for a in chunks if a.features is not None], 1))
        weights.append(w)
        rows.append((unit, k, samples))
    feats = torch.cat(features) if features else None
    return torch.cat(ids), torch.cat(labels), feats, torch.cat(weights), rows


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
    alpha = 1.0
    skipped = []
    for step in range(steps):
        ids, labels, features, weights, rows = global_batch(setup, step)
        losses = reference_losses(params, setup.config, ids, labels, features,
                                  reference_masks(setup, step, rows))
        if setup.strategy.step.idle:  # a participation pattern (replay/participation.py)
            from placeverify.replay.participation import idle_grads

            grads = idle_grads(setup, step, params, losses, weights, rows)
        elif setup.strategy.terms:  # several loss terms: their weighted sum (replay/terms.py)
            from placeverify.replay.terms import reference_grads

            grads = reference_grads(setup, step, params, losses)
        else:
            (losses * weights).sum().backward()
            grads = {n: (v.grad if v.grad is not None else torch.zeros_like(v))
                     for n, v in params.items()}
        if setup.grad_weights:
            grads = {n: g * setup.grad_weights.get(groups[n], 1.0) for n, g in grads.items()}
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
        if setup.dynamic and step == 0:
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
