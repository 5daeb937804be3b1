"""Token and sample counts per atom (batch coordinates, micro-batch) for a replay.

Either the trace's own counts, when they cover every atom of the replayed mesh, or counts the
exact interpreter (:func:`placeverify.semantics.interpreter.run`) shows diverging, so that a run
of a refuted strategy can show its divergence. Samples are equal along context axes (they split
one sequence).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.roles.relations import batch_axes, sample_axes
from placeverify.semantics.empty import Undefined
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.semantics.terms import projection, term_views
from placeverify.trace import AtomCount, Trace

AtomCounts = list[tuple[tuple[int, ...], int, int]]  # (batch coordinates, micro-batch, count)


def atom_keys(strategy: Strategy, sizes: dict[str, int], m: int) -> list[tuple[tuple[int, ...], int]]:
    axes = batch_axes(strategy)
    coords = itertools.product(*(range(sizes[a]) for a in axes))
    return [(tuple(b), k) for b in coords for k in range(m)]


def unit_samples(strategy: Strategy, keys: list[tuple[tuple[int, ...], int]],
                 rng: random.Random | None) -> dict[tuple[tuple[int, ...], int], int]:
    """Samples per micro-batch unit: equal along context axes (they split one sequence)."""
    axes = batch_axes(strategy)
    samples_at = [i for i, a in enumerate(axes) if a in sample_axes(strategy)]
    per_unit: dict[tuple[tuple[int, ...], int], int] = {}
    out = {}
    for b, k in keys:
        unit = (tuple(b[i] for i in samples_at), k)
        if unit not in per_unit:
            per_unit[unit] = rng.randint(1, 3) if rng is not None else 2
        out[(b, k)] = per_unit[unit]
    return out


def pick_counts(strategy: Strategy, sizes: dict[str, int], m: int,
                want_divergence: bool) -> tuple[AtomCounts, AtomCounts, bool]:
    """Token and sample counts per atom; with ``want_divergence``, counts the exact interpreter
    shows diverging for some parameter group (unequal counts). Returns (tokens, samples, found)."""
    keys = atom_keys(strategy, sizes, m)
    rng = random.Random(7)
    first: tuple[dict[Any, int], dict[Any, int]] | None = None
    for attempt in range(48):
        if attempt == 0:
            tokens = {key: 1 + (i % 3) for i, key in enumerate(keys)}
        else:
            tokens = {key: rng.randint(1, 4) for key in keys}
        uneven = (strategy.loss.uneven_samples
                  or any(t.loss.uneven_samples for t in strategy.terms)) and attempt > 0
        samples = unit_samples(strategy, keys, rng if uneven else None)
        if first is None:
            first = (tokens, samples)
        if not want_divergence:
            break
        for judged, group in _judged(strategy):
            view = group_view(judged, group)
            try:
                result = run(judged, view, uniform_instance(judged, view, sizes, m, tokens,
                                                            samples))
            except Undefined:  # NaN in a micro-batch without tokens, whatever the counts
                return _listed(tokens), _listed(samples), True
            except (ArithmeticError, KeyError):
                continue
            if result.mismatches():
                return _listed(tokens), _listed(samples), True
    assert first is not None
    return _listed(first[0]), _listed(first[1]), not want_divergence


def _judged(strategy: Strategy) -> list[tuple[Strategy, ParamGroup]]:
    """(strategy, group) pairs the integrity check judges: each loss term's projection on the
    groups it reaches (:mod:`placeverify.semantics.terms`), or the strategy on every group."""
    groups = strategy.model.groups_present()
    if not strategy.terms:
        return [(strategy, g) for g in groups]
    return [(projection(strategy, term), g) for term in term_views(strategy)
            for g in groups if term.reaches_group(g)]


def _listed(counts: dict[tuple[tuple[int, ...], int], int]) -> AtomCounts:
    return [(b, k, n) for (b, k), n in sorted(counts.items())]


def trace_counts(trace: Trace, strategy: Strategy, sizes: dict[str, int],
                 m: int) -> tuple[AtomCounts, AtomCounts] | None:
    """The trace's own per-atom counts, when they cover every atom of this mesh."""
    axes = batch_axes(strategy)
    keys = set(atom_keys(strategy, sizes, m))

    def read(rows: tuple[AtomCount, ...]) -> dict[tuple[tuple[int, ...], int], int] | None:
        out: dict[tuple[tuple[int, ...], int], int] = {}
        for row in rows:
            if set(row.coords) != set(axes) or row.count < 1:
                return None
            out[(tuple(row.coords[a] for a in axes), row.microbatch)] = row.count
        return out if set(out) == keys else None

    tokens = read(trace.tokens)
    samples = read(trace.samples)
    if tokens is None:
        return None
    if samples is None:
        samples = unit_samples(strategy, sorted(keys), None)
    return _listed(tokens), _listed(samples)
