"""FSDP2 (PyTorch docs, ``torch.distributed.fsdp.fully_shard``), parameter by parameter; FSDP2 × TP
applies the same rules over ``dp`` to each rank's tensor-parallel shard.

Each parameter is sharded on dim 0 like ``torch.chunk`` (chunk size ⌈d0/n⌉, the last ranks get
less or nothing) and padded to the chunk size in its storage; one all-gather per unit (a
``fully_shard``-ed module: each transformer layer, then the root for the embedding, the final norm
and the output layer) in forward and, when a non-root unit reshards after forward, again in
backward; one reduce-scatter per unit in backward. The root is left at
``reshard_after_forward``'s default, so it does not reshard (FSDP2 skips the root's reshard: it
would be gathered again at once for backward).
"""

from __future__ import annotations

import math

from placeverify.cost.implementations.common import (
    ELEMENT_BYTES,
    CommPrediction,
    Shard,
    chunk,
    collective,
)
from placeverify.cost.implementations.params import ParamTensor
from placeverify.cost.implementations.spec import RunSpec
from placeverify.cost.implementations.tp import tp_shape


def fsdp_shard(shape: tuple[int, ...], dp: int, dp_rank: int) -> tuple[int, int]:
    """(local elements, padded storage elements) of FSDP2's dim-0 shard."""
    rest = math.prod(shape[1:])
    return chunk(shape[0], dp, dp_rank) * rest, -(-shape[0] // dp) * rest


def fsdp_local_shard(spec: RunSpec, t: ParamTensor, coords: dict[str, int]) -> Shard:
    """A parameter's dim-0 shard over ``dp`` of its tensor-parallel piece, with padded storage."""
    shape = tp_shape(t, spec.tp, coords["tp"])
    numel, storage = fsdp_shard(shape, spec.dp, coords["dp"])
    return Shard(t, numel, storage, numel)


def _fsdp_units(shards: list[Shard]) -> dict[str, list[Shard]]:
    units: dict[str, list[Shard]] = {}
    for s in shards:
        units.setdefault(s.tensor.unit, []).append(s)
    return units


def fsdp_comm(spec: RunSpec, rank: int, shards: list[Shard],
              states: dict[str, int]) -> list[CommPrediction]:
    """The per-unit all-gathers and reduce-scatters of one step; records the parameters held once
    forward is done."""
    n = spec.dp
    units = _fsdp_units(shards)
    gathered = {u: n * sum(s.storage for s in group) * ELEMENT_BYTES for u, group in units.items()}
    reshards = [u for u in units if u and spec.reshard_after_forward]
    # Parameters held once forward is done: gathered units (padded) plus resharded units' shards.
    states["params_after_forward"] = sum(
        sum(s.storage for s in units[u]) * ELEMENT_BYTES if u in reshards else gathered[u]
        for u in units)
    return [
        collective("forward", "all_gather", "dp", "parameters, one per FSDP unit", len(units),
                   sum(gathered.values()), n),
        collective("backward", "all_gather", "dp", "parameters of resharded units", len(reshards),
                   sum(gathered[u] for u in reshards), n),
        collective("backward", "reduce_scatter", "dp", "gradients, one per FSDP unit", len(units),
                   sum(gathered.values()), n),
    ]
