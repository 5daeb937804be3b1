"""Whether the optimizer step runs (placeverify/semantics/skip.py): a step without an update,
``update params unless overflow``, and ``broadcast(from = k) overflow``.

Expected verdicts are derived by hand from single-device training: it applies the gradient of
every step, and skips a step exactly when the global gradient holds a non-finite element (some
rank's gradients overflowed). A replica that never updates keeps θ0 on every rank; a skip decided
on one rank's flag is the same everywhere but ignores the others' checks.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from placeverify.errors import PlaceverifyError
from placeverify.lower import load_text
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import verify

ROOT = Path(__file__).resolve().parents[1]

HEAD = """
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision PRECISION
mesh MESH
PLACES
"""
DDP = {"MESH": "{ dp = 2 }", "PLACES": "place ddp over dp"}
TP_DP = {"MESH": "{ tp = 2, dp = 2 }", "PLACES": "place megatron over tp\nplace ddp over dp"}


def text(step: str, precision: str = "fp32_adam", layout: dict[str, str] = DDP) -> str:
    head = HEAD.replace("PRECISION", precision)
    for key, value in layout.items():
        head = head.replace(key, value)
    return f"{head}step {{\n{step}\n}}\n"


def verdicts(source: str) -> dict[Condition, Verdict]:
    verification = verify(load_text(source, "d.place"))
    return {c: verification.verdict(c) for c in Condition}


NO_UPDATE = text("    backward sum / tokens(dp, step)\n    all_reduce(sum) grads over dp")


def test_a_step_without_an_update_lowers_and_is_refuted_on_integrity_only() -> None:
    # single-device training applies the gradient; the replicas never change (both keep θ0)
    got = verdicts(NO_UPDATE)
    assert got[Condition.GRADIENT_INTEGRITY] is Verdict.REFUTED
    assert got[Condition.STATE_CONSISTENCY] is Verdict.PROVED
    assert got[Condition.COMPOSITION_SAFETY] is Verdict.PROVED


def test_the_refutation_says_why_at_the_step() -> None:
    strategy = load_text(NO_UPDATE, "d.place")
    refuted = [o for o in verify(strategy).obligations if o.verdict is Verdict.REFUTED]
    assert refuted and all("never runs 'update params'" in (o.reason or "") for o in refuted)
    assert all(o.span == strategy.step.span for o in refuted)
    assert all(o.fix is not None and "update params" in o.fix for o in refuted)


def test_the_exact_interpreter_consumes_nothing_without_an_update() -> None:
    # dp = 2, one micro-batch, 1 token each, gradient sums 1 (dp 0) and 2 (dp 1): single-device
    # token mean (1 + 2) / 2 = 3/2; no update consumes 0 on both devices
    strategy = load_text(NO_UPDATE, "d.place")
    group = strategy.model.groups_present()[0]
    view = group_view(strategy, group)
    result = run(strategy, view, uniform_instance(strategy, view, {"dp": 2}, 1))
    assert result.reference == Fraction(3, 2)
    assert [d.consumed for d in result.devices] == [0, 0]


def test_with_the_update_the_same_step_is_proved() -> None:
    fixed = NO_UPDATE.replace("over dp\n}", "over dp\n    update params\n}")
    assert set(verdicts(fixed).values()) == {Verdict.PROVED}


SKIP = "    backward sum / tokens(dp, step)\n    FLAG\n    all_reduce(sum) grads over dp\n" \
       "    update params unless overflow"


@pytest.mark.parametrize(("flag", "integrity"), [
    # no flag statement: each rank checks the reduced gradient, which carries any rank's NaN
    ("", Verdict.PROVED),
    ("all_reduce(max) overflow over dp", Verdict.PROVED),
    # rank 0's flag, taken before the gradients are reduced: rank 1's NaN is not seen
    ("broadcast(from = 0) overflow over dp", Verdict.REFUTED),
    ("broadcast(from = 1) overflow over dp", Verdict.REFUTED),
])
def test_a_skip_decided_on_one_ranks_flag_ignores_the_others(flag: str, integrity: Verdict) -> None:
    got = verdicts(text(SKIP.replace("FLAG", flag)))
    assert got[Condition.GRADIENT_INTEGRITY] is integrity
    assert got[Condition.STATE_CONSISTENCY] is Verdict.PROVED  # every rank decides alike


def test_a_broadcast_after_the_gradient_reduction_sees_every_ranks_overflow() -> None:
    # the source checks the reduced gradient, which a sum gives every rank's NaN
    step = ("    backward sum / tokens(dp, step)\n    all_reduce(sum) grads over dp\n"
            "    broadcast(from = 0) overflow over dp\n    update params unless overflow")
    assert set(verdicts(text(step)).values()) == {Verdict.PROVED}


def test_a_broadcast_after_a_reduction_of_the_flag_is_the_ored_flag() -> None:
    step = SKIP.replace("FLAG", "all_reduce(max) overflow over dp\n"
                                "    broadcast(from = 0) overflow over dp")
    assert set(verdicts(text(step)).values()) == {Verdict.PROVED}


def test_the_broadcast_counterexample_names_another_rank() -> None:
    strategy = load_text(text(SKIP.replace("FLAG", "broadcast(from = 0) overflow over dp")), "b")
    [refuted] = [o for o in verify(strategy).obligations if o.verdict is Verdict.REFUTED]
    assert refuted.span is not None and refuted.span.line == 8  # the broadcast
    counter: Any = refuted.counterexample
    assert counter["overflowed"] == "the rank at dp = 1" and counter["source_overflowed"] is False
    assert refuted.fix is not None and "all_reduce(max) overflow over dp" in refuted.fix


TP_SKIP = ("    backward sum / tokens(dp, step)\n    all_reduce(sum) grads over dp\n"
           "    FLAG\n    update params unless overflow")


@pytest.mark.parametrize(("flag", "expected"), [
    # tp ranks hold different shards: a flag not shared over tp lets one skip while the other
    # updates (what dynamic loss scaling's overflow-not-over-tp does, here said in the update)
    ("all_reduce(max) overflow over dp", Verdict.REFUTED),
    ("all_reduce(max) overflow over world", Verdict.PROVED),
    # shared over dp and tp alike and taken after the dp reduction, but only the source's tp
    # shard is checked: the ranks agree, and another tp rank's overflow is ignored
    ("broadcast(from = 0) overflow over world", None),
])
def test_a_skip_decided_differently_on_tensor_ranks_refutes_consistency(
        flag: str, expected: Verdict | None) -> None:
    got = verdicts(text(TP_SKIP.replace("FLAG", flag), layout=TP_DP))
    if expected is None:
        assert got[Condition.STATE_CONSISTENCY] is Verdict.PROVED
        assert got[Condition.GRADIENT_INTEGRITY] is Verdict.REFUTED
        return
    assert got[Condition.STATE_CONSISTENCY] is expected
    assert got[Condition.GRADIENT_INTEGRITY] is expected


def test_without_a_conditional_update_bf16_never_skips() -> None:
    # no loss scaler and no 'unless overflow': the flag decides nothing; the step is right
    step = SKIP.replace("FLAG", "broadcast(from = 0) overflow over dp").replace(
        " unless overflow", "")
    assert set(verdicts(text(step, precision="megatron")).values()) == {Verdict.PROVED}


@pytest.mark.parametrize(("statement", "message"), [
    ("update params unless tokens", "unless overflow"),
    ("free grads unless overflow", "takes none"),
    ("broadcast(from = 2) overflow over dp", "below 2"),
    ("broadcast(from = owner) overflow over dp", "from = k"),
])
def test_malformed_decisions_are_refused_at_lowering(statement: str, message: str) -> None:
    step = f"    backward sum / tokens(dp, step)\n    {statement}\n    update params"
    with pytest.raises(PlaceverifyError, match=message):
        load_text(text(step), "bad.place")


def test_the_update_keeps_its_condition_in_its_label() -> None:
    from placeverify.ir.render import op_label, op_text
    from placeverify.semantics.skip import update_of

    update = update_of(load_text(text(SKIP.replace("FLAG", "")), "l").step)
    assert update is not None and update.unless_overflow
    assert op_label(update) == op_text(update) == "update params unless overflow"


# ---- the replay confirms both bugs ---------------------------------------------------------------

@pytest.fixture(autouse=False)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # traces name their files relative to the repository


def _replay(name: str | Path) -> Any:
    pytest.importorskip("torch")
    from placeverify.api import check
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_trace

    path = name if isinstance(name, Path) else f"examples/bugs/{name}.place"
    verification = check(str(path)).verification
    assert verification is not None and verification.trace is not None
    plan = plan_from_trace(verification.trace, world=None, steps=3)
    report = execute(plan, timeout=600, source=plan.main.path)
    assert report.error is None, f"{report.error.kind}: {report.error.message}"
    return report


@pytest.mark.torch
@pytest.mark.usefixtures("_at_root")
def test_the_replay_confirms_a_step_that_never_updates() -> None:
    report = _replay("optimizer-step-never-runs")
    assert report.verdict == "confirmed"
    # the run's parameters stay at their start; single-device training moved them
    assert report.main.outcome.diverges and report.main.outcome.max_across_ranks == 0
    assert report.control is not None and not report.control.outcome.diverges


@pytest.mark.torch
@pytest.mark.usefixtures("_at_root")
def test_the_replay_confirms_a_skip_decided_on_rank_zero() -> None:
    report = _replay("skip-decided-on-rank-zero")
    assert report.verdict == "confirmed"
    # the overflow injected on the last rank in the second step (replay/batch.overflow_step)
    # is applied (the reference skips that step) and every rank applies it alike
    assert report.main.outcome.diverges and 1 not in report.main.outcome.skipped
    assert report.main.outcome.max_across_ranks == 0
    assert report.control is not None and report.control.outcome.skipped == [1]
    assert not report.control.outcome.diverges


@pytest.mark.torch
@pytest.mark.usefixtures("_at_root")
def test_the_replay_confirms_a_stage_that_updates_while_another_skips(tmp_path: Path) -> None:
    """'update params unless overflow' with no flag statement on a pipeline whose clip reduces
    over pp (benchmarks/soundness.py's drop_update on the tied-embedding example): the stage
    whose gradient overflowed skips while the other updates. Its replay once matched: the
    overflow went into the first step, where the clip's infinite norm zeroes the other stage's
    gradient and the momentum is still 0, so that stage's update moved nothing, as a skip; and
    into the tied embedding, whose reduction over ends(pp) reaches every stage's check."""
    fixed = Path("examples/ok/tied-embedding-norm-twice-fixed.place").read_text()
    assert fixed.count("    update params\n") == 1
    place = tmp_path / "stage-skips-alone.place"
    place.write_text(fixed.replace("    update params\n", "    update params unless overflow\n"))
    report = _replay(place)
    assert report.verdict == "confirmed"
    # rank 0 took the overflow in the second step (replay/batch.overflow_step) and skipped it
    assert report.main.outcome.diverges and report.main.outcome.skipped == [1]
    assert report.main.outcome.max_across_ranks > 0  # the other stage updated
    assert report.control is not None and not report.control.outcome.diverges


@pytest.mark.parametrize(("bug", "words"), [
    ("optimizer-step-never-runs", "a step without 'update params' is not emitted"),
    ("skip-decided-on-rank-zero", "'update params unless overflow': a conditional update is not "
                                  "emitted"),
])
def test_emit_refuses_a_step_it_would_write_with_an_unconditional_update(bug: str, words: str) -> None:
    # the reproducer steps the optimizer every step: written out, either bug would reproduce a
    # different step than the one refuted
    from placeverify.replay.emit import EmitRefused, check_layout

    strategy = load_text((ROOT / "examples" / "bugs" / f"{bug}.place").read_text(), f"{bug}.place")
    with pytest.raises(EmitRefused, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_layout(strategy)


# ZeRO-2 under dynamic loss scaling with the flag broadcast from rank 0 (a soundness mutant of
# examples/zero-paper/zero2.place): the loss scaler still checks each rank's own gradient shard,
# so a rank whose shard overflowed skips while the others, on rank 0's clear flag, update.
ZERO2_BROADCAST = """\
strategy "ZeRO-2, the overflow flag broadcast from rank 0"
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision mixed_adam
mesh { dp = 4 }
place zero2 over dp
step {
    backward sum / tokens(dp, step)
    reduce_scatter(sum) grads over dp
    broadcast(from = 0) overflow over dp
    update params
    all_gather params over dp
}
"""


@pytest.mark.torch
def test_the_injected_overflow_lands_in_a_shard_the_broadcast_source_does_not_check() -> None:
    # injected at element 0 it landed in rank 0's shard: rank 0's own check set the flag every
    # rank took, all skipped, and the run matched; at the last element it is the last rank's
    pytest.importorskip("torch")
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_strategy

    strategy = load_text(ZERO2_BROADCAST, "zero2-broadcast.place")
    assert verify(strategy).verdict(Condition.GRADIENT_INTEGRITY) is Verdict.REFUTED
    plan = plan_from_strategy(strategy, steps=3)
    report = execute(plan, timeout=600, source="zero2-broadcast.place")
    assert report.error is None, f"{report.error.kind}: {report.error.message}"
    assert report.main.outcome.diverges


def test_a_broadcast_source_beyond_the_replayed_group_is_not_replayed() -> None:
    from placeverify.replay.layout import Unsupported, layout_of
    from placeverify.verify.size_space import Sizes, at

    strategy = load_text(ZERO2_BROADCAST.replace("from = 0", "from = 3"), "z.place")
    with pytest.raises(Unsupported, match=r"needs more than 3 ranks over dp"):
        layout_of(at(strategy, Sizes({"dp": 2}, 1)))
