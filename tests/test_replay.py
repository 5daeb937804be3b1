"""The torch replay backend: planning (no torch), comparison, and real distributed runs.

Runs that need torch are marked ``torch`` and skipped when it is not installed; they share one
warm forkserver (the pool is a process-wide singleton), so each replay forks ranks from a server
that imported torch once. CUDA/NCCL runs are marked ``cuda`` and skipped without CUDA devices.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from array import array
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placeverify import api
from placeverify.api import check
from placeverify.diagnostics import ExitCode
from placeverify.ir.placement import Role
from placeverify.lower import load, load_text
from placeverify.replay.compare import TOLERANCE_FACTOR, outcome, tolerance
from placeverify.replay.counts import pick_counts
from placeverify.replay.plan import (
    Claim,
    Expectation,
    Plan,
    RunSpec,
    plan_from_strategy,
    plan_from_trace,
    strategy_of,
)
from placeverify.replay.sizes import MAX_DEFAULT_WORLD, choose_sizes, shrink_sizes
from placeverify.trace import Trace
from placeverify.verdicts import Verdict

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPT = Path(sys.executable).parent / "placeverify"
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def torch_test(f: Any) -> Any:
    return pytest.mark.torch(needs_torch(f))


def trace_of(path: str) -> Trace:
    result = check(str(ROOT / path))
    assert result.verification is not None and result.verification.trace is not None
    # file relative to ROOT, so that the fixed twin is found from the tests' cwd
    return replace(result.verification.trace, file=path)


# A step whose 1/16 is 1/|dp * cp| written as a number: right at the declared 4 x 4 mesh only.
CONSTANT_AT_4X4 = """
strategy "Context parallel with a hard-coded 1/16"
model transformer {{ layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 8192 }}
precision megatron
mesh {{ dp = 4, cp = 4 }}
place ddp over dp
place context over cp
loss microbatch_mean
step {{
    microbatches = 2
    backward sum / tokens(cp) * |cp| / microbatches
    scale grads by {factor}
    all_reduce(sum) grads over dp * cp
    update params
}}
"""

# A small transformer with dropout; {mesh} and {place} choose the split, {seeds} the RNG policy.
DROPOUT = """
strategy "dropout seed policy"
model transformer {{ layers = 2, hidden = 64, heads = 4, vocab = 64, seq = 8, dropout = true }}
precision megatron
mesh {{ {mesh} }}
{place}
step {{
    {body}
    update params
    {seeds}
}}
"""


def dropout_text(mesh: str, place: str, body: str, seeds: str = "") -> str:
    return DROPOUT.format(mesh=mesh, place=place, body=body, seeds=seeds)


@pytest.fixture(scope="module")
def replay_pool() -> Any:
    from placeverify.backend.runtime import pool

    pool().prestart()
    return pool()


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def alive(pid: int) -> bool:
    """Is the process running (a zombie counts as gone)?"""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


# ---- planning: mesh sizes, counts, jobs (no torch) ------------------------------------------------


def test_resized_mesh_keeps_the_counterexample_axes() -> None:
    s = load(str(EXAMPLES / "bugs/tp-dropout-seed.place"))
    assert choose_sizes(s, {"tp": 2, "dp": 1}, 2) == {"tp": 2, "dp": 1}
    # four ranks: both axes split beats one axis of four (more of the composition exercised)
    assert choose_sizes(s, {"tp": 2, "dp": 1}, 4) == {"tp": 2, "dp": 2}
    hsdp = load(str(EXAMPLES / "bugs/hsdp-shard-group-of-one.place"))
    # the shard group of one is the bug: it is never grown past its declared size
    assert choose_sizes(hsdp, {"shard": 1, "replica": 2}, 4) == {"shard": 1, "replica": 4}
    order = load(str(EXAMPLES / "bugs/rank-dependent-order.place"))
    assert choose_sizes(order, {"dp": 3}, 2) == {"dp": 2}


@settings(max_examples=40, deadline=None)
@given(world=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 3]))
def test_resized_mesh_has_the_world_size(world: int, tp: int, pp: int, dp: int) -> None:
    s = load(str(EXAMPLES / "ok/recompute-restores-rng.place"))  # tp x pp x dp
    keep = {"tp": tp, "pp": pp, "dp": dp}
    sizes = choose_sizes(s, keep, world)
    assert math.prod(sizes.values()) == world
    split = [a for a, n in keep.items() if n > 1]
    if world & (world - 1) == 0 and 2 ** len(split) <= world:
        # enough factors of two for every kept axis: none of them may be dropped
        assert all(sizes[a] > 1 for a in split), (keep, world, sizes)


def test_run_spec_is_plain_json() -> None:
    spec = RunSpec("trace", "strategy \"x\"", "x.place", {"dp": 2}, 2, False,
                   [((0,), 0, 3), ((1,), 1, 1)], [((0,), 0, 2), ((1,), 1, 2)])
    again = RunSpec.from_json(spec.to_json())
    assert again == spec
    raw = json.loads(spec.to_json())
    raw["command"] = "rm -rf /"
    with pytest.raises(ValueError, match="unknown replay job fields"):
        RunSpec.from_json(json.dumps(raw))


def test_counts_picked_at_a_new_mesh_diverge_in_the_exact_interpreter() -> None:
    from placeverify.semantics.groups import group_view
    from placeverify.semantics.interpreter import run, uniform_instance

    s = load(str(EXAMPLES / "bugs/ga-token-normalisation.place"))
    spec = RunSpec("trace", s.source.text, s.source.path, {"dp": 2}, 2, False, [], [])
    resized = strategy_of(spec)
    tokens, samples, found = pick_counts(resized, {"dp": 2}, 2, want_divergence=True)
    assert found
    assert len({n for _, _, n in tokens}) > 1, "a per-micro-batch mean is only wrong for unequal counts"
    view = group_view(resized, resized.model.groups_present()[0])
    instance = uniform_instance(resized, view, {"dp": 2}, 2, {(b, k): n for b, k, n in tokens},
                               {(b, k): n for b, k, n in samples})
    assert run(resized, view, instance).mismatches()


def test_a_reduction_order_only_differs_with_three_ranks() -> None:
    doc = trace_of("examples/bugs/rank-dependent-order.place")
    assert doc.mesh == {"dp": 3}
    two = plan_from_trace(doc, world=2, steps=1)
    assert two.expect.verdict is Verdict.PROVED
    assert two.control_origin == "examples/ok/rank-dependent-order-fixed.place"
    # the claim is the trace's refutation at dp = 3: a run at dp = 2 cannot confirm it
    assert two.claim.verdict is Verdict.REFUTED and two.claim.sizes == {"dp": 3}
    assert two.resized and not two.same_verdict
    assert two.resize_reason == "--world 2 asked for 2 processes"


def test_the_control_of_a_file_outside_examples_is_the_canonical_step(tmp_path: Path) -> None:
    text = (EXAMPLES / "bugs/missing-allreduce.place").read_text(encoding="utf-8")
    mine = tmp_path / "mine.place"
    mine.write_text(text, encoding="utf-8")
    doc = check(str(mine)).verification.trace  # type: ignore[union-attr]
    assert doc is not None
    plan = plan_from_trace(doc, world=2, steps=1)
    assert plan.control_origin == "canonical step"
    assert plan.control is not None and plan.control.canonical
    assert plan.control_expect is not None and plan.control_expect.verdict is Verdict.PROVED


def test_check_replays_the_declared_mesh_up_to_eight_devices() -> None:
    for name, declared in (("ok/tp-dropout-seed-fixed.place", {"tp": 4, "dp": 2}),
                           ("ok/zero1-no-allgather-fixed.place", {"dp": 8}),
                           ("ok/missing-allreduce-fixed.place", {"dp": 4})):
        result = check(str(EXAMPLES / name))
        plan = plan_from_strategy(result.strategy, known=result.verification)
        assert plan.main.sizes == declared == plan.claim.sizes, name
        assert not plan.resized and plan.resize_reason is None
        assert plan.claim.verdict is plan.expect.verdict is Verdict.PROVED
    two = load_text(dropout_text("dp = 2", "place ddp over dp",
                                 "backward sum / tokens(dp, step)\n all_reduce(sum) grads over dp"),
                    "dp2.place")
    plan = plan_from_strategy(two)
    assert plan.main.sizes == {"dp": 2} and not plan.resized


def test_a_refuted_file_is_replayed_at_its_declared_mesh_with_its_control() -> None:
    result = check(str(EXAMPLES / "bugs/zero1-no-allgather.place"))
    assert result.verification is not None
    assert result.verification.trace is not None
    assert result.verification.trace.mesh != {"dp": 8}
    plan = plan_from_strategy(result.strategy, known=result.verification)
    assert plan.main.sizes == {"dp": 8} and not plan.resized
    assert plan.claim.verdict is plan.expect.verdict is Verdict.REFUTED
    assert plan.control is not None and plan.control.sizes == {"dp": 8}
    assert plan.control_origin is not None
    assert plan.control_origin.endswith("ok/zero1-no-allgather-fixed.place")


def test_a_mesh_above_eight_devices_is_shrunk_and_asked_again() -> None:
    text = CONSTANT_AT_4X4.format(factor="1 / 16")
    result = check_text(text)
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED  # right at dp = 4, cp = 4
    plan = plan_from_strategy(result.strategy, known=result.verification)
    assert plan.resized and plan.claim.sizes == {"dp": 4, "cp": 4}
    assert math.prod(plan.main.sizes.values()) == MAX_DEFAULT_WORLD
    assert plan.resize_reason is not None and "16 devices" in plan.resize_reason
    # at dp * cp = 8 the 1/16 halves the gradient: Z3 asked again refutes it there
    assert plan.claim.verdict is Verdict.PROVED and plan.expect.verdict is Verdict.REFUTED
    assert not plan.same_verdict
    fine = check_text(CONSTANT_AT_4X4.format(factor="1 / |dp * cp|"))
    plan = plan_from_strategy(fine.strategy, known=fine.verification)
    assert plan.resized and plan.same_verdict and plan.expect.verdict is Verdict.PROVED


def test_a_trace_replays_at_its_own_mesh_and_shrinks_only_above_eight() -> None:
    doc = trace_of("examples/bugs/missing-allreduce.place")
    own = plan_from_trace(doc, world=None, steps=1)
    assert own.main.sizes == doc.mesh == own.claim.sizes and not own.resized
    assert own.claim.origin == "trace" and own.claim.verdict is Verdict.REFUTED
    big = plan_from_trace(replace(doc, mesh={"dp": 12}), world=None, steps=1)
    assert big.main.sizes == {"dp": 8} and big.claim.sizes == {"dp": 12} and big.resized
    assert big.resize_reason is not None and "trace's mesh has 12 devices" in big.resize_reason
    assert big.expect.verdict is Verdict.REFUTED and big.same_verdict


def check_text(text: str) -> Any:
    from placeverify.api import check_strategy

    return check_strategy(load_text(text, "inline.place"))


def test_shrunk_meshes() -> None:
    s = load_text(CONSTANT_AT_4X4.format(factor="1 / 16"), "x.place")
    assert shrink_sizes(s, {"dp": 16, "cp": 1}, 8) == {"dp": 8, "cp": 1}
    assert shrink_sizes(s, {"dp": 4, "cp": 4}, 8) in ({"dp": 4, "cp": 2}, {"dp": 2, "cp": 4})
    assert shrink_sizes(s, {"dp": 3, "cp": 3}, 8) in ({"dp": 3, "cp": 2}, {"dp": 2, "cp": 3})
    deep = load(str(EXAMPLES / "ok/recompute-restores-rng.place"))  # tp = 8, pp = 8, dp = 4
    assert shrink_sizes(deep, {"tp": 8, "pp": 8, "dp": 4}, 8) == {"tp": 2, "pp": 2, "dp": 2}


@settings(max_examples=40, deadline=None)
@given(tp=st.integers(1, 16), pp=st.integers(1, 16), dp=st.integers(1, 4096),
       limit=st.sampled_from([1, 2, 4, 8]))
def test_shrunk_mesh_fits_and_keeps_the_split_axes(tp: int, pp: int, dp: int, limit: int) -> None:
    s = load(str(EXAMPLES / "ok/recompute-restores-rng.place"))
    declared = {"tp": tp, "pp": pp, "dp": dp}
    sizes = shrink_sizes(s, declared, limit)
    assert math.prod(sizes.values()) <= limit
    assert all(1 <= sizes[a] <= declared[a] for a in declared)
    split = [a for a, n in declared.items() if n > 1]
    if 2 ** len(split) <= limit:
        assert all(sizes[a] > 1 for a in split), (declared, limit, sizes)
    if math.prod(declared.values()) <= limit:
        assert sizes == declared


# ---- comparison and tolerance (no torch) --------------------------------------------------------


def test_tolerance_follows_its_derivation() -> None:
    assert 2 ** 8 * Fraction(1, 2) * 8 == TOLERANCE_FACTOR
    assert tolerance("float64", 3, 1.0) == 2 ** 10 * 3 * 2.0 ** -53
    assert tolerance("float64", 3, 0.1) == tolerance("float64", 3, 1.0)  # scale at least 1
    assert tolerance("float64", 6, 1.0) == 2 * tolerance("float64", 3, 1.0)
    assert tolerance("float32", 3, 1.0) / tolerance("float64", 3, 1.0) == 2.0 ** 29
    # the published figures: correct fp32 runs differ by at most ~1e-6, bugs by >= 1e-3
    assert 1e-6 < tolerance("float32", 3, 1.0) < 1e-3
    assert tolerance("float64", 10, 10.0) < 1e-10


def _rank_result(rank: int, values: list[float], vs: float = 0.0) -> dict[str, Any]:
    data = base64.b64encode(array("d", values).tobytes()).decode()
    return {"rank": rank, "dtype": "float64", "vs_reference": {"params": vs, "optimizer": 0.0},
            "worst": {"params": "params/w"}, "reference_scale": 1.0, "skipped": [],
            "states": {"params/w": ["params", data]}, "backend": "gloo"}


def test_replicas_are_compared_bitwise() -> None:
    same = outcome([_rank_result(0, [1.0, 2.0]), _rank_result(1, [1.0, 2.0])], {"dp": 2}, 3, 0.0)
    assert same.max_across_ranks == 0.0 and not same.diverges
    nudged = math.nextafter(2.0, 3.0)
    apart = outcome([_rank_result(0, [1.0, 2.0]), _rank_result(1, [1.0, nudged])], {"dp": 2}, 3,
                    0.0)
    assert apart.max_across_ranks == nudged - 2.0
    assert apart.diverges  # one ulp between replicas breaks state consistency
    assert "rank 0 vs rank 1" in apart.worst["across_ranks"]


def test_differences_from_the_reference_use_the_tolerance() -> None:
    tol = tolerance("float64", 3, 1.0)
    within = outcome([_rank_result(0, [1.0], vs=tol / 2)], {"dp": 1}, 3, 0.0)
    beyond = outcome([_rank_result(0, [1.0], vs=tol * 2)], {"dp": 1}, 3, 0.0)
    broken = outcome([_rank_result(0, [1.0], vs=float("nan"))], {"dp": 1}, 3, 0.0)
    assert not within.diverges and beyond.diverges and broken.diverges


def _report(declared: Verdict, replayed: Verdict, resized: bool, diverges: bool) -> Any:
    from placeverify.replay.compare import Outcome
    from placeverify.replay.report import Report, RunReport

    claim_sizes = {"dp": 16} if resized else {"dp": 8}
    spec = RunSpec("step", "", "x.place", {"dp": 8}, 1, False, [], [])
    plan = Plan(spec, Expectation(replayed), Claim(declared, claim_sizes, "file"),
                resize_reason="too big" if resized else None)
    outcome = Outcome(8, {"dp": 8}, {"params": 1.0 if diverges else 0.0}, {"params": 0.0}, 1e-12,
                      {}, [], "gloo", 0.0, 1.0)
    return Report(plan, RunReport(spec, Expectation(replayed), outcome), None, None, 0.0, "x")


P, R, U = Verdict.PROVED, Verdict.REFUTED, Verdict.UNKNOWN


@pytest.mark.parametrize(("declared", "replayed", "resized", "diverges", "verdict", "code"), [
    # at the declared mesh: the run agrees with Z3 or it is a bug
    (P, P, False, False, "confirmed", ExitCode.OK),
    (R, R, False, True, "confirmed", ExitCode.OK),
    (P, P, False, True, "not_confirmed", ExitCode.REFUTED),
    (R, R, False, False, "not_confirmed", ExitCode.REFUTED),
    (U, U, False, True, "unknown", ExitCode.UNKNOWN),
    # shrunk, Z3 says the same there: the run stands for the declared mesh
    (P, P, True, False, "confirmed", ExitCode.OK),
    (R, R, True, True, "confirmed", ExitCode.OK),
    # shrunk, Z3 says otherwise there: agreeing with the smaller mesh's verdict confirms nothing
    (P, R, True, True, "unconfirmed", ExitCode.UNKNOWN),
    (R, P, True, False, "unconfirmed", ExitCode.UNKNOWN),
    (U, P, True, False, "unconfirmed", ExitCode.UNKNOWN),
    # a disagreement with Z3 at the replayed mesh is a bug whatever the declared verdict
    (P, R, True, False, "not_confirmed", ExitCode.REFUTED),
    (P, U, True, True, "unknown", ExitCode.UNKNOWN),
])
def test_the_verdict_is_about_the_declared_mesh(declared: Verdict, replayed: Verdict,
                                                resized: bool, diverges: bool, verdict: str,
                                                code: ExitCode) -> None:
    report = _report(declared, replayed, resized, diverges)
    assert report.verdict == verdict
    assert report.exit_code is code


# ---- the rank grid and the random streams (torch, in this process) --------------------------------


@torch_test
def test_rank_grid_is_in_mesh_order() -> None:
    import torch

    from placeverify.ir.mesh import Group
    from placeverify.replay.distributed import RankGrid

    grid = RankGrid(("pp", "dp"), (4, 2), 5)
    assert torch.equal(grid.table(), torch.arange(8).view(4, 2))
    assert grid.coords == {"pp": 2, "dp": 1}
    assert grid.members(Group(("dp",))) == [4, 5]
    assert grid.members(Group(("pp",))) == [1, 3, 5, 7]
    assert grid.members(Group(("pp",), frozenset({"pp"}))) is None  # a middle stage
    first = RankGrid(("pp", "dp"), (4, 2), 1)
    assert first.members(Group(("pp",), frozenset({"pp"}))) == [1, 7]
    assert grid.partition(Group(("pp",), frozenset({"pp"}))) == ((0, 6), (1, 7))


@torch_test
def test_the_reference_draws_the_nonces_the_ranks_draw() -> None:
    """The reference rebuilds dropout masks from the nonces a rank draws from the global stream
    after seeding it: the two must be the same numbers."""
    import torch

    from placeverify.replay.data import draw_nonce, layer_seed, reference_nonces

    torch.manual_seed(layer_seed(7, 2, 1, 3))
    drawn = (draw_nonce(), draw_nonce())
    assert drawn == reference_nonces(7, 2, 1, 3)
    assert drawn != reference_nonces(7, 2, 1, 4)


@torch_test
def test_the_mask_hash_is_exact_integer_arithmetic() -> None:
    """``_mul32`` and ``_mix32`` against plain Python integers (lowbias32, C. Wellons)."""
    import random

    import torch

    from placeverify.replay.data import _mix32, _mul32

    def mix(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x7FEB352D) % 2 ** 32
        h ^= h >> 15
        h = (h * 0x846CA68B) % 2 ** 32
        return h ^ (h >> 16)

    rng = random.Random(3)
    xs = [0, 1, 2 ** 32 - 1, 2 ** 31] + [rng.randrange(2 ** 32) for _ in range(1000)]
    t = torch.tensor(xs, dtype=torch.int64)
    assert _mul32(t, 0x846CA68B).tolist() == [(x * 0x846CA68B) % 2 ** 32 for x in xs]
    assert _mix32(t).tolist() == [mix(x) for x in xs]


def _dropout(text: str) -> Any:
    import torch

    from placeverify.replay.data import Dropout
    from placeverify.replay.layout import layout_of, model_config

    strategy = load_text(text, "masks.place")
    layout = layout_of(strategy)
    config = model_config(strategy, layout, 3)
    return Dropout(strategy, layout, config, torch.float64)


MESH_3D = "tp = 2, cp = 2, dp = 2"
PLACE_3D = "place megatron{sp} over tp\nplace context over cp\nplace ddp over dp"
BODY_3D = "backward sum / tokens(dp * cp, step)\n all_reduce(sum) grads over dp * cp"
SAMPLES = 3
NONCE = 123456789


def _local(dropout: Any, site: str, coords: dict[str, int]) -> Any:
    c = dropout.config
    tp = dropout.layout.tp_size
    if site == "attn":
        shape = (SAMPLES, c.heads // tp, c.chunk, c.seq)
    else:
        shape = (SAMPLES, c.chunk // tp if dropout.layout.sp else c.chunk, c.hidden)
    return dropout.mask(site, 1, NONCE, coords, shape)


def _slice(dropout: Any, site: str, coords: dict[str, int], unit: tuple[int, ...] | None = None,
           tp: int | None = None, cp: int | None = None) -> Any:
    """The part of the reference's mask that the rank at ``coords`` holds (Megatron layouts:
    heads split by tp; positions by cp, then by tp under sequence parallelism)."""
    c = dropout.config
    t = coords["tp"] if tp is None else tp
    k = coords["cp"] if cp is None else cp
    ref = dropout.reference_mask(site, 1, NONCE, unit or (coords["dp"],), SAMPLES)
    if site == "attn":
        heads = c.heads // 2
        return ref[:, t * heads:(t + 1) * heads, k * c.chunk:(k + 1) * c.chunk, :]
    if dropout.layout.sp:
        piece = c.chunk // 2
        start = k * c.chunk + t * piece
        return ref[:, start:start + piece, :]
    return ref[:, k * c.chunk:(k + 1) * c.chunk, :]


RANKS_3D = [{"tp": t, "cp": k, "dp": d} for t in range(2) for k in range(2) for d in range(2)]


@torch_test
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("explicit", [False, True])
def test_a_correct_seed_policy_gives_every_rank_the_reference_masks(sp: bool, explicit: bool) -> None:
    import torch

    # Under sequence parallelism a tensor axis has one region (sharded), which either region
    # word names (placeverify.semantics.rng): 'replicated ... same over tp' would be a bug there.
    seeds = ""
    if explicit:
        seeds = "seed dropout(sharded) differ over dp * cp * tp"
        if not sp:
            seeds += "\n seed dropout(replicated) same over tp"
    dropout = _dropout(dropout_text(MESH_3D, PLACE_3D.format(sp="(sequence_parallel)" if sp
                                                             else ""), BODY_3D, seeds))
    for coords in RANKS_3D:
        for site in ("attn", "hid_attn", "hid_mlp"):
            local = _local(dropout, site, coords)
            assert torch.equal(local, _slice(dropout, site, coords)), (site, coords)


@torch_test
def test_reference_masks_are_independent_draws() -> None:
    import torch

    dropout = _dropout(dropout_text(MESH_3D, PLACE_3D.format(sp=""), BODY_3D))
    a = dropout.reference_mask("hid_mlp", 1, NONCE, (0,), SAMPLES)
    b = dropout.reference_mask("hid_mlp", 1, NONCE, (1,), SAMPLES)
    assert set(a.unique().tolist()) == {0.0, 2.0}  # keep with 1 - p = 1/2, scaled by 1/(1 - p)
    assert not torch.equal(a, b)  # other samples
    assert not torch.equal(a[0], a[1])  # other rows
    assert not torch.equal(a[:, 0], a[:, 1])  # other positions
    assert not torch.equal(a, dropout.reference_mask("hid_attn", 1, NONCE, (0,), SAMPLES))
    assert not torch.equal(a, dropout.reference_mask("hid_mlp", 0, NONCE, (0,), SAMPLES))
    assert not torch.equal(a, dropout.reference_mask("hid_mlp", 1, NONCE + 1, (0,), SAMPLES))
    kept = float((a > 0).to(torch.float64).mean())
    assert 0.4 < kept < 0.6, kept


@torch_test
@pytest.mark.parametrize(("seeds", "sp", "moved"), [
    ("seed dropout(sharded) same over dp", False, "dp"),
    ("seed dropout(sharded) same over cp", False, "cp"),
    ("seed dropout(sharded) same over tp", True, "tp"),
])
def test_same_over_a_sharded_axis_reuses_another_ranks_masks(seeds: str, sp: bool,
                                                              moved: str) -> None:
    """Not folding in a coordinate is computing the offset of coordinate 0: the rank gets
    exactly the masks of the elements that rank 0 along that axis holds."""
    import torch

    dropout = _dropout(dropout_text(MESH_3D, PLACE_3D.format(sp="(sequence_parallel)" if sp
                                                             else ""), BODY_3D, seeds))
    sites = ["hid_mlp"] if moved == "tp" else ["attn", "hid_attn", "hid_mlp"]
    for coords in RANKS_3D:
        for site in sites:
            local = _local(dropout, site, coords)
            borrowed = _slice(dropout, site, coords, unit=(0,) if moved == "dp" else None,
                              cp=0 if moved == "cp" else None, tp=0 if moved == "tp" else None)
            assert torch.equal(local, borrowed), (site, coords)
            own = torch.equal(local, _slice(dropout, site, coords))
            assert own == (coords[moved] == 0), (site, coords)


@torch_test
def test_differ_over_a_replicated_region_gives_the_copies_other_masks() -> None:
    import torch

    dropout = _dropout(dropout_text(MESH_3D, PLACE_3D.format(sp=""), BODY_3D,
                                    "seed dropout(replicated) differ over tp"))
    for coords in RANKS_3D:
        other = {**coords, "tp": 1 - coords["tp"]}
        for site in ("hid_attn", "hid_mlp"):
            local = _local(dropout, site, coords)
            assert not torch.equal(local, _slice(dropout, site, coords))
            assert not torch.equal(local, _local(dropout, site, other))
        # attention dropout is on this rank's heads: still the reference's
        assert torch.equal(_local(dropout, "attn", coords), _slice(dropout, "attn", coords))


# ---- real runs ---------------------------------------------------------------------------------------


def _execute(plan: Any, timeout: float = 120) -> Any:
    from placeverify.replay.cli import execute

    return execute(plan, timeout=timeout, source=plan.main.path)


@torch_test
def test_rank_dependent_order_diverges_bitwise_from_three_ranks(replay_pool: Any) -> None:
    doc = trace_of("examples/bugs/rank-dependent-order.place")
    three = plan_from_trace(doc, world=None, steps=2)
    if three.expect.verdict is Verdict.UNKNOWN:
        pytest.xfail("Z3's float32 query timed out at dp = 3 (see the report)")
    report = _execute(three)
    assert report.error is None
    o = report.main.outcome
    assert o.max_across_ranks > 0, "replicas summed in different orders must differ in some bit"
    assert o.max_vs_reference <= o.tolerance, "the sums agree as real numbers"
    two = _execute(plan_from_trace(doc, world=2, steps=2))
    assert two.main.outcome.max_across_ranks == 0.0 and two.main.agrees
    # the run agrees with Z3 at dp = 2 (proved), which says nothing about the trace's dp = 3
    assert two.verdict == "unconfirmed" and two.exit_code is ExitCode.UNKNOWN


@torch_test
def test_dynamic_loss_scaling_skips_the_overflowing_step(replay_pool: Any) -> None:
    plan = plan_from_strategy(load(str(EXAMPLES / "ok/optimizer-offload.place")), world=2)
    assert plan.expect.verdict is Verdict.PROVED
    report = _execute(plan)
    assert plan.main.steps > 1  # the overflow goes into the second step (replay/batch.overflow_step)
    assert report.main.outcome.skipped == [1]
    assert not report.main.outcome.diverges
    text = """
