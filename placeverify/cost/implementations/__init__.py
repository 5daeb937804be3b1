"""A per-tensor cost model of the real torch implementations that ``placeverify measure`` runs.

The placement-level model (:mod:`placeverify.cost.memory`, :mod:`placeverify.cost.communication`)
counts a state of s bytes as s/n per device on an axis of size n. Real implementations differ in
details that this package reproduces tensor by tensor, so that predicted / measured is exactly 1
for model states and communication. One module per implementation, each citing what it follows:
:mod:`.ddp`, :mod:`.zero1`, :mod:`.fsdp2`, :mod:`.tp` and :mod:`.pipeline`; FSDP2 × TP composes
:mod:`.fsdp2` over :mod:`.tp`. :data:`IMPLEMENTATIONS` says, per
:class:`placeverify.cost.implementations.spec.Implementation`, how a rank holds each parameter and which
collectives a step runs; :mod:`.activations` counts the bytes saved for backward.

This package does not import torch: the measure backend imports it, not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from placeverify.cost.implementations.activations import predict_activations
from placeverify.cost.implementations.common import (
    ELEMENT_BYTES,
    CommPrediction,
    RankPrediction,
    Shard,
    optimizer_bytes,
)
from placeverify.cost.implementations.ddp import ddp_comm
from placeverify.cost.implementations.fsdp2 import fsdp_comm, fsdp_local_shard
from placeverify.cost.implementations.params import ParamTensor, model_params
from placeverify.cost.implementations.pipeline import pipeline_comm, stage_shard
from placeverify.cost.implementations.spec import Implementation, RunSpec
from placeverify.cost.implementations.tp import tp_comm, tp_shard
from placeverify.cost.implementations.zero1 import zero1_comm

ShardRule = Callable[[RunSpec, ParamTensor, dict[str, int]], Shard | None]
CommRule = Callable[[RunSpec, int, list[Shard], dict[str, int]], list[CommPrediction]]


@dataclass(frozen=True, slots=True)
class ImplementationModel:
    """How a rank holds each parameter, and the collectives of one step in order (each may
    record extra model-state bytes in the rank's ``states``)."""

    shard: ShardRule
    comm: tuple[CommRule, ...]


IMPLEMENTATIONS: dict[Implementation, ImplementationModel] = {
    Implementation.DDP: ImplementationModel(tp_shard, (ddp_comm,)),
    Implementation.ZERO1: ImplementationModel(tp_shard, (ddp_comm, zero1_comm)),
    Implementation.FSDP2: ImplementationModel(fsdp_local_shard, (fsdp_comm,)),
    Implementation.TP: ImplementationModel(tp_shard, (tp_comm,)),
    Implementation.FSDP2_TP: ImplementationModel(fsdp_local_shard, (fsdp_comm, tp_comm)),
    Implementation.PIPELINE: ImplementationModel(stage_shard, (pipeline_comm,)),
}


def local_shards(spec: RunSpec, rank: int) -> list[Shard]:
    """The parameters this rank holds at rest, with their local and storage sizes."""
    coords = spec.coords(rank)
    shard = IMPLEMENTATIONS[spec.implementation].shard
    return [s for t in model_params(spec) if (s := shard(spec, t, coords)) is not None]


def predict(spec: RunSpec) -> list[RankPrediction]:
    """Per-rank model-state bytes, collectives per step and activation bytes of ``spec``."""
    return [predict_rank(spec, rank) for rank in range(spec.world)]


def predict_rank(spec: RunSpec, rank: int) -> RankPrediction:
    """One rank's prediction: its shards' states, then each of the implementation's rules."""
    shards = local_shards(spec, rank)
    numels = [s.numel for s in shards]
    # A gradient is as large as its parameter's local piece, and lives in storage as large as the
    # parameter's (FSDP2 reduce-scatters into padded shards), except where ``grad`` says otherwise.
    states: dict[str, int] = {
        "params": sum(numels) * ELEMENT_BYTES,
        "params_storage": sum(s.storage for s in shards) * ELEMENT_BYTES,
        "grads": sum(s.grad for s in shards) * ELEMENT_BYTES,
        "grads_storage": sum(s.storage + s.grad - s.numel for s in shards) * ELEMENT_BYTES,
        "optimizer": optimizer_bytes(spec.optimizer, numels),
    }
    comm: list[CommPrediction] = []
    for rule in IMPLEMENTATIONS[spec.implementation].comm:
        comm += rule(spec, rank, shards, states)
    activations = predict_activations(spec, rank)
    return RankPrediction(rank, spec.coords(rank), states, tuple(c for c in comm if c.calls),
                          activations)
