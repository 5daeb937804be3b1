"""Counts across optimizer steps: a loss normaliser that is not reset at the optimizer step.

In a step of several optimizer steps (``microbatches = [4, 4]``,
:mod:`placeverify.semantics.steps`), ``tokens(G, run)`` (or ``samples(G, run)``) is a count summed
over G and over every micro-batch since the run began: in step j it is the count of steps 1..j,
because the variable that holds it (a ``num_tokens += ...`` before the loop) is never set back
to zero. ``tokens(G, batch)`` is the count of the whole batch the listed steps split (an RL
generation or rollout batch cut into several optimizer steps, its tokens counted once): in every
step j it is the count of all k steps. Single-device training normalises each step by its own
window, which ``tokens(G, step)`` counts. So in step j such a count is step j's own count T plus
E_j, what the other steps add: for ``run`` E_1 = 0 and E_j > 0 from step 2 on, for ``batch``
E_j > 0 at every step (k >= 2; every step holds tokens).

Step j over its window is judged as follows (each domain runs the definition below):

- Its *per-step* projection (:func:`per_step`: every ``run`` and ``batch`` count read as
  ``step``, E = 0) is judged by every domain as any step, once per window
  (:mod:`placeverify.semantics.steps`).
- What E_j > 0 adds is decided on the buffer rules themselves
  (:mod:`placeverify.semantics.buffers`) in the *exponent* domain (:class:`Exponents`): a buffer
  is the set of vectors of net exponents of the counts across steps along each path from a
  backward to it (a backward contributes its loss factor's exponents, a scale adds its own). In
  step j every such path's coefficient is its per-step coefficient times the product over the
  counts with E_j > 0 of ((T + E_j)/T) ^ e, T the step's count (a count with E_j = 0 gives 1).
  A vector of zeros leaves it as it is; so when only zero vectors (over the counts with
  E_j > 0) reach what a ``clip`` or ``update`` reads, step j reads exactly its per-step
  projection's value. When a non-zero vector reaches it and every non-zero exponent has the same
  sign, that path's coefficient is strictly smaller (negative exponents) or larger (positive), and
  the others unchanged: every factor of a loss or a scale is positive, so the atom's coefficient
  differs from the per-step one, which is the single-device one when the projection is right.
  The step is then wrong (refuted, :mod:`placeverify.verify.checks.run_counts`). Exponents of both
  signs could cancel on some instance; that is *not modelled* (unknown at the line), and so is a
  ``max`` reduction of the gradients (not a sum of paths).

The exact interpreter evaluates such a count as its step's count plus ``Instance.before``, the
other steps' tokens (:mod:`placeverify.semantics.interpreter`): the refutation's numbers are its
values at the refuted step. Z3 judges the per-step projection only; a count across steps
reaching the Z3 encoding is *not modelled*. The agreement analysis judges the per-step
projection: the other steps' count is summed over the same axes as the step's, so it is the same
on the same ranks. The torch replay keeps the running total across the steps it replays for
``run``, and takes the steps it replays as one batch for ``batch``
(:mod:`placeverify.replay.step`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from placeverify.diagnostics import Span
from placeverify.ir.model import ParamGroup
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CountKind,
    LoopOp,
    Monomial,
    Op,
    ReduceOp,
    Scale,
    Scope,
    Step,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.semantics.buffers import GradMachine
from placeverify.semantics.schedule import MicroBatch, Unmodelled
from placeverify.semantics.steps import projection_step

ACROSS = (Scope.RUN, Scope.BATCH)  # the scopes of counts that span several optimizer steps
Key = tuple[CountKind, tuple[str, ...], Scope]
Vector = tuple[tuple[Key, int], ...]  # the non-zero net exponents of those counts, sorted


def run_counts(monomial: Monomial) -> Counter[Key]:
    """The net exponent of each count across steps in a loss or scale factor."""
    out: Counter[Key] = Counter()
    for term, exponent in monomial.factors:
        if term.kind is TermKind.COUNT and term.count is not None \
                and term.count.scope in ACROSS:
            out[(term.count.kind, term.count.axes, term.count.scope)] += exponent
    return out


def _factor(op: Op) -> Monomial | None:
    if isinstance(op, Backward):
        return op.loss
    if isinstance(op, Scale):
        return op.factor
    return None


def uses_run(step: Step) -> bool:
    """Does any loss or scale of the step name a count across steps (run or batch)?"""
    return any(f is not None and uses_run_monomial(f) for f in map(_factor, step.ops()))


def first_run_span(step: Step) -> Span | None:
    for op in step.ops():
        f = _factor(op)
        if f is not None and run_counts(f):
            return op.span
    return None


def _reset(monomial: Monomial) -> Monomial:
    factors = tuple((replace(t, count=replace(t.count, scope=Scope.STEP))
                     if t.count is not None and t.count.scope in ACROSS else t, e)
                    for t, e in monomial.factors)
    return replace(monomial, factors=factors)


def _op_per_step(op: Op) -> Op:
    if isinstance(op, Backward) and uses_run_monomial(op.loss):
        return replace(op, loss=_reset(op.loss))
    if isinstance(op, Scale) and uses_run_monomial(op.factor):
        return replace(op, factor=_reset(op.factor))
    return op


def uses_run_monomial(monomial: Monomial) -> bool:
    return any(t.count is not None and t.count.scope in ACROSS for t, _ in monomial.factors)


def per_step(step: Step) -> Step:
    """The step with every count across steps read as its step's count (E = 0): the
    projection every domain judges for a window."""
    if not uses_run(step):
        return step
    return replace(step, pre=tuple(map(_op_per_step, step.pre)),
                   loop=tuple(LoopOp(_op_per_step(lo.op), lo.microbatch) for lo in step.loop),
                   post=tuple(map(_op_per_step, step.post)))


def per_step_strategy(strategy: Strategy) -> Strategy:
    if not uses_run(strategy.step):
        return strategy
    return replace(strategy, step=per_step(strategy.step))


# ---- the exponent domain ---------------------------------------------------------------------------


def _vector(counts: Counter[Key]) -> Vector:
    return tuple(sorted((k, e) for k, e in counts.items() if e != 0))


def _shift(vector: Vector, by: Counter[Key]) -> Vector:
    total: Counter[Key] = Counter(dict(vector))
    total.update(by)
    return _vector(total)


class Exponents:
    """The exponent domain (a :class:`placeverify.semantics.buffers.GradDomain`): one value for
    every device, the set of net run-count exponent vectors of the paths that reach the buffer."""

    def zero(self) -> frozenset[Vector]:
        return frozenset()

    def backward(self, buffer: frozenset[Vector], op: Backward, k: MicroBatch) -> frozenset[Vector]:
        return buffer | {_vector(run_counts(op.loss))}

    def reduce(self, buffer: frozenset[Vector], op: Collective) -> frozenset[Vector] | None:
        if op.op is ReduceOp.MAX:
            raise Unmodelled(f"'{op.label()}' with a count across steps (a maximum of gradients "
                             "is not a sum of paths)", op.span)
        return buffer

    def accumulate(self, shard: frozenset[Vector], value: frozenset[Vector]) -> frozenset[Vector]:
        return shard | value

    def scale(self, buffer: frozenset[Vector], op: Scale, k: MicroBatch) -> frozenset[Vector]:
        if any(t.kind is TermKind.NUMBER and t.number == 0 for t, _ in op.factor.factors):
            return frozenset()
        by = run_counts(op.factor)
        return frozenset(_shift(v, by) for v in buffer) if by else buffer


@dataclass(frozen=True, slots=True)
class Counted:
    """At step ``step`` (1-based), what ``reader`` (a clip or the update) reads for ``group``
    carries the counts across steps with these net ``exponents`` (all of one sign)."""

    step: int
    group: ParamGroup
    exponents: Vector
    reader: Op


def windows_judged(strategy: Strategy) -> tuple[int, ...]:
    """The windows of the steps judged: one window of several steps is two steps of it."""
    w = strategy.step.windows
    return (w[0], w[0]) if len(w) == 1 else w


def counted(strategy: Strategy, group: ParamGroup) -> Counted | None:
    """The first step where a count with E_j > 0 (``batch`` at every step, ``run`` from step 2
    on) reaches what a clip or the update reads, or None when only zero exponents do. Exponents
    of both signs are not modelled."""
    if not uses_run(strategy.step):
        return None
    live = {a.name: a.size > 1 for a in strategy.mesh.axes}
    sizes = windows_judged(strategy)
    for j in range(1, len(sizes) + 1):
        step = projection_step(strategy.step, sizes[j - 1])
        machine: GradMachine[frozenset[Vector]] = GradMachine(Exponents(), group,
                                                             lambda a: live.get(a, False))
        machine.run(step, step.microbatches)
        seen = [(c.op, c.value) for c in machine.clips]
        if machine.update is not None:
            seen.append((machine.update.op, machine.update.value))
        for reader, value in seen:
            # the counts with E_j > 0: over the batch at every step, over the run from step 2
            vectors = [a for a in (tuple((key, e) for key, e in v
                                         if key[2] is Scope.BATCH or j > 1) for v in value) if a]
            if not vectors:
                continue
            signs = {e > 0 for v in vectors for _, e in v}
            if len(signs) > 1:
                raise Unmodelled("counts across steps with exponents of both signs reaching "
                                 f"'{_label(reader)}' (they could cancel)",
                                 first_run_span(strategy.step))
            return Counted(j, group, max(vectors, key=lambda v: sum(abs(e) for _, e in v)),
                           reader)
    return None


def _label(op: Op) -> str:
    if isinstance(op, Update):
        return "update params"
    if isinstance(op, Clip):
        return "clip"
    return type(op).__name__.lower()


def before(strategy: Strategy, keys: list[tuple[tuple[int, ...], int]], tokens: dict[
        tuple[tuple[int, ...], int], int], samples: dict[tuple[tuple[int, ...], int], int],
           j: int) -> dict[tuple[CountKind, Scope, tuple[int, ...]], int]:
    """``Instance.before`` for step j of an exact instance whose other steps' micro-batches hold,
    per batch coordinate, what this window's micro-batch 0 holds: each other step of m_i
    micro-batches adds m_i times it (the earlier ones to a count over the run, every other one
    to a count over the batch)."""
    sizes = windows_judged(strategy)
    earlier = sum(sizes[:j - 1])
    others = sum(sizes) - sizes[j - 1]
    out: dict[tuple[CountKind, Scope, tuple[int, ...]], int] = {}
    for b, k in keys:
        if k == 0:
            for scope, n in ((Scope.RUN, earlier), (Scope.BATCH, others)):
                out[(CountKind.TOKENS, scope, b)] = n * tokens[(b, k)]
                out[(CountKind.SAMPLES, scope, b)] = n * samples[(b, k)]
    return out
