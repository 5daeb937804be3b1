"""DDP (PyTorch docs, "DistributedDataParallel" and its design note), parameter by parameter.

Every gradient is all-reduced once per step, bucketed in reverse registration order; the first
bucket closes at ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), the others at 25 MiB,
a bucket closing once it reaches its cap. The reducer keeps its own flat bucket buffers beside the
gradients (``gradient_as_bucket_view=False``). Parameters are whole on every rank
(:func:`placeverify.cost.implementations.tp.tp_shard` with ``tp = 1``).
"""

from __future__ import annotations

from placeverify.cost.implementations.common import (
    ELEMENT_BYTES,
    CommPrediction,
    Shard,
    collective,
)
from placeverify.cost.implementations.spec import RunSpec

DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's default bucket_cap_mb


def ddp_buckets(sizes_in_backward_order: list[int]) -> list[int]:
    """Bytes of each DDP bucket: filled in the order gradients become ready, the first closing at
    1 MiB and the others at 25 MiB, each closing as soon as it reaches its cap."""
    buckets: list[int] = []
    current = 0
    for size in sizes_in_backward_order:
        current += size
        cap = DDP_FIRST_BUCKET_BYTES if not buckets else DDP_BUCKET_BYTES
        if current >= cap:
            buckets.append(current)
            current = 0
    if current:
        buckets.append(current)
    return buckets


def ddp_comm(spec: RunSpec, rank: int, shards: list[Shard],
             states: dict[str, int]) -> list[CommPrediction]:
    """The gradient all-reduces of one step, one per bucket; records the buckets' bytes."""
    sizes = [s.numel * ELEMENT_BYTES for s in reversed(shards)]
    buckets = ddp_buckets(sizes)
    states["ddp_buckets"] = sum(buckets)
    return [collective("backward", "all_reduce", "dp", "gradients (DDP buckets)", len(buckets),
                        sum(buckets), spec.dp)]
