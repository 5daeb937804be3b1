"""The space of sizes ``check --every-size`` and ``prove`` judge a strategy over: its points
(:class:`Sizes`), the strategy at one (:func:`at`), the order failures are looked for in
(:func:`smallest_first`), and the verdicts over it (:class:`EverySize`, with the sizes each
covers: :func:`coverage`). The judging is :mod:`placeverify.verify.every_size`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity
from placeverify.ir.step import LoopOp
from placeverify.ir.strategy import Strategy
from placeverify.lower import canonical
from placeverify.lower.resize import resize
from placeverify.verdicts import Condition, Verdict, Verification

REPRESENTATIVES = (1, 2, 3)  # sizes standing for 1, 2 and every size >= 3
BOUNDED_MICROBATCHES = 8
WIDEST = 6  # the largest size per axis an integer counterexample is looked for at
MICROBATCHES = "microbatches"


@dataclass(frozen=True, slots=True)
class Sizes:
    """One point of the size space: the quantified axes' sizes and the micro-batch count."""

    mesh: dict[str, int]
    microbatches: int

    def show(self) -> str:
        parts = [f"{a} = {n}" for a, n in self.mesh.items()]
        return ", ".join([*parts, f"{self.microbatches} micro-batch"
                          f"{'es' if self.microbatches != 1 else ''}"])

    def to_json(self) -> dict[str, Any]:
        return {"mesh": dict(self.mesh), "microbatches": self.microbatches}


@dataclass(frozen=True, slots=True)
class EverySize:
    """The verdict of each condition over every size of ``axes`` (and of the micro-batch count
    when ``microbatches``); ``covers`` says, per condition, which sizes its verdict covers."""

    axes: tuple[str, ...]
    microbatches: bool
    verdicts: dict[Condition, Verdict]
    covers: dict[Condition, str]
    methods: tuple[str, ...]
    detail: str = ""  # the first refutation's or unknown's reason
    counterexample: dict[str, Any] | None = None  # the first refutation's evidence
    failing: Sizes | None = None  # the smallest sizes of the first refutation
    at_failing: Verification | None = None  # the verification there (its trace), for check
    seconds: float = 0.0
    reasons: dict[Condition, str] = field(default_factory=dict)
    failures: dict[Condition, Sizes] = field(default_factory=dict)  # each refutation's sizes

    def overall(self) -> Verdict:
        return Verdict.worst(self.verdicts.values())


def with_microbatches(strategy: Strategy, m: int) -> Strategy:
    """The strategy with another micro-batch count (pipelines included). A written step keeps its
    statements: those written 'on microbatch last' run on the new last micro-batch, those on
    micro-batch k only where there is one."""
    placements = tuple(replace(p, microbatches=m) if p.microbatches is not None else p
                       for p in strategy.placements)
    changed = replace(strategy, config=replace(strategy.config, placements=placements, microbatches=m))
    if strategy.step.canonical:
        return replace(changed, step=canonical.derive(changed.config))
    step = strategy.step
    if step.windows:  # several optimizer steps keep their windows (semantics/steps.py)
        return changed
    lasts = set(step.last_ops)
    loop: list[LoopOp] = []
    kept_lasts: list[int] = []
    for i, lo in enumerate(step.loop):
        if i in lasts:
            kept_lasts.append(len(loop))
            loop.append(LoopOp(lo.op, m - 1))
        elif lo.microbatch is None or lo.microbatch < m:
            loop.append(lo)
    return replace(changed, step=replace(step, microbatches=m, loop=tuple(loop),
                                         last_ops=tuple(kept_lasts)))


def at(strategy: Strategy, sizes: Sizes) -> Strategy:
    """The strategy at one point of the size space."""
    return resize(with_microbatches(strategy, sizes.microbatches), sizes.mesh)


def smallest_first(axes: Iterable[str], sizes: Iterable[int], ms: Iterable[int]) -> list[Sizes]:
    """Every combination, fewest devices first, then fewest micro-batches."""
    names = list(axes)
    points = [Sizes(dict(zip(names, combo, strict=True)), m)
              for combo in itertools.product(list(sizes), repeat=len(names)) for m in ms]
    points.sort(key=lambda p: (math.prod(p.mesh.values()), p.microbatches, tuple(p.mesh.values())))
    return points


def quantified(strategy: Strategy, fixed: Iterable[str]) -> tuple[list[str], bool]:
    """``check --every-size --fixed NAME ...``: the axes judged for every size (every axis not
    held) and whether the micro-batch count is (unless held, or a list of optimizer steps)."""
    held = set(fixed)
    unknown = sorted(held - set(strategy.mesh.names) - {MICROBATCHES})
    if unknown:
        names = ", ".join([*strategy.mesh.names, MICROBATCHES])
        raise PlaceError([Diagnostic(Severity.ERROR, f"--fixed {unknown[0]}: not a mesh axis of "
                                     f"this strategy nor 'microbatches' (one of {names})",
                                     Code.UNKNOWN_NAME, None)], strategy.source)
    axes = [a for a in strategy.mesh.names if a not in held]
    return axes, MICROBATCHES not in held and not strategy.step.windows


def coverage(strategy: Strategy, axes: list[str], quantified_m: bool, bounded: bool) -> str:
    """Which sizes a verdict covers, in words: ``dp >= 1, ep = 2, microbatches >= 1``."""
    parts = [f"{a} >= 1" if a in axes else f"{a} = {strategy.size(a)}" for a in strategy.mesh.names]
    if quantified_m:
        parts.append(f"{MICROBATCHES} 1..{BOUNDED_MICROBATCHES} (bounded: the loop is unrolled)"
                     if bounded else f"{MICROBATCHES} >= 1")
    elif strategy.step.windows:
        parts.append(f"{MICROBATCHES} = [{', '.join(map(str, strategy.step.windows))}]")
    else:
        parts.append(f"{MICROBATCHES} = {strategy.microbatches}")
    return ", ".join(parts)