strategy "ZeRO-2 with fp16 loss scaling, overflow flag not reduced"
model { params = 1e9 }
precision mixed_adam
mesh { dp = 2 }
place zero2 over dp
step {
    backward sum / tokens(dp, step)
    reduce_scatter(sum) grads over dp
    update params
    all_gather params over dp
}
"""
    bug = plan_from_strategy(load_text(text, "overflow.place"), world=2)
    assert bug.expect.verdict is Verdict.REFUTED
    report = _execute(bug)
    assert report.main.outcome.diverges and report.verdict == "confirmed"


@torch_test
def test_float32_separates_correct_runs_from_bugs(replay_pool: Any) -> None:
    ok = plan_from_strategy(load(str(EXAMPLES / "ok/tp-dropout-seed-fixed.place")), world=4)
    ok = replace(ok, main=replace(ok.main, dtype="float32"))
    good = _execute(ok).main.outcome
    assert good.max_vs_reference < 1e-5 and not good.diverges
    doc = trace_of("examples/bugs/tp-dropout-seed.place")
    bug = plan_from_trace(doc, world=4, steps=3)
    bug = replace(bug, main=replace(bug.main, dtype="float32"), control=None)
    bad = _execute(bug).main.outcome
    assert bad.max_vs_reference > 1e-3 and bad.diverges


@torch_test
def test_a_disagreement_is_reported_as_a_verifier_bug(replay_pool: Any) -> None:
    from rich.console import Console

    from placeverify.replay.report import document, render

    plan = plan_from_trace(trace_of("examples/bugs/missing-allreduce.place"), world=2, steps=2)
    lying = replace(plan, expect=Expectation(Verdict.PROVED))  # pretend Z3 proved it
    report = _execute(lying)
    assert report.verdict == "not_confirmed" and report.exit_code is ExitCode.REFUTED
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "VERIFIER BUG: Z3 says proved but the real run diverges" in text
    assert f"{report.main.outcome.max_vs_reference:.3g}" in text
    doc = document(report)
    assert doc["verdict"] == "not_confirmed" and doc["z3_verdict"] == "proved"


@torch_test
@pytest.mark.parametrize("fault", [{"kind": "hang", "where": "step"},
                                   {"kind": "hang", "where": "start"},
                                   {"kind": "crash"}, {"kind": "raise"}])
def test_a_failed_rank_ends_the_replay_and_leaves_no_process(replay_pool: Any,
                                                             fault: dict[str, Any]) -> None:
    plan = plan_from_strategy(load(str(EXAMPLES / "ok/missing-allreduce-fixed.place")), world=4)
    broken = replace(plan, main=replace(plan.main, fault={"rank": 2, **fault}))
    if replay_pool.runs == 0:  # the deadline counts from the fork, which waits for a cold
        _execute(plan)  # server's import of torch (20 s and more beside a CPU hog)
    started = time.monotonic()
    report = _execute(broken, timeout=6)
    elapsed = time.monotonic() - started
    assert report.error is not None and report.exit_code is ExitCode.BACKEND_ERROR
    assert report.error.kind == ("hang" if fault["kind"] == "hang" else
                                 "crash" if fault["kind"] == "crash" else "error")
    assert elapsed < 6 + 10
    pids = replay_pool.last_pids
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)]
    again = _execute(plan)  # the pool still works
    assert again.verdict == "confirmed"


@torch_test
def test_a_missing_torch_is_a_backend_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from placeverify.backend import pool
    from placeverify.replay import cli
    from placeverify.trace import write

    trace = tmp_path / "t.json"
    write(trace_of("examples/bugs/missing-allreduce.place"), str(trace))
    monkeypatch.setattr(pool, "torch_available", lambda: False)
    monkeypatch.setattr(cli, "torch_available", lambda: False)
    code = cli.replay_trace(str(trace), as_json=False, steps=1, world=None, timeout=10,
                            console=Console())
    assert code is ExitCode.BACKEND_ERROR
    assert "torch is not installed" in capsys.readouterr().err


DDP = ("dp = 2", "place ddp over dp",
       "backward sum / tokens(dp, step)\n all_reduce(sum) grads over dp")
SP = ("tp = 2", "place megatron(sequence_parallel) over tp",
      "backward sum / tokens(step)\n all_reduce(sum) grads[norms] over tp")
TP = ("tp = 2", "place megatron over tp", "backward sum / tokens(step)")
CP = ("cp = 2", "place context over cp",
      "backward sum / tokens(cp, step)\n all_reduce(sum) grads over cp")


@torch_test
@pytest.mark.parametrize(("split", "seeds", "diverges"), [
    (DDP, "", False),
    (DDP, "seed dropout(sharded) differ over dp", False),
    (DDP, "seed dropout(sharded) same over dp", True),  # two samples, one mask
    (SP, "", False),
    (SP, "seed dropout(sharded) same over tp", True),  # two sequence chunks, one mask
    (TP, "seed dropout(replicated) same over tp", False),
    (TP, "seed dropout(replicated) differ over tp", True),  # one activation, two masks
    (TP, "seed dropout(sharded) same over tp", True),  # two heads' blocks, one mask
    (CP, "", False),
    (CP, "seed dropout(sharded) same over cp", True),
], ids=["ddp", "ddp-differ", "ddp-same", "sp", "sp-same", "tp-replicated-same",
        "tp-replicated-differ", "tp-heads-same", "cp", "cp-same"])
def test_a_wrong_dropout_seed_policy_diverges(replay_pool: Any, split: tuple[str, str, str],
                                              seeds: str, diverges: bool) -> None:
    plan = plan_from_strategy(load_text(dropout_text(*split, seeds), "seeds.place"))
    assert plan.main.world == 2 and not plan.resized
    o = _execute(plan).main.outcome
    if diverges:
        assert o.diverges and o.max_vs_reference > 1e-3, o
    else:
        # the masks are the reference's bit for bit: only rounding is left
        assert not o.diverges and o.max_vs_reference < 1e-14, o
        assert o.max_across_ranks == 0.0


# ---- the command, through real processes ---------------------------------------------------------


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    if not SCRIPT.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    done = subprocess.run([str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


@torch_test
def test_cli_replays_a_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    run("check", "examples/bugs/sequence-parallel-norm-grads.place", "--trace", str(trace))
    done = run("replay", str(trace), "--json", "--world", "4", "--steps", "2")
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    for key in ("verdict", "world_size", "mesh", "steps", "max_abs_diff_vs_reference",
                "max_abs_diff_across_ranks", "tolerance", "control", "z3_verdict", "condition",
                "seconds"):
        assert key in doc
    assert doc["verdict"] == "confirmed" and doc["world_size"] == 4 and doc["steps"] == 2
    assert doc["z3_verdict"] == "refuted" and doc["replay"] == "diverges"
    assert doc["max_abs_diff_vs_reference"] > doc["tolerance"]
    assert doc["control"]["replay"] == "matches"
    assert doc["control"]["origin"].endswith("ok/sequence-parallel-norm-grads-fixed.place")
    text = run("replay", str(trace))
    assert text.returncode == ExitCode.OK
    assert "the replay agrees with Z3 (refuted; the real run diverges)" in text.stdout
    assert "confirmed in" in text.stdout


@torch_test
def test_cli_check_replay() -> None:
    proved = run("check", "--replay", "examples/ok/zero1-no-allgather-fixed.place")
    assert proved.returncode == ExitCode.OK, proved.stdout + proved.stderr
    assert "the replay agrees with Z3 (proved; the real run matches)" in proved.stdout
    refuted = run("check", "--replay", "examples/bugs/zero1-no-allgather.place")
    assert refuted.returncode == ExitCode.REFUTED  # the check's own verdict
    assert "the replay agrees with Z3 (refuted; the real run diverges)" in refuted.stdout
    as_json = run("check", "--replay", "--json", "examples/bugs/double-division.place")
    document = json.loads(as_json.stdout)
    assert document["verdicts"]["gradient_integrity"] == "refuted"
    assert document["replay"]["verdict"] == "confirmed"  # embedded in the check document


@torch_test
def test_cli_check_replay_does_not_stand_a_smaller_mesh_for_the_declared_one(
        tmp_path: Path) -> None:
    wrong = tmp_path / "constant.place"
    wrong.write_text(CONSTANT_AT_4X4.format(factor="1 / 16"), encoding="utf-8")
    text = run("check", "--replay", str(wrong))
    assert text.returncode == ExitCode.UNKNOWN, text.stdout + text.stderr
    out = " ".join(text.stdout.split())  # undo the console's line wrapping
    assert "RESIZED: the declared mesh is dp = 4, cp = 4 (16 devices); replayed at" in out
    assert "more than the 8 processes" in out
    assert "Z3 at the declared mesh: proved" in out
    assert "Z3 at the replayed mesh: refuted" in out
    assert "NOT REPLAYABLE AT THE DECLARED MESH" in out
    assert "unconfirmed in" in out and " confirmed in" not in out
    as_json = run("check", "--replay", "--json", str(wrong))
    assert as_json.returncode == ExitCode.UNKNOWN
    document = json.loads(as_json.stdout)
    assert document["verdicts"]["gradient_integrity"] == "proved"
    replay = document["replay"]
    assert replay["verdict"] == "unconfirmed"
    assert replay["declared_mesh"] == {"dp": 4, "cp": 4} and replay["declared_world_size"] == 16
    assert replay["declared_verdict"] == "proved" and replay["z3_verdict"] == "refuted"
    assert replay["resized"] is True and "16 devices" in replay["resize_reason"]
    assert replay["world_size"] == 8 and math.prod(replay["mesh"].values()) == 8
    assert replay["replay"] == "diverges"  # the 1/16 is wrong at 8 devices, and it shows
    right = tmp_path / "sized.place"
    right.write_text(CONSTANT_AT_4X4.format(factor="1 / |dp * cp|"), encoding="utf-8")
    done = run("check", "--replay", "--json", str(right))
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    replay = json.loads(done.stdout)["replay"]
    assert replay["resized"] is True and replay["verdict"] == "confirmed"
    assert replay["z3_verdict"] == replay["declared_verdict"] == "proved"


@torch_test
def test_cli_check_replay_runs_a_small_file_at_its_declared_mesh(tmp_path: Path) -> None:
    small = tmp_path / "dp2.place"
    small.write_text(dropout_text(*DDP), encoding="utf-8")
    text = run("check", "--replay", str(small))
    assert text.returncode == ExitCode.OK, text.stdout + text.stderr
    assert "RESIZED" not in text.stdout
    assert "replay of" in text.stdout and "2 processes (dp = 2)" in text.stdout
    done = run("check", "--replay", "--json", str(small))
    replay = json.loads(done.stdout)["replay"]
    assert replay["mesh"] == replay["declared_mesh"] == {"dp": 2}
    assert replay["resized"] is False and replay["resize_reason"] is None
    assert replay["verdict"] == "confirmed" and replay["world_size"] == 2


def test_cli_rejects_a_bad_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something/else"}), encoding="utf-8")
    done = run("replay", str(bad))
    assert done.returncode == ExitCode.INPUT_ERROR
    assert "not a placeverify.trace/1 trace" in done.stderr
    missing = run("replay", str(tmp_path / "nothing.json"))
    assert missing.returncode == ExitCode.READ_ERROR
    good = trace_of("examples/bugs/missing-allreduce.place").to_json()
    for broken, message in (({**good, "tokens": {"dp": 1}}, "trace tokens must be a list of"),
                            ({**good, "line": "3"}, "trace line must be an integer or null"),
                            ({**good, "kind": "nonsense"}, "trace kind 'nonsense' is not known"),
                            ({k: v for k, v in good.items() if k != "devices"},
                             "trace lacks devices"),
                            ({k: v for k, v in good.items() if k != "mesh"}, "trace lacks mesh")):
        bad.write_text(json.dumps(broken), encoding="utf-8")
        done = run("replay", str(bad))
        assert done.returncode == ExitCode.INPUT_ERROR, done.stderr
        assert message in done.stderr


@torch_test
def test_torchrun_runs_the_same_worker(tmp_path: Path) -> None:
    """``torchrun`` (torch.distributed.run) starts the worker from env:// as on a cluster."""
    doc = trace_of("examples/bugs/tied-embedding-no-sync.place")
    plan = plan_from_trace(doc, world=2, steps=2)
    job = tmp_path / "job.json"
    job.write_text(plan.main.to_json(), encoding="utf-8")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "placeverify.replay.worker", str(job),
                           "--out", str(tmp_path / "out"), "--timeout", "120"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in range(2)]
    o = outcome(results, plan.main.sizes, 2, 0.0)
    assert o.diverges and o.max_across_ranks > 0  # the untied copies of the embedding drift


