"""Asynchronous collectives (issue 12, construct 3): ``all_reduce(sum, async) grads over dp`` ...
``wait grads``.

Every expected value below is worked out by hand from the definition in
:mod:`placeverify.semantics.asynchrony` (a read in flight sees the buffer before or after the
collective; a write in flight lands after it or is overwritten by its result), on instances small
enough to follow: one gradient value per (rank, micro-batch) atom, 1 token each.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from placeverify.diagnostics import Code, PlaceError
from placeverify.ir.render import step_text
from placeverify.ir.step import Backward, Clip, Collective, Update
from placeverify.lower import load_text
from placeverify.semantics.asynchrony import late, replayed, synchronous, worlds
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.verdicts import Condition, ObligationKind, Verdict
from placeverify.verify import verify

HEAD = """\
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision megatron
mesh { dp = 2 }
place ddp over dp
clip max_norm = 1.0
"""


def ddp(step: str) -> str:
    return HEAD + "step {\n" + step + "}\n"


CLIP_IN_FLIGHT = ddp("""\
    backward sum / tokens(dp, step)
    all_reduce(sum, async) grads over dp
    clip(max_norm = 1.0) grads
    wait grads
    update params
""")

CLIP_AFTER_WAIT = ddp("""\
    backward sum / tokens(dp, step)
    all_reduce(sum, async) grads over dp
    wait grads
    clip(max_norm = 1.0) grads
    update params
""")

# the last micro-batch's backward written while the reduction of the first is in flight
WRITE_IN_FLIGHT = ddp("""\
    microbatches = 2
    on microbatch last {
        all_reduce(sum, async) grads over dp
    }
    each microbatch {
        backward sum / tokens(dp, step)
    }
    wait grads
    update params
