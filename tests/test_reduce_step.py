"""``reduce = step``: sharded gradients accumulated unsharded and reduce-scattered once a step.

FSDP2 with ``set_requires_gradient_sync(False)`` before the last micro-batch, as
``torch.distributed.pipelining`` runs its stages, and Llama 3's "FP32 gradient accumulation
during backward computation over multiple micro-batches" (arXiv 2407.21783 §3.3.2). The byte
counts are worked by hand from the model's shape; the overlap rule from its statement in
``placeverify/cost/exposure.py`` (one chunk's share queued behind the later chunks' backward).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.api import check, costs
from placeverify.cost.time import CALIBRATION, step_time
from placeverify.errors import PlaceverifyError
from placeverify.ir.placement import Reduce
from placeverify.ir.step import Collective, CollectiveKind
from placeverify.lower import load_text
from placeverify.search.render import place_text
from placeverify.search.space import Layout, Recompute, Sharding
from tests.conftest import ROOT

# 4 layers of h = 64 (4 heads), a plain MLP of 256, vocabulary 1,000, two LayerNorms per layer
MODEL = ("model transformer { layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 1000, "
         "seq = 32, micro_batch = 1 }\nprecision megatron\n")
LAYER = 4 * 64 * 64 + 2 * 64 * 256 + 2 * (2 * 64)  # Q, K, V, O; two MLP matrices; two norms
ENDS = 1000 * 64 + 2 * 64  # the last stage's output layer (the tied embedding) and final norm


def strategy_text(data: str, m: int, chunks: int = 2) -> str:
    return (MODEL + "mesh {\n    dp = 4\n    pp = 2\n}\n" + f"place {data} over dp\n"
            f"place pipeline(interleaved, microbatches = {m}, chunks = {chunks}) over pp\n")


def items(text: str) -> dict[str, int]:
    return {i.label: int(i.bytes) for i in costs(load_text(text)).memory
            if i.category == "gradients"}


def test_the_option_is_read_and_reported() -> None:
    strategy = load_text(strategy_text("zero2(reduce = step)", 2))
    assert strategy.placement("dp").reduce is Reduce.STEP
    assert load_text(strategy_text("zero2", 2)).placement("dp").reduce is Reduce.MICROBATCH


def test_a_bad_value_is_an_error_at_its_text() -> None:
    with pytest.raises(PlaceverifyError) as caught:
        load_text(strategy_text("zero2(reduce = sometimes)", 2))
    text = str(caught.value)
    assert "sometimes" in text and "microbatch" in text and "step" in text


def test_the_canonical_step_reduces_after_the_loop() -> None:
    step = load_text(strategy_text("zero2(reduce = step)", 4)).step
    scatters = [op for op in step.post if isinstance(op, Collective)
                and op.kind is CollectiveKind.REDUCE_SCATTER]
    assert [op.group.axes for op in scatters] == [("dp",)]
    assert not any(isinstance(lo.op, Collective) for lo in step.loop)
    # the default reduces every micro-batch, inside the loop
    default = load_text(strategy_text("zero2", 4)).step
    assert any(isinstance(lo.op, Collective) and lo.op.kind is CollectiveKind.REDUCE_SCATTER
               for lo in default.loop)


@pytest.mark.parametrize("data", ["zero2(reduce = step)", "zero3(reduce = step)",
                                  "fsdp(grad_op, reduce = step)"])
def test_every_condition_is_proved(tmp_path: Path, data: str) -> None:
    path = tmp_path / "once.place"
    path.write_text(strategy_text(data, 4), encoding="utf-8")
    result = check(str(path))
    assert result.verification is not None
    assert set(result.verification.verdicts().values()) == {"proved"}


def test_a_written_deferred_step_needs_the_option(tmp_path: Path) -> None:
    """The same step under plain zero2 is refuted: memory would count the shard only."""
    step = ("step {\n    each microbatch {\n        backward sum / tokens(dp, step)\n    }\n"
            "    reduce_scatter(sum) grads over dp\n    update params\n"
            "    all_gather params over dp\n}\n")
    verdicts = {}
    for data in ("zero2", "zero2(reduce = step)"):
        path = tmp_path / "written.place"
        path.write_text(strategy_text(data, 4) + step, encoding="utf-8")
        result = check(str(path))
        assert result.verification is not None
        verdicts[data] = result.verification.verdicts()["composition_safety"]
    assert verdicts == {"zero2": "refuted", "zero2(reduce = step)": "proved"}


def test_one_chunks_gradient_accumulates_when_the_backward_runs_chunk_by_chunk() -> None:
    """p = 2, v = 2, m = 2 ≤ p: one chunk (one layer) of the last stage plus its ends, in fp32
    (4 bytes), beside the 1/4 shard of the stage's two layers and ends."""
    got = items(strategy_text("zero2(reduce = step)", 2))
    stage = 2 * LAYER + ENDS
    assert got["G gradients"] == stage * 4 // 4
    chunk = [v for k, v in got.items() if k.startswith("G unsharded gradient of one model chunk")]
    assert chunk == [(LAYER + ENDS) * 4]


def test_the_whole_stage_accumulates_when_chunks_interleave() -> None:
    """m = 4 > p: every chunk's backward is under way at once: the stage's whole gradient."""
    got = items(strategy_text("zero2(reduce = step)", 4))
    whole = [v for k, v in got.items() if k.startswith("G unsharded gradient")]
    assert whole == [(2 * LAYER + ENDS) * 4]


