"""Norms other than a sum of squares (issue 12, construct 6): ``clip(norm = inf)``, per-rank norms
combined by ``reduce = mean | max | sum``, and the declared ``clip ... norm = inf``.

Every expected verdict and number below is derived by hand from the definition of the norms
(the 2-norm of a concatenation is the square root of the sum of its parts' squared norms; the
inf norm of a concatenation is the largest of its parts' inf norms), not by running the checker.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import pytest

from placeverify.diagnostics import Code, PlaceError, Severity
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import step_text
from placeverify.ir.step import Clip, NormKind, ReduceOp
from placeverify.lower import load_text
from placeverify.lower.edit import replace_step
from placeverify.semantics.norms import Exact, computed, exact_witness, norm_model, true_norm
from placeverify.semantics.surd import Surd, sqrt_of
from placeverify.verdicts import ObligationKind, Verdict
from placeverify.verify.checks.update import update_obligations

ROOT = Path(__file__).resolve().parents[1]

EXPERTS = """\
model transformer {{ layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16, experts = 4, top_k = 2 }}
precision megatron
mesh {{ ep = 2 }}
place expert over ep
clip max_norm = 1.0{policy}
step {{
    backward sum / tokens(ep, step)
    all_reduce(sum) grads[dense, norms, embedding] over ep
    {clip}
    update params
}}
"""

DDP = """\
model transformer {{ layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }}
precision megatron
mesh {{ dp = 2 }}
place ddp over dp
clip max_norm = 1.0{policy}
step {{
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    {clip}
    update params
}}
"""

INF = ", norm = inf"


def clip_verdict(template: str, clip: str, policy: str = "") -> tuple[Verdict, str]:
    strategy = load_text(template.format(clip=clip, policy=policy), "norms.place")
    [obligation] = [o for o in update_obligations(strategy, 10_000)
                    if o.kind is ObligationKind.CLIP]
    return obligation.verdict, obligation.reason or ""


# ---- the language -----------------------------------------------------------------------------


def test_the_options_lower_to_the_clip_and_the_policy() -> None:
    strategy = load_text(DDP.format(clip="clip(max_norm = 1.0, norm = inf, reduce = mean) grads "
                                         "over dp", policy=INF))
    assert strategy.clip is not None and strategy.clip.norm is NormKind.INF
    [clip] = [op for op in strategy.step.ops() if isinstance(op, Clip)]
    assert (clip.norm, clip.reduce) == (NormKind.INF, ReduceOp.MEAN)
    # the defaults are the right combinations: squares summed for 2, maxima maxed for inf
    for written, expected in (("norm = inf", (NormKind.INF, ReduceOp.MAX)),
                              ("norm = 2", (NormKind.L2, ReduceOp.SUM)),
                              ("reduce = max", (NormKind.L2, ReduceOp.MAX))):
        s = load_text(DDP.format(clip=f"clip(max_norm = 1, {written}) grads over dp", policy=""))
        [c] = [op for op in s.step.ops() if isinstance(op, Clip)]
        assert (c.norm, c.reduce) == expected


def test_the_rendered_step_reads_back_the_same() -> None:
    text = DDP.format(clip="clip(max_norm = 1, norm = inf, reduce = mean) grads over dp",
                      policy=INF)
    rendered = step_text(load_text(text))
    assert "clip(max_norm = 1, norm = inf, reduce = mean) grads over dp" in rendered
    head = text.split("step {")[0]
    assert step_text(load_text(head + rendered)) == rendered
    # the defaults are not written: a file without the options renders as before
    plain = step_text(load_text(DDP.format(clip="clip(max_norm = 1, norm = 2, reduce = sum) "
                                                "grads over dp", policy="")))
    assert "clip(max_norm = 1) grads over dp" in plain


def test_norm_of_lowers_to_the_measured_groups_and_reads_back() -> None:
    text = EXPERTS.format(clip="clip(max_norm = 1.0, norm_of = [embedding, dense]) grads over ep",
                          policy="")
    strategy = load_text(text)
    [clip] = [op for op in strategy.step.ops() if isinstance(op, Clip)]
    assert clip.measured == {ParamGroup.DENSE, ParamGroup.EMBEDDING}
    assert clip.measures(ParamGroup.DENSE) and not clip.measures(ParamGroup.EXPERTS)
    rendered = step_text(strategy)
    assert "clip(max_norm = 1, norm_of = [dense, embedding]) grads over ep" in rendered
    assert step_text(load_text(text.split("step {")[0] + rendered)) == rendered
    verdict, reason = clip_verdict(EXPERTS, "clip(max_norm = 1.0, norm_of = [dense, norms, "
                                            "embedding]) grads over ep")
    assert verdict is Verdict.REFUTED
    assert ("its norm is computed over dense, norms, embedding only and leaves out experts, "
            "whose gradients it scales") in reason


@pytest.mark.parametrize(("clip", "policy", "line", "code", "message"), [
    ("clip(max_norm = 1, norm_of = [dense, bias]) grads over dp", "", 9, Code.UNKNOWN_NAME,
     "unknown parameter group 'bias'"),
    ("clip(max_norm = 1, norm_of = [experts]) grads over dp", "", 9, Code.BAD_VALUE,
     "this model has no 'experts' parameters"),
    ("clip(max_norm = 1, norm = 1) grads over dp", "", 9, Code.BAD_VALUE,
     "a clip's norm is 2 or inf, not '1'"),
    ("clip(max_norm = 1, reduce = avg) grads over dp", "", 9, Code.UNKNOWN_NAME,
     "unknown norm reduction 'avg'"),
    ("clip(max_norm = 1) grads over dp", ", norm = fro", 5, Code.BAD_VALUE,
     "a clip's norm is 2 or inf, not 'fro'"),
])
def test_other_norms_are_positioned_errors(clip: str, policy: str, line: int, code: Code,
                                           message: str) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(DDP.format(clip=clip, policy=policy))
    [error] = [d for d in raised.value.diagnostics if d.severity is Severity.ERROR]
    assert error.span is not None and error.span.line == line
    assert error.code is code
    assert error.message.startswith(message)


# ---- the exact domain, by hand --------------------------------------------------------------------

DENSE, EXPERT = ParamGroup.DENSE, ParamGroup.EXPERTS


def _model(norm: NormKind, reduce: ReduceOp, once: bool) -> object:
    """Dense parameters copied along ep, experts split over it (two parts); a clip over ep."""
    from placeverify.diagnostics import Span
    from placeverify.ir.mesh import Group

    clip = Clip(Fraction(1), Group(("ep",)), once, Span(1, 1, 1, 1), norm=norm, reduce=reduce)
    return norm_model(clip, {DENSE: set(), EXPERT: {"ep"}}, {"ep"})


def test_the_mean_of_per_rank_2_norms_by_hand() -> None:
    # squared norms: dense 1 (a copy on both ranks), experts 4 on ep 0 and 9 on ep 1
    parts = {(DENSE, ()): Fraction(1), (EXPERT, (0,)): Fraction(4), (EXPERT, (1,)): Fraction(9)}
    model = _model(NormKind.L2, ReduceOp.MEAN, once=False)
    exact = Exact()
    assert true_norm(model, exact, parts, NormKind.L2) == sqrt_of(14)  # type: ignore[arg-type]
    # each rank: sqrt(1 + 4) and sqrt(1 + 9), averaged
    mean = Surd({5: Fraction(1, 2), 10: Fraction(1, 2)})
    assert computed(model, exact, parts) == {(0,): mean, (1,): mean}  # type: ignore[arg-type]
    # summing the squares with the copy counted once is the global norm on both ranks
    model = _model(NormKind.L2, ReduceOp.SUM, once=True)
    assert set(computed(model, exact, parts).values()) == {sqrt_of(14)}  # type: ignore[arg-type]


def test_inf_norms_by_hand() -> None:
    # largest elements: dense 3 (a copy), experts 5 on ep 0 and 2 on ep 1; the global one is 5
    parts = {(DENSE, ()): Fraction(3), (EXPERT, (0,)): Fraction(5), (EXPERT, (1,)): Fraction(2)}
    exact = Exact()
    cases = {  # (reduce, copies counted once) -> what every rank computes
        (ReduceOp.MAX, True): Fraction(5), (ReduceOp.MAX, False): Fraction(5),
        (ReduceOp.SUM, False): Fraction(5 + 3),  # max(3, 5) + max(3, 2)
        (ReduceOp.SUM, True): Fraction(5 + 2),  # ep 1 leaves its copy of dense out
        (ReduceOp.MEAN, False): Fraction(5 + 3, 2),
    }
    for (reduce, once), expected in cases.items():
        model = _model(NormKind.INF, reduce, once)
        assert true_norm(model, exact, parts, NormKind.INF) == 5  # type: ignore[arg-type]
        assert set(computed(model, exact, parts).values()) == {expected}  # type: ignore[arg-type]


def test_a_witness_is_found_exactly_where_the_combination_is_wrong() -> None:
    assert exact_witness(_model(NormKind.L2, ReduceOp.SUM, True), NormKind.L2) is None  # type: ignore[arg-type]
    assert exact_witness(_model(NormKind.INF, ReduceOp.MAX, False), NormKind.INF) is None  # type: ignore[arg-type]
    found = exact_witness(_model(NormKind.L2, ReduceOp.MEAN, False), NormKind.L2)  # type: ignore[arg-type]
    assert found is not None and found.wrong() == [(0,), (1,)]


# ---- verdicts: Z3 over every combination, expected by hand ----------------------------------------

# Experts are split over ep and the dense copies are identical: a mean, maximum or sum of per-rank
# norms over ranks holding different experts is not the norm of the whole; squares summed (2) or
# maxima maxed (inf) is. Without a group each rank sees only its own experts.
EXPERT_CASES = [
    ("clip(max_norm = 1.0) grads over ep", "", Verdict.PROVED),
    ("clip(max_norm = 1.0, reduce = mean, replicated = every_rank) grads over ep", "",
     Verdict.REFUTED),
    ("clip(max_norm = 1.0, reduce = mean) grads over ep", "", Verdict.REFUTED),
    ("clip(max_norm = 1.0, reduce = max) grads over ep", "", Verdict.REFUTED),
    ("clip(max_norm = 1.0, replicated = every_rank) grads over ep", "", Verdict.REFUTED),
    ("clip(max_norm = 1.0, norm = inf) grads over ep", INF, Verdict.PROVED),
    ("clip(max_norm = 1.0, norm = inf, replicated = every_rank) grads over ep", INF,
     Verdict.PROVED),  # a maximum does not care how often a copy is seen
    ("clip(max_norm = 1.0, norm = inf) grads", INF, Verdict.REFUTED),
    ("clip(max_norm = 1.0, norm = inf, reduce = sum) grads over ep", INF, Verdict.REFUTED),
    ("clip(max_norm = 1.0, norm = inf, reduce = mean) grads over ep", INF, Verdict.REFUTED),
    # per-group norms: every group measured is the default; the shared groups only are not
    ("clip(max_norm = 1.0, norm_of = [dense, norms, embedding, experts]) grads over ep", "",
     Verdict.PROVED),
    ("clip(max_norm = 1.0, norm_of = [dense, norms, embedding]) grads over ep", "",
     Verdict.REFUTED),
    ("clip(max_norm = 1.0, norm = inf, norm_of = [experts]) grads over ep", INF, Verdict.REFUTED),
]

# Plain DDP: every rank holds the whole (reduced) gradient. A mean or maximum of identical norms
# is that norm; counting copies once leaves rank 1 with nothing, which a mean halves, a maximum
# ignores, and a sum needs; counting them on every rank doubles a sum.
DDP_CASES = [
    ("clip(max_norm = 1.0, reduce = mean, replicated = every_rank) grads over dp", "",
     Verdict.PROVED),
    ("clip(max_norm = 1.0, reduce = mean) grads over dp", "", Verdict.REFUTED),
    ("clip(max_norm = 1.0, reduce = max) grads over dp", "", Verdict.PROVED),
    ("clip(max_norm = 1.0, reduce = max, replicated = every_rank) grads over dp", "",
     Verdict.PROVED),
    ("clip(max_norm = 1.0, norm = inf) grads", INF, Verdict.PROVED),
    ("clip(max_norm = 1.0, norm = inf, reduce = sum) grads over dp", INF, Verdict.PROVED),
    ("clip(max_norm = 1.0, norm = inf, reduce = sum, replicated = every_rank) grads over dp", INF,
     Verdict.REFUTED),
    ("clip(max_norm = 1.0, norm = inf, reduce = mean, replicated = every_rank) grads over dp",
     INF, Verdict.PROVED),
    ("clip(max_norm = 1.0, norm = inf, reduce = mean) grads over dp", INF, Verdict.REFUTED),
    ("clip(max_norm = 1.0, norm_of = [dense]) grads over dp", "", Verdict.REFUTED),
]


@pytest.mark.parametrize(("clip", "policy", "expected"), EXPERT_CASES)
def test_expert_parallel_clips(clip: str, policy: str, expected: Verdict) -> None:
    assert clip_verdict(EXPERTS, clip, policy)[0] is expected


@pytest.mark.parametrize(("clip", "policy", "expected"), DDP_CASES)
def test_data_parallel_clips(clip: str, policy: str, expected: Verdict) -> None:
    assert clip_verdict(DDP, clip, policy)[0] is expected


def test_a_clip_by_another_norm_than_the_policy_is_refuted_where_it_stands() -> None:
    verdict, reason = clip_verdict(DDP, "clip(max_norm = 1.0) grads over dp", INF)
    assert verdict is Verdict.REFUTED
    assert "it clips by the 2-norm where the declared policy clips by the inf norm" in reason
    strategy = load_text(DDP.format(clip="clip(max_norm = 1.0, reduce = mean) grads over dp",
                                    policy=INF))
    [obligation] = [o for o in update_obligations(strategy, 10_000)
                    if o.kind is ObligationKind.CLIP]
    assert obligation.fix is not None
    assert obligation.fix.startswith("clip(max_norm = 1, norm = inf) grads over dp")
    verdict, reason = clip_verdict(DDP, "clip(max_norm = 1.0, norm = inf) grads over dp")
    assert verdict is Verdict.REFUTED
    assert "it clips by the inf norm where the declared policy clips by the 2-norm" in reason


def test_the_refutation_shows_an_exact_witness() -> None:
    verdict, reason = clip_verdict(
        EXPERTS, "clip(max_norm = 1.0, reduce = mean, replicated = every_rank) grads over ep")
    assert verdict is Verdict.REFUTED
    assert "averages the per-rank 2-norms over ep" in reason
    # the first candidate: squared norms 1, 4, 9, 16, 25 for dense, norms, embedding and the two
    # expert parts; the whole is sqrt(55), ep 0 computes (sqrt(1 + 4 + 9 + 16) + sqrt(1 + 4 + 9
    # + 25)) / 2
    assert "the global 2-norm is sqrt(55)" in reason
    assert "rank (ep 0) computes 1/2*sqrt(30) + 1/2*sqrt(39)" in reason


def test_files_without_the_options_keep_their_claim_words() -> None:
    strategy = load_text(DDP.format(clip="clip(max_norm = 1.0) grads over dp", policy=""))
    [obligation] = [o for o in update_obligations(strategy, 10_000)
                    if o.kind is ObligationKind.CLIP]
    assert obligation.claim == ("clipping scales the update by min(1, 1 / ||g||) with the "
                                "global norm of the single-device gradient")
    assert obligation.method == "z3 (real arithmetic over squared norms)"


# ---- the soundness harness's operator -----------------------------------------------------------


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soundness", ROOT / "benchmarks" / "soundness.py")
    assert spec is not None and spec.loader is not None
    if "soundness" in sys.modules:  # tests/test_soundness.py loaded it already
        return sys.modules["soundness"]
    module = importlib.util.module_from_spec(spec)
    sys.modules["soundness"] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def _mutated_clips(text: str) -> list[str]:
    soundness = _harness()
    strategy = load_text(text)
    body = soundness.StepBody.parse(step_text(strategy))
    base = soundness.Base("<text>", "written", replace_step(text, None), body,
                          soundness.Context.of(strategy))
    made = [mutant.flat() for mutant in soundness.OPERATORS["change_clip_norm"](base.body,
                                                                               base.context)]
    return sorted(s for flat in made for s in flat if s.startswith("clip("))


def test_the_norm_operator_changes_the_norm_and_the_combination() -> None:
    assert _mutated_clips(DDP.format(clip="clip(max_norm = 1) grads over dp", policy="")) == [
        "clip(max_norm = 1, norm = inf) grads over dp",
        "clip(max_norm = 1, norm_of = [dense]) grads over dp",
        "clip(max_norm = 1, reduce = max) grads over dp",
        "clip(max_norm = 1, reduce = mean) grads over dp"]
    assert _mutated_clips(DDP.format(clip="clip(max_norm = 1, norm = inf) grads over dp",
                                     policy=INF)) == [
        "clip(max_norm = 1) grads over dp",
        "clip(max_norm = 1, norm = inf, norm_of = [dense]) grads over dp",
        "clip(max_norm = 1, norm = inf, reduce = mean) grads over dp",
        "clip(max_norm = 1, norm = inf, reduce = sum) grads over dp"]


# ---- the replay's --emit refuses it by name ----------------------------------------------------------


def test_emit_refuses_a_clip_by_another_norm(tmp_path: Path) -> None:
    # emit writes data-parallel steps only: a mean of per-rank norms that counts copies once
    source = tmp_path / "mean.place"
    source.write_text(DDP.format(clip="clip(max_norm = 1.0, reduce = mean) grads over dp",
                                 policy=""), encoding="utf-8")
    trace = tmp_path / "t.json"
    env_run = [sys.executable, "-m", "placeverify"]
    done = subprocess.run([*env_run, "check", str(source), "--trace", str(trace)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    out = tmp_path / "repro.py"
    done = subprocess.run([*env_run, "replay", str(trace), "--emit", str(out)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "line 9: 'clip(max_norm = 1, reduce = mean) grads over dp'" in done.stderr, done.stderr
    assert "is not emitted" in done.stderr, done.stderr
    assert not out.exists()


# ---- the torch replay agrees with Z3 on every combination ----------------------------------------


@pytest.fixture(scope="module")
def replay_pool() -> object:
    pytest.importorskip("torch")
    from placeverify.backend.runtime import pool

    pool().prestart()
    return pool()


# An inf-norm clip that misses a part is wrong only when the largest element lies in that part.
# The replay's model puts it in the dense parameters (4.0 against 1.03 in the experts in the
# first step of EXPERTS), which every expert-parallel rank holds; the replay weights the groups
# an inf-norm clip misses by 8 on both sides (Setup.grad_weights), and ep-7 diverges only so.


def test_the_replay_weights_the_groups_an_inf_norm_clip_misses() -> None:
    pytest.importorskip("torch")
    from placeverify.replay.reference import INF_NORM_WEIGHT, Setup

    def weights(template: str, clip: str, policy: str) -> dict[ParamGroup, float]:
        setup = object.__new__(Setup)
        setup.strategy = load_text(template.format(clip=clip, policy=policy))
        return setup.grad_weights

    # no group: the experts, split over ep, are the part each rank misses
    assert weights(EXPERTS, "clip(max_norm = 1.0, norm = inf) grads", INF) == {
        EXPERT: INF_NORM_WEIGHT}
    # not measured: the groups left out
    assert weights(DDP, "clip(max_norm = 1.0, norm = inf, norm_of = [dense]) grads over dp",
                   INF) == {ParamGroup.NORMS: INF_NORM_WEIGHT,
                            ParamGroup.EMBEDDING: INF_NORM_WEIGHT}
    # a clip that misses nothing, and the 2-norm (a sum sees every part), are left alone
    assert weights(EXPERTS, "clip(max_norm = 1.0, norm = inf) grads over ep", INF) == {}
    assert weights(EXPERTS, "clip(max_norm = 1.0) grads", "") == {}


@pytest.mark.torch
@pytest.mark.parametrize(("template", "clip", "policy", "expected"),
                         [pytest.param(EXPERTS, c, p, v, id=f"ep-{i}")
                          for i, (c, p, v) in enumerate(EXPERT_CASES)]
                         + [pytest.param(DDP, c, p, v, id=f"dp-{i}")
                            for i, (c, p, v) in enumerate(DDP_CASES)])
def test_the_real_run_agrees_with_the_verdict(replay_pool: object, template: str, clip: str,
                                              policy: str, expected: Verdict) -> None:
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    strategy = load_text(template.format(clip=clip, policy=policy), "norms.place")
    plan = plan_from_strategy(strategy, steps=3)
    assert plan.expect.verdict is expected
    report = execute(plan, timeout=120, source=plan.main.path)
    assert report.error is None, report.error
    assert report.main is not None
    outcome = report.main.outcome
    assert outcome.diverges is (expected is Verdict.REFUTED), (outcome.max_vs_reference,
                                                               outcome.tolerance)


# ---- the agreement domain: the factor is shared along the clip's group, whatever it combines ------


@pytest.mark.parametrize(("template", "clip", "policy", "consistency"), [
    # an all-reduce over ep gives both ranks one (wrong) norm: the dense copies stay identical
    (EXPERTS, "clip(max_norm = 1.0, reduce = mean, replicated = every_rank) grads over ep", "",
     Verdict.PROVED),
    (EXPERTS, "clip(max_norm = 1.0, norm = inf, reduce = sum) grads over ep", INF, Verdict.PROVED),
    # no group: each rank divides by its own experts' norm, so the dense copies drift apart
    (EXPERTS, "clip(max_norm = 1.0, norm = inf) grads", INF, Verdict.REFUTED),
    # plain DDP: every rank holds the same gradient, so even a local norm is shared
    (DDP, "clip(max_norm = 1.0, norm = inf, reduce = mean) grads over dp", INF, Verdict.PROVED),
])
def test_the_clip_factor_is_shared_along_the_group(template: str, clip: str, policy: str,
                                                   consistency: Verdict) -> None:
    from placeverify.verdicts import Condition
    from placeverify.verify import verify

    verification = verify(load_text(template.format(clip=clip, policy=policy), "norms.place"))
    assert verification.verdict(Condition.STATE_CONSISTENCY) is consistency
    assert verification.verdict(Condition.GRADIENT_INTEGRITY) is Verdict.REFUTED


# ---- two ranks per axis: the verdict does not change with three -----------------------------------


def _judged_by_the_norm(clip: str) -> bool:
    """Not refuted by rule first: a norm_of that leaves a group out is, whatever the mesh."""
    return "norm_of" not in clip or "norm_of = [dense, norms, embedding, experts]" in clip


@pytest.mark.parametrize(("template", "clip", "policy", "expected"),
                         [(EXPERTS, c, p, v) for c, p, v in EXPERT_CASES if _judged_by_the_norm(c)]
                         + [(DDP, c, p, v) for c, p, v in DDP_CASES if _judged_by_the_norm(c)])
def test_three_ranks_per_axis_give_the_same_verdict(template: str, clip: str, policy: str,
                                                    expected: Verdict) -> None:
    from placeverify.semantics.groups import group_view
    from placeverify.verify.agreement import agreement
    from placeverify.verify.checks.clip_norms import norm_obligation
    from placeverify.verify.checks.update import clip_policy_norm

    strategy = load_text(template.format(clip=clip, policy=policy), "norms.place")
    [op] = [o for o in strategy.step.ops() if isinstance(o, Clip)]
    groups = strategy.model.groups_present()
    assert op.norm is clip_policy_norm(strategy) and all(op.measures(g) for g in groups)
    views = {g: group_view(strategy, g) for g in groups}
    agreed = {g: agreement(strategy, views[g]) for g in groups}
    verdicts = {width: norm_obligation(strategy, op, clip_policy_norm(strategy), groups, views,
                                       agreed, 10_000, width).verdict for width in (2, 3)}
    # (the sum of squares has its own encoding in a check; this one agrees with it too)
    assert verdicts == {2: expected, 3: expected}
