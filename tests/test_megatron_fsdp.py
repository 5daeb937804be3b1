"""Megatron-FSDP (``--use-megatron-fsdp``) imported from a Megatron-LM launch.

Rules from NVIDIA/Megatron-LM d98e8a6: ``megatron/training/arguments.py`` lines 3190-3199
(``--data-parallel-sharding-strategy`` no_shard / optim / optim_grads / optim_grads_params,
default optim_grads_params; ``--outer-dp-sharding-strategy`` default no_shard) and 3687-3699
(``--megatron-fsdp-main-params-dtype`` fp32, ``--megatron-fsdp-main-grads-dtype`` auto,
``--megatron-fsdp-grad-comm-dtype`` auto); ``megatron/core/distributed/
distributed_data_parallel_config.py`` lines 188-212 (main grads None: the model compute
parameters' dtype; grad comm None: the main grads' dtype); ``param_and_grad_buffer.py``
``_resolve_group_grad_dtype`` (grad dtype = param dtype unless main_grads_dtype is set).

So under --bf16 with the default strategy every state is sharded over the 16 data-parallel
ranks: bf16 parameters (2 B), bf16 main gradients (2 B), fp32 master weights with Adam's two
fp32 moments (12 B): Ψ·16/16 bytes a device, where the distributed optimizer keeps the
parameters and fp32 main gradients whole (2 + 4 B) and shards 12 B.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from placeverify import api
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import import_file, load

# Llama 3 8B by hand (vocab 128256 = 1002 x 128, no padding at tp 1): untied embedding and
# output 2 x 128256 x 4096; per layer q, o 4096^2, k, v 4096 x 1024, SwiGLU 3 x 4096 x 14336,
# two RMSNorms of 4096; 32 layers; final norm 4096.
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
PSI = 2 * 128256 * 4096 + 32 * LAYER + 4096
DP = 16
# --global-batch-size 64 / (--micro-batch-size 1 x dp 16): 4 micro-batches, each reducing its
# gradients: "For grads shard mode there will actually always be gradient sync happening"
# (megatron_fsdp.py, MegatronFSDP.no_sync, lines 1176-1187)
M = 4

LAUNCH = """#!/bin/bash
torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \\
    --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \\
    --position-embedding-type rope --untie-embeddings-and-output-weights \\
    --disable-bias-linear --seq-length 8192 --max-position-embeddings 8192 \\
    --vocab-size 128256 --micro-batch-size 1 --global-batch-size 64 \\
    --bf16 --use-megatron-fsdp {flags}
"""


def _load(tmp_path: Path, flags: str = ""):  # type: ignore[no-untyped-def]
    path = tmp_path / "train.sh"
    path.write_text(LAUNCH.format(flags=flags))
    return load(str(path), Options())


def _reduced(strategy: object) -> Fraction:
    """Bytes a device sends reducing the gradients in a step (a ring reduce-scatter moves
    (dp - 1) / dp of the buffer, once a micro-batch)."""
    costs = api.costs(strategy)  # type: ignore[arg-type]
    return sum((Fraction(i.bytes) for i in costs.comm
                if i.state == "gradients" and i.op == "reduce_scatter"), Fraction(0))


def _device(strategy: object) -> dict[str, Fraction]:
    got = api.costs(strategy).device_bytes()  # type: ignore[arg-type]
    return {k: Fraction(got[k]) for k in ("params", "gradients", "optimizer")}


def test_the_default_strategy_shards_everything_with_bf16_gradients(tmp_path: Path) -> None:
    strategy, imported = _load(tmp_path)
    assert strategy.model.params == PSI
    assert "place zero3 over dp" in imported.text
    assert _reduced(strategy) == Fraction(M * 2 * PSI * (DP - 1), DP)  # bf16 on the links
    assert _device(strategy) == {"params": Fraction(2 * PSI, DP),
                                 "gradients": Fraction(2 * PSI, DP),
                                 "optimizer": Fraction(12 * PSI, DP)}
    verdicts = api.check_strategy(strategy).verification
    assert verdicts is not None and set(verdicts.verdicts().values()) == {"proved"}


@pytest.mark.parametrize(("word", "preset", "params", "grads"), [
    ("optim_grads", "zero2", Fraction(2 * PSI), Fraction(2 * PSI, DP)),
    ("optim", "zero1", Fraction(2 * PSI), Fraction(2 * PSI)),
    ("no_shard", "ddp", Fraction(2 * PSI), Fraction(2 * PSI)),
])
def test_each_sharding_strategy(tmp_path: Path, word: str, preset: str, params: Fraction,
                                grads: Fraction) -> None:
    strategy, imported = _load(tmp_path, f"--data-parallel-sharding-strategy {word}")
    assert f"place {preset} over dp" in imported.text
    device = _device(strategy)
    assert (device["params"], device["gradients"]) == (params, grads)
    optimizer = Fraction(12 * PSI) if word == "no_shard" else Fraction(12 * PSI, DP)
    assert device["optimizer"] == optimizer


def test_fp32_main_gradients_are_kept_and_reduced_in_fp32(tmp_path: Path) -> None:
    strategy, _ = _load(tmp_path, "--megatron-fsdp-main-grads-dtype fp32")
    assert _device(strategy)["gradients"] == Fraction(4 * PSI, DP)
    assert _reduced(strategy) == Fraction(M * 4 * PSI * (DP - 1), DP)


def test_a_grad_comm_dtype_reduces_in_it(tmp_path: Path) -> None:
    # main grads fp32 (4 B kept), reduced in bf16 (2 B on the links)
    strategy, imported = _load(tmp_path, "--megatron-fsdp-main-grads-dtype fp32 "
                               "--megatron-fsdp-grad-comm-dtype bf16")
    assert _device(strategy)["gradients"] == Fraction(4 * PSI, DP)
    assert _reduced(strategy) == Fraction(M * 2 * PSI * (DP - 1), DP)
    assert "--megatron-fsdp-grad-comm-dtype" in imported.text


@pytest.mark.parametrize("flags, key", [
    ("--outer-dp-sharding-strategy optim", "--outer-dp-sharding-strategy"),
    ("--megatron-fsdp-main-params-dtype bf16", "--megatron-fsdp-main-params-dtype"),
    ("--data-parallel-sharding-strategy everything", "--data-parallel-sharding-strategy"),
])
def test_what_is_not_modelled_is_an_error_at_the_flag(tmp_path: Path, flags: str,
                                                      key: str) -> None:
    path = tmp_path / "train.sh"
    path.write_text(LAUNCH.format(flags=flags))
    with pytest.raises(PlaceError) as caught:
        import_file(str(path), Options())
    [d] = caught.value.diagnostics
    assert key in d.message and d.span is not None
    line = path.read_text().splitlines()[d.span.line - 1]
    assert key in line