@pytest.mark.cuda
@torch_test
def test_nccl_on_cuda_devices(replay_pool: Any) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    world = 2 if torch.cuda.device_count() >= 2 else 1
    plan = plan_from_strategy(load(str(EXAMPLES / "ok/missing-allreduce-fixed.place")),
                              world=world)
    plan = replace(plan, main=replace(plan.main, backend="nccl"))
    report = _execute(plan)
    assert report.error is None, report.error
    assert report.main.outcome.backend == "nccl"
    assert report.verdict == "confirmed"


def test_a_role_the_replay_does_not_model_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # A role missing from the replay's list must be refused by name, not run as if it were data.
    from placeverify.replay import layout

    strategy = load(str(ROOT / "examples" / "strategies" / "mixtral-8x7b-ep.place"))
    assert layout.layout_of(strategy).ep is not None
    monkeypatch.setattr(layout, "REPLAYED_ROLES", layout.REPLAYED_ROLES - {Role.EXPERT})
    with pytest.raises(layout.Unsupported, match="no model of expert axes"):
        layout.layout_of(strategy)


def test_a_trace_at_a_large_declared_mesh_loads_and_is_replayed_smaller() -> None:
    # Update-order refutations are stated at the declared mesh: a trace `check --trace` writes at
    # dp = 128 must load (it was refused as "sizes 1..64") and replay on at most 8 processes.
    text = (EXAMPLES / "bugs" / "clip-after-step.place").read_text(encoding="utf-8")
    large = re.sub(r"\bdp\s*=\s*\d+", "dp = 128", text, count=1)
    verification = api.verify(load_text(large, "clip-after-step-128.place"))
    assert verification.trace is not None
    doc = verification.trace.to_json()
    assert doc["mesh"] == {"dp": 128}
    plan = plan_from_trace(Trace.from_json(doc), world=None, steps=1)
    assert plan.claim.sizes == {"dp": 128}
    assert plan.main.sizes["dp"] <= MAX_DEFAULT_WORLD and plan.resize_reason is not None


