"""Composition safety: the placement and the step describe the same program.

The costs divide a state's bytes by every axis along which the placement shards it
(:mod:`placeverify.cost.memory`); the integrity and consistency proofs run the step. They are about
one program only if the step shards what the placement shards, and nothing else. For every
parameter group and every mesh axis of size > 1 along which the group's layout is a *choice* —
data and context axes, an expert axis for the groups that are data-parallel over it, a tensor axis
for the norms (which tensor parallelism replicates) — the placement's mode in memory's sense
(sharded: S, S* or O on a data or context axis; replicated otherwise) is compared with what the
step does to that group. Along the other axes (a tensor, pipeline or expert axis splitting the
group's parameters) the role itself shards Θ, Ω and G, and no statement can undo it.

The rule, per state (``n`` the axis size, ``m`` the micro-batch count):

- **G**: the step *holds the gradient as a shard* over the axis when the gradient the update reads
  was reduce-scattered over a group covering the axis (no backward or ``all_gather grads`` since)
  and, with m > 1, the full buffer does not outlive any micro-batch (``free grads`` after each
  micro-batch's reduce-scatter). G placed S or O must be held as a shard (else memory counts 1/n
  of a gradient every rank holds in full); G placed R must not be, with m > 1 (the placement then
  reports a full buffer the step never keeps). A data axis placed ``reduce = step`` declares the
  full buffer across the micro-batches (FSDP2's ``set_requires_gradient_sync(False)``): there the
  gradient need only be reduce-scattered before the update, and memory counts the full buffer
  while it accumulates. With m = 1 a step cannot tell ZeRO-1 (a full
  buffer, the shard read out of it) from ZeRO-2 (reduced bucket by bucket): both agree.
- **Ω**: Ω placed S or O must be *updated on shards* by the step: the update reads a gradient
  shard over the axis, or the parameters are reassembled over it after the update
  (``all_gather params`` or ``broadcast(from = owner) params``), or Θ itself is sharded over it.
  Otherwise every rank consumes the whole reduced gradient and nothing redistributes updated
  parameters, so each rank updates, and holds the optimizer state of, every element. Ω placed R
  must not read a gradient shard over the axis.
- **Θ**: Θ placed S* or O over a data axis must not be all-gathered or broadcast in full after the
  update (the step would then keep whole parameters between steps).

Activations are not compared: no step statement shards or gathers them. The analysis compares
sizes only with 1, so every size >= 2 behaves alike (``placeverify prove`` relies on that).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import AxisPlacement, Mode, Reduce, Role, State
from placeverify.ir.step import (
    Backward,
    Collective,
    CollectiveKind,
    Op,
    Scale,
    Step,
    TargetKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.roles import ROLES
from placeverify.roles.queries import replicates_model
from placeverify.semantics.buffers import GradMachine
from placeverify.semantics.schedule import MicroBatch, Phase
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict

METHOD = "rules over the placement and the step"
KIND = ObligationKind.PLACEMENT_STEP
GROUPS = "<groups>"  # where a reason names its parameter groups, before groups are merged


def placement_step_obligations(strategy: Strategy) -> list[Obligation]:
    """One obligation per mesh axis of size > 1 and state (G, Ω; Θ where it is sharded) whose
    layout the placement chooses: does the step shard exactly what the placement shards?"""
    out: list[Obligation] = []
    groups = strategy.model.groups_present()
    facts = {g: _walk(strategy.step, g, _live(strategy)) for g in groups}
    for p in strategy.placements:
        if strategy.size(p.axis) < 2:
            continue
        chosen = [g for g in groups if memory_sharded(strategy, g, p, State.GRADIENTS) is not None]
        if not chosen:
            continue
        for state in (State.GRADIENTS, State.OPTIMIZER, State.PARAMS):
            # groups alike in memory's view share one obligation
            kinds: dict[bool, list[ParamGroup]] = {}
            for g in chosen:
                sharded = memory_sharded(strategy, g, p, state)
                assert sharded is not None
                kinds.setdefault(sharded, []).append(g)
            for sharded, members in kinds.items():
                if state is State.PARAMS and not sharded:
                    continue  # a replicated Θ is what every step starts from (consistency checks it)
                out.append(_judge(strategy, p, state, sharded, members, facts))
    return out


def memory_sharded(strategy: Strategy, group: ParamGroup, p: AxisPlacement,
                   state: State) -> bool | None:
    """Does memory divide this group's state by the axis (True), keep it whole (False), or is the
    split fixed by the axis's role (None)? Mirrors :func:`placeverify.cost.memory.model_split`
    and :func:`~placeverify.cost.memory.data_split`."""
    if replicates_model(p, group):
        return p.mode_of(state, group).sharded
    return None if ROLES[p.role].splits_model(group) else False


# ---- what the step does to one group's gradient ---------------------------------------------


@dataclass
class _Facts:
    """What the step does to one parameter group, as far as placement is concerned."""

    update: Update | None = None
    scattered: frozenset[str] = frozenset()  # axes (size > 1) of the shard the update reads
    scatter: Collective | None = None  # the reduce-scatter that left that shard
    held_full: bool = False  # the full buffer outlives a micro-batch (is not freed before the next)
    reductions: list[Collective] = field(default_factory=list)  # gradient reductions, in order
    gathers: list[Collective] = field(default_factory=list)  # parameter gathers after the update


def _live(strategy: Strategy) -> frozenset[str]:
    return frozenset(a.name for a in strategy.mesh.axes if a.size > 1)


class _Held:
    """The domain of :mod:`placeverify.semantics.buffers` that knows only whether a buffer holds a
    gradient: what memory needs to know of the step."""

    def zero(self) -> bool:
        return False

    def backward(self, buffer: bool, op: Backward, k: MicroBatch) -> bool:
        return True

    def reduce(self, buffer: bool, op: Collective) -> bool:
        return buffer

    def accumulate(self, shard: bool, value: bool) -> bool:
        return shard or value

    def scale(self, buffer: bool, op: Scale, k: MicroBatch) -> bool:
        return buffer


def _walk(step: Step, group: ParamGroup, live: frozenset[str]) -> _Facts:
    """Run the step for ``group`` under the buffer rules of :mod:`placeverify.semantics.buffers`
    and record what memory depends on. The loop stops once a micro-batch maps the state to
    itself (later ones then change nothing), so any micro-batch count costs a few."""
    facts = _Facts()

    def observe(machine: GradMachine[bool], op: Op, k: MicroBatch) -> None:
        if isinstance(op, Update):
            facts.update = op
            if machine.sharded:
                facts.scattered, facts.scatter = machine.scattered, machine.scatter_op
        if (isinstance(op, Collective) and op.target.kind is TargetKind.GRADS
                and op.kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
                and op.target.applies_to(group)
                and not any(op is seen for seen in facts.reductions)):
            facts.reductions.append(op)

    def state(machine: GradMachine[bool]) -> tuple[object, ...]:
        return (machine.full, machine.shard, machine.sharded, machine.scattered)

    machine = GradMachine(_Held(), group, live.__contains__, observe, judges_values=False)
    machine.run(step, step.microbatches, fixpoint=state)
    facts.held_full = _holds_full_buffer(step, group, live)
    facts.gathers = [p.op for p in machine.positions
                     if p.after_update and p.op.target.kind is TargetKind.PARAMS]
    return facts


def _holds_full_buffer(step: Step, group: ParamGroup, live: frozenset[str]) -> bool:
    """Does the full gradient buffer outlive a micro-batch (hold a gradient when the next one
    starts)? A property of the statements, so judged with every micro-batch writing its gradient:
    a micro-batch without tokens (``empty microbatches``) or one that leaves the group unused
    (``unused``) writes nothing, so the buffer holds nothing after it although the step frees
    nothing — read from that pattern, a step that keeps the full buffer (ZeRO-1) would seem to
    free it after each micro-batch."""
    held_after: dict[int, bool] = {}  # does the full buffer hold a gradient after micro-batch k?

    def observe(machine: GradMachine[bool], op: Op, k: MicroBatch) -> None:
        if machine.phase is Phase.LOOP and isinstance(k, int):
            held_after[k] = machine.full

    def state(machine: GradMachine[bool]) -> tuple[object, ...]:
        return (machine.full, machine.shard, machine.sharded, machine.scattered)

    every = replace(step, idle=(), empty=frozenset())
    machine = GradMachine(_Held(), group, live.__contains__, observe, judges_values=False)
    machine.run(every, every.microbatches, fixpoint=state)
    return any(held for k, held in held_after.items() if k < step.microbatches - 1)


# ---- judging ----------------------------------------------------------------------------------


def _judge(strategy: Strategy, p: AxisPlacement, state: State, sharded: bool,
           members: list[ParamGroup], facts: dict[ParamGroup, _Facts]) -> Obligation:
    axis = p.axis
    claim = (f"the step {'shards' if sharded else 'keeps whole'} {state.symbol} ({state.value}) "
             f"of the {_names(members)} parameters over {axis}, as the placement does "
             f"({_layout(p, state, members[0])}{': ' + _why_whole(p) if _why_whole(p) else ''})"
             ).replace(GROUPS, _names(members))
    problems: dict[str, list[ParamGroup]] = {}
    fixes: list[str] = []
    for g in members:
        found = _problem(strategy, p, state, sharded, g, facts[g])
        if found is not None:
            problems.setdefault(found[0], []).append(g)
            if found[1] not in fixes:
                fixes.append(found[1])
    if not problems:
        return Obligation(Condition.COMPOSITION_SAFETY, claim, Verdict.PROVED, p.span, KIND,
                          method=METHOD)
    reasons = [text.replace(GROUPS, _names(gs)) for text, gs in problems.items()]
    return Obligation(Condition.COMPOSITION_SAFETY, claim, Verdict.REFUTED, p.span, KIND,
                      reason="; ".join(reasons), fix="; or ".join(fixes), method=METHOD)


def _problem(strategy: Strategy, p: AxisPlacement, state: State, sharded: bool,
             group: ParamGroup, facts: _Facts) -> tuple[str, str] | None:
    """(reason, fix) when the step disagrees with the placement, else None. The reason names the
    parameter groups as GROUPS, for the caller to merge groups with the same reason."""
    axis, n = p.axis, strategy.size(p.axis)
    where = f"placed at line {p.span.line}" + (f"; {_why_whole(p)}" if _why_whole(p) else "")
    m = strategy.step.microbatches
    mode = _layout(p, state, group)
    step = strategy.step
    scattered = axis in facts.scattered
    if state is State.GRADIENTS:
        shard_only = scattered and (m == 1 or not facts.held_full)
        if sharded and not scattered:
            return (f"G is {mode} over {axis} ({where}), so memory counts 1/{n} of the "
                    f"{GROUPS} gradient, but {_reductions(step, facts, axis)}, so every rank "
                    "holds the full gradient",
                    f"'reduce_scatter(sum, accumulate) grads over {axis}' after each micro-batch's "
                    f"backward, then 'free grads' (ZeRO-2), or place G = R over {axis}")
        if sharded and not shard_only and p.reduce is Reduce.STEP:
            return None  # declared: memory counts the unsharded gradient while it accumulates
        if sharded and not shard_only:
            assert facts.scatter is not None
            scatter = _statement(step, facts.scatter)
            how = (f"{scatter} reduce-scatters each micro-batch's gradient but the full buffer is "
                   f"never freed, so every rank keeps it across the {m} micro-batches"
                   if any(lo.op is facts.scatter and lo.microbatch is None for lo in step.loop)
                   else f"the gradient is accumulated in full over the {m} micro-batches and "
                   f"{scatter} reduce-scatters it only after that, so every rank holds the full "
                   "gradient while accumulating")
            return (f"G is {mode} over {axis} ({where}), so memory counts 1/{n} of the "
                    f"{GROUPS} gradient, but {how}",
                    f"'reduce_scatter(sum, accumulate) grads over {axis}' and 'free grads' inside "
                    f"the micro-batch loop (ZeRO-2), or place G = R over {axis} (ZeRO-1)")
        if not sharded and scattered and m > 1 and not facts.held_full:
            assert facts.scatter is not None
            return (f"G is {mode} over {axis} ({where}), so memory counts the "
                    f"whole {GROUPS} gradient, but the step keeps only the 1/{n} shard "
                    f"{_statement(step, facts.scatter)} leaves, freeing the full buffer after "
                    f"each of the {m} micro-batches",
                    f"place G = S over {axis}{' (zero2)' if p.role is Role.DATA else ''}, or keep "
                    "the full buffer (drop 'free grads')")
        return None
    if state is State.OPTIMIZER:
        if sharded:
            gathered = [op for op in facts.gathers if op.group.covers(axis)
                        and (op.kind is CollectiveKind.ALL_GATHER or op.from_owner)]
            params_sharded = memory_sharded(strategy, group, p, State.PARAMS)
            if scattered or gathered or params_sharded:
                return None
            return (f"Ω is {mode} over {axis} ({where}), so memory counts 1/{n} of the "
                    f"{GROUPS} optimizer state, but {_reductions(step, facts, axis)} and no "
                    f"parameter all-gather over {axis} follows the update, so every rank updates "
                    "every element and needs the whole optimizer state",
                    f"'reduce_scatter(sum) grads over {axis}' before the update, or "
                    f"'all_gather params over {axis}' (or 'broadcast(from = owner) params over "
                    f"{axis}') after it; or place Ω = R over {axis}")
        if scattered:
            assert facts.scatter is not None
            return (f"Ω is {mode} over {axis} ({where}), so every rank runs the "
                    f"optimizer on the whole {GROUPS} state, but the update reads the 1/{n} "
                    f"gradient shard {_statement(step, facts.scatter)} leaves",
                    f"'all_reduce(sum) grads over {axis}'" + _or_shard(p))
        return None
    gathers = [op for op in facts.gathers if op.group.covers(axis)]
    if sharded and gathers:
        return (f"Θ is {mode} over {axis} ({where}), so memory counts 1/{n} of the "
                f"{GROUPS} parameters, but {_statement(step, gathers[0])} assembles them "
                "in full after the update and every rank keeps them until the next step",
                f"drop '{gathers[0].label()}' (S* gathers before each use), or place Θ = R over "
                f"{axis} (zero1/zero2)")
    return None


def _reductions(step: Step, facts: _Facts, axis: str) -> str:
    """What the step does instead of leaving the update a shard over ``axis``."""
    over = [op for op in facts.reductions if op.group.covers(axis)]
    scatters = [op for op in over if op.kind is CollectiveKind.REDUCE_SCATTER]
    if scatters:
        return f"the update does not read the shard {_statement(step, scatters[-1])} leaves"
    if over:
        return f"the step all-reduces the gradient with {_statement(step, over[0])}"
    return f"the step never reduces the gradient over {axis}"


def _statement(step: Step, op: Collective) -> str:
    """A statement as the report names it: its text and line, or its place in the canonical step
    (whose statements have no line of their own)."""
    if step.canonical:
        return f"the canonical step's '{op.label()}'"
    return f"'{op.label()}' at line {op.span.line}"


def _layout(p: AxisPlacement, state: State, group: ParamGroup) -> str:
    """A group's state's mode along an axis as memory reads it."""
    return p.mode_of(state, group).value if replicates_model(p, group) else Mode.R.value


def _why_whole(p: AxisPlacement) -> str:
    """Why memory keeps groups whole along an axis whose role gives them S (a template)."""
    if p.role is Role.TENSOR:
        return f"tensor parallelism does not split the {GROUPS}"
    if p.role is Role.EXPERT:
        return f"an expert axis splits only the experts, not the {GROUPS}"
    return ""


def _or_shard(p: AxisPlacement) -> str:
    """The placement that would shard the optimizer along this axis, as a fix's alternative."""
    if p.role is Role.DATA:
        return f", or place Ω = S over {p.axis} (zero1)"
    if p.role is Role.CONTEXT:
        return f", or place Ω = S over {p.axis} (context(R, S, R, S))"
    return ""


def _names(groups: Iterable[ParamGroup]) -> str:
    names = [g.value for g in groups]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
