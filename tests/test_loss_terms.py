"""Several loss terms (issue 12, construct 1): ``loss aux: ...`` beside the main loss and
``backward aux: ...`` in the step.

Expected numbers are worked out by hand from the declared normalisations: a token-mean term weighs
an atom's gradient sum by 1 / (the global token count), a plain ``sum`` term by 1, and a term that
does not reach a parameter group adds nothing to it.
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction

import pytest

from placeverify.diagnostics import Code, PlaceError
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import step_text
from placeverify.ir.step import Backward, CountKind, TermKind
from placeverify.ir.strategy import LossKind
from placeverify.lower import load, load_text
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.semantics.schedule import Unmodelled
from placeverify.semantics.terms import nonlinear, projection, term_views
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import verify
from placeverify.verify.z3.integrity import encode
from tests.conftest import EXAMPLES

HEAD = """\
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision mixed_adam
mesh { dp = 2 }
place ddp over dp
"""


def strategy_of(losses: str, step: str, head: str = HEAD) -> object:
    return load_text(head + losses + "step {\n" + step + "\n}\n")


def integrity(text_losses: str, step: str, head: str = HEAD) -> dict[str, Verdict]:
    """Each gradient-integrity claim's verdict (the claims name the group and the term)."""
    strategy = strategy_of(text_losses, step, head)
    verification = verify(strategy)  # type: ignore[arg-type]
    return {o.claim: o.verdict for o in verification.obligations
            if o.condition is Condition.GRADIENT_INTEGRITY}


def claim(group: str, kind: str, term: str) -> str:
    return (f"the optimizer consumes the single-device gradient of the global batch ({kind}) "
            f"for the {group} parameters, loss term {term}")


# ---- the language ------------------------------------------------------------------------------


def test_a_named_term_lowers_with_its_normalisation_reach_and_backward() -> None:
    s = load_text(HEAD + "loss token_mean\nloss aux: sample_mean reaches dense, norms\n"
                  "step {\n backward sum / tokens(dp, step)\n backward aux: mean / |dp|\n"
                  " all_reduce(sum) grads over dp\n update params\n}\n")
    assert s.loss.kind is LossKind.TOKEN_MEAN
    (term,) = s.terms
    assert (term.name, term.loss.kind, term.reaches) == (
        "aux", LossKind.SAMPLE_MEAN, frozenset({ParamGroup.DENSE, ParamGroup.NORMS}))
    backwards = [op for op in s.step.ops() if isinstance(op, Backward)]
    assert [(b.term, b.reaches) for b in backwards] == [
        ("", None), ("aux", frozenset({ParamGroup.DENSE, ParamGroup.NORMS}))]
    # 'mean' in the term's backward counts the unit of the term's normalisation: samples
    counts = [(t.count.kind, e) for t, e in backwards[1].loss.factors
              if t.kind is TermKind.COUNT and t.count is not None]
    assert counts == [(CountKind.SAMPLES, -1)]
    assert "backward aux: sum / samples / |dp|" in step_text(s)


@pytest.mark.parametrize(("losses", "step", "code", "line", "column", "words"), [
    ("loss aux: token_mean\n", "backward sum\nbackward axu: sum", Code.UNKNOWN_NAME, 8, 10,
     "no loss term 'axu'; did you mean 'aux'?"),
    ("loss aux: token_mean\nloss aux: sum\n", "backward sum", Code.DUPLICATE, 6, 1,
     "duplicate loss term 'aux'"),
    ("loss main: token_mean\n", "backward sum", Code.BAD_VALUE, 5, 6, "'main' names the main loss"),
    ("loss aux: sum reaches dens\n", "backward sum", Code.UNKNOWN_NAME, 5, 23,
     "unknown parameter group 'dens'"),
    ("loss aux: sum reaches experts\n", "backward sum", Code.BAD_VALUE, 5, 23,
     "this model has no 'experts' parameters"),
    ("loss aux: sum\n", "backward sum\nbackward aux: sum\nbackward aux: sum", Code.DUPLICATE, 9, 1,
     "a step has one 'backward aux: ...'"),
    ("loss token_mean\nloss token_mean\n", "backward sum", Code.DUPLICATE, 6, 1,
     "duplicate 'loss' statement"),
])
def test_bad_terms_are_located_errors(losses: str, step: str, code: Code, line: int, column: int,
                                      words: str) -> None:
    with pytest.raises(PlaceError) as err:
        strategy_of(losses, step + "\nupdate params")
    found = [d for d in err.value.diagnostics if d.code is code]
    assert found, [d.message for d in err.value.diagnostics]
    assert words in found[0].message
    assert found[0].span is not None and (found[0].span.line, found[0].span.column) == (line, column)


