"""The step of a trace as straight-line torch code: one emitter per statement kind.

Part of ``placeverify replay --emit`` (:mod:`placeverify.replay.emit`). Micro-batches are
unrolled, each statement under a comment with its source line; which buffer a statement acts on
(the full gradient or the reduce-scatter shard) is resolved here, as
:mod:`placeverify.semantics.buffers` defines it. A statement kind with no emitter is refused with
:class:`EmitRefused`, never skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from placeverify.errors import PlaceverifyError
from placeverify.ir.model import ParamGroup
from placeverify.ir.relations import Relation
from placeverify.ir.render import op_label
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Count,
    Free,
    Monomial,
    NormKind,
    Op,
    Order,
    ReduceOp,
    Scale,
    Scope,
    Step,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.replay.layout import gathered_axes
from placeverify.roles.relations import relation as axis_relation
from placeverify.semantics.schedule import Phase, events
from placeverify.verdicts import ObligationKind

HIDDEN, FFN, VOCAB = 8, 16, 16
LOSS_SCALE = 8  # the replay's concrete loss-scale factor


# Refutations a numeric run of the tiny model cannot show, and why.
UNEMITTED_KINDS = {
    ObligationKind.RNG: "the reproducer's model has no dropout",
    ObligationKind.RECOMPUTE: "the reproducer's model has no dropout to recompute",
    ObligationKind.PLACEMENT_STEP: "it is about the placement's bookkeeping, not computed values",
    ObligationKind.REALISABLE: "it is about the placement's bookkeeping, not computed values",
}


class EmitRefused(PlaceverifyError):
    """A statement or layout the reproducer does not emit; the message names it and its line."""


# ---- the tiny model --------------------------------------------------------------------------------


def model_shapes(strategy: Strategy) -> tuple[dict[ParamGroup, list[str]], dict[str, tuple[int, ...]],
                                              bool]:
    """Parameters per group, their shapes, and whether the output layer is the embedding."""
    present = strategy.model.groups_present()
    arch = strategy.model.arch
    tied = bool(arch and arch.tied_embeddings) and ParamGroup.EMBEDDING in present
    groups: dict[ParamGroup, list[str]] = {}
    shapes: dict[str, tuple[int, ...]] = {}

    def add(group: ParamGroup, name: str, shape: tuple[int, ...]) -> None:
        groups.setdefault(group, []).append(name)
        shapes[name] = shape

    if ParamGroup.EMBEDDING in present:
        add(ParamGroup.EMBEDDING, "embed", (VOCAB, HIDDEN))
    if ParamGroup.NORMS in present:
        add(ParamGroup.NORMS, "norm.weight", (HIDDEN,))
        add(ParamGroup.NORMS, "norm.bias", (HIDDEN,))
    add(ParamGroup.DENSE, "fc1", (FFN, HIDDEN))
    add(ParamGroup.DENSE, "fc2", (HIDDEN, FFN))
    if ParamGroup.EXPERTS in present:
        add(ParamGroup.EXPERTS, "expert.fc1", (FFN, HIDDEN))
        add(ParamGroup.EXPERTS, "expert.fc2", (HIDDEN, FFN))
    if not tied:
        add(ParamGroup.DENSE, "head", (VOCAB, HIDDEN))
    ordered = {g: groups[g] for g in ParamGroup if g in groups}
    return ordered, shapes, tied


# ---- statements --------------------------------------------------------------------------------------


def _where(op: Op, written: bool) -> str:
    span = op.span
    if written and span is not None:
        return f"line {span.line}: "
    return ""


@dataclass
class _Buffer:
    """What a group's gradient statically denotes at a point of the step."""

    sharded: bool = False
    shard_axes: tuple[str, ...] | None = None  # the group the shard was scattered over
    scattered: set[str] = field(default_factory=set)


