"""Mixed-precision policies: Θ stored, gathered and computed with, G kept and reduced, each in
its own dtype (issue 32, item 1).

Expected numbers are derived by hand. Llama 3 8B has Ψ = 8,030,261,248 parameters (vocabulary
128,256 x hidden 4,096 twice, untied, plus 32 layers of 218,112,000: Q and O 4,096², K and V
4,096 x 1,024, the SwiGLU MLP 3 x 4,096 x 14,336 and two norms of 4,096; plus the final norm).
A ring reduce-scatter or all-gather over n ranks moves (n - 1)/n of its payload per rank. The
dtypes come from the frameworks' sources: FSDP2's ``MixedPrecisionPolicy`` (torch
``distributed/fsdp/_fully_shard/_fsdp_api.py``: the all-gather and compute in ``param_dtype``,
the reduce-scatter in ``reduce_dtype``, sharded Θ and G in the parameters' own dtype);
torchtitan's defaults ``mixed_precision_param = bfloat16``, ``mixed_precision_reduce = float32``
(``torchtitan/config/job_config.py``) and ``maybe_enable_amp`` (``torchtitan/distributed/
utils.py``: fully_shard's policy under FSDP, torch.autocast for DDP); accelerate's
``FullyShardedDataParallelPlugin.set_mixed_precision`` (``src/accelerate/utils/dataclasses.py``:
param_dtype = reduce_dtype = buffer_dtype = the mixed_precision dtype); DeepSpeed's
``communication_data_type`` (``deepspeed/runtime/config.py``, ``get_communication_data_type``).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from placeverify import api
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import load as import_load
from placeverify.lower import load_text

PSI = 8_030_261_248
EMBEDDING = 128_256 * 4_096  # the largest FSDP unit of Llama 3 8B (a layer is 218,112,000)
HERE = Path(__file__).parent / "importers"
CONFIG = str(HERE / "llama3-8b-config.json")


def fsdp(precision: str, mesh: str = "dp = 8") -> str:
    return (f'strategy "p"\nmodel llama3_8b\n{precision}\nmesh {{ {mesh} }}\n'
            "place fsdp over dp\n")


def comm(strategy: object) -> dict[str, Fraction]:
    costs = api.costs(strategy)  # type: ignore[arg-type]
    out: dict[str, Fraction] = {}
    for item in costs.comm:
        if item.state in ("params", "gradients"):
            key = f"{item.op} {item.what}"
            out[key] = out.get(key, Fraction(0)) + Fraction(item.bytes)
    return out


def buffer(strategy: object, label: str) -> Fraction:
    costs = api.costs(strategy)  # type: ignore[arg-type]
    return sum((Fraction(i.bytes) for i in costs.memory if i.label == label), Fraction(0))


TORCHTITAN_BLOCK = ("precision { params = fp32, gather = bf16, grads = fp32, reduce = fp32, "
                    "optimizer = 8, activations = bf16 }")


@pytest.mark.parametrize("precision", ["precision torchtitan_bf16", TORCHTITAN_BLOCK])
def test_fsdp2_gathers_in_param_dtype_and_reduces_in_reduce_dtype(precision: str) -> None:
    strategy = load_text(fsdp(precision))
    moved = comm(strategy)
    assert moved["all_gather params (gather for forward)"] == Fraction(PSI * 2 * 7, 8)
    assert moved["all_gather params (gather for backward)"] == Fraction(PSI * 2 * 7, 8)
    assert moved["reduce_scatter grads"] == Fraction(PSI * 4 * 7, 8)
    device = api.costs(strategy).device_bytes()
    assert device["params"] == Fraction(PSI * 4, 8)  # the fp32 shard
    assert device["gradients"] == Fraction(PSI * 4, 8)
    assert device["optimizer"] == Fraction(PSI * 8, 8)
    assert buffer(strategy, "gather buffer (largest layer)") == EMBEDDING * 2  # bf16 unit


def test_what_is_not_written_follows_its_state() -> None:
    # no gather, reduce or compute: gathers move Θ as stored, G as kept, matmuls in tf32
    strategy = load_text(fsdp("precision { params = fp32, grads = fp32, optimizer = 8, "
                              "activations = bf16 }", "dp = 8, device = h100_sxm"))
    moved = comm(strategy)
    assert moved["all_gather params (gather for forward)"] == Fraction(PSI * 4 * 7, 8)
    assert moved["reduce_scatter grads"] == Fraction(PSI * 4 * 7, 8)
    assert api.estimate_time(strategy).matmul == "tf32"  # type: ignore[union-attr]


def test_the_matmuls_follow_the_gathered_dtype_or_compute() -> None:
    titan = load_text(fsdp("precision torchtitan_bf16", "dp = 8, device = h100_sxm"))
    assert api.estimate_time(titan).matmul == "bf16"  # type: ignore[union-attr]
    fp8 = load_text(fsdp("precision torchtitan_bf16 { compute = fp8 }", "dp = 8, device = h100_sxm"))
    assert api.estimate_time(fp8).matmul == "fp8"  # type: ignore[union-attr]


@pytest.mark.parametrize("block, message", [
    ("precision { compute = fp32 }", "write compute = tf32"),
    ("precision { gather = 2 }", "gather takes a dtype name"),
    ("precision { reduce = fp9 }", "unknown dtype 'fp9'"),
    ("precision { reduse = fp32 }", "did you mean 'reduce'"),
])
def test_bad_policy_keys_point_at_the_text(block: str, message: str) -> None:
    with pytest.raises(PlaceError) as caught:
        load_text(fsdp(block))
    assert message in str(caught.value)


def test_compute_and_the_mesh_matmul_must_agree() -> None:
    with pytest.raises(PlaceError) as caught:
        load_text(fsdp("precision { compute = bf16 }", "dp = 8, device = h100_sxm, matmul = fp8"))
    assert "write the matmuls' dtype once" in str(caught.value)


def imported(name: str, *settings: str) -> object:
    strategy, _ = import_load(str(HERE / name), Options(model=CONFIG, world=8,
                                                        given=frozenset({"model.seq"})))
    text = strategy.source.text
    return load_text(text, "imported.place", api.overrides(["model.seq=4096", *settings]))


def test_torchtitan_defaults_gather_bf16_and_reduce_fp32(tmp_path: Path) -> None:
    toml = tmp_path / "titan.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\n'
                    'seq_len = 4096\n[parallelism]\ndata_parallel_shard_degree = -1\n')
    strategy, _ = import_load(str(toml), Options(world=8))
    moved = comm(strategy)
    assert moved["all_gather params (gather for forward)"] == Fraction(PSI * 2 * 7, 8)
    assert moved["reduce_scatter grads"] == Fraction(PSI * 4 * 7, 8)


def test_accelerate_fsdp_bf16_reduces_in_bf16() -> None:
    trl = imported("trl-fsdp2.yaml")
    moved = comm(trl)
    assert moved["reduce_scatter grads"] == Fraction(PSI * 2 * 7, 8)
    assert moved["all_gather params (gather for forward)"] == Fraction(PSI * 2 * 7, 8)


def test_accelerate_ddp_bf16_autocasts_over_fp32_gradients(tmp_path: Path) -> None:
    config = tmp_path / "ddp.yaml"
    config.write_text("distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 8\n")
    strategy, _ = import_load(str(config), Options(model=CONFIG, world=8,
                                                   given=frozenset({"model.seq"})))
    strategy = load_text(strategy.source.text, "ddp.place",
                         api.overrides(["model.seq=4096", "mesh.device=h100_sxm"]))
    assert comm(strategy)["all_reduce grads"] == 2 * Fraction(PSI * 4 * 7, 8)  # DDP in fp32
    assert api.estimate_time(strategy).matmul == "bf16"  # type: ignore[union-attr]


def test_deepspeed_communication_data_type_is_the_reduction_dtype(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, '
                      '"bf16": {"enabled": true}, "communication_data_type": "fp32", '
                      '"zero_optimization": {"stage": 2}}')
    strategy, _ = import_load(str(config), Options(model=CONFIG, world=8,
                                                   given=frozenset({"model.seq"})))
    strategy = load_text(strategy.source.text, "ds.place", api.overrides(["model.seq=4096"]))
    moved = comm(strategy)
    assert moved["reduce_scatter grads"] == Fraction(PSI * 4 * 7, 8)  # fp32 over bf16 G


def test_trl_fsdp2_bf16_and_deepspeed_fp16_of_one_model_take_one_time() -> None:
    # Both compute in 16 bits (H100 SXM: the same bf16 and fp16 peak) and move 2 B per element
    # in every gather and reduction; the step-time model once ran the FSDP2 run's matmuls in
    # tf32 (its stored fp32) and said 2.3x slower.
    trl = api.estimate_time(imported("trl-fsdp2.yaml", "mesh.device=h100_sxm"))
    ds = api.estimate_time(imported("llama3-8b-zero3-fp16.json", "mesh.device=h100_sxm"))
    assert trl is not None and ds is not None
    assert (trl.matmul, ds.matmul) == ("bf16", "fp16")
    assert trl.compute_seconds == pytest.approx(ds.compute_seconds, rel=1e-9)
    assert trl.step_seconds == pytest.approx(ds.step_seconds, rel=0.05)
