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
from placeverify.ir.placement import TensorOverlap
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
    assert strategy_.placement("tp").overlap is TensorOverlap.ALL
    assert strategy_.placement("tp").sequence_parallel


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
                 tp_overlap=TensorOverlap.ALL)
    text = place_text(pb, lay)
    assert "place megatron(sequence_parallel, overlap = true) over tp" in text
    seconds = full_seconds(text)
    assert screen_of(pb).estimate(lay).step_seconds == pytest.approx(seconds, rel=0.03)
    # and the overlap is what makes it faster than the same layout without it
    assert full_seconds(place_text(pb, replace(lay, tp_overlap=TensorOverlap.NONE))) > seconds


def test_search_flag_writes_every_sequence_parallel_layout_with_the_overlap() -> None:
    from tests.test_search import shown_layouts

    for flags, expected in (((), False), (("--tp-overlap",), True)):
        with_sp = [lay for lay in shown_layouts(*flags) if lay["tp"] > 1
                   and lay["sequence_parallel"]]
        assert with_sp, "the fastest layouts of this problem use tensor parallelism"
        assert {lay["tp_overlap"] for lay in with_sp} == {expected}


# ---- overlap = backward: Megatron-LM's column-parallel layers ------------------------------

def backward_text(bandwidth: str, sp: bool, overlap: str = "backward", moe: bool = False) -> str:
    options = ", ".join([*(["sequence_parallel"] if sp else []), f"overlap = {overlap}"])
    text = strategy(bandwidth, False).replace("megatron(sequence_parallel)",
                                              f"megatron({options})")
    return text.replace("attention = flash }", "attention = flash, experts = 4, top_k = 2 }") \
        if moe else text


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("bandwidth, share", [("1 GB/s", 1.0), ("1 GB/s", 0.5),
                                              ("10 TB/s", 0.5), ("10 TB/s", 1.0)])
def test_backward_overlap_hides_the_column_parallel_backward_collectives(
        sp: bool, bandwidth: str, share: float, moe: bool) -> None:
    """Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication: per layer, the QKV and
    first MLP layers (column-parallel) all-gather their input again beside the input-gradient
    GEMM and reduce-scatter the input gradient beside the weight-gradient GEMM (without
    sequence parallelism: all-reduce it); the output layer (column-parallel too) likewise.
    Exposed per micro-batch: what waits, plus max(T (1 - share), T - W) of those, W the
    column-parallel layers' input- and weight-gradient GEMMs: twice their forward FLOPs, and
    an MoE layer's experts reached through the token dispatcher instead (only its QKV
    projection's collectives and GEMMs count, one of each kind per layer), and
    share the calibration's backward_overlap (overlap = true's tp_overlap stays 1)."""
    cal = replace(PLAIN, backward_overlap=share)
    rate = 312e12 * 0.5
    # QKV (3h) and the first MLP matmul (f)
    column = 2 * B * S * (H * 3 * H + (0 if moe else H * 4 * H)) / T
    pairs = 1 if moe else 2
    output = 2 * B * S * H * V / T
    window = 2 * (L * column + output) / rate
    bw = {"1 GB/s": 1e9, "10 TB/s": 1e13}[bandwidth]
    bsh = B * S * H * 2
    if sp:
        # waited: per layer the 2 forward all-gathers, the 2 row-parallel reduce-scatters and
        # their 2 backward all-gathers; the embedding's reduce-scatter and gradient all-gather;
        # the final hidden states' forward all-gather. Beside: 2 + 2 per layer, and the output
        # layer's re-gather and input-gradient reduce-scatter.
        waited_calls, beside_calls, ring_steps = (10 - 2 * pairs) * L + 3, 2 * pairs * L + 2, 1
    else:
        # waited: the 2 forward all-reduces per layer and the embedding's; beside: the 2
        # column-parallel input gradients per layer and the output layer's
        waited_calls, beside_calls, ring_steps = (4 - pairs) * L + 1, pairs * L + 1, 2
    per_call = ring_steps * (bsh * (T - 1) / T / bw + (T - 1) * 1e-9)
    entropy = 3 * (2 * (T - 1) / T * B * S * 4 / bw + 2 * (T - 1) * 1e-9)
    waited = waited_calls * per_call + entropy
    beside = beside_calls * per_call
    text = backward_text(bandwidth, sp, moe=moe)
    over = load_text(text)
    assert over.placement("tp").overlap is TensorOverlap.BACKWARD
    result = step_time(over, costs(over), cal)
    assert result is not None
    expected = waited + max(beside * (1 - share), beside - window)
    assert dict(result.exposed)["tp"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # the same bytes as without the option, only fewer of them waited for
    plain = load_text(backward_text(bandwidth, sp, "none", moe))
    assert plain.placement("tp").overlap is TensorOverlap.NONE
    assert sum(c.bytes for c in costs(plain).comm) == sum(c.bytes for c in costs(over).comm)
    assert dict(step_time(plain, costs(plain), cal).exposed)["tp"] == pytest.approx(  # type: ignore[union-attr]
        waited + beside, rel=1e-9)
    assert (beside > window) == (bandwidth == "1 GB/s")


@pytest.mark.parametrize("word, level", [("true", TensorOverlap.ALL), ("all", TensorOverlap.ALL),
                                         ("backward", TensorOverlap.BACKWARD),
                                         ("false", TensorOverlap.NONE),
                                         ("none", TensorOverlap.NONE)])
def test_overlap_words(word: str, level: TensorOverlap) -> None:
    assert load_text(backward_text("100 GB/s", True, word)).placement("tp").overlap is level


def test_backward_overlap_needs_no_sequence_parallelism_all_does() -> None:
    assert load_text(backward_text("100 GB/s", False)).placement("tp").overlap \
        is TensorOverlap.BACKWARD
    with pytest.raises(PlaceError) as caught:
        load_text(backward_text("100 GB/s", False, "all"))
    assert "needs sequence parallelism" in str(caught.value)


def test_an_unknown_overlap_word_is_an_error_at_it() -> None:
    text = backward_text("100 GB/s", True, "sometimes")
    with pytest.raises(PlaceError) as caught:
        load_text(text)
    diagnostic = caught.value.diagnostics[0]
    assert "unknown tensor-parallel overlap 'sometimes'" in diagnostic.message
    assert diagnostic.span is not None
    line = text.splitlines()[diagnostic.span.line - 1]
    assert line[diagnostic.span.column - 1:].startswith("sometimes")


MEGATRON_ARGS = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
                 "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 "
                 "--tensor-model-parallel-size 4 --bf16 --vocab-size 51200")


