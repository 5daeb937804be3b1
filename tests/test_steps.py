"""State across steps (issue 12, construct 2): ``microbatches = [4, 4, 3]`` verifies k consecutive
optimizer steps, each over its own accumulation window (placeverify/semantics/steps.py).

Expected values are worked out by hand in the comments: single-device training normalises each
window by its own counts, so a loss divided by a configured 4 is right on a window of 4 and
4/3 too small on a window of 3.
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction

import pytest

from placeverify.diagnostics import Code, PlaceError, Severity
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import step_text
from placeverify.lower import load, load_text
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.semantics.steps import projection, windows
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import verify
from tests.conftest import EXAMPLES

EPOCH = """strategy "an epoch"
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision fp32_adam
mesh { dp = 2 }
place ddp over dp
loss microbatch_mean
step {
    microbatches = WINDOWS
    each microbatch {
        backward mean / DIVISOR
    }
    all_reduce(mean) grads over dp
    update params
    zero grads
}
"""


def epoch(windows: str, divisor: str) -> str:
    return EPOCH.replace("WINDOWS", windows).replace("DIVISOR", divisor)


def test_a_list_of_windows_lowers_to_the_steps_and_reads_back() -> None:
    s = load_text(epoch("[4, 4, 3]", "microbatches"))
    assert s.step.windows == (4, 4, 3)
    assert s.step.microbatches == 4  # the first window (costs are per full step)
    assert "microbatches = [4, 4, 3]" in step_text(s)
    again = load_text(EPOCH.split("step {")[0] + step_text(s))
    assert again.step.windows == (4, 4, 3)
    assert [(w.microbatches, w.steps) for w in windows(s)] == [(4, (1, 2)), (3, (3,))]


@pytest.mark.parametrize(("windows_text", "message"), [
    ("[4]", "a list of micro-batches names one window per optimizer step"),
    ("[4, 0]", "a step's micro-batches must be at least 1"),
    ("[4, 2.5]", "a step's micro-batches must be a whole number"),
])
def test_bad_window_lists_are_positioned_errors(windows_text: str, message: str) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(epoch(windows_text, "microbatches"))
    [error] = [d for d in raised.value.diagnostics if d.severity is Severity.ERROR]
    assert error.span is not None and error.span.line == 8  # the 'microbatches = [...]' line
    assert error.code is Code.BAD_VALUE
    assert error.message.startswith(message)


def test_on_microbatch_last_is_each_windows_last() -> None:
    text = epoch("[4, 2]", "microbatches").replace(
        "    all_reduce(mean) grads over dp\n",
        "    on microbatch last { all_reduce(sum) grads over dp }\n"
        "    on microbatch 3 { scale grads by 1 }\n"
        "    scale grads by 1 / |dp|\n")
    s = load_text(text)
    first = projection(s, 4).step
    tail = projection(s, 2).step
    assert [lo.microbatch for lo in first.loop] == [None, 3, 3]
    # on the tail window 'last' is micro-batch 1, and micro-batch 3 does not exist
    assert [lo.microbatch for lo in tail.loop] == [None, 1]
    assert verify(s).overall() is Verdict.PROVED


def _consumed(text: str, m: int) -> tuple[set[Fraction], Fraction]:
    s = projection(load_text(text), m)
    view = group_view(s, ParamGroup.DENSE)
    inst = uniform_instance(s, view, {"dp": 1}, m)  # 1 token each; gradient sums 1, 2, ..., m
    result = run(s, view, inst)
    return {d.consumed for d in result.devices if d.consumed is not None}, result.reference


def test_the_exact_domain_by_hand() -> None:
    text = epoch("[4, 4, 3]", "4")
    # full window: sum of gradient sums 1+2+3+4 = 10, each / 1 token / 4 -> 10/4; the
    # single-device mean of the four micro-batches' means is (1+2+3+4)/4 = 5/2: equal
    assert _consumed(text, 4) == ({Fraction(5, 2)}, Fraction(5, 2))
    # tail window: (1+2+3)/4 = 3/2 consumed; the reference is (1+2+3)/3 = 2
    assert _consumed(text, 3) == ({Fraction(3, 2)}, Fraction(2))
    fixed = epoch("[4, 4, 3]", "microbatches")  # divided by 3 on the tail: (1+2+3)/3 = 2
    assert _consumed(fixed, 3) == ({Fraction(2)}, Fraction(2))


def test_a_step_2_divergence_refutes_and_names_the_step() -> None:
    # windows [3, 4]: dividing by 4 is wrong on step 1 only (it is the first window)
    v = verify(load_text(epoch("[3, 4]", "4")))
    refuted = [o for o in v.obligations if o.verdict is Verdict.REFUTED]
    assert refuted and all(o.claim.endswith("at step 1 of 2 (3 micro-batches)") for o in refuted)
    v = verify(load_text(epoch("[4, 3]", "4")))
    refuted = [o for o in v.obligations if o.verdict is Verdict.REFUTED]
    assert refuted and all(o.claim.endswith("at step 2 of 2 (3 micro-batches)") for o in refuted)
    assert v.trace is not None and v.trace.microbatches == 3
    proved = [o for o in v.obligations if "at step 1 of 2" in o.claim]
    assert proved and all(o.verdict is Verdict.PROVED for o in proved)


def test_equal_windows_are_one_projection() -> None:
    v = verify(load_text(epoch("[4, 4]", "4")))
    assert v.overall() is Verdict.PROVED
    per_window = [o for o in v.obligations if "nothing carries" not in o.claim]
    assert per_window and all(o.claim.endswith("at steps 1, 2 of 2 (4 micro-batches each)")
                              for o in per_window)


def carry(windows_text: str, zero: str) -> str:
    """The epoch with the divisor right and 'zero grads' where ``zero`` says (or nowhere)."""
    text = epoch(windows_text, "microbatches").replace("    zero grads\n", "")
    if zero == "after":
        return text.replace("    update params\n", "    update params\n    zero grads\n")
    if zero == "before":
        return text.replace("    each microbatch {", "    zero grads\n    each microbatch {")
    if zero == "loop":  # zero_grad on every micro-batch: the window's earlier ones are lost
        return text.replace("    each microbatch {\n",
                            "    each microbatch {\n        zero grads\n")
    return text


def _carried(text: str) -> list[str]:
    v = verify(load_text(text))
    return [o.claim for o in v.obligations
            if "nothing carries" in o.claim and o.verdict is Verdict.REFUTED]


def test_gradients_not_zeroed_refute_step_2() -> None:
    # step 2 (window of 2) reads step 1's buffer as well: refuted at the update, naming step 2
    claims = _carried(carry("[3, 2]", "none"))
    assert claims and all(c.endswith("at step 2 of 2") for c in claims)
    v = verify(load_text(carry("[3, 2]", "none")))
    first = v.first_refuted()
    assert first is not None and first.span is not None and first.span.line == 13  # update
    assert v.trace is not None and v.trace.microbatches == 2  # the refuted step's window


@pytest.mark.parametrize("zero", ["after", "before"])
def test_zeroing_between_steps_is_proved(zero: str) -> None:
    assert verify(load_text(carry("[3, 2]", zero))).overall() is Verdict.PROVED


def test_zeroing_every_microbatch_is_refuted_on_the_window() -> None:
    # nothing carries between steps, but the window's own earlier micro-batches are lost
    v = verify(load_text(carry("[3, 2]", "loop")))
    assert not _carried(carry("[3, 2]", "loop"))
    assert v.verdict(Condition.GRADIENT_INTEGRITY) is Verdict.REFUTED


def test_unrolled_steps_by_hand() -> None:
    from placeverify.semantics.steps import unrolled

    s = load_text(carry("[2, 1]", "none"))
    step, owner = unrolled(s.step, 2)
    # micro-batches 0, 1 belong to step 1 and 2 to step 2; step 1's all-reduce runs on its last
    # micro-batch (1) and its update is dropped; step 2's statements after the loop stay after it
    assert owner == [0, 0, 1] and step.microbatches == 3
    assert [(type(lo.op).__name__, lo.microbatch) for lo in step.loop] == [
        ("Backward", 0), ("Backward", 1), ("Collective", 1), ("Backward", 2)]
    assert [type(op).__name__ for op in step.post] == ["Collective", "Update"]


def test_the_epoch_bug_and_its_twin() -> None:
    bug = verify(load(str(EXAMPLES / "bugs" / "ga-tail-window.place")))
    refuted = [o for o in bug.obligations if o.verdict is Verdict.REFUTED]
    assert {o.condition for o in refuted} == {Condition.GRADIENT_INTEGRITY}
    assert all("at step 3 of 3" in o.claim for o in refuted)
    assert verify(load(str(EXAMPLES / "ok" / "ga-tail-window-fixed.place"))).overall() \
        is Verdict.PROVED


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(("zero", "verdict"), [("after", Verdict.PROVED),
                                               ("none", Verdict.REFUTED)])
def test_the_replay_carries_buffers_between_steps(zero: str, verdict: Verdict) -> None:
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    pool().prestart()
    strategy = load_text(carry("[2, 2]", zero))
    plan = plan_from_strategy(strategy, steps=2, known=verify(strategy))
    assert plan.expect.verdict is verdict
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges is (verdict is Verdict.REFUTED)
    assert report.verdict == "confirmed"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(("divisor", "verdict"), [("microbatches", Verdict.PROVED),
                                                  ("4", Verdict.REFUTED)])
def test_the_replay_runs_the_tail_window(divisor: str, verdict: Verdict) -> None:
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    pool().prestart()
    plan = plan_from_strategy(load_text(epoch("[4, 4, 3]", divisor)), steps=2)
    assert plan.main.microbatches == 3  # the smallest window (and the refuted one)
    assert plan.expect.verdict is verdict
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges is (verdict is Verdict.REFUTED)
    assert report.verdict == "confirmed"


def test_zero_grads_takes_no_group_and_no_options() -> None:
    text = epoch("[4, 4]", "microbatches").replace("    zero grads\n", "    zero grads over dp\n")
    with pytest.raises(PlaceError) as raised:
        load_text(text)
    [error] = [d for d in raised.value.diagnostics if d.severity is Severity.ERROR]
    # line 14 is "    zero grads over dp": the error points at the group (column 21)
    assert error.span is not None and (error.span.line, error.span.column) == (14, 21)
    assert error.code is Code.BAD_VALUE
    assert "'zero' runs on each device" in error.message


def test_replay_emit_refuses_several_steps() -> None:
    from placeverify.replay.emit import EmitRefused, check_layout

    with pytest.raises(EmitRefused, match="several optimizer steps"):
        check_layout(load_text(epoch("[4, 4, 3]", "microbatches")))


def test_prove_leaves_several_steps_unknown() -> None:
    # 'placeverify prove' quantifies over sizes a step started from empty buffers; what several
    # steps carry is judged by 'check' only, so prove says unknown rather than proved
    from placeverify.verify.every_size import integrity

    verdict, _, reason, _, _ = integrity(load_text(carry("[2, 2]", "none")), ["dp"], False, 10_000)
    assert verdict is Verdict.UNKNOWN and reason.startswith("not modelled: several optimizer steps")


# ---- several steps beside the other step constructs -------------------------------------------

SEVERAL = """
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision fp32_adam
mesh { dp = 2 }
place ddp over dp
DECLARATION
step {
    microbatches = [2, 2]
    backward sum / tokens(dp, step)
    REDUCTION
    update params
    zero grads
}
"""


@pytest.mark.parametrize(("declaration", "reduction", "what"), [
    ("empty microbatches", "all_reduce(sum) grads over dp", "micro-batches without tokens"),
    ("unused dense", "all_reduce(sum, only = used) grads over dp", "'only = used' reductions"),
])
def test_patterns_over_several_steps_are_not_modelled(declaration: str, reduction: str,
                                                       what: str) -> None:
    # the patterns index the micro-batches of one step; over several windows they are not
    # enumerated, so every verdict that needs them is unknown at the step, never proved
    text = SEVERAL.replace("DECLARATION", declaration).replace("REDUCTION", reduction)
    verification = verify(load_text(text))
    unknown = [o for o in verification.obligations if o.verdict is Verdict.UNKNOWN]
    assert unknown and all(o.verdict is not Verdict.PROVED for o in verification.obligations
                           if what in (o.reason or ""))
    assert any(what in (o.reason or "") and "several optimizer steps" in (o.reason or "")
               for o in unknown)
