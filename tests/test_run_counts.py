"""Counts across steps (issue 12, construct 2, counters): in a step of several optimizer steps,
``tokens(dp, run)`` is a normaliser that nobody resets, so step j divides by the tokens of steps
1..j, and ``tokens(dp, batch)`` counts the whole batch the steps split, so every step divides by
all k steps' tokens (placeverify/semantics/counters.py).

Expected values are worked out by hand in the comments. The small instance: dp = 2, windows of 2
micro-batches, one token per micro-batch, gradient sums 1, 2 (dp 0, micro-batches 0 and 1) and
3, 4 (dp 1). Single-device training at any step: (1 + 2 + 3 + 4) / 4 = 5/2.
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction

import pytest

from placeverify.diagnostics import Code, PlaceError, Severity
from placeverify.ir.step import CountKind, Scope, TermKind
from placeverify.lower import load_text
from placeverify.semantics.counters import (
    Exponents,
    before,
    counted,
    per_step,
    per_step_strategy,
    uses_run,
)
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import Instance, atoms, run, uniform_instance
from placeverify.semantics.schedule import Unmodelled
from placeverify.semantics.steps import projection
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import verify
from placeverify.verify.agreement import agreement
from placeverify.verify.z3.integrity import encode

TEXT = """strategy "a count over the run"
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision fp32_adam
mesh { dp = 2 }
place ddp over dp
step {
    microbatches = WINDOWS
    each microbatch {
        backward LOSS
    }
    all_reduce(sum) grads over dp
    SCALE
    update params
    zero grads
}
"""


def text(loss: str, scale: str = "", windows: str = "[2, 2]") -> str:
    return (TEXT.replace("WINDOWS", windows).replace("LOSS", loss)
            .replace("    SCALE\n", f"    {scale}\n" if scale else ""))


def integrity(source: str) -> Verdict:
    return verify(load_text(source)).verdict(Condition.GRADIENT_INTEGRITY)


# ---- syntax -------------------------------------------------------------------------------------


def test_a_run_count_lowers_to_its_scope_and_reads_back() -> None:
    strategy = load_text(text("sum / tokens(dp, run)"))
    [backward] = [lo.op for lo in strategy.step.loop]
    [(term, exponent)] = [(t, e) for t, e in backward.loss.factors if t.kind is TermKind.COUNT]
    assert term.count is not None and exponent == -1
    assert (term.count.kind, term.count.axes, term.count.scope) == (CountKind.TOKENS, ("dp",),
                                                                    Scope.RUN)
    assert term.count.label() == "tokens(dp, run)"


def test_a_run_count_in_one_step_is_an_error_at_the_word() -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(text("sum / tokens(dp, run)", windows="2"), "one.place")
    [error] = [d for d in raised.value.diagnostics if d.severity is Severity.ERROR]
    # line 9 is "        backward sum / tokens(dp, run)": 'run' starts at column 35
    assert error.span is not None and (error.span.line, error.span.column) == (9, 35)
    assert error.code is Code.BAD_VALUE
    assert "spans several optimizer steps" in error.message


def test_the_cli_prints_the_error_with_its_caret(tmp_path: object) -> None:
    import pathlib
    import subprocess
    import sys

    assert isinstance(tmp_path, pathlib.Path)
    path = tmp_path / "one.place"
    path.write_text(text("sum / tokens(dp, run)", windows="2"))
    done = subprocess.run([sys.executable, "-m", "placeverify", "check", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert f"{path}:9:35: error: a count over the run ('run') or the batch" in done.stderr
    assert "   9 |         backward sum / tokens(dp, run)" in done.stderr
    assert "     |                                   ^^^" in done.stderr


# ---- the semantics by hand ------------------------------------------------------------------------


def test_the_exact_domain_at_step_2_by_hand() -> None:
    # Step 2's count over the run holds step 1's 4 tokens too: 4 + 4 = 8. Each rank divides its
    # sums by 8: dp 0 (1 + 2) / 8 = 3/8, dp 1 (3 + 4) / 8 = 7/8; the all-reduce sums them: 10/8
    # = 5/4, half the single-device 5/2. At step 1 nothing came before: 10/4 = 5/2.
    strategy = load_text(text("sum / tokens(dp, run)"))
    window = projection(strategy, 2)
    group = strategy.model.groups_present()[0]
    view = group_view(window, group)
    sizes = {"dp": 2}
    base = uniform_instance(window, view, sizes, 2)
    keys = atoms(view, sizes, 2)
    for j, consumed in ((1, Fraction(5, 2)), (2, Fraction(5, 4)), (3, Fraction(5, 6))):
        # step 3 (a third window of 2): 4 + 4 + 4 = 12 tokens, 10/12 = 5/6
        windows = ",".join(["2"] * max(j, 2))
        earlier = before(load_text(text("sum / tokens(dp, run)", windows=f"[{windows}]")),
                         keys, base.tokens, base.samples, j)
        instance = Instance(base.sizes, 2, base.tokens, base.samples, base.grads, earlier)
        result = run(window, view, instance)
        assert result.reference == Fraction(5, 2)
        assert {d.consumed for d in result.devices} == {consumed}


def test_the_exact_domain_over_the_batch_by_hand() -> None:
    # tokens(dp, batch) over [2, 2]: every step divides by both steps' 8 tokens, so step 1 and
    # step 2 both consume 10/8 = 5/4; over [2, 2, 2] by 12: 10/12 = 5/6 at every step.
    for windows, consumed in (("[2, 2]", Fraction(5, 4)), ("[2, 2, 2]", Fraction(5, 6))):
        strategy = load_text(text("sum / tokens(dp, batch)", windows=windows))
        window = projection(strategy, 2)
        view = group_view(window, strategy.model.groups_present()[0])
        base = uniform_instance(window, view, {"dp": 2}, 2)
        keys = atoms(view, {"dp": 2}, 2)
        for j in (1, 2):
            instance = Instance(base.sizes, 2, base.tokens, base.samples, base.grads,
                                before(strategy, keys, base.tokens, base.samples, j))
            result = run(window, view, instance)
            assert result.reference == Fraction(5, 2)
            assert {d.consumed for d in result.devices} == {consumed}


def test_the_exponent_domain_by_hand() -> None:
    # backward sum / tokens(dp, run): exponent -1 on the path; a scale by tokens(dp, run) adds +1
    # (net 0, the per-step value); a scale by 0 empties the buffer.
    strategy = load_text(text("sum / tokens(dp, run)", "scale grads by tokens(dp, run) / "
                              "tokens(dp, step)"))
    ops = strategy.step.ops()
    backward, scale = ops[0], ops[2]
    domain = Exponents()
    key = (CountKind.TOKENS, ("dp",), Scope.RUN)
    after_backward = domain.backward(domain.zero(), backward, 0)  # type: ignore[arg-type]
    assert after_backward == {((key, -1),)}
    assert domain.scale(after_backward, scale, 0) == {()}  # type: ignore[arg-type]


@pytest.mark.parametrize(("loss", "scale", "verdict"), [
    # the normaliser over the run: step 2 consumes half its gradient (above)
    ("sum / tokens(dp, run)", "", Verdict.REFUTED),
    # the same normaliser applied to the reduced gradients (a scale after the all-reduce)
    ("sum", "scale grads by 1 / tokens(dp, run)", Verdict.REFUTED),
    # reset every step: right at every step
    ("sum / tokens(dp, step)", "", Verdict.PROVED),
    # the whole batch's count: wrong at step 1 already
    ("sum / tokens(dp, batch)", "", Verdict.REFUTED),
    # divided by the batch's count and multiplied back: net exponent 0
    ("sum / tokens(dp, batch)", "scale grads by tokens(dp, batch) / tokens(dp, step)",
     Verdict.PROVED),
    # divided by the run's count, multiplied back and divided by the step's: net exponent 0
    ("sum / tokens(dp, run)", "scale grads by tokens(dp, run) / tokens(dp, step)",
     Verdict.PROVED),
])
def test_verdicts(loss: str, scale: str, verdict: Verdict) -> None:
    assert integrity(text(loss, scale)) is verdict


def test_the_refutation_names_step_2_the_backward_and_the_exact_values() -> None:
    verification = verify(load_text(text("sum / tokens(dp, run)")))
    refuted = [o for o in verification.obligations if o.verdict is Verdict.REFUTED]
    assert refuted and all(o.claim.endswith("at step 2 of 2") for o in refuted)
    assert all(o.span is not None and o.span.line == 9 for o in refuted)  # the backward
    assert "consumes 5/4 where the single-device gradient is 5/2" in refuted[0].reason
    # the windows' own obligations (each run count read as the step's) are all proved
    others = [o for o in verification.obligations if "own window's count" not in o.claim]
    assert others and all(o.verdict is Verdict.PROVED for o in others)


def test_a_count_over_the_batch_is_refuted_at_step_1() -> None:
    verification = verify(load_text(text("sum / tokens(dp, batch)")))
    refuted = [o for o in verification.obligations if o.verdict is Verdict.REFUTED]
    assert refuted and all(o.claim.endswith("at step 1 of 2") for o in refuted)
    assert "counts the whole batch of the 2 steps" in refuted[0].reason
    assert "consumes 5/4 where the single-device gradient is 5/2" in refuted[0].reason


def test_exponents_of_both_signs_are_not_modelled_at_the_line() -> None:
    # tokens over the run divided, samples over the run multiplied: they could cancel
    verification = verify(load_text(text("sum * samples(dp, run) / tokens(dp, run)")))
    unknown = [o for o in verification.obligations if o.kind == "not-modelled"]
    assert unknown and all(o.span is not None and o.span.line == 9 for o in unknown)
    assert verification.overall() is not Verdict.PROVED


def test_a_maximum_with_a_run_count_is_not_modelled() -> None:
    source = text("sum / tokens(dp, run)").replace("all_reduce(sum) grads over dp",
                                                    "all_reduce(max) grads over dp")
    with pytest.raises(Unmodelled):
        strategy = load_text(source)
        counted(strategy, strategy.model.groups_present()[0])
    assert verify(load_text(source)).overall() is not Verdict.PROVED


def test_every_solver_domain_judges_the_per_step_projection() -> None:
    strategy = load_text(text("sum / tokens(dp, run)"))
    group = strategy.model.groups_present()[0]
    window = projection(strategy, 2)
    assert uses_run(window.step) and not uses_run(per_step(window.step))
    # Z3 refuses a run count by name (never silently read as another scope) ...
    with pytest.raises(Unmodelled, match="a count across optimizer steps"):
        encode(window, group_view(window, group), {"dp": 2}, 2, "t_", integer=False)
    # ... and models the per-step projection, as the agreement analysis does
    reset = per_step_strategy(window)
    encode(reset, group_view(reset, group), {"dp": 2}, 2, "t_", integer=False)
    agreement(reset, group_view(reset, group))


def test_the_bug_and_its_twin() -> None:
    # huggingface/trl#6024: both steps of the generation batch divide by its 8 tokens; with
    # sum * |dp| and DDP's mean over dp, step 1 consumes (3 + 7) * 2 / 8 / 2 = 5/4, not 5/2
    from tests.conftest import EXAMPLES

    bug = verify(load_text((EXAMPLES / "bugs" / "generation-batch-token-count.place").read_text()))
    refuted = [o for o in bug.obligations if o.verdict is Verdict.REFUTED]
    assert refuted and all(o.claim.endswith("at step 1 of 2") for o in refuted)
    assert all(o.span is not None and o.span.line == 23 for o in refuted)  # the '# <--' line
    assert "consumes 5/4 where the single-device gradient is 5/2" in refuted[0].reason
    assert verify(load_text((EXAMPLES / "ok" / "generation-batch-token-count-fixed.place").read_text())
                  ).overall() is Verdict.PROVED


# ---- the replay ------------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(("scope", "verdict"), [("step", Verdict.PROVED), ("run", Verdict.REFUTED),
                                               ("batch", Verdict.REFUTED)])
def test_the_replay_keeps_the_count_over_the_steps(scope: str, verdict: Verdict) -> None:
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    pool().prestart()
    strategy = load_text(text(f"sum / tokens(dp, {scope})"))
    plan = plan_from_strategy(strategy, steps=2, known=verify(strategy))
    assert plan.expect.verdict is verdict
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges is (verdict is Verdict.REFUTED)
    assert report.verdict == "confirmed"