def test_a_forkserver_lost_while_ranks_start_is_a_backend_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # multiprocessing reads the new rank's pid from the forkserver; a server that died (killed,
    # out of memory) answers with end of file. That is a failed run (exit 5), not a crash (70).
    from placeverify.backend import runtime
    from placeverify.backend.runtime import BackendFailure, FailureKind

    class LostServer:
        def Pipe(self, duplex: bool) -> tuple[object, object]:
            import multiprocessing

            return multiprocessing.Pipe(duplex)

        def Process(self, **kwargs: object) -> object:
            class Never:
                pid = None

                def start(self) -> None:
                    raise EOFError("unexpected EOF")

                def is_alive(self) -> bool:
                    return False

            return Never()

    class Spec:
        world = 2

        def to_json(self) -> str:
            return "{}"

    pool = runtime.Pool(context=LostServer())
    monkeypatch.setattr(runtime.Pool, "start", lambda self: None)
    with pytest.raises(BackendFailure) as err:
        pool.run(Spec(), timeout=5)
    assert err.value.kind is FailureKind.CRASH
    assert "was lost while rank 0 started (EOFError: unexpected EOF)" in err.value.message


EXPERTS_OVER_FOUR = """strategy "four expert ranks, two micro-batches"
model transformer {
    layers = 2, hidden = 1024, heads = 16, vocab = 32000, seq = 2048
    experts = 4, top_k = 1, expert_ffn = 2816
}
precision megatron
mesh { ep = 4 }
place expert over ep
step {
    microbatches = 2
    each microbatch {
        backward sum / tokens(ep, step)
    }
    all_reduce(sum) grads[dense, embedding, norms] over ep
    update params
}
"""


@torch_test
def test_an_expert_rank_no_token_reaches_still_joins_the_backward_all_to_alls(
        tmp_path: Path) -> None:
    # At ep = 4 with 2 micro-batches the replay's router sends no token to one rank's expert in
    # some layer; its expert output was a constant there, outside the autograd graph, so that
    # rank skipped both all-to-alls of the layer's backward while the others ran them: gloo
    # aborted on a size mismatch ("rank N exited (code -6) without an answer"; found by the
    # soundness harness on clip-experts-not-summed-fixed under several_steps). The step is
    # correct (the dense gradients summed over ep, the experts each on their own rank).
    path = tmp_path / "ep4.place"
    path.write_text(EXPERTS_OVER_FOUR, encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "placeverify", "check", "--replay", "-q",
                          "--width", "200", str(path)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "the replay agrees with Z3 (proved; the real run matches)" in run.stdout
