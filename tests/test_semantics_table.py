"""Every step statement against every backend: modelled, or refused out loud.

The step semantics is written once (placeverify.semantics.buffers) and run by the exact, Z3
coefficient and agreement domains and by the torch replay. A statement outside the table must
raise ``Unmodelled`` (``Unsupported`` in the replay) and make the verdict *unknown* at the
statement's line — never be skipped, never be proved.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from fractions import Fraction

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


# ---- participation (placeverify.semantics.participation): 'only = used' in every domain --------

PARTICIPATION = """
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 128, seq = 16 }
precision fp32_adam
mesh { dp = 2 }
place ddp over dp
unused dense
step {
    microbatches = 2
    each microbatch { backward sum / tokens(dp, step) }
    on microbatch last { COLLECTIVE }
    update params
}
"""


@pytest.mark.parametrize("collective", [
    "all_reduce(sum, only = used) grads over dp",
    "reduce_scatter(sum, only = used) grads over dp",
])
def test_only_used_is_honoured_by_every_solver_domain(collective: str) -> None:
    # Under the pattern that leaves dense unused in the last micro-batch every domain skips the
    # reduction (the gradient stays local: wrong and different across dp); with every group used
    # it is the plain reduction (right, identical).
    from placeverify.ir.model import ParamGroup
    from placeverify.semantics.participation import Pattern, with_pattern
    from placeverify.verify.z3 import solve
    from placeverify.verify.z3.integrity import mismatch_formula
    from placeverify.verify.z3.solve import SolverStatus

    base = load_text(PARTICIPATION.replace("COLLECTIVE", collective), "p.place")
    view = group_view(base, ParamGroup.DENSE)
    for idle, right in ((frozenset(), True), (frozenset({1}), False)):
        strategy = with_pattern(base, Pattern(((ParamGroup.DENSE, idle),)))
        exact = run(strategy, view, uniform_instance(strategy, view, {"dp": 2}, 2))
        assert (not exact.mismatches()) is right
        encoded = encode(strategy, view, {"dp": 2}, 2, "t_", integer=False)
        status = solve.check(mismatch_formula(encoded), 10_000).status
        assert (status is SolverStatus.UNSAT) is right
        if "all_reduce" in collective:  # a shard is scattered over dp: never identical there
            assert ("dp" in agreement(strategy, view).identical) is right


@pytest.mark.torch
def test_the_replay_skips_an_only_used_reduction_by_the_same_rule() -> None:
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from placeverify.ir.model import ParamGroup
    from placeverify.replay.collectives import RankCollectives
    from placeverify.semantics.participation import Pattern, with_pattern

    base = load_text(PARTICIPATION.replace(
        "COLLECTIVE", "all_reduce(sum, only = used) grads over dp"), "p.place")
    strategy = with_pattern(base, Pattern(((ParamGroup.DENSE, frozenset({1})),)))
    op = next(o for o in strategy.step.ops() if isinstance(o, Collective))
    reduced: list[object] = []
    buffers = [SimpleNamespace(group=g) for g in (ParamGroup.DENSE, ParamGroup.NORMS)]
    rank = SimpleNamespace(strategy=strategy, targeted=lambda applies: buffers,
                           grads_collective=lambda o, buf: reduced.append(buf.group))
    RankCollectives.collective(rank, op, 1)  # type: ignore[arg-type]
    assert reduced == [ParamGroup.NORMS]  # dense unused in micro-batch 1: left as it is
    reduced.clear()
    RankCollectives.collective(rank, op, 0)  # type: ignore[arg-type]
    assert reduced == [ParamGroup.DENSE, ParamGroup.NORMS]


# ---- collectives inside the loss (placeverify/semantics/gather.py) -------------------------------

LOSS_GATHER_KINDS = {"all_gather": "", "all_reduce": "sum, "}


@pytest.mark.parametrize("mode", ["differentiable", "detached"])
@pytest.mark.parametrize("kind", list(LOSS_GATHER_KINDS))
def test_a_collective_inside_the_loss_is_modelled_by_every_solver_domain(kind: str, mode: str) -> None:
    # not a buffer statement: it rides on the backward it feeds, which every domain runs
    text = DDP.replace("        backward sum / tokens(dp, step)",
                       f"        {kind}({LOSS_GATHER_KINDS[kind]}{mode}) embeddings over dp\n"
                       "        backward sum / tokens(dp, step)")
    strategy = load_text(text, "gather.place")
    assert any(getattr(lo.op, "gather", None) is not None for lo in strategy.step.loop)
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        run(strategy, view, uniform_instance(strategy, view, {"dp": 2}, 2))
        encode(strategy, view, {"dp": 2}, 2, "t_", integer=False)
        agreement(strategy, view)
    verification = verify(strategy)
    assert all(o.verdict is not Verdict.UNKNOWN for o in verification.obligations)
    # the loss is the global token mean on every rank: DDP's sum is right only when detached
    assert verification.verdict(Condition.GRADIENT_INTEGRITY) is (
        Verdict.PROVED if mode == "detached" else Verdict.REFUTED)


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


# ---- counts across steps (placeverify/semantics/counters.py) -----------------------------------


@pytest.mark.parametrize(("scope", "consumed"), [
    # by hand, tokens 1 each, gradient sums 1, 2 (dp 0, mb 0 and 1) and 3, 4 (dp 1), step 2 of
    # [2, 2]: one micro-batch's count over dp is 2: 1/2 + 2/2 + 3/2 + 4/2 = 5; the step's is 4:
    # 10/4 = 5/2; the run's, steps 1 and 2, and the batch's, both steps, are 8: 10/8 = 5/4
    ("microbatch", Fraction(5)), ("step", Fraction(5, 2)), ("run", Fraction(5, 4)),
    ("batch", Fraction(5, 4)),
])
def test_every_count_scope_in_every_solver_domain(scope: str, consumed: Fraction) -> None:
    from placeverify.ir.step import Scope
    from placeverify.semantics.counters import ACROSS, before, per_step_strategy
    from placeverify.semantics.interpreter import Instance, atoms
    from placeverify.semantics.steps import projection

    text = DDP.replace("microbatches = 2", "microbatches = [2, 2]").replace(
        "tokens(dp, step)", f"tokens(dp, {scope})")
    strategy = load_text(text, "scope.place")
    window = projection(strategy, 2)
    group = strategy.model.groups_present()[0]
    view = group_view(window, group)
    base = uniform_instance(window, view, {"dp": 2}, 2)
    instance = Instance(base.sizes, 2, base.tokens, base.samples, base.grads,
                        before(strategy, atoms(view, {"dp": 2}, 2), base.tokens, base.samples, 2))
    result = run(window, view, instance)  # the exact domain evaluates every scope
    assert {d.consumed for d in result.devices} == {consumed}
    assert result.reference == Fraction(5, 2)
    if Scope(scope) in ACROSS:  # Z3 refuses a count across steps by name ...
        with pytest.raises(Unmodelled, match="a count across optimizer steps"):
            encode(window, view, {"dp": 2}, 2, "t_", integer=False)
    else:
        encode(window, view, {"dp": 2}, 2, "t_", integer=False)
    reset = per_step_strategy(window)  # ... and, with the agreement analysis, models its
    encode(reset, group_view(reset, group), {"dp": 2}, 2, "t_", integer=False)  # per-step
    agreement(reset, group_view(reset, group))                                  # projection



# ---- parameter gathers in flight (placeverify/semantics/param_flights.py) ------------------------

ASYNC_GATHER = DDP.replace("place ddp over dp", "place zero1 over dp").replace(
    "    each microbatch {\n", "    wait params\n    each microbatch {\n").replace(
    "    all_reduce(sum) grads over dp\n    update params\n",
    "    reduce_scatter(sum) grads over dp\n    update params\n"
    "    all_gather(async) params over dp\n")


def test_an_asynchronous_parameter_gather_is_modelled_by_every_domain() -> None:
    # The gradient domains take it as a gather (it leaves the gradient as it is); the forwards
    # it overlaps are param_flights' exact and agreement domains and the Z3 obligation: waited
    # before the forward, none is in flight, and every domain proves it.
    from placeverify.semantics.param_flights import identical_along, param_flights, simulate

    strategy = load_text(ASYNC_GATHER, "g.place")
    assert any(isinstance(op, Collective) and op.asynchronous for op in strategy.step.ops())
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        result = run(strategy, view, uniform_instance(strategy, view, {"dp": 2}, 2))
        assert all(d.consumed == result.reference for d in result.devices)
        encode(strategy, view, {"dp": 2}, 2, "t_", integer=False)
        agreement(strategy, view)
    (flight,) = param_flights(strategy.step)
    assert simulate(flight, 2, 2).mismatches() == []
    assert identical_along(flight, ("dp",), {"dp": True}, 0) == frozenset({"dp"})
    assert verify(strategy).overall() is Verdict.PROVED


@pytest.mark.torch
def test_the_replay_defers_an_asynchronous_parameter_gather_to_its_wait() -> None:
    pytest.importorskip("torch")
    from placeverify.replay.layout import Unsupported
    from placeverify.replay.param_flights import Pending, param_events
    from placeverify.replay.step import RankRun

    step = load_text(ASYNC_GATHER, "g.place").step
    gather = next(o for o in step.ops() if isinstance(o, Collective) and o.asynchronous)
    with pytest.raises(Unsupported):  # never run where it starts by the plain statement path
        RankRun.apply(object.__new__(RankRun), gather, 0, 0)
    order = [type(item).__name__ for item, _ in param_events(step)]
    assert order[0] == "Wait" and order[-1] == "Collective"
    pending = Pending()
    pending.start(gather)
    (done,) = pending.complete(step.waits[0])
    assert not done.asynchronous and pending.flying == []