class StepEmitter:
    """Straight-line code for one step function, statement by statement."""

    def __init__(self, strategy: Strategy, sizes: dict[str, int], microbatches: int,
                 groups: dict[ParamGroup, list[str]], written: bool) -> None:
        self.s = strategy
        self.sizes = sizes
        self.m = microbatches
        self.groups = groups
        self.written = written  # the file's own step (its statements have source lines)
        self.axes_used: set[tuple[str, ...]] = set()
        self.lines: list[str] = []
        self.state: dict[ParamGroup, _Buffer] = {}
        self.counts: dict[Count, str] = {}

    # ---- helpers ----

    def refuse(self, op: Op, why: str) -> EmitRefused:
        return EmitRefused(f"{_where(op, self.written)}'{op_label(op)}': {why}")

    def axes(self, op: Op, group_axes: tuple[str, ...], ends: frozenset[str]) -> tuple[str, ...]:
        if ends:
            raise self.refuse(op, "groups over the ends of a pipeline axis are not emitted "
                                  "(`placeverify replay` runs them)")
        ordered = tuple(a for a in self.s.mesh.names if a in group_axes)
        self.axes_used.add(ordered)
        return ordered

    def emit(self, text: str) -> None:
        self.lines.append("    " + text)

    def targets(self, applies: Callable[[ParamGroup], bool]) -> list[ParamGroup]:
        return [g for g in self.groups if applies(g)]

    def denoted(self, g: ParamGroup) -> str:
        return f'run.shard["{g.value}"]' if self.state[g].sharded else f'run.full["{g.value}"]'

    def live(self, axis: str) -> bool:
        return self.sizes.get(axis, 1) > 1

    def count_name(self, count: Count) -> str:
        name = self.counts.get(count)
        if name is None:
            name = "_".join([count.kind.value, *count.axes] + (["step"] if count.scope is Scope.STEP
                                                                 else []))
            self.counts[count] = name
        return name

    def factor(self, monomial: Monomial, k: int, op: Op) -> str:
        parts: list[str] = []
        for term, exponent in monomial.factors:
            if term.kind is TermKind.LOSS_SUM:
                if exponent != 1:
                    raise self.refuse(op, "a loss that is not linear in the loss sum is not emitted")
                continue
            if term.kind is TermKind.NUMBER:
                n = term.number
                x = f"Fraction({n.numerator}, {n.denominator})" if n.denominator != 1 \
                    else f"Fraction({n.numerator})"
            elif term.kind is TermKind.MICROBATCHES:
                x = "MICROBATCHES"
            elif term.kind is TermKind.LOSS_SCALE:
                x = "LOSS_SCALE"
            elif term.kind is TermKind.SIZE:
                assert term.group is not None
                group_axes = self.axes(op, term.group.axes, term.group.ends)
                x = f"size({', '.join(repr(a) for a in group_axes)})"
            elif term.kind is TermKind.SIZE_ROOT:
                raise self.refuse(op, "a square root of a size (|g| ^ 0.5) is not emitted")
            else:
                assert term.count is not None
                x = f"{self.count_name(term.count)}[{k}]"
            if x == "Fraction(1)":
                continue
            parts += [("* " if exponent > 0 else "/ ") + x] * abs(exponent)
        return " ".join(["Fraction(1)", *parts])

    # ---- the step ----

    def step(self, step: Step, name: str, what: str) -> list[str]:
        self.state = {g: _Buffer() for g in self.groups}
        body: list[str] = []
        for event in events(step, self.m):
            assert isinstance(event.k, int)
            self.lines = []
            op = event.op
            where = _where(op, self.written)
            loop = f" (micro-batch {event.k})" if event.phase is Phase.LOOP else ""
            self.emit(f"# {where}{op_label(op)}{loop}")
            emitter = EMITTERS.get(type(op))
            if emitter is None:
                raise self.refuse(op, "this statement kind is not emitted")
            emitter(self, op, event.k)
            body += self.lines
        self.lines = []
        gathered = gathered_axes(self.s)
        if gathered:
            axes = self.axes_used_add(tuple(a for a in self.s.mesh.names if a in gathered))
            self.emit("# parameters sharded before use are gathered from their owners")
            for g in self.groups:
                self.emit(f'gather_params(run, "{g.value}", {axes!r})')
            body += self.lines
        head = [f"def {name}(run, t, ref):", f'    """{what}"""']
        for count, var in self.counts.items():
            axes = self.axes_used_add(tuple(a for a in self.s.mesh.names if a in count.axes))
            scope = ("the step's total, for every micro-batch" if count.scope is Scope.STEP
                     else "each micro-batch's own")
            over = f"summed over {' * '.join(axes)}" if axes else "on this rank only"
            head.append(f'    {var} = count("{count.kind.value}", {axes!r}, '
                        f"{count.scope is Scope.STEP})  # {scope}, {over}")
        return head + body

    def axes_used_add(self, axes: tuple[str, ...]) -> tuple[str, ...]:
        self.axes_used.add(axes)
        return axes