# ---- term by term ---------------------------------------------------------------------------------


def test_the_projection_keeps_one_term_and_silences_the_others() -> None:
    s = load(str(EXAMPLES / "bugs" / "moe-aux-loss-local-tokens.place"))
    main, aux = term_views(s)
    assert (main.label, aux.label) == ("main", "aux")
    p = projection(s, main)
    assert p.terms == () and p.loss.kind is LossKind.TOKEN_MEAN
    assert [(b.term, b.reaches) for b in p.step.ops() if isinstance(b, Backward)] == [
        ("", None), ("aux", frozenset())]
    q = projection(s, aux)
    assert [(b.term, b.reaches) for b in q.step.ops() if isinstance(b, Backward)] == [
        ("", frozenset()), ("aux", None)]


def test_the_megatron_aux_loss_bug_is_refuted_for_the_aux_term_only() -> None:
    path = EXAMPLES / "bugs" / "moe-aux-loss-local-tokens.place"
    verification = verify(load(str(path)))
    verdicts = {o.claim: o.verdict for o in verification.obligations
                if o.condition is Condition.GRADIENT_INTEGRITY}
    groups = ("dense", "norms", "embedding", "experts")
    assert all(verdicts[claim(g, "token_mean", "main")] is Verdict.PROVED for g in groups)
    assert all(verdicts[claim(g, "token_mean", "aux")] is Verdict.REFUTED for g in groups)
    first = verification.first_refuted()
    assert first is not None and first.span is not None and first.span.line == 23
    # the aux gradient: (sum / T) * (T / |tp|) / T_global = sum / (|tp| T_global), the
    # reference sum / T_global: half of it at |tp| = 2, where the counterexample is
    assert first.counterexample is not None
    assert "tp = 2" in first.reason and "consumes 1/2" in first.reason
    assert first.fix is not None and first.fix.startswith(
        "loss term aux's gradients are too small by a factor |tp|: multiply its backward by |tp|")


def test_the_fixed_twin_is_proved() -> None:
    verification = verify(load(str(EXAMPLES / "ok" / "moe-aux-loss-local-tokens-fixed.place")))
    assert verification.overall() is Verdict.PROVED


CANCEL = ("loss token_mean\nloss aux: token_mean\n",
          "backward 1.5 * sum / tokens(dp, step)\nbackward aux: 0.5 * sum / tokens(dp, step)\n"
          "all_reduce(sum) grads over dp\nupdate params")


def test_terms_wrong_in_opposite_directions_do_not_cancel() -> None:
    # on one gradient value per atom the weights add up: 3/2 + 1/2 = 1 + 1 (no mismatch) ...
    s = strategy_of(*CANCEL)
    view = group_view(s, ParamGroup.DENSE)  # type: ignore[arg-type]
    instance = uniform_instance(s, view, {"dp": 2}, 1, {((0,), 0): 1, ((1,), 0): 3})  # type: ignore[arg-type]
    assert run(s, view, instance).mismatches() == []  # type: ignore[arg-type]
    # ... but the terms have gradients of their own: each one is refuted
    verdicts = integrity(*CANCEL)
    assert verdicts[claim("dense", "token_mean", "main")] is Verdict.REFUTED
    assert verdicts[claim("dense", "token_mean", "aux")] is Verdict.REFUTED


def test_the_exact_reference_sums_the_terms_that_reach_the_group() -> None:
    s = strategy_of("loss token_mean\nloss aux: sum reaches norms\n",
                    "backward sum / tokens(dp, step)\nbackward aux: sum\n"
                    "all_reduce(sum) grads over dp\nupdate params")
    tokens = {((0,), 0): 1, ((1,), 0): 3}
    # uniform_instance: gradient sums tokens x (n + 1): 1 and 6; the global token count is 4
    norms = group_view(s, ParamGroup.NORMS)  # type: ignore[arg-type]
    got = run(s, norms, uniform_instance(s, norms, {"dp": 2}, 1, tokens))  # type: ignore[arg-type]
    assert got.reference == Fraction(1, 4) * 1 + 1 + Fraction(1, 4) * 6 + 6  # 35/4
    assert got.mismatches() == []
    dense = group_view(s, ParamGroup.DENSE)  # type: ignore[arg-type]
    got = run(s, dense, uniform_instance(s, dense, {"dp": 2}, 1, tokens))  # type: ignore[arg-type]
    assert got.reference == Fraction(7, 4)  # the aux term does not reach the dense weights
    assert [d.consumed for d in got.devices] == [Fraction(7, 4)] * 2


