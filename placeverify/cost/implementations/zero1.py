"""ZeRO-1 (Rajbhandari et al., arXiv 1910.02054, stage 1; PyTorch's ``ZeroRedundancyOptimizer``).

Gradients are all-reduced by DDP (:mod:`placeverify.cost.implementations.ddp`); the optimizer
state is partitioned by *whole parameters*: parameters sorted by size (largest first, stable),
each given to the rank with the fewest elements so far (the first such rank); after the local
step each rank broadcasts its parameters to all others, one broadcast per parameter.
"""

from __future__ import annotations

from placeverify.cost.implementations.common import (
    ELEMENT_BYTES,
    CommPrediction,
    Shard,
    collective,
    optimizer_bytes,
)
from placeverify.cost.implementations.spec import RunSpec


def zero_partition(sizes: list[int], world: int) -> list[int]:
    """ZeroRedundancyOptimizer's owner of each parameter (given in registration order): sorted by
    size, largest first (a stable sort), each to the first rank holding the fewest elements."""
    owner = [0] * len(sizes)
    load = [0] * world
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


def zero1_comm(spec: RunSpec, rank: int, shards: list[Shard],
               states: dict[str, int]) -> list[CommPrediction]:
    """This rank's share of the optimizer state, and the parameter broadcasts after the step."""
    numels = [s.numel for s in shards]
    owners = zero_partition(numels, spec.dp)
    mine = [n for n, owner in zip(numels, owners, strict=True) if owner == rank]
    states["optimizer"] = optimizer_bytes(spec.optimizer, mine)
    return [collective("optimizer", "broadcast", "dp",
                       "updated parameters from their owner (one per parameter)", len(numels),
                       sum(numels) * ELEMENT_BYTES, spec.dp)]
