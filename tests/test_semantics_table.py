"""Every step statement against every backend: modelled, or refused out loud.

The step semantics is written once (placeverify.semantics.buffers) and run by the exact, Z3
coefficient and agreement domains and by the torch replay. A statement outside the table must
raise ``Unmodelled`` (``Unsupported`` in the replay) and make the verdict *unknown* at the
statement's line — never be skipped, never be proved.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest

from placeverify.diagnostics import Span
from placeverify.ir.collectives import COLLECTIVES
from placeverify.ir.step import (
    Collective,
    CollectiveKind,
    LoopOp,
    ReduceOp,
    Target,
    TargetKind,
)
from placeverify.lower import load_text
from placeverify.semantics.buffers import (
    GRADIENT_COLLECTIVES,
    MODELLED_COLLECTIVES,
    NEUTRAL_COLLECTIVES,
    POSITIONAL_COLLECTIVES,
)
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import verify
from placeverify.verify.agreement import agreement
from placeverify.verify.z3.integrity import encode

DDP = """
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision megatron
mesh { dp = 2 }
place ddp over dp
step {
    microbatches = 2
    each microbatch {
        backward sum / tokens(dp, step)
    }
    all_reduce(sum) grads over dp
    update params
}
"""

ALL_PAIRS = list(itertools.product(CollectiveKind, TargetKind))
LOWERED = {(kind, target) for kind, spec in COLLECTIVES.items() for target in spec.targets}
UNMODELLED = [pair for pair in ALL_PAIRS if pair not in MODELLED_COLLECTIVES]


def test_every_collective_the_language_accepts_is_modelled() -> None:
    assert LOWERED <= MODELLED_COLLECTIVES
    assert LOWERED == MODELLED_COLLECTIVES  # nothing is modelled that cannot be written


def test_the_table_classes_are_disjoint() -> None:
    classes = [set(GRADIENT_COLLECTIVES), POSITIONAL_COLLECTIVES, NEUTRAL_COLLECTIVES]
    for a, b in itertools.combinations(classes, 2):
        assert not a & b


def _with_loop_op(op: object) -> object:
    strategy = load_text(DDP, "ddp.place")
    step = strategy.step
    return replace(strategy, step=replace(step, loop=(*step.loop, LoopOp(op))))  # type: ignore[arg-type]


SPAN = Span(11, 9, 11, 40)


@pytest.mark.parametrize("pair", UNMODELLED, ids=lambda p: f"{p[0].value}-{p[1].value}")
def test_an_unmodelled_collective_is_refused_by_every_solver_domain(
        pair: tuple[CollectiveKind, TargetKind]) -> None:
    kind, target = pair
    op = Collective(kind, ReduceOp.SUM, Target(target), load_text(DDP, "x").mesh.group("dp"), SPAN)
    strategy = _with_loop_op(op)
    group = strategy.model.groups_present()[0]  # type: ignore[attr-defined]
    view = group_view(strategy, group)  # type: ignore[arg-type]
    sizes = {"dp": 2}
    with pytest.raises(Unmodelled):
        run(strategy, view, uniform_instance(strategy, view, sizes, 2))  # type: ignore[arg-type]
    with pytest.raises(Unmodelled):
        encode(strategy, view, sizes, 2, "t_", integer=False)  # type: ignore[arg-type]
    with pytest.raises(Unmodelled):
        agreement(strategy, view)  # type: ignore[arg-type]
    verification = verify(strategy)  # type: ignore[arg-type]
    assert verification.overall() is not Verdict.PROVED
    unknown = [o for o in verification.obligations if o.verdict is Verdict.UNKNOWN]
    assert unknown and all(o.span == SPAN for o in unknown if o.kind == "not-modelled")
    assert verification.verdict(Condition.GRADIENT_INTEGRITY) is Verdict.UNKNOWN


@dataclass(frozen=True)
class Mystery:
    """A statement no backend knows."""

    span: Span


def test_an_unknown_statement_type_is_refused() -> None:
    strategy = _with_loop_op(Mystery(SPAN))
    group = strategy.model.groups_present()[0]  # type: ignore[attr-defined]
    view = group_view(strategy, group)  # type: ignore[arg-type]
    with pytest.raises(Unmodelled):
        agreement(strategy, view)  # type: ignore[arg-type]
    verification = verify(strategy)  # type: ignore[arg-type]
    assert verification.overall() is Verdict.UNKNOWN


@pytest.mark.torch
@pytest.mark.parametrize("pair", UNMODELLED[:4], ids=lambda p: f"{p[0].value}-{p[1].value}")
def test_the_replay_refuses_an_unmodelled_collective(pair: tuple[CollectiveKind, TargetKind]) -> None:
    pytest.importorskip("torch")
    from placeverify.replay.layout import Unsupported
    from placeverify.replay.step import RankRun

    kind, target = pair
    op = Collective(kind, ReduceOp.SUM, Target(target), load_text(DDP, "x").mesh.group("dp"), SPAN)
    with pytest.raises(Unsupported):
        RankRun.collective(object.__new__(RankRun), op)


@pytest.mark.parametrize(("parts", "whole"), [
    ((), Verdict.PROVED),
    ((Verdict.PROVED, Verdict.PROVED), Verdict.PROVED),
    ((Verdict.PROVED, Verdict.UNKNOWN), Verdict.UNKNOWN),
    ((Verdict.UNKNOWN, Verdict.REFUTED), Verdict.REFUTED),  # a counterexample stands on its own
    ((Verdict.REFUTED, Verdict.PROVED, Verdict.UNKNOWN), Verdict.REFUTED),
])
def test_one_verdict_order_for_a_conjunction(parts: tuple[Verdict, ...], whole: Verdict) -> None:
    assert Verdict.worst(parts) is whole


def test_every_collective_kind_has_one_spec() -> None:
    # A kind the language accepts but the table forgets would lower with no targets at all.
    assert set(COLLECTIVES) == set(CollectiveKind)
    assert all(spec.targets for spec in COLLECTIVES.values())


# ---- 'zero grads' and several steps (placeverify/semantics/steps.py) -----------------------------

ZEROED = DDP.replace("    each microbatch {\n", "    each microbatch {\n        zero grads\n")


def test_zero_grads_is_modelled_by_every_solver_domain() -> None:
    # zero_grad on every micro-batch: only the last micro-batch's gradient reaches the update.
    # Exact, by hand: tokens 1 each, gradient sums 1 (dp 0, mb 0), 2 (dp 0, mb 1), 3, 4 (dp 1);
    # each device keeps its mb 1 sum / 4 tokens: dp 0 2/4, dp 1 4/4; summed over dp: 6/4 = 3/2,
    # against the single-device (1 + 2 + 3 + 4) / 4 = 5/2.
    from fractions import Fraction

    strategy = load_text(ZEROED, "zeroed.place")
    group = strategy.model.groups_present()[0]
    view = group_view(strategy, group)
    result = run(strategy, view, uniform_instance(strategy, view, {"dp": 2}, 2))
    assert {d.consumed for d in result.devices} == {Fraction(3, 2)}
    assert result.reference == Fraction(5, 2)
    encode(strategy, view, {"dp": 2}, 2, "t_", integer=False)  # modelled: no Unmodelled
    agreement(strategy, view)
    assert verify(strategy).verdict(Condition.GRADIENT_INTEGRITY) is Verdict.REFUTED


def test_a_maximum_over_several_steps_is_not_modelled_at_its_line() -> None:
    text = DDP.replace("microbatches = 2", "microbatches = [2, 2]").replace(
        "all_reduce(sum) grads over dp", "all_reduce(max) grads over dp")
    verification = verify(load_text(text, "max.place"))
    unknown = [o for o in verification.obligations if o.kind == "not-modelled"]
    assert unknown and all(o.span is not None and o.span.line == 11 for o in unknown)
    assert verification.overall() is not Verdict.PROVED


@pytest.mark.torch
def test_the_replay_zeroes_the_full_buffer_and_the_shard() -> None:
    torch = pytest.importorskip("torch")
    from placeverify.ir.step import Free
    from placeverify.replay.buffers import Buffers
    from placeverify.replay.step import RankRun

    run_ = object.__new__(RankRun)
    buf = object.__new__(Buffers)
    buf.full, buf.shard, buf.numel = torch.ones(4), torch.ones(2), 4
    run_.targeted = lambda applies: [buf]  # type: ignore[method-assign]
    run_._zeros = lambda n: torch.zeros(4)  # type: ignore[method-assign]
    run_.apply(Free(Target(TargetKind.GRADS), SPAN, zero=True), 0, 0)
    assert float(buf.full.abs().sum()) == 0 and float(buf.shard.abs().sum()) == 0