def test_a_term_is_judged_only_where_it_reaches() -> None:
    verdicts = integrity("loss token_mean\nloss aux: token_mean reaches norms\n",
                         "backward sum / tokens(dp, step)\nbackward aux: sum\n"
                         "all_reduce(sum) grads over dp\nupdate params")
    assert verdicts[claim("norms", "token_mean", "aux")] is Verdict.REFUTED  # not normalised
    assert claim("dense", "token_mean", "aux") not in verdicts
    assert verdicts[claim("dense", "token_mean", "main")] is Verdict.PROVED


def test_a_declared_term_never_back_propagated_is_refuted() -> None:
    verdicts = integrity("loss token_mean\nloss aux: token_mean\n",
                         "backward sum / tokens(dp, step)\nall_reduce(sum) grads over dp\n"
                         "update params")
    assert verdicts[claim("dense", "token_mean", "aux")] is Verdict.REFUTED
    assert verdicts[claim("dense", "token_mean", "main")] is Verdict.PROVED


def test_a_maximum_of_gradients_with_several_terms_is_not_modelled() -> None:
    s = strategy_of("loss token_mean\nloss aux: token_mean\n",
                    "backward sum / tokens(dp, step)\nbackward aux: sum / tokens(dp, step)\n"
                    "all_reduce(max) grads over dp\nupdate params")
    assert nonlinear(s) is not None  # type: ignore[arg-type]
    verification = verify(s)  # type: ignore[arg-type]
    integrity_obligations = [o for o in verification.obligations
                             if o.condition is Condition.GRADIENT_INTEGRITY and "loss term" in o.claim]
    assert len(integrity_obligations) == 6  # two terms x three groups
    assert all(o.verdict is Verdict.UNKNOWN and o.reason is not None
               and o.reason.startswith("not modelled") for o in integrity_obligations)
    assert verification.overall() is not Verdict.PROVED


def test_one_encoding_of_several_terms_is_refused() -> None:
    s = load(str(EXAMPLES / "ok" / "moe-aux-loss-local-tokens-fixed.place"))
    view = group_view(s, ParamGroup.DENSE)
    with pytest.raises(Unmodelled, match="several loss terms"):
        encode(s, view, {"tp": 2, "dp": 2}, 2, "x_", integer=False)


def test_a_file_without_a_step_gets_one_canonical_backward_per_term() -> None:
    s = load_text(HEAD.replace("mesh { dp = 2 }", "mesh { dp = 2, cp = 2 }")
                  + "place context over cp\nloss token_mean\nloss aux: microbatch_mean\n"
                  "microbatches = 2\n")
    text = step_text(s)
    assert "backward sum / tokens(dp, cp, step)" in text
    assert "backward aux: sum / tokens(cp) / microbatches / |dp|" in text
    assert verify(s).overall() is Verdict.PROVED


def test_replay_emit_refuses_named_terms() -> None:
    from placeverify.replay.emit import EmitRefused, check_layout

    s = strategy_of("loss token_mean\nloss aux: token_mean\n",
                    "backward sum / tokens(dp, step)\nbackward aux: sum / tokens(dp, step)\n"
                    "all_reduce(sum) grads over dp\nupdate params")
    with pytest.raises(EmitRefused, match="named loss terms are not emitted"):
        check_layout(s)  # type: ignore[arg-type]


def test_files_without_terms_are_judged_as_before() -> None:
    s = load(str(EXAMPLES / "bugs" / "double-division.place"))
    assert s.terms == ()
    claims = [o.claim for o in verify(s).obligations
              if o.condition is Condition.GRADIENT_INTEGRITY]
    assert claims and not any("loss term" in c for c in claims)


# ---- the torch replay --------------------------------------------------------------------------

REACH = """\
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision megatron
mesh { dp = 2, cp = 2 }
place ddp over dp
place context over cp
loss token_mean
loss aux: microbatch_mean reaches norms
step {
    microbatches = 2
    backward sum / tokens(dp, cp, step)
    backward aux: AUX
    all_reduce(sum) grads over dp * cp
    update params
}
"""


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(("aux", "verdict"), [
    ("sum / tokens(cp) / microbatches / |dp|", Verdict.PROVED),  # the term's own normalisation
    ("sum / tokens / microbatches / |dp|", Verdict.REFUTED),  # one context rank's tokens only
])
def test_the_replay_runs_a_term_that_reaches_one_group(aux: str, verdict: Verdict) -> None:
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    pool().prestart()
    strategy = load_text(REACH.replace("AUX", aux))
    plan = plan_from_strategy(strategy, steps=2)
    assert plan.expect.verdict is verdict
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges is (verdict is Verdict.REFUTED)
    assert report.verdict == "confirmed"


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_replay_tells_terms_apart_where_their_errors_cancel_on_one_gradient() -> None:
    # main x 3/2 and aux x 1/2: right on equal gradients, wrong on the replay's own per-term
    # losses (L and L^2 / 2 have gradients in different directions)
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    pool().prestart()
    plan = plan_from_strategy(strategy_of(*CANCEL), steps=2)  # type: ignore[arg-type]
    assert plan.expect.verdict is Verdict.REFUTED
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges
    assert report.verdict == "confirmed"


