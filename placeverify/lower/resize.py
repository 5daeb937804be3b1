"""A strategy on a resized mesh: the IR -> IR step replay and counterexample search use."""

from __future__ import annotations

from dataclasses import replace

from placeverify.ir.strategy import Strategy
from placeverify.lower import canonical


def resize(strategy: Strategy, sizes: dict[str, int]) -> Strategy:
    """The same strategy on a mesh with some axes resized (pipeline micro-batches unchanged).

    A canonical step is derived again for the new mesh (it depends on which axes have more than
    one rank); a step written in the file is kept as written. A list of layers per pipeline stage
    is dropped when its axis is resized (the layers then split evenly). Divisibility of the model's
    dimensions is not re-checked: replay and counterexample search use small meshes on purpose.
    """
    unknown = set(sizes) - set(strategy.mesh.names)
    if unknown:
        raise ValueError(f"no such axes: {sorted(unknown)}")
    placements = tuple(
        replace(p, layers=None, layers_span=None)
        if p.layers is not None and sizes.get(p.axis, strategy.size(p.axis)) != strategy.size(p.axis)
        else p for p in strategy.placements)  # a layer list fits only the mesh it was written for
    resized = replace(strategy, config=replace(strategy.config, mesh=strategy.mesh.with_sizes(sizes),
                                               placements=placements))
    if strategy.step.canonical:
        resized = replace(resized, step=canonical.derive(resized.config))
    return resized
