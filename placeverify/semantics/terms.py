"""Several loss terms: the single-device loss is the declared sum of the declared terms.

A strategy may declare named loss terms beside its main loss (``loss aux: token_mean reaches
experts``) and back-propagate each with its own ``backward aux: ...``. Each term has its own
per-token losses, so its gradient sum on an atom is a value of its own: the consumed gradient is
a linear function of every term's gradients (backward adds, sum and mean reductions and scales are
linear; clip and update only read), and it equals the single-device gradient for every value of
them exactly when it does for each term alone, the other terms' gradients zero. So every domain
that computes with one gradient value per atom judges a strategy term by term, on its
:func:`projection`: the term's normalisation as the loss, every other term's backward reaching no
parameter group. A ``max`` reduction of gradients is not linear: with several terms it is not
modelled (:func:`nonlinear`), and the verdict is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Backward, Collective, LoopOp, Op, ReduceOp, TargetKind
from placeverify.ir.strategy import MAIN_TERM, Loss, Strategy


@dataclass(frozen=True, slots=True)
class TermView:
    name: str  # "" for the main loss
    loss: Loss
    reaches: frozenset[ParamGroup] | None  # None: every parameter group

    @property
    def label(self) -> str:
        return self.name or MAIN_TERM

    def reaches_group(self, group: ParamGroup) -> bool:
        return self.reaches is None or group in self.reaches


def term_views(strategy: Strategy) -> list[TermView]:
    """The main loss and every named term, in declaration order."""
    return [TermView("", strategy.loss, None),
            *(TermView(t.name, t.loss, t.reaches) for t in strategy.terms)]


def projection(strategy: Strategy, term: TermView) -> Strategy:
    """The strategy as one term sees it: the term's normalisation is the loss, there are no other
    terms, and every backward of another term reaches no parameter group (it still makes
    ``grads`` denote the full buffer, as it does when it runs)."""
    def mine(op: Op) -> Op:
        if not isinstance(op, Backward) or op.term == term.name:
            return op
        return replace(op, reaches=frozenset())

    step = strategy.step
    loop = tuple(LoopOp(mine(lo.op), lo.microbatch) for lo in step.loop)
    # the sample counts are shared: uneven for every projection when any loss says so
    uneven = any(t.loss.uneven_samples for t in term_views(strategy))
    config = replace(strategy.config, loss=replace(term.loss, uneven_samples=uneven), terms=())
    return replace(strategy, config=config, step=replace(step, loop=loop))


def nonlinear(strategy: Strategy) -> Collective | None:
    """A statement that makes the consumed gradient non-linear in the terms' gradients."""
    for op in strategy.step.ops():
        if isinstance(op, Collective) and op.op is ReduceOp.MAX and \
                op.target.kind is TargetKind.GRADS:
            return op
    return None
