"""ZeRO-3 / FSDP in the step-time model: gathers and reductions unit by unit (issue 32, item 6).

Torch's FSDP wraps each transformer block in its own unit (torchtitan's ``apply_fsdp``,
llm-foundry's ``fsdp_wrap_fn``) and the root holds the rest, so a pass over a stage of L layers is
U = L + 1 units (``cost/time.py``: ``fsdp_units``). Each unit's all-gather and reduce-scatter is
its own NCCL collective with its own ring latency ((n - 1) steps each). FSDP prefetches one unit
ahead (FSDP2's default; FSDP1's ``BackwardPrefetch.BACKWARD_PRE``): in forward unit k + 1's
gather runs beside unit k's compute, so the first unit's gather has nothing to hide behind; in
backward unit k - 1's gather and unit k + 1's reduce-scatter run beside unit k's backward, so the
last unit's reduce-scatter is exposed, and the last forward unit stays gathered for the first
backward one. With equal units each of the other U - 1 collectives hides behind one unit's
compute (F / U, B / U), exposing what outlasts it:

    forward:  G / U + (U - 1) · max(0, G / U - F / U)
    backward: R / U + (U - 1) · max(0, (G + R) / U - B / U)      (one micro-batch)

with G the α-β time of the whole model's gather over a pass and R of its reduce-scatter. The
model and the calibration without memory-bound terms are those of ``tests/test_data_overlap.py``
(8 layers, hidden 2048, 616,632,320 parameters; matmuls at 312 TFLOP/s x 0.5; ``PLAIN`` hides a
collective entirely when its window is long enough). ``precision megatron``: gathers in bf16
(2 B), reductions in fp32 (4 B).
"""

from __future__ import annotations

import pytest

from placeverify.api import costs
from placeverify.cost.exposure import by_units
from placeverify.cost.time import fsdp_units, step_time
from placeverify.ir.placement import TensorOverlap
from placeverify.lower import load_text
from placeverify.search.render import place_text
from placeverify.search.space import Layout, Recompute, Sharding
from tests.test_data_overlap import BACKWARD, FORWARD, PARAMS, L, N
from tests.test_search import problem, screen_of
from tests.test_tp_overlap import MODEL, PLAIN

LATENCY = 1e-6
UNITS = L + 1  # 8 blocks and the root


def text(bandwidth: float, microbatches: int = 1) -> str:
    return (f'strategy "t"\n{MODEL}\nprecision megatron\nmesh {{\n'
            f"    dp = {N} {{ bandwidth = {bandwidth / 1e9:g} GB/s, latency = 1 us }}\n"
            f"    device = a100_80gb_sxm\n}}\nplace fsdp over dp\n"
            f"microbatches = {microbatches}\nrecompute none\n")


def exposed_dp(source: str) -> float:
    s = load_text(source)
    result = step_time(s, costs(s), PLAIN)
    assert result is not None
    return dict(result.exposed)["dp"]


def scalar(bandwidth: float) -> float:
    """The step's token-count all-reduce (8 bytes, 2 (n - 1) steps), exposed."""
    return 2 * (N - 1) / N * 8 / bandwidth + 2 * (N - 1) * LATENCY


def gather(bandwidth: float) -> float:
    """A pass's all-gathers of the bf16 parameters, U collectives of (n - 1) ring steps each."""
    return (N - 1) / N * PARAMS * 2 / bandwidth + (N - 1) * LATENCY * UNITS


def scatter(bandwidth: float) -> float:
    """A pass's reduce-scatters of the fp32 gradients, U collectives."""
    return (N - 1) / N * PARAMS * 4 / bandwidth + (N - 1) * LATENCY * UNITS


def test_units_are_the_layers_and_the_root() -> None:
    assert fsdp_units(L) == UNITS == 9


def test_a_fast_link_leaves_the_first_gather_and_the_last_reduction() -> None:
    """At 1 TB/s every other unit's collectives hide behind their unit (G / U = 1.2e-4 s against
    F / U = 1.6e-3 s), but nothing hides the first unit's gather nor the last unit's
    reduce-scatter: G / U + R / U (main hid everything: 0)."""
    bw = 1e12
    g, r = gather(bw), scatter(bw)
    assert g < FORWARD and g + r < BACKWARD
    assert exposed_dp(text(bw)) - scalar(bw) == pytest.approx(g / UNITS + r / UNITS, rel=1e-9)


def test_a_slow_link_exposes_what_outlasts_each_unit() -> None:
    """At 10 GB/s the gathers outlast their units: each of the U - 1 prefetched gathers exposes
    (G - F) / U and the backward's U - 1 units (G + R - B) / U, the first gather and the last
    reduce-scatter whole."""
    bw = 1e10
    g, r = gather(bw), scatter(bw)
    assert g > FORWARD
    forward = g / UNITS + (UNITS - 1) * (g - FORWARD) / UNITS
    backward = r / UNITS + (UNITS - 1) * (g + r - BACKWARD) / UNITS
    assert exposed_dp(text(bw)) - scalar(bw) == pytest.approx(forward + backward, rel=1e-9)


def test_micro_batches_repeat_the_pass_per_micro_batch() -> None:
    """FSDP reduce-scatters each micro-batch's gradients (reduce = microbatch): M passes, each
    with its first gather and last reduce-scatter exposed."""
    bw, m = 1e12, 4
    g, r = gather(bw), scatter(bw)
    assert exposed_dp(text(bw, m)) - scalar(bw) == pytest.approx(m * (g + r) / UNITS, rel=1e-9)


def test_by_units_by_hand() -> None:
    # 10 s of gathers beside 4 s of compute over 5 units, 0.5 s of it first: 0.5 + 4 x (2 - 0.8)
    assert by_units(10.0, 4.0, 1.0, 5, 0.5) == pytest.approx(0.5 + 4 * 1.2)
    # the share 1 - overlap exposed at least: 4 x max(0.2 x 2, 2 - 8 / 5)
    assert by_units(10.0, 8.0, 0.8, 5, 0.0) == pytest.approx(4 * 0.4)


@pytest.mark.parametrize("m, b", [(1, 2), (4, 1)])
def test_screen_agrees_on_a_communication_bound_fsdp_layout(m: int, b: int) -> None:
    """The search's screen counts the units as the full model does (within its 3 %), on 64
    A100 over the network, where Llama 3 8B's gathers outlast short micro-batches."""
    pb = problem("llama3_8b", "a100_80gb_sxm", 64, 64 * m * b, 2048)
    lay = Layout(tp=1, cp=1, pp=1, v=1, ep=1, dp=64, sharding=Sharding.ZERO3, shard=64,
                 sp=False, recompute=Recompute.FULL, offload=False, b=b, m=m,
                 tp_overlap=TensorOverlap.NONE)
    strategy = load_text(place_text(pb, lay), "<layout>")
    st = step_time(strategy, costs(strategy))
    assert st is not None and st.step_seconds is not None
    assert screen_of(pb).estimate(lay).step_seconds == pytest.approx(st.step_seconds, rel=0.03)
