"""Deterministic data and dropout masks, shared by the ranks and the single-device reference.

**Atoms.** The global batch of one step is a set of atoms: the tokens that the ranks with batch
coordinates ``b`` (data, context and expert axes) see in micro-batch ``k``, exactly the atoms of
:mod:`placeverify.semantics.groups`. An atom holds ``samples`` sequences of ``chunk`` positions
(a context rank's part of each sequence); ``tokens`` of its positions carry a label that counts in
the loss, the rest are padding (``ignore_index``, as in Hugging Face models — how token counts come
to differ between micro-batches, transformers#34191). Every atom is drawn from its own generator,
seeded from (seed, step, micro-batch, coordinates), so every rank that holds an atom, and the
reference, draw the same one; each training step draws fresh data.

**Loss units.** ``sum`` in a backward statement is the sum of per-token losses (cross entropy)
over the atom's labelled positions, or under ``loss sample_mean`` the sum of per-sample losses,
a sample's loss being the mean of its per-position losses over the whole sequence (so a context
rank's share of it is its positions' sum divided by the full sequence length).

**Dropout.** A mask is a function of (layer nonce, site, layer, the coordinates folded in): a rank
draws it from a private generator, never from the global stream. The *layer nonce* is the only
value drawn from the global RNG (``torch.randint`` after ``torch.manual_seed(layer seed)``, outside
any recomputation), so ``torch.utils.checkpoint(preserve_rng_state=False)`` recomputes a layer
with a different nonce and different masks (OLMo-core#828), and ``preserve_rng_state=True`` with
the same. Along each mesh axis a site is in a *replicated* region (all ranks hold the same
activations: hidden dropout over a tensor axis without sequence parallelism) or a *sharded* one
(attention heads over a tensor axis, and every batch axis). The step's ``seed dropout(region)
same|differ over axes`` statements say whether the axis coordinate is folded into the seed (differ)
or not (same); without a statement a sharded region differs and a replicated region is the same —
Megatron-LM's ``model_parallel_cuda_manual_seed`` split into a default and a tracker stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from placeverify.ir.placement import Role
from placeverify.ir.step import Region
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.replay.layout import Layout, ModelConfig

MASK64 = (1 << 64) - 1
NONCE_LIMIT = 1 << 62
SITES = {"attn": 1, "hid_attn": 2, "hid_mlp": 3}


def mix(*values: int) -> int:
    """A 63-bit hash of integers (SplitMix64 finaliser, Steele et al. 2014), stable across runs."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & MASK64)) & MASK64
        h = (h * 0xBF58476D1CE4E5B9) & MASK64
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & MASK64
        h ^= h >> 29
    return h >> 1


@dataclass(frozen=True, slots=True)
class Atom:
    ids: torch.Tensor  # (samples, chunk) input token ids
    labels: torch.Tensor  # (samples, chunk)
    mask: torch.Tensor  # (samples, chunk): 1 where the position's loss counts
    features: torch.Tensor | None  # (samples, chunk, hidden) inputs of the MLP model
    tokens: int
    samples: int


def make_atom(config: ModelConfig, seed: int, step: int, coords: tuple[int, ...], k: int,
              samples: int, tokens: int, dtype: torch.dtype) -> Atom:
    if tokens > samples * config.chunk:
        raise ValueError(f"{tokens} tokens do not fit {samples} x {config.chunk} positions")
    g = torch.Generator().manual_seed(mix(seed, 1, step, k, *coords))
    shape = (samples, config.chunk)
    ids = torch.randint(0, config.vocab, shape, generator=g)
    labels = torch.randint(0, config.vocab, shape, generator=g)
    features = None
    if not config.transformer:
        features = torch.randn((*shape, config.hidden), generator=g, dtype=dtype)
    # Labelled positions fill the sequences position by position, so every sample gets some.
    order = torch.arange(samples * config.chunk).view(config.chunk, samples).t()
    mask = (order < tokens).to(dtype)
    return Atom(ids, labels, mask, features, tokens, samples)


def loss_weights(strategy: Strategy, atom: Atom, config: ModelConfig) -> torch.Tensor:
    """Weights that turn per-position losses into this atom's ``sum`` (see the module doc)."""
    if strategy.loss.kind is LossKind.SAMPLE_MEAN:
        return torch.full_like(atom.mask, 1.0 / config.seq)
    return atom.mask


def layer_seed(seed: int, step: int, k: int, layer: int) -> int:
    return mix(seed, 2, step, k, layer)


def draw_nonce(generator: torch.Generator | None = None) -> int:
    return int(torch.randint(0, NONCE_LIMIT, (1,), generator=generator).item())


def reference_nonces(seed: int, step: int, k: int, layer: int) -> tuple[int, int]:
    """The (hidden, attention) nonces a rank draws from the global stream for this layer."""
    g = torch.Generator().manual_seed(layer_seed(seed, step, k, layer))
    return draw_nonce(g), draw_nonce(g)


class Dropout:
    """Mask factory for every dropout site, following the step's seed statements."""

    def __init__(self, strategy: Strategy, layout: Layout, config: ModelConfig,
                 dtype: torch.dtype) -> None:
        self.p = config.dropout
        self.dtype = dtype
        self.names = layout.names
        self.fold: dict[str, tuple[str, ...]] = {}
        roles = {pl.axis: pl.role for pl in strategy.placements}
        for site in SITES:
            folded = []
            for axis in layout.names:
                role = roles[axis]
                if role is Role.PIPELINE:
                    continue  # a layer lives on one stage: its nonce already tells stages apart
                region = Region.SHARDED
                if role is Role.TENSOR and site != "attn" and not layout.sp:
                    region = Region.REPLICATED
                differ = region is Region.SHARDED
                for s in strategy.step.seeds:
                    if s.region is region and axis in s.group.axes:
                        differ = not s.same
                if differ:
                    folded.append(axis)
            self.fold[site] = tuple(folded)

    @property
    def active(self) -> bool:
        return self.p > 0

    def mask(self, site: str, layer: int, nonce: int, coords: dict[str, int],
             shape: tuple[int, ...]) -> torch.Tensor:
        folded = [v for a in self.fold[site] for v in (self.names.index(a), coords.get(a, 0))]
        g = torch.Generator().manual_seed(mix(nonce, SITES[site], layer, *folded))
        keep = torch.rand(shape, generator=g, dtype=self.dtype) >= self.p
        return keep.to(self.dtype) / (1 - self.p)