# ---- one emitter per statement kind -------------------------------------------------------------------


def _backward(e: StepEmitter, op: Op, k: int) -> None:
    assert isinstance(op, Backward)
    if op.reaches is not None:
        # the late outcome of an asynchronous reduction (semantics/asynchrony.py): its result
        # overwrites what this backward writes to the gradients in flight
        raise e.refuse(op, "a backward whose writes land while an asynchronous collective is in "
                           "flight on the same gradients (they are lost) is not emitted (the "
                           "reproducer runs each collective where it is waited; `placeverify "
                           "replay` runs this trace)")
    e.emit(f"run.backward(t, {k}, {e.factor(op.loss, k, op)})")
    for buf in e.state.values():
        buf.sharded = False


def _scale(e: StepEmitter, op: Op, k: int) -> None:
    assert isinstance(op, Scale)
    e.emit(f"factor = float({e.factor(op.factor, k, op)})")
    for g in e.targets(op.target.applies_to):
        e.emit(f"{e.denoted(g)} = {e.denoted(g)} * factor")


def _free(e: StepEmitter, op: Op, k: int) -> None:
    assert isinstance(op, Free)
    for g in e.targets(op.target.applies_to):
        e.emit(f'run.full["{g.value}"] = torch.zeros_like(run.full["{g.value}"])')


def _clip(e: StepEmitter, op: Op, k: int) -> None:
    assert isinstance(op, Clip)
    if op.options() or (e.s.clip is not None and e.s.clip.norm is not NormKind.L2):
        raise e.refuse(op, "a clip by the inf norm or by per-rank norms combined (norm = inf, "
                           "reduce = mean | max) is not emitted")
    axes = e.axes(op, op.group.axes, op.group.ends)
    e.emit("squares = torch.zeros((), dtype=DTYPE, device=DEVICE)")
    clipped = e.targets(op.target.applies_to)
    for g in clipped:
        once = [a for a in axes if e.live(a) and _replica(e, g, a)] if op.replicated_once else []
        if once:
            condition = " and ".join(f'COORDS["{a}"] == 0' for a in once)
            note = f"  # copies along {', '.join(once)}: counted once"
            e.emit(f"squares = squares + ({e.denoted(g)} ** 2).sum() * ({condition}){note}")
        else:
            e.emit(f"squares = squares + ({e.denoted(g)} ** 2).sum()")
    e.emit(f"squares = all_reduce(squares, {axes!r})")
    e.emit(f"coef = min(1.0, {float(op.max_norm)!r} / (math.sqrt(squares) + NORM_EPS))")
    for g in clipped:
        e.emit(f"{e.denoted(g)} = {e.denoted(g)} * coef")


def _replica(e: StepEmitter, g: ParamGroup, axis: str) -> bool:
    """Do the ranks along ``axis`` hold copies of the same elements of this group?"""
    buf = e.state[g]
    if buf.sharded and axis in buf.scattered:
        return False
    return axis_relation(e.s, g, axis) is not Relation.OWNED


def _update(e: StepEmitter, op: Op, k: int) -> None:
    consumed = ", ".join(f'"{g.value}": run.consumed("{g.value}", {e.state[g].sharded})'
                         for g in e.groups)
    e.emit(f"run.update(t, {{{consumed}}}, ref)")


def _collective(e: StepEmitter, op: Op, k: int) -> None:
    assert isinstance(op, Collective)
    emitter = COLLECTIVES.get((op.kind, op.target.kind.value))
    if emitter is None:
        raise e.refuse(op, "this collective is not emitted")
    emitter(e, op, e.axes(op, op.group.axes, op.group.ends))


def _neutral(e: StepEmitter, op: Collective, axes: tuple[str, ...]) -> None:
    e.emit("pass  # the token counts in the loss are all-reduced where they are computed")