DEVICE_TEXT = ("model llama3_8b { seq = 8192, micro_batch = 1 }\nprecision megatron\n"
               "mesh {\n    pp = 4\n    dp = 8 { bandwidth = BW GB/s, latency = 1 us }\n"
               "    device = h100_sxm\n}\n"
               "place zero2(reduce = step) over dp\n"
               "place pipeline(interleaved, microbatches = 4, chunks = 2) over pp\n")


@pytest.mark.parametrize("bandwidth", [1, 5000])
def test_the_chunks_reductions_queue_behind_the_later_chunks_backward(tmp_path: Path,
                                                                      bandwidth: int) -> None:
    """Exposed over dp: the token count's all-reduce, the reduce-scatter's max(T / v, T - (v - 1)
    B / v) with B = m t_bwd the stage's backward (t_bwd = 2 t_fwd without recomputation, so B is
    2/3 of the compute), and the parameter all-gather beyond one forward (t_fwd = compute / 3m).
    A slow link exposes T - (v - 1) B / v, a fast one T / v; and at least the share
    1 - data_overlap of each is exposed."""
    path = tmp_path / "queue.place"
    path.write_text(DEVICE_TEXT.replace("BW", str(bandwidth)), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    doc = json.loads(out.stdout)
    collectives = doc["communication"]["collectives"]
    secs = {(c["op"], c["what"]): c["seconds"] for c in collectives if c["axes"] == ["dp"]}
    time = doc["time"]
    m, v = 4, 2
    compute = time["breakdown"]["compute_seconds"]
    backward, forward = 2 * compute / 3, compute / (3 * m)
    scatter = secs[("reduce_scatter", "grads")]
    share = 1 - CALIBRATION.data_overlap  # what no window hides (README "Step time")
    queued = max(scatter / v, scatter * share, scatter - (v - 1) * backward / v)
    gather = max(secs[("all_gather", "params")] * share, secs[("all_gather", "params")] - forward)
    expected = secs[("all_reduce", "tokens(dp, step)")] + queued + gather
    assert time["breakdown"]["exposed_communication_seconds"]["dp"] == pytest.approx(expected,
                                                                                     rel=1e-9)
    slow = scatter - (v - 1) * backward / v > scatter / v
    assert slow == (bandwidth == 1)


@pytest.mark.parametrize("sharding, shard, m", [
    (Sharding.ZERO2, 16, 4),  # chunk by chunk: one chunk's gradient, the queued reduction
    (Sharding.ZERO3, 16, 4),
    (Sharding.HSDP, 4, 4),
])
def test_search_writes_the_option_and_screens_it_as_the_full_model(
        sharding: Sharding, shard: int, m: int) -> None:
    from tests.test_search import problem, screen_of

    pb = problem("llama3_70b", "h100_sxm", 512, 16 * m, 8192)
    lay = Layout(tp=8, cp=1, pp=4, v=2, ep=1, dp=16, sharding=sharding, shard=shard, sp=True,
                 recompute=Recompute.NONE, offload=False, b=1, m=m, reduce_step=True)
    assert lay.chunk_ordered
    text = place_text(pb, lay)
    assert "(reduce = step) over" in text
    strategy = load_text(text, "<layout>")
    assert {p.reduce for p in strategy.placements if p.role.value == "data"} == {Reduce.STEP}
    full = costs(strategy)
    st = step_time(strategy, full)
    assert st is not None and st.step_seconds is not None and full.peak is not None
    est = screen_of(pb).estimate(lay)
    assert est.peak_bytes == pytest.approx(float(full.peak.bytes), rel=0.03)
    assert est.step_seconds == pytest.approx(st.step_seconds, rel=0.03)


def test_measure_refuses_the_option_at_its_placement() -> None:
    """measure's FSDP2 run reduces every micro-batch: the option has no torch implementation
    there, an error at the place line, not a run of something else."""
    from placeverify.diagnostics import PlaceError
    from placeverify.measure.plan import plan

    text = (MODEL.replace("precision megatron", "precision fp32_adam")
            + "mesh {\n    dp = 2\n}\nplace zero2(reduce = step) over dp\nmicrobatches = 2\n")
    with pytest.raises(PlaceError) as caught:
        plan(load_text(text))
    assert "reduce = step" in str(caught.value)
    assert caught.value.diagnostics[0].span is not None
    assert caught.value.diagnostics[0].span.line == 6  # MODEL is two lines, the mesh three


def test_without_a_device_every_reduction_stays_exposed(tmp_path: Path) -> None:
    """No device, no backward to hide behind: the once-a-step reduce-scatter is exposed in full
    with the rest of the data-parallel traffic (it once dropped out of the sum)."""
    path = tmp_path / "links.place"
    path.write_text(MODEL + "mesh {\n    dp = 4 { bandwidth = 1 GB/s }\n"
                    "    pp = 2 { bandwidth = 1 GB/s }\n}\n"
                    "place zero2(reduce = step) over dp\n"
                    "place pipeline(interleaved, microbatches = 2, chunks = 2) over pp\n",
                    encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", "--json", str(path)],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    doc = json.loads(out.stdout)
    over_dp = [c["seconds"] for c in doc["communication"]["collectives"] if c["axes"] == ["dp"]]
    assert len(over_dp) == 3  # the token count, the reduce-scatter, the parameter all-gather
    exposed = doc["time"]["breakdown"]["exposed_communication_seconds"]["dp"]
    assert exposed == pytest.approx(sum(over_dp), rel=1e-9)