@pytest.mark.parametrize("flags, level", [
    ("", TensorOverlap.BACKWARD), ("--sequence-parallel", TensorOverlap.BACKWARD),
    ("--no-async-tensor-model-parallel-allreduce", TensorOverlap.NONE),
    ("--sequence-parallel --tp-comm-overlap", TensorOverlap.ALL)])
def test_megatron_layers_overlap_their_backward_collectives(tmp_path: Path, flags: str,
                                                            level: TensorOverlap) -> None:
    """Megatron-LM's tensor-parallel layers run the column-parallel backward collectives beside
    their GEMMs by default; --no-async-tensor-model-parallel-allreduce turned the all-reduce's
    off (sequence parallelism's are always async)."""
    path = tmp_path / "run.args"
    path.write_text(f"{MEGATRON_ARGS} {flags}\n", encoding="utf-8")
    assert load_strategy(str(path), Options(world=8)).placement("tp").overlap is level


def test_megatron_deepspeed_layers_wait_for_their_collectives() -> None:
    """BigScience's Megatron-DeepSpeed (megatron/mpu/layers.py) keeps Megatron-LM's layers of
    2021: copy_to_tensor_model_parallel_region's all-reduce, waited for."""
    from tests.conftest import ROOT

    path = ROOT / "tests" / "importers" / "bloom-176b-megatron-deepspeed.slurm"
    assert load_strategy(str(path), Options()).placement("tp").overlap is TensorOverlap.NONE


@pytest.mark.parametrize("pp, v, m, sp", [(1, 1, 8, True), (4, 2, 8, True), (1, 1, 8, False)])
def test_search_writes_the_backward_overlap_and_screens_it_as_the_full_model(
        pp: int, v: int, m: int, sp: bool) -> None:
    from placeverify.search.render import place_text
    from placeverify.search.space import Layout, Recompute, Sharding
    from tests.test_search import full_seconds, problem, screen_of

    pb = problem("llama3_70b", "h100_sxm", 256, 32 * m // pp, 8192)
    lay = Layout(tp=8, cp=1, pp=pp, v=v, ep=1, dp=32 // pp, sharding=Sharding.ZERO1,
                 shard=32 // pp, sp=sp, recompute=Recompute.NONE, offload=False, b=1, m=m,
                 tp_overlap=TensorOverlap.BACKWARD)
    text = place_text(pb, lay)
    written = "sequence_parallel, overlap = backward" if sp else "overlap = backward"
    assert f"place megatron({written}) over tp" in text
    seconds = full_seconds(text)
    assert screen_of(pb).estimate(lay).step_seconds == pytest.approx(seconds, rel=0.03)
    waits = full_seconds(place_text(pb, replace(lay, tp_overlap=TensorOverlap.NONE)))
    overlaps = full_seconds(place_text(pb, replace(lay, tp_overlap=TensorOverlap.ALL))) \
        if sp else 0.0
    assert waits > seconds > overlaps


def test_search_flag_writes_every_tensor_parallel_layout_with_the_backward_overlap() -> None:
    from tests.test_search import shown_layouts

    shown = shown_layouts("--tp-overlap-backward")
    tensor = [lay for lay in shown if lay["tp"] > 1]
    assert tensor, "the layouts of this problem use tensor parallelism"
    assert {lay["tp_overlap"] for lay in tensor} == {"backward"}
    # a layout without a tensor axis has nothing to overlap
    assert all(lay["tp_overlap"] is False for lay in shown if lay["tp"] == 1)
    # under --tp-overlap, sequence parallel layouts overlap everything, the others backward
    shown = [lay for lay in shown_layouts("--tp-overlap") if lay["tp"] > 1]
    assert {lay["tp_overlap"] for lay in shown} == {
        True if lay["sequence_parallel"] else "backward" for lay in shown}


def test_search_of_a_megatron_file_keeps_its_backward_overlap(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    path = tmp_path / "run.args"
    path.write_text(MEGATRON_ARGS.replace("--global-batch-size 8", "--global-batch-size 32")
                    + " --overlap-grad-reduce\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "search", str(path), "--world",
                          "16", "--device", "h100_sxm", "--json", "-q"],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    shown = [e["layout"] for e in (*document["top"], *document["frontier"]) if e["layout"]["tp"] > 1]
    assert shown and {lay["tp_overlap"] for lay in shown} == {"backward"}