def _grads_all_reduce(e: StepEmitter, op: Collective, axes: tuple[str, ...]) -> None:
    assert op.op is not None
    call = "all_reduce_rank_dependent" if op.order is Order.RANK_DEPENDENT else "all_reduce"
    for g in e.targets(op.target.applies_to):
        e.emit(f'{e.denoted(g)} = {call}({e.denoted(g)}, {axes!r}, "{op.op.value}")')


def _grads_reduce_scatter(e: StepEmitter, op: Collective, axes: tuple[str, ...]) -> None:
    assert op.op is not None
    for g in e.targets(op.target.applies_to):
        buf = e.state[g]
        name = g.value
        e.emit(f'shard, run.shard_at["{name}"] = reduce_scatter(run.full["{name}"], {axes!r}, '
               f'"{op.op.value}", "{op.order.value}")')
        if op.accumulate and buf.shard_axes is not None:
            if buf.shard_axes != axes:
                raise e.refuse(op, "accumulates into a shard scattered over another group")
            e.emit(f'run.shard["{name}"] = run.shard["{name}"] + shard  # accumulate')
        else:
            e.emit(f'run.shard["{name}"] = shard')
        buf.sharded, buf.shard_axes = True, axes
        buf.scattered |= {a for a in axes if e.live(a)}


def _grads_all_gather(e: StepEmitter, op: Collective, axes: tuple[str, ...]) -> None:
    for g in e.targets(op.target.applies_to):
        buf = e.state[g]
        if not buf.sharded:
            e.emit(f"pass  # {g.value}: no shard to gather")
            continue
        if buf.shard_axes != axes:
            raise e.refuse(op, "gathers over another group than the shard was scattered over")
        e.emit(f'run.full["{g.value}"] = all_gather(run.shard["{g.value}"], {axes!r}, '
               f'NUMEL["{g.value}"])')
        buf.sharded, buf.scattered = False, set()


def _params_gather(e: StepEmitter, op: Collective, axes: tuple[str, ...]) -> None:
    source = "'owner'" if op.from_owner or op.kind is CollectiveKind.ALL_GATHER else op.source
    if source != "'owner'" and not 0 <= int(source) < _size(e, axes):
        raise e.refuse(op, f"broadcasts from rank {source} of a group of {_size(e, axes)}")
    for g in e.targets(op.target.applies_to):
        e.emit(f'gather_params(run, "{g.value}", {axes!r}, {source})')


def _overflow(e: StepEmitter, op: Collective, axes: tuple[str, ...]) -> None:
    if op.op is not ReduceOp.MAX:
        raise e.refuse(op, "only all_reduce(max) of the overflow flag is emitted")
    buffers = ", ".join(e.denoted(g) for g in e.groups)
    e.emit(f"flag = torch.tensor([float(nonfinite({buffers}))], dtype=DTYPE, device=DEVICE)")
    e.emit(f'run.overflow = bool(all_reduce(flag, {axes!r}, "max").item() > 0)')


def _size(e: StepEmitter, axes: tuple[str, ...]) -> int:
    n = 1
    for a in axes:
        n *= e.sizes[a]
    return n


EMITTERS: dict[type, Callable[[StepEmitter, Op, int], None]] = {
    Backward: _backward,
    Collective: _collective,
    Scale: _scale,
    Clip: _clip,
    Free: _free,
    Update: _update,
}

COLLECTIVES: dict[tuple[CollectiveKind, str], Callable[[StepEmitter, Collective, tuple[str, ...]],
                                                       None]] = {
    (CollectiveKind.ALL_REDUCE, "grads"): _grads_all_reduce,
    (CollectiveKind.REDUCE_SCATTER, "grads"): _grads_reduce_scatter,
    (CollectiveKind.ALL_GATHER, "grads"): _grads_all_gather,
    (CollectiveKind.ALL_GATHER, "params"): _params_gather,
    (CollectiveKind.BROADCAST, "params"): _params_gather,
    (CollectiveKind.ALL_REDUCE, "overflow"): _overflow,
    (CollectiveKind.ALL_REDUCE, "tokens"): _neutral,
}


# ---- the layout --------------------------------------------------------------------------------------
