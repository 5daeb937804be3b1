"""``placeverify replay trace.json --emit repro.py``: a standalone PyTorch reproducer.

Like Kani's concrete playback (REFERENCE §7), the counterexample becomes a program the user runs
with their own tools: ``torchrun --nproc-per-node N repro.py`` on CPUs (gloo) or GPUs (NCCL when
CUDA is available). The script imports only torch and the standard library. It hard-codes the
counterexample — the mesh, which axes each process group spans, the per-rank token and sample
counts, the micro-batch count — on a tiny model (the parameter groups of the file's model: an
embedding, a LayerNorm, an MLP, an expert MLP, a tied or untied output layer), trains it for a
few steps twice, once with the file's step and once with the canonical correct step of the same
placement (the replay's control), computes single-device training on the global batch in every
rank, and prints per rank the largest difference of the gradient the optimizer consumes and of
the parameters from the reference, then a verdict; it exits 1 when the buggy step diverges and
the fixed one matches, 0 otherwise (2 when started on the wrong number of processes).

The step is emitted as straight-line code, one emitter per statement kind (:data:`EMITTERS`,
:data:`COLLECTIVES`), micro-batches unrolled, each statement under a comment with its source
line. Which buffer a statement acts on (the full gradient or the reduce-scatter shard) is known
statically and resolved here, as :mod:`placeverify.semantics.buffers` defines it. The fixed part
of the script is :data:`placeverify.replay.emit_runtime.RUNTIME`.

Emitted: meshes whose split axes all hold data (DDP, ZeRO-1/2/3, FSDP, HSDP), every loss kind,
``backward``, ``scale``, ``clip``, ``free``, ``update``, gradient ``all_reduce`` (sum, mean,
max; fixed or rank-dependent order), ``reduce_scatter`` (also with ``accumulate``), gradient
``all_gather``, parameter ``all_gather`` and ``broadcast``, the ``overflow`` flag of dynamic
loss scaling, and token all-reduces (which the counts already do). Refused with
:class:`EmitRefused` (exit 2, the statement or placement named with its line): tensor,
pipeline, context and expert axes of more than one rank, ``ends(pp)`` groups, ``seed``
statements and recomputation without restoring the RNG state (the tiny model has no dropout),
and anything else the replay itself would refuse.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from placeverify import __version__
from placeverify.diagnostics import ExitCode
from placeverify.errors import PlaceverifyError
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role
from placeverify.ir.precision import LossScale
from placeverify.ir.relations import Relation
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Count,
    Free,
    Monomial,
    Op,
    Order,
    ReduceOp,
    Scale,
    Scope,
    Step,
    TermKind,
    Update,
)
from placeverify.ir.strategy import RecomputeKind, Strategy
from placeverify.lower import canonical, load_text
from placeverify.lower.resize import resize
from placeverify.replay.counts import AtomCounts, pick_counts, trace_counts
from placeverify.replay.emit_runtime import RUNTIME
from placeverify.replay.layout import gathered_axes, optimizer_axes
from placeverify.replay.plan import DEFAULT_SEED, DEFAULT_STEPS
from placeverify.replay.sizes import replayed_sizes
from placeverify.roles.relations import batch_axes
from placeverify.roles.relations import relation as axis_relation
from placeverify.semantics.schedule import Phase, events
from placeverify.trace import Trace, load
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


def label(op: Op) -> str:
    """A statement as the .place language writes it."""
    if isinstance(op, Backward):
        return f"backward {op.loss.text}"
    if isinstance(op, Collective):
        return op.label()
    if isinstance(op, Scale):
        return f"scale {op.target.label()} by {op.factor.text}"
    if isinstance(op, Clip):
        group = f" over {op.group.label()}" if op.group.axes else ""
        once = "" if op.replicated_once else ", replicated = every"
        return f"clip(max_norm = {op.max_norm}{once}) {op.target.label()}{group}"
    if isinstance(op, Free):
        return f"free {op.target.label()}"
    return "update params"


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
        return EmitRefused(f"{_where(op, self.written)}'{label(op)}': {why}")

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
            self.emit(f"# {where}{label(op)}{loop}")
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


def check_layout(strategy: Strategy) -> None:
    """Refuse what the tiny, unsplit model cannot show."""
    for p in strategy.placements:
        if p.role is not Role.DATA and strategy.size(p.axis) > 1:
            raise EmitRefused(f"line {p.span.line}: 'place {p.preset or p.role.value} over "
                              f"{p.axis}' ({p.role.value} axis of {strategy.size(p.axis)} ranks): "
                              "only data-parallel axes are emitted (`placeverify replay` runs "
                              "this trace)")
    for seed in strategy.step.seeds:
        word = "same" if seed.same else "differ"
        raise EmitRefused(f"line {seed.span.line}: 'seed dropout({seed.region.value}) {word} over "
                          f"{seed.group.label()}': dropout seeds are not emitted (the "
                          "reproducer's model has no dropout; `placeverify replay` runs this trace)")
    rc = strategy.recompute
    arch = strategy.model.arch
    if rc.kind is not RecomputeKind.NONE and not rc.restore_rng and arch is not None and arch.dropout:
        line = f"line {rc.span.line}: " if rc.span else ""
        raise EmitRefused(f"{line}'recompute {rc.kind.value}(restore_rng = false)': the RNG state "
                          "of a recomputation is not emitted (the reproducer's model has no "
                          "dropout; `placeverify replay` runs this trace)")


# ---- the script ----------------------------------------------------------------------------------------


def _counts_literal(counts: AtomCounts) -> str:
    rows = [f"{(tuple(b), k)!r}: {n}" for b, k, n in counts]
    return "{" + ", ".join(rows) + "}"


def emit_script(trace: Trace, *, trace_path: str, script: str = "repro.py",
                world: int | None = None, steps: int = DEFAULT_STEPS) -> str:
    """The reproducer's text, or :class:`EmitRefused`."""
    path = trace.file or "<trace>"
    declared = load_text(trace.source, path)
    keep = {a: trace.mesh.get(a, 1) for a in declared.mesh.names}
    sizes, resized_because = replayed_sizes(declared, keep, world, "trace's mesh")
    m = trace.microbatches
    strategy = resize(declared, sizes)
    check_layout(strategy)
    if trace.kind in UNEMITTED_KINDS:
        where = f"line {trace.line}: " if trace.line else ""
        raise EmitRefused(f"{where}a '{trace.kind.value}' refutation is not emitted: "
                          f"{UNEMITTED_KINDS[trace.kind]} (`placeverify replay` runs this trace)")
    counts = trace_counts(trace, strategy, sizes, m) if sizes == keep else None
    if counts is None:
        tokens, samples, _ = pick_counts(strategy, sizes, m,
                                         trace.kind is ObligationKind.COEFFICIENT)
    else:
        tokens, samples = counts
    groups, shapes, tied = model_shapes(strategy)
    buggy = StepEmitter(strategy, sizes, m, groups, written=not strategy.step.canonical)
    buggy_lines = buggy.step(strategy.step, "buggy_step", "The step as the file writes it.")
    fixed = StepEmitter(strategy, sizes, m, groups, written=False)
    fixed_lines = fixed.step(canonical.derive(strategy.config), "fixed_step",
                             "The canonical correct step of the same placement "
                             "(the replay's control).")
    seq = max(2, *(-(-n // s) for (_, _, n), (_, _, s) in zip(tokens, samples, strict=True)))
    names = strategy.mesh.names
    group_axes = sorted(buggy.axes_used | fixed.axes_used | {names, ()},
                        key=lambda axes: (len(axes), axes))
    clip = strategy.clip.max_norm if strategy.clip is not None else next(
        (op.max_norm for op in strategy.step.ops() if isinstance(op, Clip)), None)
    world_size = 1
    for n in sizes.values():
        world_size *= n
    numel = {g: sum(_prod(shapes[n]) for n in params) for g, params in groups.items()}
    header = _header(trace, trace_path, script, sizes, keep, resized_because, world_size, steps)
    constants = [
        "# ---- the counterexample " + "-" * 74,
        "",
        f"MESH = {dict(sizes)!r}  # axis -> size; ranks laid out as arange(world).view(*sizes)",
        f"BATCH_AXES = {batch_axes(strategy)!r}  # the axes whose ranks see different data",
        f"MICROBATCHES = {m}",
        "# (coordinates along BATCH_AXES, micro-batch) -> labelled tokens and sequences",
        f"TOKENS = {_counts_literal(tokens)}",
        f"SAMPLES = {_counts_literal(samples)}",
        f'LOSS = "{strategy.loss.kind.value}"  # the single-device loss the step must compute',
        f"MAX_NORM = {None if clip is None else float(clip)!r}  # gradient clipping (global norm)",
        f"DYNAMIC_LOSS_SCALE = {strategy.loss_scale == LossScale.DYNAMIC}",
        f"LOSS_SCALE = {LOSS_SCALE}  # the loss-scale factor, where the step names it",
        "# axes along which each rank updates 1/n of a parameter group (ZeRO)",
        "OPTIMIZER_AXES = {" + ", ".join(f'"{g.value}": {optimizer_axes(strategy, g)!r}'
                                         for g in groups) + "}",
        f"GROUP_AXES = {group_axes!r}  # the process groups the step uses",
        f"STEPS = {steps}",
        f"SEED = {DEFAULT_SEED}",
        "",
        "# ---- the tiny model: the parameter groups of the file's model " + "-" * 36,
        "",
        f"HIDDEN, VOCAB, SEQ = {HIDDEN}, {VOCAB}, {seq}",
        f"TIED = {tied}  # the output layer is the embedding",
        "SHAPES = {" + ", ".join(f'"{n}": {s!r}' for n, s in shapes.items()) + "}",
        "GROUPS = {" + ", ".join(f'"{g.value}": {p!r}' for g, p in groups.items()) + "}",
        "NUMEL = {" + ", ".join(f'"{g.value}": {n}' for g, n in numel.items()) + "}",
    ]
    steps_text = ["# ---- the steps, statement by statement " + "-" * 59, "", *buggy_lines, "",
                  "", *fixed_lines]
    return "\n".join([header, IMPORTS, *constants, RUNTIME.rstrip(), "", "", *steps_text, "", "",
                      'if __name__ == "__main__":', "    main()", ""])


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


IMPORTS = """import hashlib
import math
import os
import sys
from fractions import Fraction

import torch
import torch.distributed as dist
import torch.nn.functional as F
"""


def _header(trace: Trace, trace_path: str, script: str, sizes: dict[str, int], keep: dict[str, int],
            resized_because: str | None, world: int, steps: int) -> str:
    mesh = ", ".join(f"{a} = {n}" for a, n in sizes.items())
    lines = [
        "#!/usr/bin/env python3",
        '"""Standalone reproducer of a placeverify counterexample (no placeverify needed).',
        "",
        f"Trace: {trace_path} (placeverify.trace/1), from {trace.file or '<no file>'}"
        + (f" line {trace.line}" if trace.line else ""),
        f"Strategy: {trace.strategy or '(unnamed)'}",
        f"Refuted: {trace.condition.value} ({trace.kind.value})",
        f"Claim: {trace.claim}",
        f"Why: {trace.reason}",
    ]
    if trace.fix:
        lines.append(f"Fix: {trace.fix}")
    lines += [
        f"Emitted by placeverify {__version__} (the trace was written by placeverify "
        f"{trace.placeverify}).",
        "",
        f"Mesh: {mesh} ({world} process{'es' if world != 1 else ''}).",
    ]
    if resized_because:
        lines.append(f"Resized from the trace's mesh "
                     f"{', '.join(f'{a} = {n}' for a, n in keep.items())}: {resized_because}.")
    lines += [
        "",
        "Run:",
        f"    torchrun --standalone --nproc-per-node {world} {script}",
        "on CPUs (gloo), or on GPUs (NCCL, one per process) when CUDA is available"
        + (f"; or: python {script}." if world == 1 else "."),
        "",
        f"It trains a tiny model for {steps} steps twice, with the step as the file writes it and",
        "with the canonical correct step of the same placement, computes single-device training on",
        "the global batch in every rank, and prints per rank the largest difference of the",
        "gradient the optimizer consumes and of the parameters from it (float64). Exit status: 1",
        "when the buggy step diverges and the fixed one matches, 0 otherwise, 2 when started on",
        "the wrong number of processes.",
        '"""',
        "",
    ]
    return "\n".join(lines)


# ---- the command ------------------------------------------------------------------------------------


def write_atomically(text: str, path: str) -> None:
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=".repro-", suffix=".py", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def emit_trace(path: str, out: str, *, world: int | None, steps: int,
               console: Console) -> ExitCode:
    """``placeverify replay trace.json --emit repro.py``: 0 when written, 2 when refused."""
    trace = load(path)  # a bad trace raises PlaceError: the CLI prints it
    try:
        text = emit_script(trace, trace_path=path, script=Path(out).name, world=world,
                           steps=steps)
    except EmitRefused as refused:
        Console(stderr=True, highlight=False, markup=False, soft_wrap=True).print(
            f"placeverify: replay --emit: cannot emit {trace.file or path}: {refused}",
            markup=False)
        return ExitCode.INPUT_ERROR
    try:
        write_atomically(text, out)
    except OSError as err:
        Console(stderr=True, highlight=False, markup=False, soft_wrap=True).print(
            f"placeverify: replay --emit: cannot write {out}: {err.strerror}", markup=False)
        return ExitCode.READ_ERROR
    processes = text.split("--nproc-per-node ", 1)[1].split(" ", 1)[0]
    console.print(f"reproducer written to {out}; run: torchrun --standalone --nproc-per-node "
                  f"{processes} {out}", markup=False)
    return ExitCode.OK

