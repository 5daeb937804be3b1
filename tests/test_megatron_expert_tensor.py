"""``--expert-tensor-parallel-size`` different from ``--tensor-model-parallel-size`` (issue 32,
item 4, part b): what is still refused at the flag, and ETP = TP still read as before.

Megatron-core (NVIDIA/Megatron-LM at d98e8a64dd, ``megatron/core/parallel_state.py:874-890``,
initialize_model_parallel) builds a second rank mesh for the experts, ``RankGenerator(tp=ETP,
ep=EP, dp=world // (ETP * EP * PP), pp=PP)``. ETP 1 with EP a multiple of TP (and CP 1) is
modelled (``place expert over tp * ep``, tests/test_expert_tp.py, the Mixtral launch of
tests/importers/mixtral-8x7b-megatron-etp1.sh); with EP 1 every tensor rank would hold every
expert whole, copies along a tensor axis that no placement gives, so it stays refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.diagnostics import Code, PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import load

HERE = Path(__file__).parent / "importers"


def refusal(path: Path, **options: object):  # type: ignore[no-untyped-def]
    with pytest.raises(PlaceError) as caught:
        load(str(path), Options(**options))  # type: ignore[arg-type]
    return next(e for e in caught.value.diagnostics
                if "--expert-tensor-parallel-size" in e.message)


def test_etp_differing_with_one_expert_rank_is_refused(tmp_path: Path) -> None:
    # EP 1, ETP 1, TP 2: Megatron keeps every expert whole on each rank (the expert mesh is
    # tp = 1, ep = 1, dp = world / PP); splitting them over tp would halve the experts' memory
    script = tmp_path / "moe.sh"
    script.write_text("""#!/bin/bash
torchrun --nproc-per-node 4 pretrain_gpt.py \\
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 1000 \\
    --num-experts 4 --moe-router-topk 2 \\
    --tensor-model-parallel-size 2 --expert-tensor-parallel-size 1 \\
    --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 2
""", encoding="utf-8")
    error = refusal(script)
    assert error.code is Code.NOT_MODELLED
    assert error.span is not None and error.span.line == 5


def test_etp_equal_to_tp_is_read() -> None:
    # ETP = TP (Megatron's default when the flag is absent) stays modelled
    text = (HERE / "mixtral-8x7b-megatron-etp1.sh").read_text()
    path = Path(__file__).parent.parent / "build" / "mixtral-etp2.sh"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace("--expert-tensor-parallel-size 1", "--expert-tensor-parallel-size 2"),
                    encoding="utf-8")
    strategy, _ = load(str(path), Options(model=str(HERE / "mixtral-8x7b-config.json")))
    assert {a.name: a.size for a in strategy.mesh.axes}["tp"] == 2
