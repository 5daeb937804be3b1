"""Collectives inside the loss (issue 12, construct 7): ``all_gather(differentiable | detached)
embeddings over G`` and ``all_reduce(sum, ...) embeddings over G`` before a backward.

The expected gradients are worked by hand (placeverify/semantics/gather.py's docstring has the
derivation): every rank of G computes the group's loss; its gradient with respect to rank r's
embeddings is r's *share* s_r of the single-device gradient (Σ_r s_r = g). A differentiable
collective sends each rank the sum of the |G| copies' gradients, |G|·s_r; a detached one only its
own copy's, s_r. DDP's mean over dp then gives g (differentiable) or g/|dp| (detached); a sum
gives |dp|·g or g.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import pytest

from placeverify.diagnostics import Code, PlaceError
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import step_text
from placeverify.ir.step import Backward, CollectiveKind, TermKind
from placeverify.lower import load, load_text
from placeverify.lower.edit import replace_step
from placeverify.semantics.gather import gathered_loss
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import verify
from placeverify.verify.agreement import agreement
from tests.conftest import EXAMPLES

ROOT = Path(__file__).resolve().parents[1]

HEAD = """\
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision megatron
mesh { dp = 2, tp = 2 }
place ddp over dp
place tp over tp
loss sample_mean
"""


def strategy(gather: str, loss: str = "sum / samples(dp)", reduce: str = "mean",
             head: str = HEAD) -> object:
    lines = [gather] if gather else []
    body = "\n".join(f"        {line}" for line in [*lines, f"backward {loss}"])
    return load_text(f"{head}step {{\n    microbatches = 1\n    each microbatch {{\n{body}\n    }}\n"
                     f"    all_reduce({reduce}) grads over dp\n    update params\n}}\n", "g.place")


def dense_integrity(s: object) -> Verdict:
    verification = verify(s)  # type: ignore[arg-type]
    return next(o.verdict for o in verification.obligations
                if o.condition is Condition.GRADIENT_INTEGRITY and "dense" in o.claim)


# ---- the language --------------------------------------------------------------------------------


def test_the_collective_lowers_onto_the_backward_it_feeds() -> None:
    s = strategy("all_reduce(sum, detached) embeddings over dp")
    backward = next(op for op in s.step.ops() if isinstance(op, Backward))  # type: ignore[attr-defined]
    assert backward.gather is not None
    assert backward.gather.kind is CollectiveKind.ALL_REDUCE
    assert backward.gather.differentiable is False
    assert backward.gather.group.axes == ("dp",)
    assert (backward.gather.span.line, backward.gather.span.column) == (10, 9)
    # the loss as written; no collective statement of its own in the step
    assert backward.loss.text == "sum / samples(dp)"
    assert len(s.step.ops()) == 3  # type: ignore[attr-defined]


def test_the_step_renders_the_collective_before_its_backward_and_reads_back() -> None:
    s = strategy("all_gather(differentiable) embeddings over dp")
    text = step_text(s)  # type: ignore[arg-type]
    assert ("        all_gather(differentiable) embeddings over dp\n"
            "        backward sum / samples(dp)\n") in text
    again = load_text(replace_step(HEAD + "step {\n}\n", text), "again.place")
    assert step_text(again) == text


@pytest.mark.parametrize(("gather", "line", "column", "code", "words"), [
    ("all_gather embeddings over dp", 10, 9, Code.MISSING,
     "say whether the all_gather of embeddings is differentiable"),
    ("all_gather(detatched) embeddings over dp", 10, 20, Code.UNKNOWN_NAME,
     "takes no option 'detatched'; did you mean 'detached'?"),
    ("all_gather(sum, detached) embeddings over dp", 10, 20, Code.UNKNOWN_NAME,
     "takes no option 'sum'"),
    ("all_gather(detached, differentiable) embeddings over dp", 10, 30, Code.DUPLICATE,
     "say once"),
    ("all_gather(detached) embeddings over tp", 10, 46, Code.BAD_VALUE,
     "'tp' is not one"),
    ("reduce_scatter(sum, detached) embeddings over dp", 10, 9, Code.BAD_VALUE,
     "'reduce_scatter' does not act on embeddings"),
    ("all_gather(detached) embeddings[dense] over dp", 10, 30, Code.BAD_VALUE,
     "no parameter groups"),
    ("all_gather(detached) embeddings", 10, 9, Code.MISSING, "needs a group"),
])
def test_bad_collectives_of_embeddings_are_located_errors(gather: str, line: int, column: int,
                                                          code: Code, words: str) -> None:
    with pytest.raises(PlaceError) as err:
        strategy(gather)
    found = [d for d in err.value.diagnostics if d.code is code]
    assert found, [d.message for d in err.value.diagnostics]
    assert words in found[0].message
    assert found[0].span is not None and (found[0].span.line, found[0].span.column) == (line, column)


@pytest.mark.parametrize(("step", "line", "words"), [
    # after the backward in its block: nothing left for it to feed
    ("each microbatch {\nbackward sum / samples(dp)\nall_gather(detached) embeddings over dp\n}",
     11, "no 'backward' follows"),
    # after the loop
    ("each microbatch {\nbackward sum / samples(dp)\n}\nall_gather(detached) embeddings over dp",
     12, "write it in 'each microbatch'"),
    # in an 'on microbatch' block
    ("each microbatch {\nbackward sum / samples(dp)\n}\n"
     "on microbatch last { all_gather(detached) embeddings over dp }", 12,
     "write it in 'each microbatch'"),
])
def test_a_collective_of_embeddings_must_come_before_a_backward(step: str, line: int,
                                                                words: str) -> None:
    text = f"{HEAD}step {{\nmicrobatches = 1\n{step}\nall_reduce(mean) grads over dp\nupdate params\n}}\n"
    with pytest.raises(PlaceError) as err:
        load_text(text, "g.place")
    found = [d for d in err.value.diagnostics if words in d.message]
    assert found, [d.message for d in err.value.diagnostics]
    assert found[0].span is not None and found[0].span.line == line


def test_the_cli_prints_the_error_at_the_text(tmp_path: Path) -> None:
    path = tmp_path / "bad.place"
    path.write_text(f"{HEAD}step {{\n    each microbatch {{\n        all_gather embeddings over dp\n"
                    "        backward sum / samples(dp)\n    }\n    all_reduce(mean) grads over dp\n"
                    "    update params\n}\n")
    done = subprocess.run([sys.executable, "-m", "placeverify", "check", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert f"{path}:9:9: error: say whether the all_gather of embeddings" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


# ---- the semantics, on hand-worked instances ----------------------------------------------------


def test_the_factor_is_the_group_size_when_differentiable_and_one_when_detached() -> None:
    for gather, factor in (("all_gather(differentiable) embeddings over dp", 1),
                           ("all_gather(detached) embeddings over dp", 0),
                           ("all_reduce(sum, differentiable) embeddings over dp * dp", None)):
        if factor is None:
            with pytest.raises(PlaceError):
                strategy(gather)
            continue
        s = strategy(gather)
        backward = next(op for op in s.step.ops() if isinstance(op, Backward))  # type: ignore[attr-defined]
        sizes = [(t.group.axes if t.group else None, e) for t, e in gathered_loss(backward).factors
                 if t.kind is TermKind.SIZE]
        assert sizes == ([(("dp",), 1)] if factor else [])


@pytest.mark.parametrize(("gather", "reduce", "consumed"), [
    # one sample on each rank, gradient sums 1 (dp 0) and 2 (dp 1); loss sum / samples(dp) = /2;
    # single-device: (1 + 2) / 2 = 3/2
    ("all_gather(detached) embeddings over dp", "mean", Fraction(3, 4)),   # (1/2 + 1) / 2
    ("all_gather(differentiable) embeddings over dp", "mean", Fraction(3, 2)),  # (1 + 2) / 2
    ("all_reduce(sum, detached) embeddings over dp", "sum", Fraction(3, 2)),    # 1/2 + 1
    ("all_reduce(sum, differentiable) embeddings over dp", "sum", Fraction(3)),  # 1 + 2
    ("", "mean", Fraction(3, 4)),  # no collective: each rank's share, as detached
])
def test_the_exact_interpreter_gives_the_hand_worked_gradient(gather: str, reduce: str,
                                                              consumed: Fraction) -> None:
    s = strategy(gather, reduce=reduce,
                 head=HEAD.replace("mesh { dp = 2, tp = 2 }", "mesh { dp = 2 }")
                 .replace("place tp over tp\n", ""))
    view = group_view(s, ParamGroup.DENSE)  # type: ignore[arg-type]
    instance = uniform_instance(s, view, {"dp": 2}, 1)  # type: ignore[arg-type]
    assert sorted(instance.grads.values()) == [1, 2]
    result = run(s, view, instance)  # type: ignore[arg-type]
    assert result.reference == Fraction(3, 2)
    assert [d.consumed for d in result.devices] == [consumed, consumed]


@pytest.mark.parametrize(("gather", "loss", "reduce", "verdict"), [
    ("all_gather(detached) embeddings over dp", "sum / samples(dp)", "mean", Verdict.REFUTED),
    ("all_gather(detached) embeddings over dp", "sum / samples(dp) * |dp|", "mean", Verdict.PROVED),
    ("all_gather(detached) embeddings over dp", "sum / samples(dp)", "sum", Verdict.PROVED),
    ("all_gather(differentiable) embeddings over dp", "sum / samples(dp)", "mean", Verdict.PROVED),
    ("all_gather(differentiable) embeddings over dp", "sum / samples(dp)", "sum", Verdict.REFUTED),
    ("all_reduce(sum, differentiable) embeddings over dp", "sum / samples / |dp|", "mean",
     Verdict.PROVED),
    ("all_reduce(sum, detached) embeddings over dp", "sum / samples / |dp|", "mean",
     Verdict.REFUTED),
])
def test_z3_judges_every_combination_as_worked_by_hand(gather: str, loss: str, reduce: str,
                                                      verdict: Verdict) -> None:
    # with tp = 2 beside dp: the tensor ranks hold the same samples, the gather is over dp only
    assert dense_integrity(strategy(gather, loss, reduce)) is verdict


def test_the_agreement_analysis_needs_nothing_new() -> None:
    # |dp| is the same on every rank: the replicas stay identical whatever the collective
    for mode in ("detached", "differentiable"):
        s = strategy(f"all_gather({mode}) embeddings over dp")
        for group in s.model.groups_present():  # type: ignore[attr-defined]
            agreement(s, group_view(s, group))  # type: ignore[arg-type]
        verification = verify(s)  # type: ignore[arg-type]
        assert verification.verdict(Condition.STATE_CONSISTENCY) is Verdict.PROVED


def test_the_refutation_names_the_detached_collective() -> None:
    path = EXAMPLES / "bugs" / "barlow-twins-detached-all-reduce.place"
    verification = verify(load(str(path)))
    first = verification.first_refuted()
    assert first is not None and first.span is not None
    line = path.read_text().splitlines()[first.span.line - 1]
    assert "all_reduce(sum, detached) embeddings over dp" in line
    assert first.fix is not None and "make it differentiable" in first.fix
    assert verify(load(str(EXAMPLES / "ok" / "barlow-twins-detached-all-reduce-fixed.place"))
                  ).overall() is Verdict.PROVED


def test_a_wrong_reduction_after_a_differentiable_collective_is_not_blamed_on_it() -> None:
    # differentiable + sum: |dp|x too large; making it differentiable changes nothing, so the
    # refutation stays at the reduction
    verification = verify(strategy("all_gather(differentiable) embeddings over dp", reduce="sum"))
    first = verification.first_refuted()
    assert first is not None and first.span is not None and first.span.line == 13


def test_replay_emit_refuses_a_collective_inside_the_loss() -> None:
    from placeverify.replay.emit import EmitRefused, check_layout

    s = strategy("all_gather(detached) embeddings over dp",
                 head=HEAD.replace("mesh { dp = 2, tp = 2 }", "mesh { dp = 2 }")
                 .replace("place tp over tp\n", ""))
    with pytest.raises(EmitRefused, match="a collective inside the loss is not emitted"):
        check_layout(s)  # type: ignore[arg-type]


# ---- the torch replay runs the collective for real ---------------------------------------------


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(("gather", "loss", "verdict"), [
    ("all_gather(detached) embeddings over dp", "sum / samples(dp)", Verdict.REFUTED),
    ("all_gather(differentiable) embeddings over dp", "sum / samples(dp)", Verdict.PROVED),
    ("all_reduce(sum, detached) embeddings over dp", "sum / samples / |dp|", Verdict.REFUTED),
    ("all_reduce(sum, differentiable) embeddings over dp", "sum / samples / |dp|", Verdict.PROVED),
])
def test_the_replay_measures_the_factor_torch_autograd_gives(gather: str, loss: str,
                                                            verdict: Verdict) -> None:
    # dp = 2 beside tp = 2: the gather's process group is {0, 2} or {1, 3}, not ranks 0..n-1
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    pool().prestart()
    plan = plan_from_strategy(strategy(gather, loss), steps=2)  # type: ignore[arg-type]
    assert plan.expect.verdict is verdict
    report = execute(plan, timeout=120, source="<text>")
    assert report.error is None and report.main is not None
    assert report.main.outcome.diverges is (verdict is Verdict.REFUTED)
    assert report.verdict == "confirmed"


# ---- the soundness harness's operators ---------------------------------------------------------


def _harness() -> ModuleType:
    if "soundness" in sys.modules:  # another test module loaded it already
        return sys.modules["soundness"]
    spec = importlib.util.spec_from_file_location("soundness", ROOT / "benchmarks" / "soundness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soundness"] = module
    spec.loader.exec_module(module)
    return module


def _mutants(operator: str, gather: str) -> list[list[str]]:
    soundness = _harness()
    s = strategy(gather)
    body = soundness.StepBody.parse(step_text(s))  # type: ignore[arg-type]
    return [m.flat() for m in soundness.OPERATORS[operator](body, soundness.Context.of(s))]


def test_the_operators_flip_insert_and_drop_the_collective() -> None:
    flipped = _mutants("flip_loss_gather", "all_gather(detached) embeddings over dp")
    assert sorted(f[1] for f in flipped) == [
        "each microbatch: all_gather(differentiable) embeddings over dp",
        "each microbatch: all_reduce(sum, detached) embeddings over dp",
        "each microbatch: all_reduce(sum, differentiable) embeddings over dp"]
    inserted = _mutants("insert_loss_gather", "")
    assert sorted(f[1] for f in inserted) == [
        "each microbatch: all_gather(detached) embeddings over dp",
        "each microbatch: all_gather(differentiable) embeddings over dp"]
    assert _mutants("insert_loss_gather", "all_gather(detached) embeddings over dp") == []
    dropped = _mutants("drop_loss_gather", "all_gather(detached) embeddings over dp")
    assert dropped == [["microbatches = 1", "each microbatch: backward sum / samples(dp)",
                        "all_reduce(mean) grads over dp", "update params"]]