def test_counterexamples_keep_counts_a_trace_can_hold() -> None:
    # a constant factor 2 (any count shows it): the solver may pick any token count, but a shown
    # counterexample uses counts a trace holds (1..4096); before, one group got 2^41 tokens and
    # the soundness harness an internal error writing its trace
    import re

    from placeverify.trace import MAX_ATOM_COUNT

    s = load_text(HEAD.replace("mesh { dp = 2 }", "mesh { tp = 2, dp = 2 }")
                  .replace("place ddp over dp", "place megatron(sequence_parallel) over tp\n"
                           "place ddp over dp")
                  + "step {\n backward mean * tokens * 2\n all_reduce(sum) grads[norms] over tp\n"
                    " all_reduce(sum) grads over dp\n scale grads by 1 / tokens(dp, step)\n"
                    " update params\n}\n")
    reasons = [o.reason or "" for o in verify(s).obligations if o.verdict is Verdict.REFUTED]
    assert len(reasons) >= 3
    counts = [int(n) for r in reasons for n in re.findall(r"(\d+) tokens?\b", r)]
    assert counts and max(counts) <= MAX_ATOM_COUNT


def test_a_backward_that_does_not_reach_a_group_leaves_its_replicas_identical() -> None:
    # the aux backward runs after the reduction: the norms' replicas drift apart (its gradient is
    # rank-local), the dense replicas do not (nothing of the aux term reaches them)
    s = strategy_of("loss token_mean\nloss aux: token_mean reaches norms\n",
                    "each microbatch {\n backward sum / tokens(dp, step)\n"
                    " all_reduce(sum) grads over dp\n backward aux: sum / tokens(dp, step)\n}\n"
                    "update params", HEAD.replace("mixed_adam", "megatron"))  # no skipped steps
    consistency = {o.claim.split(" parameters")[0]: o.verdict for o in verify(s).obligations  # type: ignore[arg-type]
                   if o.condition is Condition.STATE_CONSISTENCY and "across dp" in o.claim}
    assert consistency == {"dense": Verdict.PROVED, "norms": Verdict.REFUTED,
                           "embedding": Verdict.PROVED}


def test_set_loss_overrides_the_main_loss_only() -> None:
    from placeverify.lower.overrides import parse_settings

    text = HEAD + "loss aux: microbatch_mean\nloss token_mean\n"
    s = load_text(text, "<text>", parse_settings(["loss=sum"]))
    assert s.loss.kind is LossKind.SUM
    assert [(t.name, t.loss.kind) for t in s.terms] == [("aux", LossKind.MICROBATCH_MEAN)]


def test_a_trace_replayed_on_another_mesh_is_judged_at_its_own_micro_batch_count() -> None:
    # found by rescale_term: an aux term right only when |dp| equals the micro-batch count. The
    # trace has 2 micro-batches (the file 4); replayed at dp = 4, Z3 was asked at the file's 4
    # (proved: 4 = 4) while the run used the trace's 2, which diverges. Z3 now sees the 2.
    from placeverify.api import check
    from placeverify.replay.plan import plan_from_trace

    text = (EXAMPLES / "bugs" / "moe-aux-loss-accumulation.place").read_text(encoding="utf-8")
    s = load_text(text.replace("backward aux: mean                       # <-- no / microbatches",
                               "backward aux: mean / |dp|"))
    assert "backward aux: sum / tokens / |dp|" in step_text(s)  # mean = sum / tokens
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mutant.place"
        path.write_text(s.source.text, encoding="utf-8")
        verification = check(str(path)).verification
        assert verification is not None and verification.trace is not None
        trace = verification.trace
        assert trace.microbatches < s.step.microbatches  # the search's smaller count
        plan = plan_from_trace(trace, world=4, steps=2)
    assert (plan.main.sizes, plan.main.microbatches) == ({"dp": 4}, trace.microbatches)
    assert plan.expect.verdict is Verdict.REFUTED  # |dp| = 4 != 2 micro-batches
