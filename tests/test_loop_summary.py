"""The summarised micro-batch loop of the Z3 encoding decides as the unrolled one does.

A loop with collectives is unrolled in the coefficient encoding; once its micro-batches reach a
steady state only the first few and the last are encoded
(:func:`placeverify.verify.z3.integrity.encode`). Random loops with 7 to 10 micro-batches are
checked both ways (the unrolled one by switching the summary off) and against the exact
interpreter: the verdicts must be the same, and a proof must hold on concrete instances.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placeverify.diagnostics import PlaceError
from placeverify.lower import load_text
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run
from placeverify.verdicts import Verdict
from placeverify.verify.checks.coefficients import group_obligation
from placeverify.verify.z3 import integrity
from tests.test_differential import ARCH, instances

FSDP_128 = """model gpt3_175b { micro_batch = 1 }
mesh { dp = 2
       pp = 4 }
place fsdp over dp
place pipeline(1f1b, microbatches = 128) over pp
loss microbatch_mean
"""


@st.composite
def looped(draw: st.DrawFn) -> str:
    """A correct loop (reduce-scatter per micro-batch into an accumulated shard, or a DDP
    reduction after the loop) that is then mutated or not, so both verdicts come up."""
    dp = draw(st.integers(2, 3))
    zero = draw(st.sampled_from(["ddp", "zero2", "zero3"]))
    loss = draw(st.sampled_from(["sum", "token_mean"]))
    m = draw(st.integers(7, 10))
    backward = "sum" if loss == "sum" else draw(st.sampled_from(["sum / tokens(dp, step)",
                                                                 "sum / tokens(step)"]))
    op, accumulate, free = "sum", True, True

    def mutate() -> bool:
        return draw(st.integers(0, 5)) == 0

    if mutate():
        backward = draw(st.sampled_from(["mean", "sum / microbatches", "sum / tokens(dp)"]))
    if mutate():
        op = "mean"
    if mutate():
        accumulate = False
    if mutate():
        free = False
    loop: list[str] = [f"backward {backward}"]
    if mutate():
        loop.append("scale grads by " + draw(st.sampled_from(["1 / |dp|", "2", "1 / tokens(dp)"])))
    post: list[str] = []
    if zero == "ddp":
        if mutate():
            loop.append(f"all_reduce({op}) grads over dp")
        else:
            post.append(f"all_reduce({op}) grads over dp")
        loop.append("scale grads by 1")  # keeps the loop from being uniform
    else:
        loop.append(f"reduce_scatter({op}{', accumulate' if accumulate else ''}) grads over dp")
        if free:
            loop.append("free grads")
    first: list[str] = []
    if mutate():
        first.append("scale grads by " + draw(st.sampled_from(["2", "1 / |dp|"])))
    if mutate():
        post.append("scale grads by " + draw(st.sampled_from(["1 / microbatches", "1 / |dp|"])))
    post.append("update params")
    lines = [ARCH, "precision megatron", f"mesh {{ dp = {dp} }}", f"place {zero} over dp",
             f"loss {loss}", "step {", f"    microbatches = {m}", "    each microbatch {",
             *(f"        {s}" for s in loop), "    }"]
    if first:
        lines += ["    on microbatch 0 {", *(f"        {s}" for s in first), "    }"]
    lines += [*(f"    {s}" for s in post), "}", ""]
    return "\n".join(lines)


def verdicts(text: str, monkeypatch: pytest.MonkeyPatch, summarise: bool) -> list[Verdict]:
    strategy = load_text(text)
    with monkeypatch.context() as patch:
        if not summarise:
            patch.setattr(integrity, "summary_indices", lambda step, m: None)
        return [group_obligation(strategy, g, timeout_ms=10_000)[0].verdict
                for g in strategy.model.groups_present()]


STEADY: list[bool] = []
VERDICTS: list[Verdict] = []


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=looped())
def test_a_summarised_loop_decides_as_the_unrolled_one(text: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        strategy = load_text(text)
    except PlaceError:
        return
    steady = integrity._steady
    seen: list[bool] = []

    def record(snapshots: list[integrity._Snapshot]) -> bool:
        seen.append(steady(snapshots))
        return seen[-1]

    with monkeypatch.context() as patch:
        patch.setattr(integrity, "_steady", record)
        summarised = verdicts(text, monkeypatch, summarise=True)
    STEADY.append(any(seen))
    VERDICTS.extend(summarised)
    assert summarised == verdicts(text, monkeypatch, summarise=False), text
    if Verdict.PROVED in summarised:
        for group, verdict in zip(strategy.model.groups_present(), summarised, strict=True):
            if verdict is Verdict.PROVED:
                view = group_view(strategy, group)
                assert not [inst for inst in instances(strategy, view, 4)
                            if run(strategy, view, inst).mismatches()], text


def test_the_random_loops_reach_the_summary() -> None:
    """Run after the property above (same module, file order): some loops were summarised and
    some were not, and both verdicts came up, so no path went unchecked."""
    assert STEADY, "the property test did not run first"
    assert any(STEADY) and not all(STEADY), STEADY
    assert Verdict.PROVED in VERDICTS and Verdict.REFUTED in VERDICTS, VERDICTS


def test_a_reduce_scatter_per_microbatch_is_summarised() -> None:
    # FSDP under a 128-micro-batch pipeline: backward, reduce-scatter (accumulate) and free per
    # micro-batch. Summarised: micro-batches 0-3 (the window of alike ones before the last) and
    # 127 are encoded, 5 of 128.
    strategy = load_text(FSDP_128)
    view = group_view(strategy, strategy.model.groups_present()[0])
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    encoded = integrity.encode(strategy, view, sizes, 128, "t_", integer=False)
    assert sorted({key.k for key in encoded.consumed}) == [0, 1, 2, 3, 127]


def test_a_loop_that_rescales_earlier_microbatches_is_unrolled() -> None:
    # An all-reduce of the accumulating buffer in every micro-batch changes every earlier
    # micro-batch's coefficients again: no steady state, every micro-batch is encoded.
    text = "\n".join([ARCH, "mesh { dp = 2 }", "place ddp over dp", "loss sum", "step {",
                      "    microbatches = 9", "    each microbatch {", "        backward sum",
                      "        all_reduce(sum) grads over dp", "    }", "    update params", "}"])
    strategy = load_text(text)
    view = group_view(strategy, strategy.model.groups_present()[0])
    encoded = integrity.encode(strategy, view, {"dp": 2}, 9, "t_", integer=False)
    assert sorted({key.k for key in encoded.consumed}) == list(range(9))
