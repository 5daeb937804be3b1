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


ASYNC_DDP = DDP.replace("    all_reduce(sum) grads over dp\n",
                        "    all_reduce(sum, async) grads over dp\n    wait grads\n")


def test_an_asynchronous_collective_is_judged_on_its_outcomes_by_every_domain() -> None:
    # Waited at once, an asynchronous all-reduce is the synchronous one: both outcomes are the
    # written step, and every domain proves it through them (verify runs each family on both).
    from placeverify.semantics.asynchrony import worlds

    strategy = load_text(ASYNC_DDP, "a.place")
    outcomes = worlds(strategy)
    assert outcomes is not None and [w.name for w in outcomes] == ["synchronous", "late"]
    sizes = {"dp": 2}
    for world in outcomes:
        group = world.strategy.model.groups_present()[0]
        view = group_view(world.strategy, group)
        result = run(world.strategy, view, uniform_instance(world.strategy, view, sizes, 2))
        assert all(d.consumed == result.reference for d in result.devices)
        encode(world.strategy, view, sizes, 2, "t_", integer=False)
        agreement(world.strategy, view)
    assert verify(strategy).overall() is Verdict.PROVED


def test_an_asynchronous_collective_outside_its_outcomes_is_refused() -> None:
    # A backend handed the written step (not an outcome) refuses the statement: never judged as
    # if it completed where it starts.
    strategy = load_text(ASYNC_DDP, "a.place")
    group = strategy.model.groups_present()[0]
    view = group_view(strategy, group)
    sizes = {"dp": 2}
    with pytest.raises(Unmodelled):
        run(strategy, view, uniform_instance(strategy, view, sizes, 2))
    with pytest.raises(Unmodelled):
        encode(strategy, view, sizes, 2, "t_", integer=False)
    with pytest.raises(Unmodelled):
        agreement(strategy, view)


@pytest.mark.torch
def test_the_replay_refuses_an_asynchronous_collective_outside_its_outcome() -> None:
    pytest.importorskip("torch")
    from placeverify.replay.layout import Unsupported
    from placeverify.replay.step import RankRun

    op = next(o for o in load_text(ASYNC_DDP, "a.place").step.ops() if isinstance(o, Collective))
    with pytest.raises(Unsupported):
        RankRun.apply(object.__new__(RankRun), op, 0, 0)
