"""Parameter gathers in flight (issue 12, construct 3, second half): ``all_gather(async) params
over dp`` after the update, completed at a ``wait params`` in the same step or the next one.

Every expected value below is worked out by hand from the definition in
:mod:`placeverify.semantics.param_flights` (a forward that runs while the gather is in flight
reads the other ranks' shards from before the update), on the smallest instance: ZeRO-1 over two
ranks, one element per shard.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.api import check
from placeverify.diagnostics import Code, PlaceError
from placeverify.ir.render import step_text
from placeverify.ir.step import Backward
from placeverify.lower import load_text
from placeverify.semantics.param_flights import identical_along, param_flights, simulate
from placeverify.verdicts import Condition, ObligationKind, Verdict
from placeverify.verify import verify

ROOT = Path(__file__).resolve().parents[1]

HEAD = """\
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision megatron
mesh { dp = 2 }
place zero1 over dp
"""


def zero1(step: str) -> str:
    return HEAD + "step {\n" + step + "}\n"


# line 6 is 'microbatches = 2'
WAIT_BEFORE_FORWARD = zero1("""\
    microbatches = 2
    wait params
    each microbatch {
        backward sum / tokens(dp, step)
    }
    reduce_scatter(sum) grads over dp
    update params
    all_gather(async) params over dp
""")

WAIT_AFTER_FIRST_FORWARD = zero1("""\
    microbatches = 2
    each microbatch {
        backward sum / tokens(dp, step)
    }
    on microbatch 0 {
        wait params
    }
    reduce_scatter(sum) grads over dp
    update params
    all_gather(async) params over dp
""")

WAIT_IN_THE_SAME_STEP = zero1("""\
    microbatches = 2
    each microbatch {
        backward sum / tokens(dp, step)
    }
    reduce_scatter(sum) grads over dp
    update params
    all_gather(async) params over dp
    wait params
