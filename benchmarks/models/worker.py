"""A measure rank on a model placeverify did not write: ``python benchmarks/models/worker.py JOB
RANK STORE OUT`` with ``PLACEVERIFY_FOREIGN_MODEL`` naming one of :data:`foreign.MODELS`.

It is :mod:`placeverify.measure.worker` (the same process group, implementations, warm-up steps,
meter and result) with the model, its DTensor plan and its blocks taken from :mod:`foreign`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import foreign
from torch import nn

from placeverify.cost.implementations.spec import RunSpec
from placeverify.measure import worker

MODEL_ENV = "PLACEVERIFY_FOREIGN_MODEL"


def build_model(spec: RunSpec) -> nn.Module:
    import torch

    torch.manual_seed(0)
    assert spec.arch is not None, "foreign models are transformers"
    return foreign.build(os.environ[MODEL_ENV], spec.arch)


def tp_plan(spec: RunSpec, model: nn.Module) -> dict[str, Any]:
    assert isinstance(model, foreign.Foreign)
    if model.plan is None:
        raise ValueError(f"{os.environ[MODEL_ENV]} has no DTensor tensor-parallel plan")
    return model.plan


def blocks_of(model: nn.Module) -> list[nn.Module]:
    assert isinstance(model, foreign.Foreign)
    return list(model.layers.values())


if __name__ == "__main__":
    worker.build_model = build_model
    worker.tp_plan = tp_plan
    worker.blocks_of = blocks_of
    sys.exit(worker.main(sys.argv[1:]))
