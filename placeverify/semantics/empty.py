"""Micro-batches with no tokens, written once for every backend (``docs/language/empty.md``).

``empty microbatches`` declares that a micro-batch may hold no token of the loss's kind on any
rank: a micro-batch made entirely of padding (every label ``ignore_index``), as sequence packing
or a ragged last batch produces. Such a micro-batch uses no parameter, so its gradient is zero:
it is idle for every group (:meth:`placeverify.ir.step.Step.idle_in`), which every domain already
runs (a backward there adds nothing, an ``only = used`` reduction skips, the single-device
reference weighs it nothing). A backward whose factor divides by a count of the micro-batch
itself — ``mean``, ``sum / tokens``, ``sum / tokens(dp)``, ``mean * tokens`` — computes 0/0 =
NaN there, which poisons the accumulated gradient: :func:`check_backward` raises
:class:`Undefined`, and every verdict that needs that backward is *refuted* with the pattern
named. A backward normalised by a count over the step (``tokens(dp, step)``) stays defined.

Assumption: not every micro-batch of a rank is empty, so a count over the step is > 0 (the
single-device loss over the global batch is defined).

Which patterns are judged (:func:`patterns`): the one with every micro-batch holding tokens, and
for each kind of micro-batch one where a micro-batch of that kind holds no tokens on any rank. A
micro-batch empty on some ranks only makes a subset of the counts zero, so every NaN it makes the
all-ranks pattern makes too. Where no backward is NaN, an empty micro-batch's zero gradient is
one of the gradient values every backend already quantifies over (and the counts over the step
stay positive), so several empty micro-batches at once decide nothing new. What an empty
micro-batch k can change beyond its values is decided by the statements that run in it — a
backward that divides by its count, an ``only = used`` reduction that skips when no rank used a
group — so micro-batches running the same loop statements, neither being the first (the
statements before the loop run there) nor the last (those after it), are of one kind and the
first of each kind stands for all. More than :data:`MAX_KINDS` kinds are *not modelled*
(unknown).
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.ir.step import Backward, Count, Scope, TermKind
from placeverify.ir.strategy import Strategy
from placeverify.semantics.schedule import Unmodelled, microbatch_ops

MAX_KINDS = 16  # kinds of micro-batch judged (module docstring)


class Undefined(Unmodelled):
    """A backward that divides by the count of a micro-batch holding no tokens: 0/0 = NaN. A
    subclass of :class:`Unmodelled`, so a domain that does not judge it says unknown (never
    proved); the gradient-integrity check judges it refuted."""


def divisor(op: Backward) -> Count | None:
    """The count of the backward's own micro-batch that its factor divides by, if any."""
    for term, exponent in op.loss.factors:
        if term.kind is TermKind.COUNT and exponent < 0:
            assert term.count is not None
            if term.count.scope is Scope.MICROBATCH:
                return term.count
    return None


def check_backward(op: Backward, k: object, empty: frozenset[int]) -> None:
    """Raise :class:`Undefined` when ``op`` runs in micro-batch ``k`` that holds no tokens and
    divides by that micro-batch's count."""
    if not (isinstance(k, int) and k in empty):
        return
    count = divisor(op)
    if count is not None:
        raise Undefined(f"micro-batch {k} holds no tokens and 'backward {op.loss.text}' divides "
                        f"by its count {count.label()} = 0: 0/0 is NaN, and the accumulated "
                        "gradient is NaN", op.span)


def describe(empty: frozenset[int]) -> str:
    which = ", ".join(str(k) for k in sorted(empty))
    return f"micro-batch{'es' if len(empty) > 1 else ''} {which} holding no tokens"


def patterns(strategy: Strategy) -> list[frozenset[int]]:
    """Every pattern a verdict must consider (module docstring); the step's own when it already
    has one (a replay realising a chosen one)."""
    if strategy.step.empty or not strategy.config.empty:
        return [strategy.step.empty]
    step = strategy.step
    if step.windows:
        raise Unmodelled("micro-batches without tokens over several optimizer steps "
                         "('microbatches = [...]')", step.span)
    m = step.microbatches
    if m == 1:
        return [frozenset()]  # the only micro-batch holds tokens (module docstring's assumption)
    kinds: dict[tuple[object, ...], int] = {}
    for k in range(m):
        key = (*(id(op) for op in microbatch_ops(step, k)), k == 0, k == m - 1)
        kinds.setdefault(key, k)
        if len(kinds) > MAX_KINDS:
            raise Unmodelled(f"more than {MAX_KINDS} kinds of micro-batch that may hold no tokens "
                             "(micro-batches running different statements)", step.span)
    return [frozenset(), *(frozenset({k}) for k in sorted(kinds.values()))]


def with_empty(strategy: Strategy, empty: frozenset[int]) -> Strategy:
    """The strategy whose step runs with the micro-batches ``empty`` holding no tokens."""
    return replace(strategy, step=replace(strategy.step, empty=empty))