""")


# ---- syntax and lowering -----------------------------------------------------------------------


def test_a_wait_before_the_forward_lowers_before_the_loop_and_renders_back() -> None:
    strategy = load_text(WAIT_BEFORE_FORWARD, "a.place")
    (wait,) = strategy.step.waits
    assert (wait.phase, wait.index, wait.span.line) == ("pre", 0, 7)
    text = step_text(strategy)
    assert "    microbatches = 2\n    wait params\n    each microbatch {\n" in text
    again = load_text(HEAD + text, "b.place").step
    assert [(w.phase, w.index) for w in again.waits] == [("pre", 0)]


@pytest.mark.parametrize(("step", "message", "code", "line", "column"), [
    # a gather never waited anywhere in the step: the error points at the gather
    ("    backward sum / tokens(dp, step)\n    reduce_scatter(sum) grads over dp\n"
     "    update params\n    all_gather(async) params over dp\n",
     "the asynchronous 'all_gather(async) params over dp' is never waited", Code.MISSING, 9, 5),
    # a parameter wait with no asynchronous gather: the error points at the wait
    ("    wait params\n    backward sum / tokens(dp, step)\n    reduce_scatter(sum) grads over dp\n"
     "    update params\n    all_gather params over dp\n",
     "nothing is in flight on params here", Code.BAD_VALUE, 6, 5),
    # a wait of the gradients still belongs after the backward
    ("    wait grads\n    backward sum / tokens(dp, step)\n    reduce_scatter(sum) grads over dp\n"
     "    update params\n    all_gather params over dp\n",
     "'wait' completes an asynchronous collective of the gradients", Code.BAD_VALUE, 6, 5),
    # 'async' on a gather of the gradients stays an unknown option
    ("    backward sum / tokens(dp, step)\n    reduce_scatter(sum) grads over dp\n"
     "    all_gather(async) grads over dp\n    update params\n",
     "'all_gather' takes no option 'async'", Code.UNKNOWN_NAME, 8, 16),
])
def test_errors_point_at_the_text(step: str, message: str, code: Code, line: int,
                                  column: int) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(zero1(step), "e.place")
    first = raised.value.diagnostics[0]
    assert message in first.message
    assert first.code is code
    assert first.span is not None and (first.span.line, first.span.column) == (line, column)
    rendered = str(raised.value)
    assert rendered.startswith(f"e.place:{line}:{column}: error: ")
    assert f"[{code.value}]" in rendered and "^" in rendered


# ---- the forwards in flight ------------------------------------------------------------------


def test_the_forwards_in_flight_are_those_before_the_wait_in_the_next_step() -> None:
    # The gather starts last in the step; the step repeats, so it is in flight from the start of
    # the next one until its wait. Before the loop: no forward in between. After micro-batch 0's
    # backward: that forward (micro-batch 0) in between, micro-batch 1's after the wait. In the
    # same step: nothing in between (the gather waited right after it starts).
    (before,) = param_flights(load_text(WAIT_BEFORE_FORWARD, "a.place").step)
    assert before.wraps and before.reads == ()
    (after,) = param_flights(load_text(WAIT_AFTER_FIRST_FORWARD, "a.place").step)
    assert after.wraps and [(type(op), k) for op, k in after.reads] == [(Backward, 0)]
    (same,) = param_flights(load_text(WAIT_IN_THE_SAME_STEP, "a.place").step)
    assert not same.wraps and same.reads == ()


def test_the_exact_two_step_run_by_hand() -> None:
    # Two ranks, element e owned by rank e, theta0 = (1, 2), gradient (1/2, 1/3), lr = 1/2:
    # updated = (1 - 1/4, 2 - 1/6) = (3/4, 11/6). Micro-batch 0 runs before the wait: rank 0
    # reads its own element updated and rank 1's stale, (3/4, 2); rank 1 reads (1, 11/6).
    # Micro-batch 1 runs after the wait: both read (3/4, 11/6), the reference.
    (flight,) = param_flights(load_text(WAIT_AFTER_FIRST_FORWARD, "a.place").step)
    sim = simulate(flight, 2, 2)
    assert sim.reference == (Fraction(3, 4), Fraction(11, 6))
    reads = {(r.rank, r.microbatch): r.values for r in sim.reads}
    assert reads[(0, 0)] == (Fraction(3, 4), Fraction(2))
    assert reads[(1, 0)] == (Fraction(1), Fraction(11, 6))
    assert reads[(0, 1)] == reads[(1, 1)] == (Fraction(3, 4), Fraction(11, 6))
    assert [(r.rank, r.microbatch) for r in sim.mismatches()] == [(0, 0), (1, 0)]
    # the wait before the forward: every read is the reference
    (fixed,) = param_flights(load_text(WAIT_BEFORE_FORWARD, "a.place").step)
    assert simulate(fixed, 2, 2).mismatches() == []


def test_the_agreement_domain_by_hand() -> None:
    # In flight the two dp ranks read different parameters (each its own shard fresh), so the
    # forward's parameters are not identical along dp; after the wait they are. An axis of one
    # rank is never split.
    (flight,) = param_flights(load_text(WAIT_AFTER_FIRST_FORWARD, "a.place").step)
    live = {"dp": True}
    assert identical_along(flight, ("dp",), live, 0) == frozenset()
    assert identical_along(flight, ("dp",), live, 1) == frozenset({"dp"})
    assert identical_along(flight, ("dp",), {"dp": False}, 0) == frozenset({"dp"})


# ---- verdicts ----------------------------------------------------------------------------------


def test_a_forward_in_flight_is_refuted_at_its_backward_and_the_wait_before_it_proved() -> None:
    bug = verify(load_text(WAIT_AFTER_FIRST_FORWARD, "a.place"))
    stale = [o for o in bug.obligations if o.verdict is Verdict.REFUTED]
    assert stale and all(o.condition is Condition.STATE_CONSISTENCY for o in stale)
    assert all(o.kind == ObligationKind.STALE_SHARD for o in stale)
    assert all(o.span is not None and o.span.line == 8 for o in stale)  # the backward
    assert bug.verdict(Condition.GRADIENT_INTEGRITY) is Verdict.PROVED
    assert "'wait params' before the forward" in (stale[0].fix or "")
    for text in (WAIT_BEFORE_FORWARD, WAIT_IN_THE_SAME_STEP):
        assert verify(load_text(text, "a.place")).overall() is Verdict.PROVED


def test_a_gather_without_a_sharded_optimizer_is_not_stale() -> None:
    # DDP: every rank updates all of it; the gather copies identical values: nothing stale
    text = WAIT_AFTER_FIRST_FORWARD.replace("place zero1 over dp", "place ddp over dp").replace(
        "reduce_scatter(sum) grads over dp", "all_reduce(sum) grads over dp")
    verification = verify(load_text(text, "a.place"))
    assert verification.overall() is Verdict.PROVED


def test_parameters_gathered_before_use_are_not_read_stale() -> None:
    # FSDP: the parameters are sharded and gathered before use (S*), so the forward gathers them
    # from their owners itself; the explicit gather in flight leaves nothing stale for it to read
    # (the replay agrees: it gathers S* parameters before the next step).
    text = WAIT_AFTER_FIRST_FORWARD.replace("place zero1 over dp", "place fsdp over dp")
    verification = verify(load_text(text, "a.place"))
    assert verification.verdict(Condition.STATE_CONSISTENCY) is Verdict.PROVED
    assert not [o for o in verification.obligations if o.kind == ObligationKind.STALE_SHARD
                and o.verdict is not Verdict.PROVED]


@pytest.mark.parametrize(("step", "line", "why"), [
    # the update rewrites the shard the gather is still sending
    ("    microbatches = 2\n    each microbatch {\n        backward sum / tokens(dp, step)\n"
     "    }\n    reduce_scatter(sum) grads over dp\n    all_gather(async) params over dp\n"
     "    update params\n    wait params\n", 12, "'update params' while"),
])
def test_what_is_not_modelled_is_unknown_at_its_line(step: str, line: int, why: str) -> None:
    verification = verify(load_text(zero1(step), "u.place"))
    unknown = [o for o in verification.obligations if o.kind == ObligationKind.NOT_MODELLED]
    assert unknown and all(o.span is not None and o.span.line == line for o in unknown)
    assert all(why in o.reason for o in unknown)
    assert verification.overall() is Verdict.UNKNOWN


def test_the_bug_example_is_refuted_and_its_twin_proved() -> None:
    bug = check(str(ROOT / "examples/bugs/param-gather-after-forward.place")).verification
    assert bug is not None
    refuted = [o for o in bug.obligations if o.verdict is Verdict.REFUTED]
    # the dense bucket alone is read in flight; embedding and norms are waited before the loop
    assert {o.claim.split(" parameters")[0].rsplit(" ", 1)[1] for o in refuted} == {"dense"}
    assert "Megatron-LM#950" in (refuted[0].fix or "")
    twin = check(str(ROOT / "examples/ok/param-gather-after-forward-fixed.place")).verification
    assert twin is not None and twin.overall() is Verdict.PROVED


# ---- the replay --------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize(("text", "diverges"), [(WAIT_AFTER_FIRST_FORWARD, True),
                                                (WAIT_BEFORE_FORWARD, False)])
def test_the_replay_runs_the_forward_on_stale_shards(text: str, diverges: bool) -> None:
    # Three steps on gloo: with the wait after micro-batch 0's forward, steps 2 and 3 compute
    # that forward on the other rank's shard from before the update, and the parameters move
    # away from the single-device reference; with the wait before the forward they match.
    pytest.importorskip("torch")
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    plan = plan_from_strategy(load_text(text, "r.place"), steps=3)
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges is diverges
    assert report.verdict == "confirmed"
