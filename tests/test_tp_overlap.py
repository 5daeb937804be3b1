"""``megatron(sequence_parallel, overlap = true)``: tensor-parallel collectives overlapped with
the GEMMs (Megatron-LM's --tp-comm-overlap, torchtitan's async tensor parallelism).

The expected times are worked by hand: the GEMM FLOPs of a plain GPT layer (QKV 3h², output
projection h², MLP 2·h·f, each 2·b·s FLOPs per weight, ÷ t; the output layer 2·b·s·h·V ÷ t),
three times for forward and backward, at peak × η; the sequence-parallel collectives' bytes
from the ring formula ((t - 1)/t of b·s·h per call: 6 all-gathers and 4 reduce-scatters per
layer per micro-batch, Megatron-LM's sequence-parallel linear layers; 2 for the vocab-parallel
embedding and 3 for the column-parallel output layer).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from placeverify.api import costs
from placeverify.cost.time import Calibration, step_time
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.cli import load_strategy
from placeverify.lower import load_text

L, H, B, S, V, T = 8, 2048, 1, 2048, 51200, 4
MODEL = (f"model transformer {{ layers = {L}, hidden = {H}, heads = 16, ffn = {4 * H}, "
         f"mlp = plain, vocab = {V}, seq = {S}, micro_batch = {B}, position = learned, "
         "norm = layernorm, bias = false, attention = flash }")
PLAIN = Calibration(efficiency=(("default", 0.5),), score_passes=0.0, hidden_passes=0.0,
                    attention_efficiency=1.0, link_efficiency=1.0, fp8_cast_bytes=0.0,
                    memory_efficiency=1.0)


def strategy(bandwidth: str, overlap: bool) -> str:
    option = ", overlap = true" if overlap else ""
    return (f'strategy "t"\n{MODEL}\nprecision megatron\nmesh {{\n'
            f"    tp = {T} {{ bandwidth = {bandwidth}, latency = 1 ns }}\n"
            "    device = a100_80gb_sxm\n}\n"
            f"place megatron(sequence_parallel{option}) over tp\nrecompute none\n")


def test_overlap_needs_sequence_parallelism_an_error_at_the_placement() -> None:
    text = strategy("100 GB/s", False).replace("megatron(sequence_parallel)",
                                                "megatron(overlap = true)")
    with pytest.raises(PlaceError) as caught:
        load_text(text)
    message = str(caught.value)
    assert "needs sequence parallelism" in message and "--tp-comm-overlap" in message
    assert caught.value.diagnostics[0].span is not None
    assert caught.value.diagnostics[0].span.line == 8  # strategy, model, precision, mesh: 7


@pytest.mark.parametrize("bandwidth, share", [("1 GB/s", 1.0), ("1 GB/s", 0.5),
                                              ("10 TB/s", 0.5), ("10 TB/s", 1.0)])
def test_overlapped_collectives_hide_behind_the_gemms(bandwidth: str, share: float) -> None:
    """Exposed per micro-batch: max(T (1 - tp_overlap), T - W), W the GEMMs' time."""
    cal = replace(PLAIN, tp_overlap=share)
    rate = 312e12 * 0.5
    gemm = 2 * B * S * (3 * H * H + H * H + 2 * H * 4 * H) / T * L + 2 * B * S * H * V / T
    window = 3 * gemm / rate
    bw = {"1 GB/s": 1e9, "10 TB/s": 1e13}[bandwidth]
    bsh = B * S * H * 2  # bf16 activations
    # per layer 6 all-gathers + 4 reduce-scatters; the vocab-parallel embedding's output
    # reduce-scattered (forward) and its gradient all-gathered (backward); the output layer's
    # input all-gathered in forward and again in backward, its gradient reduce-scattered
    calls = 10 * L + 2 + 3
    # the vocab-parallel cross-entropy: 3 all-reduces of one fp32 per token (max, sum of
    # exponentials, target logit)
    moved = calls * bsh * (T - 1) / T + 3 * 2 * (T - 1) / T * B * S * 4
    latency = (calls * (T - 1) + 3 * 2 * (T - 1)) * 1e-9
    tensor = moved / bw + latency
    plain = load_text(strategy(bandwidth, False))
    over = load_text(strategy(bandwidth, True))
    exposed_plain = dict(step_time(plain, costs(plain), cal).exposed)["tp"]  # type: ignore[union-attr]
    result = step_time(over, costs(over), cal)
    assert result is not None
    assert exposed_plain == pytest.approx(tensor, rel=1e-9)
    expected = max(tensor * (1 - share), tensor - window)
    assert dict(result.exposed)["tp"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # the slow link outlasts the GEMMs; the fast one hides entirely when the share is 1
    assert (tensor > window) == (bandwidth == "1 GB/s")


def test_megatron_tp_comm_overlap_is_read(tmp_path: Path) -> None:
    args = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 "
            "--tensor-model-parallel-size 4 --sequence-parallel --tp-comm-overlap --bf16 "
            "--vocab-size 51200")
    path = tmp_path / "run.args"
    path.write_text(args + "\n", encoding="utf-8")
    strategy_ = load_strategy(str(path), Options(world=8))
    assert strategy_.placement("tp").overlap and strategy_.placement("tp").sequence_parallel


def test_megatron_tp_comm_overlap_without_sequence_parallelism_is_an_error(tmp_path: Path) -> None:
    """Megatron-LM's validate_args asserts sequence parallelism under --tp-comm-overlap."""
    args = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 "
            "--tensor-model-parallel-size 4 --tp-comm-overlap --bf16 --vocab-size 51200")
    path = tmp_path / "run.args"
    path.write_text(args + "\n", encoding="utf-8")
    with pytest.raises(PlaceError) as caught:
        load_strategy(str(path), Options(world=8))
    assert "only when sequence parallelism is enabled" in str(caught.value)
    span = caught.value.diagnostics[0].span
    assert span is not None and args[span.column - 1:].startswith("--tp-comm-overlap")


@pytest.mark.parametrize("pp, v, m", [(1, 1, 8), (4, 2, 8)])
def test_search_writes_the_overlap_and_screens_it_as_the_full_model(pp: int, v: int,
                                                                    m: int) -> None:
    from placeverify.search.render import place_text
    from placeverify.search.space import Layout, Recompute, Sharding
    from tests.test_search import full_seconds, problem, screen_of

    pb = problem("llama3_70b", "h100_sxm", 256, 32 * m // pp, 8192)
    lay = Layout(tp=8, cp=1, pp=pp, v=v, ep=1, dp=32 // pp, sharding=Sharding.ZERO1,
                 shard=32 // pp, sp=True, recompute=Recompute.NONE, offload=False, b=1, m=m,
                 tp_overlap=True)
    text = place_text(pb, lay)
    assert "place megatron(sequence_parallel, overlap = true) over tp" in text
    seconds = full_seconds(text)
    assert screen_of(pb).estimate(lay).step_seconds == pytest.approx(seconds, rel=0.03)
    # and the overlap is what makes it faster than the same layout without it
    assert full_seconds(place_text(pb, replace(lay, tp_overlap=False))) > seconds


def test_search_flag_writes_every_sequence_parallel_layout_with_the_overlap() -> None:
    from tests.test_search import shown_layouts

    for flags, expected in (((), False), (("--tp-overlap",), True)):
        with_sp = [lay for lay in shown_layouts(*flags) if lay["tp"] > 1
                   and lay["sequence_parallel"]]
        assert with_sp, "the fastest layouts of this problem use tensor parallelism"
        assert {lay["tp_overlap"] for lay in with_sp} == {expected}
