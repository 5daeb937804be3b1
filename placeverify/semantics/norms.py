"""The norm a clip statement computes on every rank, and the global norm it stands for: written once.

Single-device training clips by the p-norm of the whole gradient (p = 2 or inf, the declared
``clip ... norm``). On a mesh, each rank holds *parts* of each parameter group: along the axes
where ranks hold different elements (owned parameters, a reduce-scattered shard) the parts are
different; along the other axes of the clip's group they are copies. A clip
``clip(max_norm = c, norm = p, reduce = op, replicated = r) grads over G`` runs, on every rank:

1. the rank's *local* value over the groups it measures (those it scales, or ``norm_of``'s):
   the sum of the parts' squared 2-norms (p = 2) or the largest of their inf norms (p = inf);
   with ``replicated = once`` a part that is a copy along an axis of G counts only on that
   axis's rank 0;
2. an all-reduce of that value over G: ``reduce = sum`` sums the squared 2-norms (then the square
   root: ``torch.nn.utils.clip_grad_norm_``'s way) or the inf norms; ``reduce = max`` and
   ``reduce = mean`` take the largest or the mean of the per-rank *norms* (the square root of
   the local value for p = 2). The defaults are the right combinations: ``sum`` for 2, ``max``
   for inf.

The clip is the single-device one when every rank's result equals the global norm for every
gradient. :class:`NormModel` lays the parts out on a mesh with two ranks per live axis (whether a
combination is the global norm depends only on which axes have more than one rank: a sum, mean or
maximum over two parts or copies shows every way one over more can differ). :func:`computed` and
:func:`true_norm` evaluate it in any :class:`NormDomain`: exact numbers here (:class:`Exact`: parts
given as whole squared norms, square roots as :mod:`placeverify.semantics.surd` numbers), Z3
terms in :mod:`placeverify.verify.checks.clip_norms`, torch tensors in the replay
(:meth:`placeverify.replay.step.RankRun.clip` runs the same steps on real gradients).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Generic, Protocol, TypeVar

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Clip, NormKind, ReduceOp
from placeverify.semantics.surd import Real, sqrt_of

N = TypeVar("N")
Rank = tuple[int, ...]  # coordinates on NormModel.axes
Part = tuple[ParamGroup, tuple[int, ...]]  # a group and its coordinates on the group's split axes


class NormDomain(Protocol[N]):
    """The arithmetic of one backend: nonnegative numbers, their sum, largest, square root."""

    def number(self, value: Fraction) -> N: ...

    def total(self, values: Sequence[N]) -> N: ...

    def largest(self, values: Sequence[N]) -> N: ...

    def root(self, value: N) -> N: ...

    def divide(self, value: N, n: int) -> N: ...


@dataclass(frozen=True, slots=True)
class NormModel:
    """Which parts each rank holds and counts, for one clip statement."""

    clip: Clip
    axes: tuple[str, ...]  # the live axes that matter, ``width`` ranks each
    split: dict[ParamGroup, tuple[str, ...]]  # per group: axes where ranks hold different parts
    measured: tuple[ParamGroup, ...]  # the groups whose gradients the norm is computed over
    live_group: tuple[str, ...]  # the clip group's live axes
    width: int = 2  # ranks per axis (2; the tests compare with 3)

    @property
    def ranks(self) -> list[Rank]:
        return [tuple(r) for r in itertools.product(*(range(self.width) for _ in self.axes))]

    def parts(self) -> list[Part]:
        """Every part of every group (the global gradient is their concatenation)."""
        return [(g, tuple(c)) for g, axes in self.split.items()
                for c in itertools.product(*(range(self.width) for _ in axes))]

    def part_of(self, group: ParamGroup, rank: Rank) -> Part:
        return group, tuple(rank[self.axes.index(a)] for a in self.split[group])

    def counted(self, group: ParamGroup, rank: Rank) -> bool:
        """Does ``rank`` count its part of ``group``? Not where it is a copy along an axis of the
        clip's group and replicated elements are counted once (only rank 0 of that axis)."""
        if not self.clip.replicated_once:
            return True
        copies = [a for a in self.live_group if a not in self.split[group]]
        return all(rank[self.axes.index(a)] == 0 for a in copies)

    def members(self, rank: Rank) -> list[Rank]:
        """The ranks of ``rank``'s clip group (those that differ from it only along G)."""
        free = [self.axes.index(a) for a in self.live_group]
        out = []
        for combo in itertools.product(*(range(self.width) for _ in free)):
            r = list(rank)
            for i, c in zip(free, combo, strict=True):
                r[i] = c
            out.append(tuple(r))
        return out


