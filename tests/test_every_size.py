"""``check --every-size``: the three conditions for every size of the mesh axes and the
micro-batch count, not only the sizes a file declares (placeverify.verify.every_size).

The expected verdicts and smallest failing sizes are worked out by hand from each step's
factors (in the comments); the bundled pair is DeepSpeed#5555 (examples/every-size/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.api import check, load_text
from placeverify.lower.resize import resize
from placeverify.verdicts import Condition, ObligationKind, Verdict
from placeverify.verify import verify
from placeverify.verify.every_size import Sizes, for_check, quantified
from tests.conftest import EXAMPLES, ROOT, example_files

GI, SC, CS = Condition.GRADIENT_INTEGRITY, Condition.STATE_CONSISTENCY, Condition.COMPOSITION_SAFETY
BUG = "examples/every-size/ulysses-zero0-sequence-data-divide.place"
FIXED = "examples/ok/ulysses-zero0-sequence-data-divide-fixed.place"

# The fixed FSDP x EP step of examples/ok (Megatron-LM#5956), with the experts' divide factor
# 1 / |dp * ep| written as 1 / |dp * dp|: the same number wherever dp = ep, as at the file's
# dp = ep = 2. An expert's gradient sums the local token means of its |ep| ranks, and the
# reduce-scatter sums |dp| of them: |dp * ep| local means, of which the single-device gradient
# is the average. With 1 / |dp|^2 the optimizer consumes ep / dp times the single-device
# gradient: right at dp = ep, wrong at (dp, ep) = (1, 2), the first of the two 2-device meshes.
EQUAL_SIZES = """\
strategy "FSDP x EP, the experts' divide factor written with the wrong axis"
model transformer {
    layers = 2, hidden = 1024, heads = 16, vocab = 32000, seq = 2048
    experts = 4, top_k = 2, expert_ffn = 2816
}
precision megatron
mesh { dp = 2, ep = 2 }
place fsdp over ep * dp
place expert over ep
step {
    backward sum / tokens(dp, ep, step) * |dp * ep|
    reduce_scatter(mean) grads[dense, embedding, norms] over dp * ep
    scale grads[experts] by 1 / |dp|^2
    reduce_scatter(sum) grads[experts] over dp
    update params
}
"""


def _every_size(text: str, fixed: tuple[str, ...] = ("microbatches",)):  # type: ignore[no-untyped-def]
    strategy = load_text(text, "e.place")
    return strategy, for_check(strategy, quantified(strategy, fixed), 10_000, 60.0)


def test_a_factor_right_only_where_two_axes_are_equal_is_refuted_for_every_size() -> None:
    strategy, sized = _every_size(EQUAL_SIZES)
    assert verify(strategy).verdict(GI) is Verdict.PROVED  # at the file's dp = ep = 2
    assert sized.verdicts[GI] is Verdict.REFUTED
    assert sized.failures[GI] == Sizes({"dp": 1, "ep": 2}, 1)
    # the counterexample there is a confirmed trace at those sizes
    assert sized.at_failing is not None and sized.at_failing.trace is not None
    assert sized.at_failing.trace.mesh == {"dp": 1, "ep": 2}


def test_the_wider_search_finds_a_failure_above_size_three(monkeypatch: pytest.MonkeyPatch) -> None:
    # With the ordinary search held to size 1 (dp = ep = 1: 1 / 1 = 1 / 1, no failure), the
    # integer counterexample comes from the wider search over sizes above 3: the first mesh
    # with an axis of 4 is (dp, ep) = (1, 4), where 1 / |dp|^2 = 1 but 1 / |dp * ep| = 1 / 4.
    from placeverify.verify.z3 import search

    monkeypatch.setattr(search, "MAX_SEARCH_SIZE", 1)
    _, sized = _every_size(EQUAL_SIZES)
    assert sized.verdicts[GI] is Verdict.REFUTED
    assert sized.failures[GI] == Sizes({"dp": 1, "ep": 4}, 1)


def test_a_held_axis_keeps_its_size() -> None:
    # DeepSpeed#5555 divides by |dp * cp| where |dp| is right: with cp held at its file size 1
    # the factors agree for every dp and micro-batch count.
    text = (ROOT / BUG).read_text()
    _, sized = _every_size(text, ("cp",))
    assert sized.verdicts == {GI: Verdict.PROVED, SC: Verdict.PROVED, CS: Verdict.PROVED}
    assert sized.covers[GI] == "dp >= 1, cp = 1, microbatches >= 1"


def test_several_optimizer_steps_are_not_modelled_for_every_size() -> None:
    strategy, sized = _every_size((EXAMPLES / "ok" / "ga-tail-window-fixed.place").read_text(), ())
    assert verify(strategy).overall() is Verdict.PROVED
    assert sized.verdicts[GI] is Verdict.UNKNOWN
    assert "not modelled" in sized.reasons[GI]
    assert not sized.microbatches  # a list of windows keeps its micro-batch counts


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_bundled_bug_is_proved_at_its_sizes_and_refuted_for_every_size() -> None:
    at_file = _cli("check", "--json", BUG)
    assert at_file.returncode == 0, at_file.stderr
    assert json.loads(at_file.stdout)["verdicts_cover"] == {"mesh": {"dp": 4, "cp": 1},
                                                             "microbatches": 1}
    every = _cli("check", "--json", "--every-size", BUG)
    assert every.returncode == 1, every.stderr
    doc = json.loads(every.stdout)
    assert doc["verdicts"]["gradient_integrity"] == "proved"
    assert doc["every_size"]["verdicts"]["gradient_integrity"] == "refuted"
    # at dp = 1, cp = 2 the two ranks' losses are halves of one mean: their all-reduced sum is
    # the single-device gradient and the 1 / |dp * cp| leaves half of it
    assert doc["every_size"]["smallest_failures"]["gradient_integrity"] == {
        "mesh": {"dp": 1, "cp": 2}, "microbatches": 1}
    fixed = _cli("check", "--json", "--every-size", FIXED)
    assert fixed.returncode == 0, fixed.stderr
    assert set(json.loads(fixed.stdout)["every_size"]["verdicts"].values()) == {"proved"}


def test_the_text_says_which_sizes_the_verdicts_cover() -> None:
    plain = _cli("check", "--width", "200", BUG).stdout
    assert "verdicts at dp = 4, cp = 1, 1 micro-batch (the file's sizes; --every-size" in plain
    every = _cli("check", "--width", "200", "--every-size", BUG).stdout
    assert "every size: dp >= 1, cp >= 1, microbatches >= 1" in every
    assert "smallest sizes where it fails: dp = 1, cp = 2, 1 micro-batch" in every
    assert "counterexample (gradient integrity, dense parameters)" in every


def test_the_trace_of_an_every_size_failure_replays_and_confirms(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    trace = tmp_path / "t.json"
    done = _cli("check", "-q", "--every-size", "--trace", str(trace), BUG)
    assert done.returncode == 1, done.stderr
    assert json.loads(trace.read_text())["mesh"] == {"dp": 1, "cp": 2}
    replayed = _cli("replay", "-q", "--json", str(trace))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["verdict"] == "confirmed"


def test_a_wrong_fixed_name_is_an_input_error() -> None:
    done = _cli("check", "--every-size", "--fixed", "tp", BUG)
    assert done.returncode == 2
    assert "--fixed tp: not a mesh axis of this strategy nor 'microbatches'" in done.stderr
    assert _cli("check", "--fixed", "dp", BUG).returncode == 2


def test_a_spent_budget_is_unknown_never_proved() -> None:
    strategy = load_text((ROOT / FIXED).read_text(), "f.place")
    sized = for_check(strategy, quantified(strategy, ()), 10_000, 1e-9)
    assert sized.verdicts == {GI: Verdict.UNKNOWN, SC: Verdict.UNKNOWN, CS: Verdict.UNKNOWN}
    assert set(sized.reasons.values()) == {"time budget"}


def _structure(strategy) -> dict[tuple[Condition, ObligationKind], Verdict]:  # type: ignore[no-untyped-def]
    out: dict[tuple[Condition, ObligationKind], Verdict] = {}
    for o in verify(strategy, budget_s=None).obligations:
        if o.kind is not ObligationKind.COEFFICIENT:
            key = (o.condition, o.kind)
            out[key] = Verdict.worst([out.get(key, Verdict.PROVED), o.verdict])
    return out


@pytest.mark.parametrize("path", example_files("ok", "bugs", "every-size"), ids=lambda p: p.stem)
def test_size_three_stands_for_four(path: Path) -> None:
    # The claim every_size rests on: the analyses other than the integrity coefficients compare
    # sizes with 1, 2 and 3 only, so an axis at 4 gives the verdicts it gives at 3.
    strategy = load_text(path.read_text(), str(path))
    base = resize(strategy, {a.name: min(a.size, 2) for a in strategy.mesh.axes})
    for axis in strategy.mesh.names:
        at3, at4 = resize(base, {axis: 3}), resize(base, {axis: 4})
        assert _structure(at3) == _structure(at4), axis


def test_a_statement_on_the_last_micro_batch_runs_on_the_last_at_every_count() -> None:
    # DDP under no_sync: the reduction written 'on microbatch last' runs after the last backward
    # whatever the count; at one micro-batch that is micro-batch 0, not the file's micro-batch 1.
    text = (EXAMPLES / "ok" / "ddp-unused-params-no-sync-fixed.place").read_text()
    _, sized = _every_size(text, ())
    assert sized.verdicts == {GI: Verdict.PROVED, SC: Verdict.PROVED, CS: Verdict.PROVED}
    assert sized.covers[GI] == "dp >= 1, microbatches 1..8 (bounded: the loop is unrolled)"


def test_a_refutation_at_the_file_sizes_is_a_refutation_for_every_size() -> None:
    # several optimizer steps are not judged for every size, but the file's own sizes are one
    result = check(str(EXAMPLES / "bugs" / "ga-tail-window.place"), every_size=())
    assert result.verification is not None and result.every_size is not None
    assert result.verification.verdict(GI) is Verdict.REFUTED
    assert result.every_size.verdicts[GI] is Verdict.REFUTED
    assert result.every_size.reasons[GI].startswith("refuted at the file's sizes")
    assert result.every_size.covers[GI] == "dp >= 1, microbatches = [4, 4, 3]"


def test_ci_outputs_name_a_failure_for_every_size_at_its_statement() -> None:
    github = _cli("check", "--every-size", "--output-format", "github", BUG)
    assert github.returncode == 1
    annotation = github.stdout.splitlines()[0]
    # line 20 is 'scale grads by 1 / |dp * cp|', the statement the refutation names
    assert annotation.startswith(f"::error file={BUG},line=20,col=5,")
    assert "gradient integrity refuted for every size at dp = 1, cp = 2, 1 micro-batch" in annotation
    assert github.stdout.splitlines()[-1] == "placeverify: 1 file: 1 refuted; exit 1"
    sarif = json.loads(_cli("check", "--every-size", "--output-format", "sarif", BUG).stdout)
    (result,) = sarif["runs"][0]["results"]
    assert result["ruleId"] == "gradient_integrity" and result["level"] == "error"
    assert "codeFlows" in result  # the counterexample at those sizes


def test_an_asynchronous_step_is_judged_on_both_outcomes_for_every_size() -> None:
    # as at the file's sizes (verify/outcomes.py): the reduction completed where it starts, and
    # only at its wait; the fixed twin waits before the update, so both outcomes are the DDP step
    _, fixed = _every_size((EXAMPLES / "ok" / "overlap-update-before-wait-fixed.place").read_text(), ())
    assert fixed.verdicts == {GI: Verdict.PROVED, SC: Verdict.PROVED, CS: Verdict.PROVED}
    # the bug updates before the wait: in the late outcome each of dp = 2 ranks consumes its own
    # local mean, so (tokens 1 and 2) a rank consumes 1/2 of 1 where the single-device gradient
    # is (1 + 2) / 2 = 3/2
    _, bug = _every_size((EXAMPLES / "bugs" / "overlap-update-before-wait.place").read_text(), ())
    assert bug.verdicts[GI] is Verdict.REFUTED
    assert bug.failures[GI] == Sizes({"dp": 2}, 1)


def test_a_failure_at_more_micro_batches_than_the_file_replays_at_its_own_count(tmp_path: Path) -> None:
    # sum-without-average-fixed: each micro-batch's mean back-propagated, no division by the
    # count; right at its one micro-batch, twice the gradient at two (the smallest failure)
    pytest.importorskip("torch")
    trace = tmp_path / "t.json"
    done = _cli("check", "-q", "--every-size", "--trace", str(trace),
                "examples/ok/sum-without-average-fixed.place")
    assert done.returncode == 1, done.stderr
    doc = json.loads(trace.read_text())
    assert (doc["mesh"], doc["microbatches"], doc["values"]["every_size"]) == ({"dp": 1}, 2, True)
    replayed = _cli("replay", "-q", "--json", str(trace))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["verdict"] == "confirmed"
