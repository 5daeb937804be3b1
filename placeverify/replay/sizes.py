"""Which mesh a replay runs on when the claimed one is too large or ``--world`` asks for another.

A replay runs the claimed mesh when it has at most :data:`MAX_DEFAULT_WORLD` devices; otherwise
(or at ``--world N``) these choose the axis sizes: keep the counterexample's split axes split,
prefer splitting non-data axes (where composition goes wrong), stay close to the declared sizes.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from placeverify.ir.placement import Role
from placeverify.ir.strategy import Strategy

MAX_DEFAULT_WORLD = 8  # a trace or file on a larger mesh is replayed on a smaller one


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_sizes(strategy: Strategy, keep: dict[str, int], world: int) -> dict[str, int]:
    """Axis sizes with product ``world`` that keep the counterexample's axes.

    Among all factorisations of ``world`` over the mesh axes, prefer (in order): every axis with
    more than one rank in ``keep`` still has more than one; no axis larger than both its declared
    and its ``keep`` size; more non-data axes split (tensor, pipeline, context and expert
    parallelism are where composition goes wrong); more axes split; sizes closest to ``keep``.
    """
    names = list(strategy.mesh.names)
    declared = {a.name: a.size for a in strategy.mesh.axes}
    roles = {p.axis: p.role for p in strategy.placements}
    best: tuple[Any, ...] | None = None
    chosen: dict[str, int] | None = None
    for combo in itertools.product(*(_divisors(world) for _ in names)):
        if math.prod(combo) != world:
            continue
        sizes = dict(zip(names, combo, strict=True))
        dropped = sum(1 for a in names if keep.get(a, 1) > 1 and sizes[a] == 1)
        over = sum(1 for a in names if sizes[a] > max(declared[a], keep.get(a, 1)))
        split_other = sum(1 for a in names if sizes[a] > 1 and roles.get(a) is not Role.DATA)
        split = sum(1 for a in names if sizes[a] > 1)
        distance = sum(abs(math.log(sizes[a]) - math.log(max(1, keep.get(a, 1)))) for a in names)
        score = (dropped, over, -split_other, -split, round(distance, 9), tuple(-s for s in combo))
        if best is None or score < best:
            best, chosen = score, sizes
    assert chosen is not None  # world itself on the first axis always factorises
    return chosen


def shrink_sizes(strategy: Strategy, declared: dict[str, int], limit: int) -> dict[str, int]:
    """The mesh to replay when the declared one has more than ``limit`` devices.

    Every axis at most its declared size and the product at most ``limit``; prefer (in order):
    every declared split axis still split, the most devices, more non-data axes split, sizes
    closest to the declared ones (log scale), larger leading axes.
    """
    names = list(strategy.mesh.names)
    roles = {p.axis: p.role for p in strategy.placements}
    best: tuple[Any, ...] | None = None
    chosen: dict[str, int] | None = None
    for combo in itertools.product(*(range(1, min(declared[a], limit) + 1) for a in names)):
        world = math.prod(combo)
        if world > limit:
            continue
        sizes = dict(zip(names, combo, strict=True))
        dropped = sum(1 for a in names if declared[a] > 1 and sizes[a] == 1)
        split_other = sum(1 for a in names if sizes[a] > 1 and roles.get(a) is not Role.DATA)
        distance = sum(math.log(declared[a]) - math.log(sizes[a]) for a in names)
        score = (dropped, -world, -split_other, round(distance, 9), tuple(-n for n in combo))
        if best is None or score < best:
            best, chosen = score, sizes
    assert chosen is not None  # all ones always fits
    return chosen


def replayed_sizes(strategy: Strategy, claimed: dict[str, int], world: int | None,
                    what: str) -> tuple[dict[str, int], str | None]:
    """The mesh to run and, when it is not ``claimed``, why."""
    total = math.prod(claimed.values())
    if world is not None:
        if world == total:
            return claimed, None
        return choose_sizes(strategy, claimed, world), f"--world {world} asked for {world} processes"
    if total <= MAX_DEFAULT_WORLD:
        return claimed, None
    return (shrink_sizes(strategy, claimed, MAX_DEFAULT_WORLD),
            f"the {what} has {total} devices, more than the {MAX_DEFAULT_WORLD} processes a replay "
            "runs on one machine")