def norm_model(clip: Clip, split: dict[ParamGroup, set[str]], live: set[str],
               width: int = 2) -> NormModel:
    """``split``: per parameter group, the live axes where ranks hold different elements;
    ``live``: the mesh axes with more than one rank."""
    live_group = tuple(a for a in clip.group.axes if a in live)
    axes = tuple(sorted({a for s in split.values() for a in s} | set(live_group)))
    return NormModel(clip, axes, {g: tuple(sorted(s)) for g, s in split.items()},
                     tuple(g for g in split if clip.measures(g)), live_group, width)


def local(model: NormModel, domain: NormDomain[N], parts: dict[Part, N], rank: Rank) -> N:
    """Step 1: the rank's squared 2-norm, or its inf norm, over the parts it counts."""
    mine = [parts[model.part_of(g, rank)] for g in model.measured if model.counted(g, rank)]
    if not mine:
        return domain.number(Fraction(0))
    return domain.total(mine) if model.clip.norm is NormKind.L2 else domain.largest(mine)


def computed(model: NormModel, domain: NormDomain[N], parts: dict[Part, N]) -> dict[Rank, N]:
    """Step 2: the norm each rank divides max_norm by."""
    clip = model.clip
    locals_ = {r: local(model, domain, parts, r) for r in model.ranks}
    l2 = clip.norm is NormKind.L2
    norms = {r: domain.root(v) for r, v in locals_.items()} if l2 and clip.reduce is not \
        ReduceOp.SUM else locals_
    out: dict[Rank, N] = {}
    for rank in model.ranks:
        values = [norms[m] for m in model.members(rank)]
        if clip.reduce is ReduceOp.SUM:
            total = domain.total(values)
            out[rank] = domain.root(total) if l2 else total
        elif clip.reduce is ReduceOp.MAX:
            out[rank] = domain.largest(values)
        else:
            out[rank] = domain.divide(domain.total(values), len(values))
    return out


def true_norm(model: NormModel, domain: NormDomain[N], parts: dict[Part, N],
              norm: NormKind) -> N:
    """The p-norm of the whole single-device gradient (every part of every group once)."""
    values = [parts[p] for p in model.parts()]
    return domain.root(domain.total(values)) if norm is NormKind.L2 else domain.largest(values)


class Exact:
    """The exact domain: rationals, and sums of square roots where a root is irrational."""

    def number(self, value: Fraction) -> Real:
        return value

    def total(self, values: Sequence[Real]) -> Real:
        out: Real = Fraction(0)
        for v in values:
            out = out + v
        return out

    def largest(self, values: Sequence[Real]) -> Real:
        out = values[0]
        for v in values[1:]:
            if v > out:
                out = v
        return out

    def root(self, value: Real) -> Real:
        if value == 0:
            return Fraction(0)
        assert isinstance(value, Fraction) and value > 0, "roots of squared norms only"
        # sqrt(p/q) = sqrt(p*q)/q
        return sqrt_of(value.numerator * value.denominator) / value.denominator

    def divide(self, value: Real, n: int) -> Real:
        return value / n


@dataclass(frozen=True, slots=True)
class Witness(Generic[N]):
    """Concrete parts on which some rank's norm differs from the global one."""

    parts: dict[Part, N]
    true: N
    computed: dict[Rank, N]

    def wrong(self) -> list[Rank]:
        return [r for r, v in self.computed.items() if v != self.true]


def candidates(model: NormModel) -> list[dict[Part, Real]]:
    """Small exact instances, in order: distinct perfect squares (1, 4, 9, ...: whole 2-norms),
    one part alone, every part equal."""
    parts = model.parts()
    return [{p: Fraction((i + 1) ** 2) for i, p in enumerate(parts)},
            {p: Fraction(1 if i == 0 else 0) for i, p in enumerate(parts)},
            {p: Fraction(1) for p in parts}]


def exact_witness(model: NormModel, norm: NormKind) -> Witness[Real] | None:
    """The first candidate on which the clip's norm differs from the global ``norm``, exactly."""
    domain = Exact()
    for parts in candidates(model):
        found = Witness(parts, true_norm(model, domain, parts, norm),
                        computed(model, domain, parts))
        if found.wrong():
            return found
    return None
