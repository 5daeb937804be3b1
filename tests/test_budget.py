"""The whole-check time budget, the encoding size limit, and failures inside a check family:
each ends as an *unknown* obligation with its reason (exit 3), never a hang, a crash or proved."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from placeverify import api
from placeverify.verdicts import ObligationKind, Verdict
from placeverify.verify import budget, checks
from placeverify.verify.check import Check
from placeverify.verify.z3 import integrity as z3_integrity

ROOT = Path(__file__).resolve().parents[1]
ZERO2 = ROOT / "examples" / "zero-paper" / "zero2.place"
DDP_MANY_AXES = "\n".join([
    'strategy "DDP over 12 axes of size 2"', "model { params = 7.5e9 }", "mesh {",
    *(f"    a{i} = 2" for i in range(12)), "}", *(f"place ddp over a{i}" for i in range(12))]) + "\n"


def test_a_spent_budget_leaves_every_family_unknown_with_its_reason() -> None:
    strategy = api.load(str(ZERO2))
    verification = api.verify(strategy, budget_s=1e-9)
    assert verification.overall() is Verdict.UNKNOWN
    assert {o.kind for o in verification.obligations} == {ObligationKind.TIME_BUDGET}
    assert all(budget.TIME_BUDGET in o.reason for o in verification.obligations)


def test_a_slow_encoding_stops_at_the_budget() -> None:
    strategy = api.load_text(DDP_MANY_AXES, "ddp12.place")
    started = time.monotonic()
    verification = api.verify(strategy, budget_s=0.3)
    assert time.monotonic() - started < 0.3 * 1.1 + 0.5
    assert verification.overall() is Verdict.UNKNOWN
    assert any(o.kind is ObligationKind.TIME_BUDGET for o in verification.obligations)


def test_the_budget_caps_each_solver_query() -> None:
    with budget.active(budget.Budget.start(0.5, 10_000)):
        assert budget.query_ms(10_000) <= 500
        assert budget.query_limit(10_000)[1]  # the budget sets it: the query must stop there
        # its own request sets it, but 0.45 s could not absorb the pipeline's overshoot
        assert budget.query_limit(100) == (100, True)
    with budget.active(budget.Budget.start(30.0, 10_000)):
        assert budget.query_limit(100) == (100, False)  # its own request, with time to spare
        assert budget.query_limit(10_000) == (10_000, False)  # 27 s absorb 10 s past 10 s
    with budget.active(budget.Budget.start(21.0, 10_000)):
        assert budget.query_limit(10_000) == (10_000, True)  # 18.9 s do not
    with budget.active(budget.Budget.start(-1.0)), pytest.raises(budget.BudgetExhausted):
        budget.query_ms(10_000)
    assert budget.query_ms(1234) == 1234  # no budget: the request itself


def test_an_encoding_past_its_size_limit_is_unknown_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(z3_integrity, "MAX_ENCODING_TERMS", 1)
    verification = api.verify(api.load(str(ZERO2)), budget_s=None)
    integrity = [o for o in verification.obligations if "too large to encode" in o.reason]
    assert integrity and all(o.verdict is Verdict.UNKNOWN for o in integrity)
    assert verification.overall() is not Verdict.PROVED


def test_a_family_that_raises_is_unknown_naming_the_family_and_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(strategy: object, ctx: object) -> list[object]:
        raise ZeroDivisionError("injected")

    families = tuple(Check(c.condition, c.name, broken) if c.name == checks.update.CHECK.name
                     else c for c in checks.CHECKS)
    monkeypatch.setattr("placeverify.verify.CHECKS", families)
    monkeypatch.delenv("PLACEVERIFY_DEBUG", raising=False)
    verification = api.verify(api.load(str(ZERO2)))
    failed = [o for o in verification.obligations if o.kind is ObligationKind.INTERNAL_ERROR]
    assert len(failed) == 1
    assert failed[0].verdict is Verdict.UNKNOWN
    assert checks.update.CHECK.name in failed[0].reason
    assert "ZeroDivisionError: injected" in failed[0].reason
    assert verification.overall() is Verdict.UNKNOWN  # the other families still ran: proved


def test_check_cli_exits_3_when_the_budget_runs_out(tmp_path: Path) -> None:
    place = tmp_path / "ddp12.place"
    place.write_text(DDP_MANY_AXES)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "placeverify", "check", "--timeout", "0.5",
                           str(place)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "time budget" in done.stdout
    assert time.monotonic() - started < 60


# benchmarks/fuzz.py --seed 1, input 142: its gradient-integrity query is a large nonlinear
# formula whose preprocessing in Z3's default tactic pipeline polls no time limit.
FUZZ_1_142 = """strategy "fuzz"
model mixtral_8x7b
mesh {
    x0 = 8
    x1 = 1
    x2 = 8
    x3 = 4
}
place zero2 over x0
place zero3 over x1
place ddp over x2
place expert over x3
loss microbatch_mean
clip max_norm = 1.0
microbatches = 32
"""


def test_a_query_the_budget_limits_stops_at_its_limit() -> None:
    from placeverify.ir.model import ParamGroup
    from placeverify.semantics.groups import group_view
    from placeverify.verify.z3 import solve

    strategy = api.load_text(FUZZ_1_142, "fuzz-1-142.place")
    view = group_view(strategy, ParamGroup.DENSE)
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    encoded = z3_integrity.encode(strategy, view, sizes, strategy.step.microbatches, "t_",
                                  integer=False)
    formula = z3_integrity.mismatch_formula(encoded)
    with budget.active(budget.Budget.start(1.0)):
        assert budget.query_ms(10_000) == pytest.approx(900, abs=20)
        started = time.monotonic()
        with contextlib.suppress(budget.BudgetExhausted):
            solve.check(formula, 10_000)
        elapsed = time.monotonic() - started
    # Z3's default pipeline took 1.3-1.4 s on this query at a 0.3 s limit, 2.3 s at 1 s
    assert elapsed < 1.1, f"a 0.9 s query took {elapsed:.2f} s (budget 1 s + 10%)"



# benchmarks/fuzz.py --seed 0, input 93: FSDP with a reduction inside a 128-micro-batch loop; its
# count constraints are cubic in the 257 count sets (33,154 constraints, 2 s each time).
FUZZ_0_93 = """strategy "fuzz"
model gpt3_175b { micro_batch = 1 }
mesh {
    x0 = 2
}
place fsdp over x0
loss microbatch_mean
clip max_norm = 1.0
step {
    microbatches = 128
    each microbatch {
        backward sum / tokens(x0, step)
        all_reduce(mean) grads over x0
    }
    reduce_scatter(sum) grads over x0
    clip(max_norm = 1.0) grads over x0
    update params
}
"""


def test_building_the_count_constraints_stops_at_the_budget() -> None:
    from placeverify.ir.model import ParamGroup
    from placeverify.semantics.groups import group_view

    strategy = api.load_text(FUZZ_0_93, "fuzz-0-93.place")
    view = group_view(strategy, ParamGroup.DENSE)
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    encoded = z3_integrity.encode(strategy, view, sizes, strategy.step.microbatches, "t_",
                                  integer=False)
    assert len(encoded.counts.sets) > 200
    with budget.active(budget.Budget.start(0.05)):
        time.sleep(0.06)
        started = time.monotonic()
        with pytest.raises(budget.BudgetExhausted):
            encoded.counts.constraints()
        assert time.monotonic() - started < 0.5



# benchmarks/fuzz.py --seed 0, input 7054: FSDP and ZeRO-2 axes with 128 micro-batches; each
# micro-batch's reduce-scatter relabels every coefficient, an expression that grows with k.
FUZZ_0_7054 = """strategy "fuzz"
model { params = 1e6 }
mesh {
    x0 = 1
    x1 = 4096
    x2 = 8
    x3 = 4
}
place ddp over x0
place (R, R, R, R) over x1
place (S*, S, S, R) over x2
place zero2 over x3
loss microbatch_mean
clip max_norm = 0.5
microbatches = 128
"""


def test_a_reduction_stops_at_the_budget_between_two_coefficients(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each coefficient of a reduction may cost a traversal of an expression that grows with the
    # micro-batch (0.1 s and more late in a 128-micro-batch loop); here each costs 1 ms.
    is_zero = z3_integrity._is_zero
    late: list[int] = []

    def slow(term: object) -> bool:
        if sys._getframe(1).f_code.co_name == "reduce":
            active = budget.current()
            if active is not None and active.exhausted():
                late.append(1)
            time.sleep(0.001)
        return is_zero(term)

    monkeypatch.setattr(z3_integrity, "_is_zero", slow)
    verification = api.verify(api.load_text(FUZZ_0_7054, "fuzz-0-7054.place"), budget_s=0.3)
    assert verification.overall() is Verdict.UNKNOWN
    assert len(late) <= 2, f"{len(late)} coefficients looked at after the deadline (up to 510)"


def test_a_query_gets_what_is_left_after_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    import z3

    from placeverify.verify.z3 import solve

    limits: list[object] = []
    add, set_ = z3.Solver.add, z3.Solver.set

    def slow_add(self: z3.Solver, *args: object) -> None:
        time.sleep(0.3)  # building a large query takes time too
        add(self, *args)

    def record(self: z3.Solver, *args: object, **kwargs: object) -> None:
        if args and args[0] == "timeout":
            limits.append(args[1])
        set_(self, *args, **kwargs)

    monkeypatch.setattr(z3.Solver, "add", slow_add)
    monkeypatch.setattr(z3.Solver, "set", record)
    with budget.active(budget.Budget.start(1.0)):
        solve.check(z3.Real("x") > 0, 10_000)
    assert len(limits) == 1 and isinstance(limits[0], int)
    assert limits[0] <= 650  # 1 s, less 0.1 s of reserve and the 0.3 s the query took to build


def _dense_mismatch(text: str) -> object:
    from placeverify.ir.model import ParamGroup
    from placeverify.semantics.groups import group_view

    strategy = api.load_text(text, "fuzz.place")
    view = group_view(strategy, ParamGroup.DENSE)
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    encoded = z3_integrity.encode(strategy, view, sizes, strategy.step.microbatches, "t_",
                                  integer=False)
    return z3_integrity.mismatch_formula(encoded)


def test_a_query_whose_overshoot_would_pass_the_deadline_keeps_the_budget() -> None:
    # Issue 36.4: a query's own limit (300 ms) was below what was left (0.9 s), so it ran in Z3's
    # default pipeline, whose preprocessing polls no limit: 1.3-1.4 s on an idle machine, past
    # the 1 s budget. What is left could not absorb that overshoot: the query is bounded.
    from placeverify.verify.z3 import solve

    formula = _dense_mismatch(FUZZ_1_142)
    with budget.active(budget.Budget.start(1.0)):
        assert budget.query_limit(300) == (300, True)
        started = time.monotonic()
        with contextlib.suppress(budget.BudgetExhausted):
            solve.check(formula, 300)
        elapsed = time.monotonic() - started
    assert elapsed < 1.1, f"a 300 ms query under a 1 s budget took {elapsed:.2f} s"


@contextlib.contextmanager
def cpu_hogs() -> Iterator[None]:
    """A busy loop on every core beside the test (a machine at load 2x its cores and more)."""
    # each spins until its parent is gone, so none outlives a run that was killed
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin])
            for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.3)  # let them start spinning
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


# After the deadline the families not yet run are marked unknown, and a module first needed
# there (the fixes, the counterexample search) is imported: up to 0.2 s measured at load 10 on
# 2 cores. The allowance covers that, not the solver: a query that overran its limit by 10% of a
# 2 s budget would already fail.
AFTER_DEADLINE_S = 0.3


@pytest.mark.slow
@pytest.mark.parametrize("timeout_ms", [10_000, 1_000, 300])
def test_the_budget_holds_beside_a_cpu_hog(timeout_ms: int) -> None:
    strategies = [api.load_text(text, f"{name}.place") for name, text in
                  (("fuzz-1-142", FUZZ_1_142), ("fuzz-0-93", FUZZ_0_93), ("ddp12", DDP_MANY_AXES))]
    seconds = 2.0
    took = {}
    # A caller's large heap, as a long test run's worker holds: a full collection of it that
    # straddled the deadline carried ddp12 to 2.58 s in a CI run (placeverify/verify/heap.py).
    heap = [[i] for i in range(2_000_000)]
    with cpu_hogs():
        for strategy in strategies:
            started = time.monotonic()
            verification = api.verify(strategy, timeout_ms=timeout_ms, budget_s=seconds)
            took[strategy.source.path] = time.monotonic() - started
            assert verification.overall() is not Verdict.PROVED or took[strategy.source.path] < seconds
    del heap
    over = {k: round(v, 2) for k, v in took.items() if v > seconds * 1.1 + AFTER_DEADLINE_S}
    assert over == {}, f"past the {seconds} s budget + 10% + {AFTER_DEADLINE_S} s: {over}"


def test_a_verification_leaves_the_callers_heap_out_of_collection() -> None:
    import gc

    seen: list[int] = []
    before = [[i] for i in range(1000)]  # tracked objects that exist before the verification
    strategy = api.load(str(ZERO2))
    original = budget.Budget.checkpoint

    def record(self: budget.Budget) -> None:
        seen.append(gc.get_freeze_count())
        original(self)

    budget.Budget.checkpoint = record  # type: ignore[method-assign]
    try:
        api.verify(strategy)
    finally:
        budget.Budget.checkpoint = original  # type: ignore[method-assign]
    assert seen and min(seen) >= len(before)  # frozen while it ran
    assert gc.get_freeze_count() == 0  # and given back to the collector after


def test_every_key_loop_of_an_encoding_stops_at_the_budget() -> None:
    calls = []
    with budget.active(budget.Budget.start(30.0)):
        assert list(budget.each(iter("abc"))) == ["a", "b", "c"]
    spent = budget.Budget(1.0, time.monotonic() - 1.0)
    with budget.active(spent), pytest.raises(budget.BudgetExhausted):
        for item in budget.each(range(3)):
            calls.append(item)
    assert calls == []


def test_reading_and_lowering_count_against_the_budget_of_a_check(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``check --timeout S`` answers within S: a file that takes 0.8 s to read and lower leaves
    the verification 0.2 s of a 1 s budget, and the verification ends 5% early for the report
    (a fault-and-load fuzz run answered 20% past the budget: parsing, lowering and the report
    ran outside it)."""
    from placeverify import lower

    path = tmp_path / "ddp12.place"
    path.write_text(DDP_MANY_AXES, encoding="utf-8")
    slow_load = lower.load

    def load(*args: object, **kwargs: object) -> object:
        time.sleep(0.8)
        return slow_load(*args, **kwargs)

    monkeypatch.setattr(api, "load", load)
    started = time.monotonic()
    result = api.check(str(path), budget_s=1.0)
    spent = time.monotonic() - started
    assert result.verification is not None
    assert result.verification.overall() is Verdict.UNKNOWN
    assert any(o.kind is ObligationKind.TIME_BUDGET for o in result.verification.obligations)
    assert spent <= 1.0 * (1 - budget.REPORT_FRACTION) + 0.15
    # without a budget nothing is bounded: the same file is decided
    monkeypatch.setattr(api, "load", slow_load)
    assert api.check(str(path), budget_s=None).verification.overall() is not Verdict.UNKNOWN
