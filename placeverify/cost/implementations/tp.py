"""Tensor parallelism (PyTorch docs, ``torch.distributed.tensor.parallel``; Shoeybi et al., arXiv
1909.08053), parameter by parameter.

``ColwiseParallel`` shards a Linear's weight and bias on dim 0 and all-reduces the gradient of its
replicated input in backward, once per module (q, k and v each do their own); ``RowwiseParallel``
shards the weight on dim 1, keeps the bias replicated and all-reduces its partial output in
forward. The embedding is vocabulary-parallel (``RowwiseParallel`` on ``nn.Embedding``: rows
sharded, output all-reduced) and the output layer ``ColwiseParallel`` with sharded logits under
``loss_parallel``. With ``tp = 1`` a parameter is whole: DDP's and ZeRO-1's pieces.
"""

from __future__ import annotations

import math

from placeverify.cost.implementations.common import (
    ELEMENT_BYTES,
    CommPrediction,
    Shard,
    chunk,
    collective,
    hidden_bytes,
    tokens,
)
from placeverify.cost.implementations.params import ParamTensor
from placeverify.cost.implementations.spec import RunSpec
from placeverify.ir.model import ParamGroup


def tp_shape(t: ParamTensor, tp: int, tp_rank: int) -> tuple[int, ...]:
    if t.tp_dim is None or tp == 1:
        return t.shape
    shape = list(t.shape)
    shape[t.tp_dim] = chunk(shape[t.tp_dim], tp, tp_rank)
    return tuple(shape)


def tp_shard(spec: RunSpec, t: ParamTensor, coords: dict[str, int]) -> Shard:
    """A parameter's tensor-parallel piece (the whole parameter when ``tp = 1``)."""
    shape = tp_shape(t, spec.tp, coords["tp"])
    numel = math.prod(shape)
    # DTensor's embedding backward (RowwiseParallel on nn.Embedding) yields a replicated
    # gradient of the whole table: each rank holds vocab x hidden, not its rows.
    vocab_rows = t.group is ParamGroup.EMBEDDING and t.tp_dim == 0 and spec.tp > 1
    return Shard(t, numel, numel, t.numel if vocab_rows else numel)


def tp_comm(spec: RunSpec, rank: int, shards: list[Shard],
            states: dict[str, int]) -> list[CommPrediction]:
    """The tensor-parallel all-reduces of one step (none when ``tp = 1``)."""
    if spec.tp <= 1:
        return []
    hidden = hidden_bytes(spec)
    t = spec.tp
    if spec.arch is None:
        assert spec.mlp is not None
        rowwise = sum(1 for i in range(spec.mlp.depth) if i % 2 == 1)
        colwise_inner = sum(1 for i in range(1, spec.mlp.depth) if i % 2 == 0)
        return [
            collective("forward", "all_reduce", "tp", "row-parallel outputs", rowwise,
                       rowwise * hidden, t),
            collective("backward", "all_reduce", "tp", "column-parallel input gradients",
                       colwise_inner, colwise_inner * hidden, t),
        ]
    arch = spec.arch
    b, s = tokens(spec)
    layers = arch.layers
    colwise_per_layer = 3 + (2 if arch.gated else 1)  # q, k, v; gate and up, or up
    # loss_parallel's cross-entropy: the max and the sum of exponentials of each token's logits
    # (log-softmax), then the target logit (nll_loss), each an all-reduce of b·s fp32 values.
    loss_calls = 3
    return [
        collective("forward", "all_reduce", "tp",
                   "embedding output, and 2 row-parallel outputs per layer (o, down)", 1 + 2 * layers,
                   (1 + 2 * layers) * hidden, t),
        collective("forward", "all_reduce", "tp", "vocab-parallel cross-entropy", loss_calls,
                   loss_calls * b * s * ELEMENT_BYTES, t),
        collective("backward", "all_reduce", "tp",
                   f"input gradients of column-parallel modules ({colwise_per_layer} per layer and the "
                   "output layer)", colwise_per_layer * layers + 1,
                   (colwise_per_layer * layers + 1) * hidden, t),
    ]
