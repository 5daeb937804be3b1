"""``ddp(overlap = none | grads | params | all)``: which collectives of a data axis overlap with
compute (Megatron-LM's --overlap-grad-reduce / --overlap-param-gather, both off by default;
DeepSpeed's ``zero_optimization.overlap_comm``, on by default only at stage 3).

The expected times are worked by hand. The model is a plain GPT of 8 layers, hidden 2048, MLP
8192, vocabulary 51,200, learned positions of 2,048, LayerNorm (weight and bias) and an untied
output layer: 12·L·h² + 2·V·h + s·h + (4L + 2)·h = 616,632,320 parameters. ``precision
megatron`` keeps bf16 parameters (2 B) and fp32 gradients (4 B). A ring all-reduce over n ranks
moves 2(n - 1)/n of the buffer in 2(n - 1) steps, a reduce-scatter or an all-gather (n - 1)/n
in n - 1. A micro-batch's forward runs 2·s·(4h² + 2·h·f) per layer plus the causal flash
attention core 4·s·s·h / 2, and the output layer 2·s·h·V, at 312 TFLOP/s × 0.5; backward is
twice that. Each step also all-reduces the token count (8 bytes) over dp: ``SCALAR``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.api import costs
from placeverify.cost.time import step_time
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.cli import load_strategy
from placeverify.importers.registry import import_file
from placeverify.ir.placement import Overlap
from placeverify.lower import load_text
from tests.seq_given import import_seq

# the plain GPT and the calibration without memory-bound terms of the tensor-overlap tests
# (MODEL: 8 layers, hidden 2048, MLP 4 x 2048, vocabulary 51,200, sequence 2,048, one sequence)
from tests.test_tp_overlap import MODEL, PLAIN

L, H, F, V, S, N, M = 8, 2048, 8192, 51200, 2048, 8, 4
PARAMS = 12 * L * H * H + 2 * V * H + S * H + (4 * L + 2) * H
RATE = 312e12 * 0.5
FORWARD = (L * (2 * S * (4 * H * H + 2 * H * F) + 4 * S * S * H / 2) + 2 * S * H * V) / RATE
BACKWARD = 2 * FORWARD


def scalar(bandwidth: float) -> float:
    return 2 * (N - 1) / N * 8 / bandwidth + 2 * (N - 1) * 1e-9


def strategy(preset: str, bandwidth: float = 1e10) -> str:
    return (f'strategy "t"\n{MODEL}\nprecision megatron\nmesh {{\n'
            f"    dp = {N} {{ bandwidth = {bandwidth / 1e9:g} GB/s, latency = 1 ns }}\n"
            f"    device = a100_80gb_sxm\n}}\nplace {preset} over dp\nmicrobatches = {M}\n"
            "recompute none\n")


def exposed_dp(text: str) -> tuple[float, float]:
    s = load_text(text)
    result = step_time(s, costs(s), PLAIN)
    assert result is not None and result.step_seconds is not None
    return dict(result.exposed)["dp"], result.step_seconds


def test_the_model_counts_the_parameters_by_hand() -> None:
    assert PARAMS == 616_632_320
    assert load_text(strategy("ddp")).model.params == PARAMS


@pytest.mark.parametrize("bandwidth", [1e10, 1e12])
def test_ddp_without_overlap_waits_for_the_whole_all_reduce(bandwidth: float) -> None:
    """Once a step after the last backward: hidden behind that backward by default, all of it
    exposed with overlap = none."""
    reduce = 2 * (N - 1) / N * PARAMS * 4 / bandwidth + 2 * (N - 1) * 1e-9
    hidden, step_hidden = exposed_dp(strategy("ddp", bandwidth))
    waited, step_waited = exposed_dp(strategy("ddp(overlap = none)", bandwidth))
    assert waited - scalar(bandwidth) == pytest.approx(reduce, rel=1e-9)
    assert hidden - scalar(bandwidth) == pytest.approx(max(0.0, reduce - BACKWARD), rel=1e-9,
                                                       abs=1e-12)
    assert step_waited - step_hidden == pytest.approx(min(reduce, BACKWARD), rel=1e-6)
    # the slow link outlasts the backward; the fast one hides entirely
    assert (reduce > BACKWARD) == (bandwidth == 1e10)


def test_zero1_grads_hides_the_reduce_scatter_not_the_parameter_all_gather() -> None:
    """Megatron-LM's distributed optimizer: the fp32 gradients reduce-scattered after the
    backward, the bf16 parameters all-gathered after the update, before the next forward. With
    a fast link both hide by default; overlap = grads leaves the all-gather exposed."""
    bandwidth = 1e12
    scatter = (N - 1) / N * PARAMS * 4 / bandwidth + (N - 1) * 1e-9
    gather = (N - 1) / N * PARAMS * 2 / bandwidth + (N - 1) * 1e-9
    assert scatter < BACKWARD and gather < FORWARD
    every, _ = exposed_dp(strategy("zero1", bandwidth))
    grads, _ = exposed_dp(strategy("zero1(overlap = grads)", bandwidth))
    none, _ = exposed_dp(strategy("zero1(overlap = none)", bandwidth))
    assert every == pytest.approx(scalar(bandwidth), rel=1e-9)
    assert grads - scalar(bandwidth) == pytest.approx(gather, rel=1e-9)
    assert none - scalar(bandwidth) == pytest.approx(gather + scatter, rel=1e-9)


def test_zero2_without_overlap_lengthens_every_micro_batch() -> None:
    """ZeRO-2 reduce-scatters each micro-batch's gradients (DeepSpeed stage 2): with overlap =
    none each of the M reductions is waited for; the gathers after the update too."""
    bandwidth = 1e12
    scatter = (N - 1) / N * PARAMS * 4 / bandwidth + (N - 1) * 1e-9
    gather = (N - 1) / N * PARAMS * 2 / bandwidth + (N - 1) * 1e-9
    none, _ = exposed_dp(strategy("zero2(overlap = none)", bandwidth))
    params, _ = exposed_dp(strategy("zero3(overlap = params)", bandwidth))
    assert none - scalar(bandwidth) == pytest.approx(M * scatter + gather, rel=1e-9)
    # ZeRO-3 with its gathers prefetched and its M reduce-scatters waited for. ZeRO-3 moves
    # unit by unit (U = L + 1 units: the layers and the rest), each collective with its own
    # ring latency; one unit prefetched, the first unit's gather of each forward has nothing to
    # hide behind (1/U of it), the other gathers hide behind their units on this fast link
    units = L + 1
    scatter_u = (N - 1) / N * PARAMS * 4 / bandwidth + (N - 1) * 1e-9 * units
    gather_u = (N - 1) / N * PARAMS * 2 / bandwidth + (N - 1) * 1e-9 * units
    assert params - scalar(bandwidth) == pytest.approx(M * scatter_u + M * gather_u / units,
                                                       rel=1e-9)


def test_report_and_json_show_the_option_only_when_set() -> None:
    from placeverify.api import check_strategy
    from placeverify.report.data import check_document

    for preset, shown in (("ddp", None), ("ddp(overlap = none)", "none"),
                          ("hsdp(overlap = grads)", "grads")):
        text = strategy(preset)
        if preset.startswith("hsdp"):
            text = text.replace(f"dp = {N} {{", f"shard = 2 {{ bandwidth = 10 GB/s }}\n"
                                f"    replica = {N // 2} {{").replace("over dp",
                                                                      "over shard * replica")
        s = load_text(text)
        data = check_document(check_strategy(s))
        for axis in ("dp",) if "dp" in data["placement"] else ("shard", "replica"):
            assert data["placement"][axis].get("overlap") == shown
            if shown is not None:
                assert s.placement(axis).data_overlap is Overlap(shown)


@pytest.mark.parametrize("written, said", [
    ("ddp(overlap = true)", "data-parallel overlap"),
    ("zero1(overlap = sometimes)", "data-parallel overlap"),
])
def test_a_bad_value_is_an_error_at_the_text(written: str, said: str) -> None:
    text = strategy(written)
    with pytest.raises(PlaceError) as caught:
        load_text(text)
    d = caught.value.diagnostics[0]
    assert said in d.message, d.message
    assert d.span is not None and d.span.line == 8


def test_tensor_overlap_takes_no_data_words() -> None:
    text = (f'strategy "t"\n{MODEL}\nprecision megatron\nmesh {{ tp = 2 }}\n'
            "place megatron(sequence_parallel, overlap = grads) over tp\n")
    with pytest.raises(PlaceError) as caught:
        load_text(text)
    assert caught.value.diagnostics[0].span is not None


# ---- importers --------------------------------------------------------------------------------

MEGATRON = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--vocab-size 51200 ")


@pytest.mark.parametrize("flags, written", [
    ("", "place ddp(overlap = none) over dp"),
    ("--overlap-grad-reduce", "place ddp over dp"),
    ("--use-distributed-optimizer", "place zero1(overlap = none) over dp"),
    ("--use-distributed-optimizer --overlap-grad-reduce", "place zero1(overlap = grads) over dp"),
    ("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather",
     "place zero1 over dp"),
])
def test_megatron_overlap_flags(tmp_path: Path, flags: str, written: str) -> None:
    # DistributedDataParallelConfig: overlap_grad_reduce and overlap_param_gather default False
    path = tmp_path / "run.args"
    path.write_text(MEGATRON + flags + "\n", encoding="utf-8")
    imported = import_file(str(path), Options(world=8))
    assert written in imported.text.splitlines()[-10:] or any(
        line.startswith(written + " ") or line == written for line in imported.text.splitlines())
    assert not [w for w, _ in imported.warnings if "overlap" in w.message]


@pytest.mark.parametrize("flags, said", [
    ("--overlap-param-gather", "without --overlap-grad-reduce"),
    ("--overlap-grad-reduce --overlap-param-gather", "without --use-distributed-optimizer"),
])
def test_megatron_param_gather_overlap_needs_its_conditions(tmp_path: Path, flags: str,
                                                            said: str) -> None:
    """validate_args: --overlap-param-gather only with the distributed optimizer (or
    Megatron-FSDP) and with --overlap-grad-reduce."""
    path = tmp_path / "run.args"
    text = MEGATRON + flags
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(PlaceError) as caught:
        load_strategy(str(path), Options(world=8))
    d = caught.value.diagnostics[0]
    assert said in d.message
    assert d.span is not None and text[d.span.column - 1:].startswith("--overlap-param-gather")


@pytest.mark.parametrize("zero, written", [
    ("", "place ddp(overlap = none) over dp"),  # stage 0: allreduce_gradients after backward
    ('"zero_optimization": {"stage": 1},', "place zero1(overlap = none) over dp"),
    ('"zero_optimization": {"stage": 2, "overlap_comm": true},',
     "place zero2(overlap = grads) over dp"),
    ('"zero_optimization": {"stage": 3},', "place zero3 over dp"),
    ('"zero_optimization": {"stage": 3, "overlap_comm": false},',
     "place zero3(overlap = params) over dp"),
])
def test_deepspeed_overlap_comm(tmp_path: Path, zero: str, written: str) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, '
                    f'{zero} "gradient_clipping": 1.0}}\n', encoding="utf-8")
    config = Path(__file__).parent / "importers" / "llama3-8b-config.json"
    imported = import_seq(str(path), Options(str(config), 8))
    assert any(line.startswith(written + " ") for line in imported.text.splitlines()), \
        imported.text


def test_imported_megatron_run_without_overlap_is_slower(tmp_path: Path) -> None:
    """The same Megatron-LM run predicted with and without --overlap-grad-reduce on a device:
    the waited all-reduce lengthens the step."""
    from placeverify.importers.registry import load
    from placeverify.lower.overrides import parse_settings

    times = []
    for flags in ("", "--overlap-grad-reduce"):
        path = tmp_path / "run.args"
        path.write_text(MEGATRON + flags + "\n", encoding="utf-8")
        s, _ = load(str(path), Options(world=8), parse_settings(["mesh.device=a100_80gb_sxm"]))
        result = step_time(s, costs(s), PLAIN)
        assert result is not None and result.step_seconds is not None
        times.append(result.step_seconds)
    assert times[0] > times[1]


# ---- search -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sharding, pp, v, m", [("DDP", 1, 1, 8), ("ZERO1", 4, 2, 8),
                                                ("ZERO3", 1, 1, 4)])
def test_search_writes_the_wait_and_screens_it_as_the_full_model(sharding: str, pp: int, v: int,
                                                                 m: int) -> None:
    from dataclasses import replace

    from placeverify.search.render import place_text
    from placeverify.search.space import Layout, Recompute, Sharding
    from tests.test_search import full_seconds, problem, screen_of

    kind = Sharding[sharding]
    d = 64 // (8 * pp)
    pb = problem("llama3_8b", "h100_sxm", 64, d * m, 4096)
    lay = Layout(tp=8, cp=1, pp=pp, v=v, ep=1, dp=d, sharding=kind, shard=d, sp=True,
                 recompute=Recompute.NONE, offload=False, b=1, m=m, dp_wait=True)
    assert pb.global_batch == d * m
    text = place_text(pb, lay)
    assert f"place {kind.value}(overlap = none) over dp" in text
    seconds = full_seconds(text)
    assert screen_of(pb).estimate(lay).step_seconds == pytest.approx(seconds, rel=0.03)
    # and waiting is what makes it slower than the same layout overlapped
    assert full_seconds(place_text(pb, replace(lay, dp_wait=False))) < seconds


def test_search_flag_writes_every_layout_waiting() -> None:
    from tests.test_search import shown_layouts

    for flags, expected in (((), True), (("--no-data-overlap",), False)):
        shown = shown_layouts(*flags)
        assert shown and {lay["data_overlap"] for lay in shown} == {expected}


def test_search_of_a_file_keeps_its_frameworks_overlap(tmp_path: Path) -> None:
    """A Megatron-LM argument file without --overlap-grad-reduce, searched: every layout shown
    waits for its data-parallel collectives, as that run's framework does; with the flag they
    overlap."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    for flags, expected in (("", False), ("--overlap-grad-reduce", True)):
        path = tmp_path / "run.args"
        path.write_text(MEGATRON.replace("--global-batch-size 8", "--global-batch-size 32")
                        + flags + "\n", encoding="utf-8")
        out = subprocess.run([sys.executable, "-m", "placeverify", "search", str(path),
                              "--world", "16", "--device", "h100_sxm", "--json", "-q"],
                             capture_output=True, text=True, cwd=ROOT, check=False)
        assert out.returncode == 0, out.stderr
        document = json.loads(out.stdout)
        shown = [e["layout"] for e in (*document["top"], *document["frontier"])]
        assert shown and {lay["data_overlap"] for lay in shown} == {expected}