""")


def exact_run(text: str, world: str) -> object:
    strategy = load_text(text, "a.place")
    chosen = {w.name: w.strategy for w in worlds(strategy) or []}[world]
    group = chosen.model.groups_present()[0]
    view = group_view(chosen, group)
    return run(chosen, view, uniform_instance(chosen, view, {"dp": 2}, chosen.step.microbatches))


# ---- syntax and lowering -----------------------------------------------------------------------


def test_async_and_wait_lower_to_a_flag_and_a_position() -> None:
    step = load_text(CLIP_IN_FLIGHT, "a.place").step
    collective = next(op for op in step.ops() if isinstance(op, Collective))
    assert collective.asynchronous
    assert collective.label() == "all_reduce(sum, async) grads over dp"
    (wait,) = step.waits
    # post holds: all_reduce (0), clip (1), update (2); the wait stands before the update
    assert (wait.phase, wait.index, wait.span.line) == ("post", 2, 10)
    assert not any(type(op).__name__ == "Wait" for op in step.ops())  # never a statement


def test_the_step_renders_its_waits_and_lowers_back_to_them() -> None:
    strategy = load_text(WRITE_IN_FLIGHT, "a.place")
    text = step_text(strategy)
    assert "        all_reduce(sum, async) grads over dp\n" in text
    assert "    wait grads\n" in text
    again = load_text(HEAD + text, "b.place").step
    assert [(w.phase, w.index) for w in again.waits] == [(w.phase, w.index)
                                                          for w in strategy.step.waits]


@pytest.mark.parametrize(("step", "message", "code", "line", "column"), [
    # never waited: the error points at the collective
    ("    backward sum / tokens(dp, step)\n    all_reduce(sum, async) grads over dp\n"
     "    update params\n",
     "the asynchronous 'all_reduce(sum, async) grads over dp' is never waited", Code.MISSING, 8, 5),
    ("    backward sum / tokens(dp, step)\n    all_reduce(sum) grads over dp\n    wait grads\n"
     "    update params\n", "nothing is in flight on grads here", Code.BAD_VALUE, 9, 5),
    ("    backward sum / tokens(dp, step)\n    all_reduce(sum, async) grads over dp\n"
     "    wait grads over dp\n    update params\n", "'wait' names the buffer", Code.BAD_VALUE, 9, 21),
    ("    all_reduce(sum, async) tokens over dp\n    backward sum / tokens(dp, step)\n"
     "    all_reduce(sum) grads over dp\n    update params\n",
     "'async' is modelled for collectives of the gradients", Code.BAD_VALUE, 7, 5),
    ("    backward sum / tokens(dp, step)\n    all_gather(async) grads over dp\n"
     "    update params\n", "'all_gather' takes no option 'async'", Code.UNKNOWN_NAME, 8, 16),
])
def test_errors_point_at_the_text(step: str, message: str, code: Code, line: int,
                                  column: int) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(ddp(step), "e.place")
    first = raised.value.diagnostics[0]
    assert message in first.message
    assert first.code is code
    assert first.span is not None and (first.span.line, first.span.column) == (line, column)
    rendered = str(raised.value)
    assert rendered.startswith(f"e.place:{line}:{column}: error: ")
    assert f"[{code.value}]" in rendered and "^" in rendered


# ---- the two outcomes ------------------------------------------------------------------------


def test_the_synchronous_outcome_completes_where_it_starts() -> None:
    step = synchronous(load_text(CLIP_IN_FLIGHT, "a.place").step)
    assert [type(op).__name__ for op in step.post] == ["Collective", "Clip", "Update"]
    assert step.waits == ()
    assert not any(isinstance(op, Collective) and op.asynchronous for op in step.ops())


def test_the_late_outcome_completes_at_the_wait() -> None:
    step = late(load_text(CLIP_IN_FLIGHT, "a.place").step)
    assert [type(op).__name__ for op in step.post] == ["Clip", "Collective", "Update"]


def test_a_read_in_flight_sees_the_buffer_before_the_collective_in_the_late_outcome() -> None:
    # dp = 2, one micro-batch, gradient sums 1 (dp 0) and 2 (dp 1), 1 token each: backward
    # sum / tokens(dp, step) leaves 1/2 and 2/2 = 1; the all-reduce gives 3/2 on both.
    sync = exact_run(CLIP_IN_FLIGHT, "synchronous")
    late_run = exact_run(CLIP_IN_FLIGHT, "late")
    assert sync.clips[0].value == [Fraction(3, 2), Fraction(3, 2)]  # type: ignore[attr-defined]
    assert late_run.clips[0].value == [Fraction(1, 2), Fraction(1)]  # type: ignore[attr-defined]
    # the update after the wait sees the reduced gradient in both
    for r in (sync, late_run):
        assert [d.consumed for d in r.devices] == [Fraction(3, 2)] * 2  # type: ignore[attr-defined]
        assert r.reference == Fraction(3, 2)  # type: ignore[attr-defined]


def test_a_write_in_flight_is_lost_in_the_late_outcome() -> None:
    # dp = 2, m = 2, 1 token each; gradient sums in order (dp 0, mb 0) = 1, (dp 0, mb 1) = 2,
    # (dp 1, mb 0) = 3, (dp 1, mb 1) = 4; weight 1 / tokens(dp, step) = 1/4.
    # single device: (1 + 2 + 3 + 4) / 4 = 5/2.
    # late: the all-reduce takes micro-batch 0 only, (1 + 3) / 4 = 1, and micro-batch 1's
    # backward is overwritten by its result: 1 on both ranks.
    # synchronous: 1 on both after micro-batch 0, then each adds its own micro-batch 1 unreduced:
    # 1 + 2/4 = 3/2 on dp 0 and 1 + 4/4 = 2 on dp 1.
    late_run = exact_run(WRITE_IN_FLIGHT, "late")
    sync = exact_run(WRITE_IN_FLIGHT, "synchronous")
    assert late_run.reference == Fraction(5, 2)  # type: ignore[attr-defined]
    assert [d.consumed for d in late_run.devices] == [1, 1]  # type: ignore[attr-defined]
    assert [d.consumed for d in sync.devices] == [Fraction(3, 2), 2]  # type: ignore[attr-defined]


def test_the_lost_write_reaches_no_reduced_group() -> None:
    step = late(load_text(WRITE_IN_FLIGHT, "a.place").step)
    # unrolled: micro-batch 0's backward, micro-batch 1's backward reaching nothing
    backwards = [(lo.microbatch, lo.op.reaches) for lo in step.loop if isinstance(lo.op, Backward)]
    assert backwards == [(0, None), (1, frozenset())]
    assert isinstance(step.post[0], Collective) and isinstance(step.post[1], Update)


# ---- verdicts ----------------------------------------------------------------------------------


def obligations(text: str) -> list[object]:
    return list(verify(load_text(text, "a.place"), budget_s=None).obligations)


def test_a_read_in_flight_is_refuted_and_the_read_after_the_wait_proved() -> None:
    refuted = [o for o in obligations(CLIP_IN_FLIGHT) if o.verdict is Verdict.REFUTED]  # type: ignore[attr-defined]
    assert refuted and all(o.span.line == 9 for o in refuted)  # type: ignore[attr-defined]
    assert all("completed only at its wait (line 10)" in o.reason for o in refuted)  # type: ignore[attr-defined]
    assert all("'wait grads' before the gradients are read" in o.fix for o in refuted)  # type: ignore[attr-defined]
    verification = verify(load_text(CLIP_AFTER_WAIT, "a.place"), budget_s=None)
    assert verification.overall() is Verdict.PROVED


def test_a_write_in_flight_is_blamed_on_the_collective_start() -> None:
    found = [o for o in obligations(WRITE_IN_FLIGHT) if o.verdict is Verdict.REFUTED  # type: ignore[attr-defined]
             and o.kind is ObligationKind.COEFFICIENT]  # type: ignore[attr-defined]
    assert found and all(o.span.line == 9 for o in found)  # type: ignore[attr-defined]
    assert all("after the last write of the gradients it reduces" in o.fix for o in found)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("step", "line", "why"), [
    ("    backward sum / tokens(dp, step)\n    all_reduce(sum, async) grads over dp\n"
     "    all_reduce(sum, async) grads over dp\n    wait grads\n    update params\n", 9,
     "starts while"),
    ("    backward sum / tokens(dp, step)\n    all_reduce(sum, async) grads over dp\n"
     "    free grads\n    wait grads\n    update params\n", 9, "free grads"),
    ("    backward sum / tokens(dp, step)\n    all_reduce(max, async) grads over dp\n"
     "    wait grads\n    update params\n", 8, "maximum"),
    ("    backward sum / tokens(dp, step)\n    all_reduce(sum, async) grads over dp\n"
     "    scale grads by 2\n    clip(max_norm = 1.0) grads\n    wait grads\n    update params\n",
     10, "after 'scale grads by 2' wrote them"),
])
def test_what_is_not_modelled_is_unknown_at_its_line(step: str, line: int, why: str) -> None:
    found = obligations(ddp(step))
    integrity = [o for o in found if o.condition is Condition.GRADIENT_INTEGRITY]  # type: ignore[attr-defined]
    assert integrity and all(o.verdict is Verdict.UNKNOWN for o in integrity)  # type: ignore[attr-defined]
    assert all(o.span.line == line and "not modelled" in o.reason and why in o.reason  # type: ignore[attr-defined]
               for o in integrity)


def test_the_replay_runs_the_late_outcome() -> None:
    strategy = replayed(load_text(CLIP_IN_FLIGHT, "a.place"))
    assert isinstance(strategy.step.post[0], Clip) and isinstance(strategy.step.post[1], Collective)
    plain = load_text(HEAD + "step {\n    backward sum / tokens(dp, step)\n"
                      "    all_reduce(sum) grads over dp\n    update params\n}\n", "p.place")
    assert replayed(plain) is plain  # a step without async is replayed as written


# ---- a step rewritten twice (issue 34) ---------------------------------------------------------

# the soundness harness's mutant of examples/ok/overlap-reduce-before-grad-write-fixed.place whose
# parameter gather is asynchronous: WAIT is where its 'wait params' stands
OVERLAPPED_GATHER = """\
model transformer {{ layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }}
precision megatron
mesh {{ dp = 2, inst = 2 }}
place zero1 over dp
place ddp over inst

