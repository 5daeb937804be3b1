"""Pipelining (PyTorch docs, ``torch.distributed.pipelining``; GPipe, Huang et al., arXiv
1811.06965; 1F1B, Narayanan et al., arXiv 2104.04473), parameter by parameter.

Stage k holds its layers (the first stage also the embeddings, the last the final norm and the
output layer), whole; per micro-batch it sends its output forward and the gradient of its input
backward. A pipeline runs alone: rank = stage.
"""

from __future__ import annotations

from placeverify.cost.implementations.common import (
    CommPrediction,
    Shard,
    collective,
    hidden_bytes,
)
from placeverify.cost.implementations.params import ParamTensor
from placeverify.cost.implementations.spec import RunSpec


def stage_layers(spec: RunSpec, stage: int) -> range:
    """Layers of a pipeline stage: contiguous, as even as possible, earlier stages first."""
    layers = spec.arch.layers if spec.arch is not None else (spec.mlp.depth if spec.mlp else 0)
    return range(chunk_start(layers, spec.pp, stage), chunk_start(layers, spec.pp, stage + 1))


def chunk_start(size: int, parts: int, index: int) -> int:
    base, extra = divmod(size, parts)
    return index * base + min(index, extra)


def on_stage(spec: RunSpec, t: ParamTensor, stage: int) -> bool:
    if t.first_stage:
        return stage == 0
    if t.last_stage:
        return stage == spec.pp - 1
    return t.layer in stage_layers(spec, stage)


def stage_shard(spec: RunSpec, t: ParamTensor, coords: dict[str, int]) -> Shard | None:
    """The whole parameter on the stage that holds it; None on the other stages."""
    if on_stage(spec, t, coords["pp"]):
        return Shard(t, t.numel, t.numel, t.numel)
    return None


def pipeline_comm(spec: RunSpec, rank: int, shards: list[Shard],
                  states: dict[str, int]) -> list[CommPrediction]:
    """The sends and receives of one step between neighbouring stages."""
    stage = spec.coords(rank)["pp"]
    hidden = hidden_bytes(spec)
    m = spec.microbatches
    p = spec.pp
    out: list[CommPrediction] = []
    if stage < p - 1:
        out.append(collective("forward", "send", "pp", "activations to the next stage", m,
                              m * hidden, 2))
        out.append(collective("backward", "recv", "pp", "gradients from the next stage", m, m * hidden,
                              2))
    if stage > 0:
        out.append(collective("forward", "recv", "pp", "activations from the previous stage", m,
                              m * hidden, 2))
        out.append(collective("backward", "send", "pp", "input gradients to the previous stage", m,
                              m * hidden, 2))
    return out
