"""What the ranks and the single-device reference share: the setup of a run and its global batch.

A :class:`Setup` holds the strategy, its mesh layout, the replay model and the token and sample
counts of every micro-batch; :func:`global_batch` builds, for one training step, every sequence of
the global batch (all data, context and expert coordinates, all micro-batches) with its
per-position loss weight, an exact rational (:class:`fractions.Fraction`) before it becomes a
float, as the declared loss says (:class:`placeverify.ir.strategy.LossKind`):

- ``token_mean``: the sum of labelled positions' losses over the global token count;
- ``sample_mean``: the mean over all samples of each sample's loss;
- ``microbatch_mean``: the mean over micro-batch units (one per micro-batch and sample-axis
  coordinate) of each unit's token mean;
- ``sum``: the plain sum.

The reference (:mod:`placeverify.replay.reference`), its loss terms (:mod:`placeverify.replay.
terms`) and participation patterns (:mod:`placeverify.replay.participation`) all read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import torch

from placeverify.ir.model import ParamGroup
from placeverify.ir.precision import LossScale
from placeverify.ir.relations import Relation
from placeverify.ir.step import Clip, NormKind
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.replay.data import Dropout, make_atom
from placeverify.replay.layout import Layout, ModelConfig, ParamSpec
from placeverify.roles.relations import relation

INF_NORM_WEIGHT = 8.0  # Setup.grad_weights: the gradients of a group an inf-norm clip misses

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

    @property
    def skips(self) -> bool:
        """Does the update skip on the overflow flag (dynamic loss scaling, or 'update params
        unless overflow'; placeverify.semantics.skip)? The ranks then inject an overflow into
        one rank's gradients in step :func:`overflow_step`, and the reference skips that step."""
        from placeverify.semantics.skip import skips_on_overflow

        return skips_on_overflow(self.strategy)

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


def overflow_step(steps: int) -> int:
    """The step whose gradients the ranks make overflow when the update skips on the flag: the
    second of several, the only one of one. In the first the momentum is still 0, so a rank that
    updates with the zero gradient a clip of an infinite norm leaves it (max_norm / inf) moves
    nothing, as a skip does, and a rank that should have skipped could not be told apart."""
    return 1 if steps > 1 else 0


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