step {{
    microbatches = 2
{pre}    each microbatch {{
{loop}        backward sum / {tokens}
    }}
    on microbatch last {{
        reduce_scatter(sum, async) grads over dp
    }}
    wait grads
    all_reduce(sum) grads over inst
    update params
    all_gather(async) params over dp
{post}}}
"""
WAITS = {"after the gather": ("", "", "    wait params\n"),
         "before the loop": ("    wait params\n", "", ""),
         "before each forward": ("", "        wait params\n", "")}


def overlapped_gather(wait: str, tokens: str = "tokens(dp, inst, step)") -> str:
    pre, loop, post = WAITS[wait]
    return OVERLAPPED_GATHER.format(pre=pre, loop=loop, post=post, tokens=tokens)


@pytest.mark.parametrize("wait", list(WAITS))
def test_a_step_already_unrolled_keeps_each_micro_batch_when_rewritten_again(wait: str) -> None:
    # the flight of the gradients starts in the loop, so the replayed step unrolls it: micro-batch
    # 0's backward, then micro-batch 1's (the same statement under two filters). Judging that step
    # rewrites it once more, without unrolling (only the gather is in flight): each backward keeps
    # its own micro-batch, none runs twice
    once = replayed(load_text(overlapped_gather(wait), "a.place")).step
    assert [(type(lo.op), lo.microbatch) for lo in once.loop] == [(Backward, 0), (Backward, 1)]
    twice = late(once)
    assert [(type(lo.op), lo.microbatch) for lo in twice.loop] == [(Backward, 0), (Backward, 1)]


@pytest.mark.parametrize("wait", list(WAITS))
def test_the_replayed_step_of_an_overlapped_gather_is_judged_as_the_written_one(wait: str) -> None:
    # by hand: every rank adds sum / tokens(dp, inst, step) over its two micro-batches, the
    # reduce-scatter sums over dp and the all-reduce over inst, so each owned shard is the global
    # token mean; the gather completes at its wait, before the next step's first forward. Proved
    # written, and in the step the replay runs (the reduce-scatter completed at 'wait grads'),
    # which is the verdict the replay's run is held to
    from placeverify.replay.plan import plan_from_strategy

    strategy = load_text(overlapped_gather(wait), "a.place")
    assert verify(strategy, budget_s=None).overall() is Verdict.PROVED
    assert verify(replayed(strategy), budget_s=None).overall() is Verdict.PROVED
    assert plan_from_strategy(strategy, world=4).expect.verdict is Verdict.PROVED


def test_the_replayed_step_of_an_overlapped_gather_still_refutes_a_wrong_coefficient() -> None:
    # dividing by a dp group's tokens only: the all-reduce over inst then sums two such means, a
    # coefficient of 2 where the single device has 1, found where the optimizer consumes it
    strategy = load_text(overlapped_gather("after the gather", "tokens(dp, step)"), "a.place")
    for judged in (strategy, replayed(strategy)):
        found = [o for o in verify(judged, budget_s=None).obligations
                 if o.verdict is Verdict.REFUTED and o.kind is ObligationKind.COEFFICIENT]
        assert found and all(o.span.line == 17 for o in found)  # 'update params'
