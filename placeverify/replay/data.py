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

**Dropout: one independent draw per element of the single-device model.** The reference is the
paper's single-device semantics: every element of every dropout site draws its own mask, a pure
function of its *global identity* — (layer nonce, site, layer, the sample's coordinates on the
sample axes and its row in its atom, global head, global position, key position or hidden index)
— through a counter-based hash (:func:`uniform`), so the reference computes exactly the mask each
element must get, whatever the mesh. The *layer nonce* is the only value drawn from the global RNG
(``torch.randint`` after ``torch.manual_seed(layer seed)``, outside any recomputation; the layer
seed mixes step, micro-batch and layer), so ``torch.utils.checkpoint(preserve_rng_state=False)``
recomputes a layer with a different nonce and different masks (OLMo-core#828), and
``preserve_rng_state=True`` with the same.

A rank does not know global identities: it hashes a *stream key* — the coordinates its seed
policy folds in — with the *local* index of each element, exactly as a rank seeding its own
generator does. Along each mesh axis a site is *sharded* (the ranks hold different elements:
samples along data and expert axes, positions along context axes and along a tensor axis under
sequence parallelism, heads of attention dropout along a tensor axis) or *replicated* (the ranks
hold copies: hidden dropout along a tensor axis without sequence parallelism). The step's ``seed
dropout(region) same|differ over axes`` statements say whether the axis coordinate is folded in
(differ) or not (same); without a statement a sharded region differs and a replicated region is
the same — Megatron-LM's ``model_parallel_cuda_manual_seed`` split into a default and a tracker
stream. Folding in the coordinate of a sharded axis is knowing which global element a local index
is (the local index plus the rank's offset along the axis), so with the correct policy a rank's
key *is* the global identity and its masks equal the reference's bit for bit. A wrong policy
shows: ``same`` over a sharded axis makes every rank compute the offset of coordinate 0, so it
reuses the masks of another rank's samples, positions or heads; ``differ`` over a replicated axis
adds the coordinate to the key (the global identity has none), so the copies draw different masks.
Pipeline axes are neither: a layer lives on one stage, and the layer is part of the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from placeverify.ir.placement import Role
from placeverify.ir.step import Region
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.replay.layout import Layout, ModelConfig
from placeverify.semantics import rng

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


M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2^32`` for ``0 <= x < 2^32`` in int64, without overflowing int64."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & M32


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit finaliser (C. Wellons' ``lowbias32``), elementwise and exact."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x7FEB352D)
    h = h ^ (h >> 15)
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def uniform(key: int, fields: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Uniform numbers in [0, 1) on 24 bits, one per element of the broadcast ``fields`` (int64
    index tensors, each below 2^32), a pure function of ``key`` and the element's field values:
    the same on every rank, device and run."""
    h = _mix32(torch.tensor(key & M32, dtype=torch.int64))
    h = _mix32(h ^ ((key >> 32) & M32))
    for f in fields:
        h = _mix32(h ^ f)
    return (h >> 8).to(dtype) * 2.0 ** -24


@dataclass(frozen=True, slots=True)
class SiteAxes:
    """How the mesh axes split one dropout site's activations (see the module doc)."""

    samples: tuple[str, ...]  # axes whose ranks hold different samples
    heads: tuple[str, ...]  # axes whose ranks hold different heads (attention dropout)
    positions: tuple[str, ...]  # axes whose ranks hold different positions, outermost first
    replicated: tuple[str, ...]  # axes whose ranks hold copies of the same activations


class Dropout:
    """Mask factory for every dropout site: the ranks' masks follow the step's seed statements,
    the reference's follow the elements' global identity (see the module doc)."""

    def __init__(self, strategy: Strategy, layout: Layout, config: ModelConfig,
                 dtype: torch.dtype) -> None:
        self.p = config.dropout
        self.dtype = dtype
        self.layout = layout
        self.config = config
        self.names = layout.names
        self.sites: dict[str, SiteAxes] = {}
        self.fold: dict[str, tuple[str, ...]] = {}
        roles = {pl.axis: pl.role for pl in strategy.placements}
        for site in SITES:
            samples = layout.samples
            heads: tuple[str, ...] = ()
            positions: tuple[str, ...] = (layout.cp,) if layout.cp else ()
            replicated: tuple[str, ...] = ()
            if layout.tp is not None:
                if site == "attn":
                    heads = (layout.tp,)
                elif layout.sp:
                    positions = (*positions, layout.tp)
                else:
                    replicated = (layout.tp,)
            self.sites[site] = SiteAxes(samples, heads, positions, replicated)
            folded = []
            for axis in layout.names:
                if roles[axis] is Role.PIPELINE:
                    continue  # stages are told apart by the layer (stream_layer)
                region = Region.REPLICATED if axis in replicated else Region.SHARDED
                differ, _ = rng.declared(strategy, axis, region)
                if differ:
                    folded.append(axis)
            self.fold[site] = tuple(folded)
        # Along a pipeline axis stages hold different layers; a seed shared by the stages
        # ('same over pp') makes stage s's j-th layer draw what stage 0's j-th layer draws.
        self.stages_differ = layout.pp is None or rng.declared(strategy, layout.pp,
                                                               Region.SHARDED)[0]

    def stream_layer(self, layer: int, coords: dict[str, int]) -> int:
        """The layer index a rank's random stream is keyed by: the global layer, or with one
        seed shared by all pipeline stages, the layer's index within its stage."""
        if self.stages_differ or self.layout.pp is None:
            return layer
        return layer - coords.get(self.layout.pp, 0) * (self.config.layers // self.layout.pp_size)

    @property
    def active(self) -> bool:
        return self.p > 0

    def _keep(self, site: str, layer: int, nonce: int, sample: tuple[int, ...],
              salt: tuple[int, ...], fields: list[torch.Tensor]) -> torch.Tensor:
        key = mix(nonce, SITES[site], layer, len(sample), *sample, len(salt), *salt)
        keep = uniform(key, fields, self.dtype) >= self.p
        return keep.to(self.dtype) / (1 - self.p)

    def mask(self, site: str, layer: int, nonce: int, coords: dict[str, int],
             shape: tuple[int, ...]) -> torch.Tensor:
        """A rank's mask: its local elements, keyed by the coordinates its policy folds in."""
        axes = self.sites[site]
        fold = self.fold[site]

        def seen(axis: str) -> int:  # the coordinate the rank's stream knows (0 when not folded)
            return coords.get(axis, 0) if axis in fold else 0

        def offset(split: tuple[str, ...], local: int) -> int:
            total, stride = 0, local
            for axis in reversed(split):
                total += seen(axis) * stride
                stride *= self.layout.size(axis)
            return total

        sample = tuple(seen(a) for a in axes.samples)
        salt = tuple(v for a in axes.replicated if a in fold and self.layout.size(a) > 1
                     for v in (self.names.index(a), coords.get(a, 0)))
        rows = _index(shape, 0, 0)
        if site == "attn":
            fields = [rows, _index(shape, 1, offset(axes.heads, shape[1])),
                      _index(shape, 2, offset(axes.positions, shape[2])), _index(shape, 3, 0)]
        else:
            fields = [rows, _index(shape, 1, offset(axes.positions, shape[1])),
                      _index(shape, 2, 0)]
        return self._keep(site, layer, nonce, sample, salt, fields)

    def reference_mask(self, site: str, layer: int, nonce: int, unit: tuple[int, ...],
                       samples: int) -> torch.Tensor:
        """The single-device model's mask for the ``samples`` sequences of one micro-batch unit
        (coordinates ``unit`` on the sample axes): every element from its global identity."""
        c = self.config
        shape = ((samples, c.heads, c.seq, c.seq) if site == "attn"
                 else (samples, c.seq, c.hidden))
        return self._keep(site, layer, nonce, unit, (),
                          [_index(shape, d, 0) for d in range(len(shape))])


def _index(shape: tuple[int, ...], dim: int, start: int) -> torch.Tensor:
    """Indices ``start + i`` along ``dim``, shaped to broadcast against ``shape``."""
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return (torch.arange(shape[dim], dtype=torch.int64) + start).view(view)
