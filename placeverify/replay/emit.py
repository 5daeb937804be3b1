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
the parameters from the reference, then a verdict; it exits 0 when the buggy step diverges and
the fixed one matches (the bug is reproduced, so ``torchrun`` ends cleanly), 1 otherwise (2 when
started on the wrong number of processes).

The step is emitted as straight-line code, one emitter per statement kind (:data:`EMITTERS`,
:data:`COLLECTIVES`), micro-batches unrolled, each statement under a comment with its source
line. Which buffer a statement acts on (the full gradient or the reduce-scatter shard) is known
statically and resolved here, as :mod:`placeverify.semantics.buffers` defines it. The fixed part
of the script is :data:`placeverify.replay.emit_runtime.PROCESSES` and
:data:`placeverify.replay.emit_oracle.ORACLE`.

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

from pathlib import Path

from rich.console import Console

from placeverify import __version__
from placeverify.console import stderr_console, write_atomically
from placeverify.diagnostics import ExitCode
from placeverify.ir.placement import Role
from placeverify.ir.precision import LossScale
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    Update,
)
from placeverify.ir.strategy import RecomputeKind, Strategy
from placeverify.lower import canonical
from placeverify.replay.counts import AtomCounts, pick_counts, trace_counts
from placeverify.replay.emit_oracle import ORACLE
from placeverify.replay.emit_runtime import PROCESSES
from placeverify.replay.emit_step import (
    HIDDEN,
    LOSS_SCALE,
    UNEMITTED_KINDS,
    VOCAB,
    EmitRefused,
    StepEmitter,
    model_shapes,
)
from placeverify.replay.layout import optimizer_axes
from placeverify.replay.plan import DEFAULT_SEED, DEFAULT_STEPS, trace_case
from placeverify.roles.relations import batch_axes
from placeverify.trace import Trace, load
from placeverify.verdicts import ObligationKind


def check_layout(strategy: Strategy) -> None:
    """Refuse what the tiny, unsplit model cannot show."""
    if strategy.model.frozen or strategy.model.adapter is not None:
        raise EmitRefused("a fine-tune (frozen groups or adapters) is not emitted (the "
                          "reproducer's model trains every parameter and has no adapters; "
                          "`placeverify replay` runs this trace)")
    for p in strategy.placements:
        if p.role is not Role.DATA and strategy.size(p.axis) > 1:
            raise EmitRefused(f"line {p.span.line}: 'place {p.preset or p.role.value} over "
                              f"{p.axis}' ({p.role.value} axis of {strategy.size(p.axis)} ranks): "
                              "only data-parallel axes are emitted (`placeverify replay` runs "
                              "this trace)")
    for p in strategy.placements:
        if p.group_modes:
            raise EmitRefused(f"placements for some parameter groups over '{p.axis}' ('place ... "
                              f"for {', '.join(g for g, _ in p.group_modes)}') are not emitted "
                              "(`placeverify replay` runs this trace)")
    for term in strategy.terms:
        raise EmitRefused(f"line {term.span.line}: 'loss {term.name}: {term.loss.kind.value}': "
                          "named loss terms are not emitted (the reproducer has one loss; "
                          "`placeverify replay` runs this trace)")
    if strategy.config.unused:
        from placeverify.semantics.participation import declared

        groups = ", ".join(g.value for g in declared(strategy)) or "none present"
        raise EmitRefused(f"'unused' groups ({groups}): participation patterns are not emitted "
                          "(the reproducer's model uses every parameter in every micro-batch; "
                          "`placeverify replay` runs this trace)")
    if strategy.config.empty:
        raise EmitRefused("'empty microbatches': micro-batches without tokens are not emitted "
                          "(the reproducer's data holds tokens in every micro-batch; "
                          "`placeverify replay` runs this trace)")
    for op in strategy.step.ops():
        if isinstance(op, Backward) and op.gather is not None:
            raise EmitRefused(f"line {op.gather.span.line}: '{op.gather.label()}': a collective "
                              "inside the loss is not emitted (the reproducer has no embeddings "
                              "to gather; `placeverify replay` runs this trace)")
        if isinstance(op, Update) and op.unless_overflow:
            raise EmitRefused(f"line {op.span.line}: 'update params unless overflow': a "
                              "conditional update is not emitted (the reproducer steps the "
                              "optimizer every step; `placeverify replay` runs this trace)")
        if isinstance(op, Collective) and op.asynchronous:
            raise EmitRefused(f"line {op.span.line}: '{op.label()}': asynchronous collectives "
                              "are not emitted (the reproducer runs each collective where it "
                              "stands; `placeverify replay` runs this trace)")
    if not any(isinstance(op, Update) for op in strategy.step.ops()) and \
            strategy.step.span is not None:
        raise EmitRefused(f"line {strategy.step.span.line}: a step without 'update params' is "
                          "not emitted (the reproducer steps the optimizer every step; "
                          "`placeverify replay` runs this trace)")
    for seed in strategy.step.seeds:
        word = "same" if seed.same else "differ"
        raise EmitRefused(f"line {seed.span.line}: 'seed dropout({seed.region.value}) {word} over "
                          f"{seed.group.label()}': dropout seeds are not emitted (the "
                          "reproducer's model has no dropout; `placeverify replay` runs this trace)")
    if strategy.step.windows and strategy.step.span is not None:
        raise EmitRefused(f"line {strategy.step.span.line}: several optimizer steps ('microbatches "
                          "= [...]'): the reproducer runs one window and zeroes its buffers "
                          "every step (`placeverify replay` runs this trace)")
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
    case = trace_case(trace, world=world)  # the checks replay makes: exit 2 where it refuses
    sizes, keep, resized_because = case.sizes, case.keep, case.reason
    m = trace.microbatches
    strategy = case.strategy
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
    return "\n".join([header, IMPORTS, *constants, (PROCESSES + ORACLE).rstrip(), "", "", *steps_text, "", "",
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
        "gradient the optimizer consumes and of the parameters from it (float64). Exit status: 0",
        "when the buggy step diverges and the fixed one matches (reproduced), 1 otherwise, 2 when",
        "started on the wrong number of processes.",
        '"""',
        "",
    ]
    return "\n".join(lines)


# ---- the command ------------------------------------------------------------------------------------


def emit_trace(path: str, out: str, *, world: int | None, steps: int,
               console: Console) -> ExitCode:
    """``placeverify replay trace.json --emit repro.py``: 0 when written, 2 when refused."""
    trace = load(path)  # a bad trace raises PlaceError: the CLI prints it
    try:
        text = emit_script(trace, trace_path=path, script=Path(out).name, world=world,
                           steps=steps)
    except EmitRefused as refused:
        stderr_console().print(
            f"placeverify: replay --emit: cannot emit {trace.file or path}: {refused}",
            markup=False, emoji=False)
        return ExitCode.INPUT_ERROR
    try:
        write_atomically(text, out)
    except OSError as err:
        stderr_console().print(
            f"placeverify: replay --emit: cannot write {out}: {err.strerror}", markup=False, emoji=False)
        return ExitCode.READ_ERROR
    processes = text.split("--nproc-per-node ", 1)[1].split(" ", 1)[0]
    console.print(f"reproducer written to {out}; run: torchrun --standalone --nproc-per-node "
                  f"{processes} {out}", markup=False, emoji=False)
    return ExitCode.OK

