"""What ``placeverify measure`` runs and the per-tensor cost model predicts: one torch
implementation on a small mesh, as plain data.

It lives beside the predictors (not in :mod:`placeverify.measure`) so that the cost model never
imports the torch backend's package. :class:`RunSpec` travels as JSON from the placeverify
process to the torch worker processes (:mod:`placeverify.measure.worker`) and is what the
per-tensor cost model (:mod:`placeverify.cost.implementations`) predicts for. The pipeline schedule is the
IR's :class:`placeverify.ir.placement.Schedule` (measure runs its ``gpipe`` and ``1f1b`` members).

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from placeverify.ir.model import Transformer
from placeverify.ir.placement import Schedule


class Implementation(StrEnum):
    DDP = "ddp"
    ZERO1 = "zero1"
    FSDP2 = "fsdp2"
    TP = "tp"
    FSDP2_TP = "fsdp2_tp"
    PIPELINE = "pipeline"


IMPLEMENTATION_LABELS: dict[Implementation, str] = {
    Implementation.DDP: "DistributedDataParallel",
    Implementation.ZERO1: "ZeroRedundancyOptimizer over DistributedDataParallel",
    Implementation.FSDP2: "FSDP2 fully_shard",
    Implementation.TP: "DTensor tensor parallelism (ColwiseParallel / RowwiseParallel)",
    Implementation.FSDP2_TP: "FSDP2 fully_shard over dp x DTensor tensor parallelism over tp",
    Implementation.PIPELINE: "torch.distributed.pipelining",
}


class OptimizerKind(StrEnum):
    ADAM = "adam"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd_momentum"


@dataclass(frozen=True, slots=True)
class Mlp:
    """The plain model for a bare parameter count: ``depth`` Linear(width, width) + GELU layers."""

    width: int
    depth: int
    batch: int

    def params(self) -> int:
        return self.depth * (self.width * self.width + self.width)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What the measure backend runs: one implementation on a dp x tp (or pp) mesh, in fp32.

    Ranks are laid out like ``init_device_mesh("cpu", (dp, tp))``: rank = dp_rank * tp + tp_rank.
    A pipeline runs alone: rank = stage.
    """

    implementation: Implementation
    optimizer: OptimizerKind
    dp: int = 1
    tp: int = 1
    pp: int = 1
    reshard_after_forward: bool = True
    schedule: Schedule = Schedule.GPIPE
    microbatches: int = 1
    arch: Transformer | None = None
    mlp: Mlp | None = None

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def label(self) -> str:
        text = IMPLEMENTATION_LABELS[self.implementation]
        if self.implementation in (Implementation.FSDP2, Implementation.FSDP2_TP):
            text += f" (reshard_after_forward={self.reshard_after_forward})"
        if self.implementation is Implementation.PIPELINE:
            text += f" ({self.schedule.value}, {self.microbatches} micro-batches)"
        return text

    def coords(self, rank: int) -> dict[str, int]:
        if self.implementation is Implementation.PIPELINE:
            return {"pp": rank}
        return {"dp": rank // self.tp, "tp": rank % self.tp}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["implementation"] = self.implementation.value
        data["optimizer"] = self.optimizer.value
        data["schedule"] = self.schedule.value
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> RunSpec:
        arch = data.get("arch")
        mlp = data.get("mlp")
        return RunSpec(
            implementation=Implementation(data["implementation"]),
            optimizer=OptimizerKind(data["optimizer"]),
            dp=int(data["dp"]), tp=int(data["tp"]), pp=int(data["pp"]),
            reshard_after_forward=bool(data["reshard_after_forward"]),
            schedule=Schedule(data["schedule"]), microbatches=int(data["microbatches"]),
            arch=Transformer(**arch) if arch is not None else None,
            mlp=Mlp(**mlp) if mlp is not None else None)
