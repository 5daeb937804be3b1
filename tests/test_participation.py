"""Participation (issue 12, construct 4): 'unused' groups and 'only = used' reductions.

Expected values are worked out by hand in the comments (README "Participation" gives the rules):
a micro-batch that leaves a group unused adds nothing to its gradient and weighs nothing in the
single-device reference; an ``only = used`` reduction leaves such a group as it is.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from placeverify.diagnostics import PlaceError
from placeverify.ir.model import ParamGroup
from placeverify.lower import load_text
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.semantics.participation import (
    MAX_PATTERNS,
    Pattern,
    deciding,
    patterns,
    with_pattern,
)
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import verify
from placeverify.verify.agreement import agreement
from placeverify.verify.z3 import solve
from placeverify.verify.z3.integrity import encode, mismatch_formula
from placeverify.verify.z3.solve import SolverStatus
from tests.conftest import EXAMPLES

HEAD = """
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision fp32_adam
mesh { dp = 2 }
place ddp over dp
loss microbatch_mean
"""

# DDP under no_sync: one reduction after the last micro-batch, of the groups it used
LAST_ONLY = HEAD + """unused dense
step {
    microbatches = 2
    each microbatch { backward mean / microbatches }
    on microbatch last { all_reduce(mean, only = used) grads over dp }
    update params
}
"""

# DDP without no_sync: each micro-batch's backward reduces the groups it used (a mean of
# identical earlier values is those values, so reducing the accumulated buffer is right)
EVERY = HEAD + """unused dense
step {
    microbatches = 3
    each microbatch {
        backward mean / microbatches
        all_reduce(mean, only = used) grads over dp
    }
    update params
}
"""

DENSE = ParamGroup.DENSE
IDLE_LAST = Pattern(((DENSE, frozenset({1})),))


def _exact(text: str, pattern: Pattern) -> tuple[list[Fraction], Fraction]:
    strategy = with_pattern(load_text(text, "p.place"), pattern)
    view = group_view(strategy, DENSE)
    result = run(strategy, view, uniform_instance(strategy, view, {"dp": 2}, 2))
    consumed = [d.consumed for d in result.devices]
    assert all(isinstance(c, Fraction) for c in consumed)
    return consumed, result.reference  # type: ignore[return-value]


def test_patterns_are_the_subsets_of_the_deciding_microbatches() -> None:
    last = load_text(LAST_ONLY, "p.place")
    assert deciding(last) == [1]
    assert [p.idle for p in patterns(last)] == [((DENSE, frozenset()),), ((DENSE, frozenset({1})),)]
    every = load_text(EVERY, "p.place")
    assert deciding(every) == [0, 1, 2]
    assert len(patterns(every)) == 8  # 2^3


def test_a_file_without_only_used_has_the_empty_pattern() -> None:
    fixed = LAST_ONLY.replace("(mean, only = used)", "(mean)")
    assert patterns(load_text(fixed, "p.place")) == [Pattern()]


def test_exact_interpreter_every_group_used() -> None:
    # uniform_instance: one token per atom, gradient sums 1, 2 (dp 0, micro-batches 0 and 1) and
    # 3, 4 (dp 1). Each backward adds S / 1 / 2: dp 0 holds 3/2, dp 1 holds 7/2; the mean over
    # dp is 5/2. Reference: 4 units of one token, weight 1/4 each: (1 + 2 + 3 + 4) / 4 = 5/2.
    consumed, reference = _exact(LAST_ONLY, Pattern(((DENSE, frozenset()),)))
    assert consumed == [Fraction(5, 2)] * 2
    assert reference == Fraction(5, 2)


def test_exact_interpreter_dense_unused_in_the_last_microbatch() -> None:
    # micro-batch 1 adds nothing: dp 0 holds 1/2, dp 1 holds 3/2, and the reduction leaves them.
    # Reference: only micro-batch 0's atoms, (1 + 3) / 4 = 1.
    consumed, reference = _exact(LAST_ONLY, IDLE_LAST)
    assert consumed == [Fraction(1, 2), Fraction(3, 2)]
    assert reference == 1


def test_exact_interpreter_dense_unused_in_the_first_microbatch() -> None:
    # micro-batch 0 adds nothing: dp 0 holds 2/2 = 1, dp 1 holds 4/2 = 2; the last micro-batch
    # used the group, so it is averaged: 3/2. Reference: (2 + 4) / 4 = 3/2.
    consumed, reference = _exact(LAST_ONLY, Pattern(((DENSE, frozenset({0})),)))
    assert consumed == [Fraction(3, 2)] * 2
    assert reference == Fraction(3, 2)


def test_z3_refutes_only_the_pattern_that_skips() -> None:
    strategy = load_text(LAST_ONLY, "p.place")
    view = group_view(strategy, DENSE)
    for pattern, status in ((Pattern(((DENSE, frozenset()),)), SolverStatus.UNSAT),
                            (Pattern(((DENSE, frozenset({0})),)), SolverStatus.UNSAT),
                            (IDLE_LAST, SolverStatus.SAT)):
        encoded = encode(with_pattern(strategy, pattern), view, {"dp": 2}, 2, "t_", integer=False)
        assert solve.check(mismatch_formula(encoded), 10_000).status is status, pattern


def test_agreement_sees_the_replicas_drift_under_the_skipping_pattern() -> None:
    strategy = load_text(LAST_ONLY, "p.place")
    view = group_view(strategy, DENSE)
    assert "dp" in agreement(strategy, view).identical  # every group used: identical over dp
    assert "dp" not in agreement(with_pattern(strategy, IDLE_LAST), view).identical


def test_verdicts_over_every_pattern() -> None:
    result = verify(load_text(LAST_ONLY, "p.place"))
    assert result.verdict(Condition.GRADIENT_INTEGRITY) is Verdict.REFUTED
    assert result.verdict(Condition.STATE_CONSISTENCY) is Verdict.REFUTED
    refuted = result.first_refuted()
    assert refuted is not None and refuted.span is not None
    assert refuted.span.line == 11  # the 'only = used' reduction
    assert "dense parameters unused in micro-batch 1" in refuted.reason
    # the other groups are not declared unused: their obligations hold
    norms = [o for o in result.obligations if "norms parameters" in o.claim]
    assert norms and all(o.verdict is Verdict.PROVED for o in norms)
    assert verify(load_text(EVERY, "p.place")).overall() is Verdict.PROVED  # all 8 patterns


def test_without_the_declaration_only_used_changes_nothing() -> None:
    text = LAST_ONLY.replace("unused dense\n", "")
    assert verify(load_text(text, "p.place")).overall() is Verdict.PROVED


def test_too_many_patterns_are_not_modelled() -> None:
    m = MAX_PATTERNS.bit_length()  # 7 deciding micro-batches: 128 patterns
    text = EVERY.replace("microbatches = 3", f"microbatches = {m}")
    result = verify(load_text(text, "p.place"))
    assert result.overall() is Verdict.UNKNOWN
    assert all(o.verdict is Verdict.UNKNOWN and "not modelled" in o.reason
               for o in result.obligations)


def test_a_group_that_does_not_span_the_batch_axes_is_not_modelled() -> None:
    text = LAST_ONLY.replace("mesh { dp = 2 }", "mesh { dp = 2, rep = 2 }").replace(
        "place ddp over dp", "place ddp over dp\nplace ddp over rep")
    result = verify(load_text(text, "p.place"))
    assert result.overall() is Verdict.UNKNOWN
    assert any("decisions may differ" in o.reason for o in result.obligations)


@pytest.mark.parametrize(("text", "fragment", "caret"), [
    (HEAD + "unused widgets\n", "unknown parameter group 'widgets'", (7, 8)),
    (HEAD + "unused dense\nunused dense\n", "'dense' is declared unused twice", (8, 1)),
    (LAST_ONLY.replace("only = used", "only = sometimes"), "'sometimes' is not a value of only",
     (11, 50)),  # "    on microbatch last { " is 25 characters, "all_reduce(mean, only = " 24
    (LAST_ONLY.replace("all_reduce(mean, only = used) grads", "all_reduce(sum, only = used) tokens"),
     "'only = used' reduces the gradients", (11, 26)),  # the statement
])
def test_errors_point_at_the_text(text: str, fragment: str, caret: tuple[int, int]) -> None:
    with pytest.raises(PlaceError) as err:
        load_text(text, "p.place")
    rendered = str(err.value)
    diagnostics = err.value.diagnostics
    assert any(fragment in d.message for d in diagnostics), rendered
    spans = [(d.span.line, d.span.column) for d in diagnostics if fragment in d.message and d.span]
    assert caret in spans, spans


def test_the_bug_and_its_twin() -> None:
    bug = load_text((EXAMPLES / "bugs" / "ddp-unused-params-no-sync.place").read_text(),
                    "bug.place")
    twin = load_text((EXAMPLES / "ok" / "ddp-unused-params-no-sync-fixed.place").read_text(),
                     "twin.place")
    assert verify(bug).verdict(Condition.GRADIENT_INTEGRITY) is Verdict.REFUTED
    assert verify(twin).overall() is Verdict.PROVED


@pytest.mark.torch
def test_the_replay_realises_the_refuting_pattern() -> None:
    pytest.importorskip("torch")
    from placeverify.replay.participation import chosen_idle

    bug = load_text(LAST_ONLY, "p.place")
    assert chosen_idle(bug, 10_000) == [("dense", [1])]
    # proved under every pattern: the one with the most idle micro-batches is replayed
    every = load_text(EVERY, "p.place")
    assert chosen_idle(every, 10_000) == [("dense", [0, 1, 2])]


TERMS = HEAD.replace("loss microbatch_mean", "loss token_mean\nloss aux: token_mean") + """unused dense
step {
    microbatches = 2
    each microbatch {
        backward sum / tokens(dp, step)
        backward aux: sum / tokens(dp, step)
    }
    on microbatch last { all_reduce(sum, only = used) grads over dp }
    update params
}
"""


@pytest.mark.torch
@pytest.mark.parametrize(("text", "verdict", "idle"), [
    (LAST_ONLY, Verdict.REFUTED, [("dense", [1])]),  # dense unused in the last micro-batch
    # every group reduced: proved, replayed with dense unused in every deciding micro-batch
    (LAST_ONLY.replace("(mean, only = used)", "(mean)"), Verdict.PROVED, []),
    (EVERY, Verdict.PROVED, [("dense", [0, 1, 2])]),
    # two loss terms under the skipping pattern: the reference keeps each term's weights
    (TERMS, Verdict.REFUTED, [("dense", [1])]),
])
def test_the_replay_confirms_the_verdict_under_its_pattern(
        text: str, verdict: Verdict, idle: list[tuple[str, list[int]]]) -> None:
    pytest.importorskip("torch")
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    pool().prestart()
    plan = plan_from_strategy(load_text(text, "p.place"), steps=2)
    assert plan.main.idle == idle
    assert plan.expect.verdict is verdict
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges is (verdict is Verdict.REFUTED)
    assert report.verdict == "confirmed"


def test_a_run_spec_carries_its_pattern_through_json() -> None:
    from placeverify.replay.plan import RunSpec, strategy_of

    spec = RunSpec("step", LAST_ONLY, "p.place", {"dp": 2}, 2, False, [], [],
                   idle=[("dense", [1])])
    again = RunSpec.from_json(spec.to_json())
    assert again == spec
    assert strategy_of(again).step.idle_in(DENSE) == frozenset({1})
    assert strategy_of(again).step.idle_in(ParamGroup.NORMS) == frozenset()


def test_a_trace_records_the_refuted_pattern() -> None:
    from placeverify.api import verify as api_verify

    result = api_verify(load_text(LAST_ONLY, "p.place"))
    assert result.trace is not None
    assert result.trace.values["participation"] == [["dense", [1]]]


def test_the_patterns_share_one_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # each pattern is given what is left of the one budget, never a fresh one
    import time

    import placeverify.verify as verify_module
    from placeverify.verdicts import Verification

    given: list[float | None] = []

    def fake(strategy: object, timeout_ms: int, budget_s: float | None) -> Verification:
        given.append(budget_s)
        time.sleep(0.05)
        return Verification(())

    monkeypatch.setattr(verify_module, "_verify_one", fake)
    verify_module.verify(load_text(EVERY, "p.place"), budget_s=10.0)
    assert len(given) == 8  # the 2^3 patterns
    assert all(b is not None for b in given)
    left = [b for b in given if b is not None]
    assert left[0] <= 10.0 and left[-1] <= 10.0 - 7 * 0.05  # seven sleeps spent before the last
    assert left == sorted(left, reverse=True)


def test_a_refutation_that_holds_with_every_group_used_is_replayed_with_every_group_used() -> None:
    # found by the soundness harness (toggle_only_used on zero1-no-allgather): the parameters are
    # never gathered after the sharded update, refuted whatever micro-batches leave dense unused;
    # replayed with dense unused in the only micro-batch, its gradient and so its update are zero
    # and the stale shards do not show. The replay must run the pattern where they do: every
    # group used (no idle micro-batch).
    from placeverify.replay.participation import chosen_idle

    text = """
model { params = 1.3e9 }
precision megatron
mesh { dp = 8 }
place zero1 over dp
unused dense
step {
    backward sum / tokens(dp, step)
    reduce_scatter(sum, only = used) grads over dp
    update params
}
"""
    assert chosen_idle(load_text(text, "stale.place"), 10_000) == []
