"""Participation: parameter groups a micro-batch may leave unused, written once for every backend.

``unused dense`` declares that any micro-batch, on any rank, may leave the dense parameters
unused (stochastic depth, a conditional branch, experts no token is routed to): their gradient
from that micro-batch is zero there. Single-device training is the same sum: a group's gradient is
the sum over the micro-batches and ranks that use it, zero elsewhere.

``all_reduce(op, only = used) grads over G`` is DDP's reducer with ``find_unused_parameters``: it
reduces a group only when some rank of G used it in the *current* micro-batch (the last one after
the loop); a group no rank of G used there is left as it is on every rank, local. Under ``no_sync``
accumulation that leaves a group used in earlier micro-batches but not in the last one unsynced
(pytorch/pytorch#69031, mosaicml/composer#9).

A *pattern* says, per declared group, the micro-batches that no rank uses it in
(:attr:`placeverify.ir.step.Step.idle`). What a pattern does is two rules of
:mod:`placeverify.semantics.buffers`: a backward in an idle micro-batch adds nothing to the group,
and an ``only = used`` collective there leaves the group's buffer as it is; and one rule of the
single-device reference: an idle micro-batch's atoms weigh nothing (the exact interpreter, the Z3
reference and the torch replay's reference).

Which patterns are judged (:func:`patterns`), and why that covers every one the declaration
allows: a pattern in general is a Boolean per group, micro-batch and rank. The consumed gradient
is linear in the atoms' gradients, and a rank that does not use a group contributes a zero
gradient, which is one of the values every backend already quantifies over (Z3: every gradient
value; the coefficient check holds for all of them). So a rank's own choice matters only through
the decisions of ``only = used`` collectives, and such a decision is "some rank of G used the
group in this micro-batch": the collective is skipped exactly when the micro-batch is idle on
every rank of G. Hence the patterns to judge are the subsets of the *deciding* micro-batches
(those where an ``only = used`` collective runs), idle on every rank, every other micro-batch and
rank used with free gradient values — 2^d patterns per group with d deciding micro-batches. A
collective whose group does not span every batch axis with more than one rank could decide
differently in different groups of G: that is not modelled (unknown). More than
:data:`MAX_PATTERNS` patterns are not modelled either.

A file without ``unused`` declarations, or without ``only = used`` collectives, has the one empty
pattern: its verdicts are exactly those without this module.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Collective
from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import group_view
from placeverify.semantics.schedule import Unmodelled, events

MAX_PATTERNS = 64  # 2^6: six deciding micro-batches for one group

Idle = tuple[tuple[ParamGroup, frozenset[int]], ...]


@dataclass(frozen=True, slots=True)
class Pattern:
    """Per declared group, the micro-batches no rank uses it in."""

    idle: Idle = ()

    def describe(self) -> str:
        parts = []
        for group, ks in self.idle:
            if ks:
                which = ", ".join(str(k) for k in sorted(ks))
                many = "es" if len(ks) > 1 else ""
                parts.append(f"the {group.value} parameters unused in micro-batch{many} {which}")
        return "; ".join(parts) if parts else "every group used in every micro-batch"


def selective(strategy: Strategy) -> list[Collective]:
    """The ``only = used`` collectives of the step, in order."""
    return [op for op in strategy.step.ops() if isinstance(op, Collective) and op.only_used]


def deciding(strategy: Strategy) -> list[int]:
    """The micro-batches in which an ``only = used`` collective runs (the last one for a
    collective after the loop)."""
    out: set[int] = set()
    for event in events(strategy.step, strategy.step.microbatches):
        if isinstance(event.op, Collective) and event.op.only_used:
            assert isinstance(event.k, int)
            out.add(event.k)
    return sorted(out)


def declared(strategy: Strategy) -> list[ParamGroup]:
    present = strategy.model.groups_present()
    return [g for g in present if g in strategy.config.unused]


def patterns(strategy: Strategy) -> list[Pattern]:
    """Every pattern a verdict must consider (module docstring); the step's own pattern when it
    already has one (a replay realising a chosen one)."""
    if strategy.step.idle:
        return [Pattern(strategy.step.idle)]
    groups = declared(strategy)
    chosen = selective(strategy)
    if not groups or not chosen:
        return [Pattern()]
    if strategy.step.windows:
        raise Unmodelled("'only = used' reductions over several optimizer steps "
                         "('microbatches = [...]')", strategy.step.span)
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for group in groups:
        batch = [a for a in group_view(strategy, group).batch if sizes[a] > 1]
        for op in chosen:
            if not op.target.applies_to(group):
                continue
            outside = [a for a in batch if a not in op.group.axes]
            if outside:
                raise Unmodelled(f"'{op.label()}' decides per group of {op.group.label()}, and "
                                 f"ranks along {', '.join(outside)} use other data: their "
                                 "decisions may differ (participation across groups)", op.span)
    ks = deciding(strategy)
    subsets = [frozenset(c) for n in range(len(ks) + 1) for c in itertools.combinations(ks, n)]
    total = len(subsets) ** len(groups)
    if total > MAX_PATTERNS:
        raise Unmodelled(f"{len(groups)} unused group(s) over {len(ks)} deciding micro-batches "
                         f"make {total} participation patterns; at most {MAX_PATTERNS} are "
                         "judged", chosen[0].span)
    return [Pattern(tuple(zip(groups, combo, strict=True)))
            for combo in itertools.product(subsets, repeat=len(groups))]


def with_pattern(strategy: Strategy, pattern: Pattern) -> Strategy:
    """The strategy whose step runs under ``pattern``."""
    idle = tuple((g, ks) for g, ks in pattern.idle if ks)
    return replace(strategy, step=replace(strategy.step, idle=idle))


def idle_at(idle: frozenset[int], k: object) -> bool:
    """Is micro-batch ``k`` one that leaves the group unused on every rank? Its backward adds
    nothing to the group and its atoms weigh nothing in the single-device reference."""
    return isinstance(k, int) and k in idle


def skips(op: Collective, idle: frozenset[int], k: object) -> bool:
    """Does ``op`` leave the group's gradient as it is in micro-batch ``k``? An ``only = used``
    collective does where no rank of its group used the group."""
    return op.only_used and idle_at(idle, k)
