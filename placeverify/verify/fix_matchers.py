"""What a refutation's evidence looks like: the matchers of the fix table.

Each function answers the fields of its rule's template in :data:`placeverify.verify.fixes.FIXES`
where a refutation (a :class:`FixCase`) matches a known bug pattern (REFERENCE §3), or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from itertools import combinations

from placeverify.evidence import Cause, Counterexample, Divergence
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, State
from placeverify.ir.presets import hybrid
from placeverify.ir.step import (
    Backward,
    Collective,
    CollectiveKind,
    CountKind,
    Free,
    Op,
    Scale,
    TermKind,
)
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.roles.relations import batch_axes
from placeverify.semantics.groups import GroupView, group_view
from placeverify.verify.explain import has_local_count, ratio_pattern, reductions_of, wrong_count_kind

Fields = Mapping[str, object]


@dataclass(frozen=True)
class FixCase:
    """What a rule matches on: the strategy, the refutation's evidence, and the facts the check
    that refuted it already knows (``copies``, ``region`` for dropout). The integrity facts are
    computed once, when a rule first asks."""

    strategy: Strategy
    evidence: Counterexample | Divergence | None
    facts: Fields = field(default_factory=dict)

    @cached_property
    def found(self) -> Counterexample:
        assert isinstance(self.evidence, Counterexample)
        return self.evidence

    @cached_property
    def view(self) -> GroupView:
        return group_view(self.strategy, self.found.group)

    @cached_property
    def missing(self) -> list[str]:
        """Axes where the group's gradient is never reduced (and that have more than one rank)."""
        view = self.view
        reduced = {a for op in reductions_of(self.strategy, view.group)
                   if op.kind is not CollectiveKind.ALL_GATHER for a in op.group.axes}
        return [a for a in view.coordinates if a not in reduced and a not in view.routed
                and view.size(a, self.found.sizes) > 1]

    @cached_property
    def ratio(self) -> Fraction | None:
        return ratio_pattern(self.strategy, self.view, self.found)

    @cached_property
    def named(self) -> str | None:
        """The product of axes whose size is the (inverse) ratio, as ``a * b``."""
        ratio = self.ratio
        if ratio is None or ratio == 0 or ratio == 1:
            return None
        return _size_product(self.strategy, self.found.sizes, ratio)


Match = Callable[[FixCase], Fields | None]



def _integrity(case: FixCase) -> bool:
    return isinstance(case.evidence, Counterexample)


def tied_embedding(case: FixCase) -> Fields | None:
    if not _integrity(case) or case.view.group is not ParamGroup.EMBEDDING:
        return None
    ends = [a for a in case.missing if a in case.view.ends]
    return {"axis": ends[0]} if ends else None


def sequence_parallel_norms(case: FixCase) -> Fields | None:
    if not _integrity(case) or case.view.group is not ParamGroup.NORMS:
        return None
    sp_axes = [a for a in case.missing if a in case.view.extra
               and case.strategy.placement(a).role is Role.TENSOR]
    return {"axis": sp_axes[0]} if sp_axes else None


def token_mean(case: FixCase) -> Fields | None:
    strategy = case.strategy
    if _integrity(case) and strategy.loss.kind is LossKind.TOKEN_MEAN and \
            has_local_count(strategy) and case.found.microbatches > 1:
        return {"axes": ", ".join([*batch_axes(strategy), "step"])}
    return None


def _unreduced_data(case: FixCase) -> list[str]:
    return [a for a in case.missing if a in case.view.batch] if _integrity(case) else []


def hsdp_replicas(case: FixCase) -> Fields | None:
    data = _unreduced_data(case)
    strategy = case.strategy
    if data:
        hsdp = [p for p in strategy.placements if hybrid(p.preset)]
        # the shard axis is the one holding Ω sharded, whatever order the mesh declares them in
        shards = [p.axis for p in hsdp if p.mode(State.OPTIMIZER).sharded]
        replicas = [p.axis for p in hsdp if not p.mode(State.OPTIMIZER).sharded]
        if shards and data[0] in replicas:
            shard = shards[0]
            return {"axis": data[0], "shard": shard, "n": case.found.sizes.get(shard, 1)}
    return None


def missing_reduction(case: FixCase) -> Fields | None:
    data = _unreduced_data(case)
    return {"axes": " * ".join(data)} if data else None


def free_before_update(case: FixCase) -> Fields | None:
    if not _integrity(case) or case.ratio != 0:
        return None
    freed = [op for op in case.strategy.step.ops() if isinstance(op, Free)
             and op.target.applies_to(case.view.group)]
    if freed:
        return {"target": freed[0].target.label(), "line": freed[0].span.line}
    return None


def _too_large(case: FixCase) -> str | None:
    ratio = case.ratio if _integrity(case) else None
    return case.named if ratio is not None and ratio > 1 else None


def context_loss_scale(case: FixCase) -> Fields | None:
    named = _too_large(case)
    cp = case.strategy.axes(Role.CONTEXT)
    return {"axes": named} if named is not None and cp and named == cp[0] else None


def sum_without_average(case: FixCase) -> Fields | None:
    named = _too_large(case)
    return {"axes": named} if named is not None else None


def double_division(case: FixCase) -> Fields | None:
    ratio = case.ratio if _integrity(case) else None
    if ratio is not None and ratio < 1 and case.named is not None:
        return {"axes": case.named}
    return None


def loss_term_scale(case: FixCase) -> Fields | None:
    """A named loss term (judged on its projection, :mod:`placeverify.semantics.terms`) whose
    gradient is off by the size of some axes."""
    ratio = case.ratio if _integrity(case) else None
    if ratio is None or ratio == 0 or ratio == 1:
        return None
    judged = [op for op in case.strategy.step.ops()
              if isinstance(op, Backward) and op.term and op.reaches != frozenset()]
    if not judged:
        return None
    m = case.found.microbatches
    if case.named is not None:
        factor = f"|{case.named}|"
    elif m > 1 and ratio in (m, Fraction(1, m)):
        factor = "microbatches"
    else:
        return None
    small = ratio < 1
    return {"term": judged[0].term, "factor": factor, "how": "small" if small else "large",
            "then": "multiply" if small else "divide"}


def _loop_ops(case: FixCase) -> list[Op]:
    """The ops of the micro-batch loop, where the step accumulates over more than one."""
    if not _integrity(case) or case.found.microbatches < 2:
        return []
    return [lo.op for lo in case.strategy.step.loop]


def free_in_loop(case: FixCase) -> Fields | None:
    """A free in the loop with no reduce-scatter there to keep a shard (ZeRO-2 frees after it)."""
    ops = [op for op in _loop_ops(case) if isinstance(op, Free | Collective)
           and op.target.applies_to(case.view.group)]
    freed = [op for op in ops if isinstance(op, Free)]
    if freed and not any(isinstance(op, Collective) and op.kind is CollectiveKind.REDUCE_SCATTER
                         for op in ops):
        return {"target": freed[0].target.label(), "line": freed[0].span.line}
    return None


def overwritten_shard(case: FixCase) -> Fields | None:
    """Under a pipeline the composition check names the repair (reduce once, DeepSpeed#1629)."""
    if case.strategy.axes(Role.PIPELINE):
        return None
    scatters = [op for op in _loop_ops(case) if isinstance(op, Collective)
                and op.kind is CollectiveKind.REDUCE_SCATTER and not op.accumulate
                and op.target.applies_to(case.view.group)]
    return {"axes": scatters[0].group.label()} if scatters else None


def scaled_in_loop(case: FixCase) -> Fields | None:
    """A gradient scale that runs before the loop's last micro-batch: every later run multiplies
    what the earlier micro-batches accumulated once more (torchtitan#1733's scale_grads)."""
    if not _integrity(case) or case.found.microbatches < 2:
        return None
    last = case.found.microbatches - 1
    scales = [lo.op for lo in case.strategy.step.loop if isinstance(lo.op, Scale)
              and lo.op.target.applies_to(case.view.group)
              and (lo.microbatch is None or lo.microbatch < last)]
    return {"line": scales[0].span.line} if scales else None


def reduced_in_loop(case: FixCase) -> Fields | None:
    reductions = [op for op in _loop_ops(case) if isinstance(op, Collective)
                  and op.kind is CollectiveKind.ALL_REDUCE and op.target.applies_to(case.view.group)]
    return {"axes": reductions[0].group.label()} if reductions else None


def _loss_counts(case: FixCase) -> list[tuple[CountKind, tuple[str, ...]]]:
    """(kind, axes) of every count the loss divides by."""
    counts = []
    for op in case.strategy.step.ops():
        if isinstance(op, Backward):
            for term, exponent in op.loss.factors:
                if term.kind is TermKind.COUNT and term.count is not None and exponent < 0:
                    counts.append((term.count.kind, term.count.axes))
    return counts


def count_kind(case: FixCase) -> Fields | None:
    if not _integrity(case) or not wrong_count_kind(case.strategy):
        return None
    loss = case.strategy.loss.kind
    want, got = ("tokens", "samples") if loss is LossKind.TOKEN_MEAN else ("samples", "tokens")
    return {"want": want, "got": got, "loss": loss.value}


def local_count(case: FixCase) -> Fields | None:
    if not _integrity(case):
        return None
    data = [a for a in case.view.batch if case.view.size(a, case.found.sizes) > 1]
    local = [k for k, axes in _loss_counts(case) if not axes]
    if data and local:
        return {"kind": local[0].value, "axes": ", ".join([*batch_axes(case.strategy), "step"])}
    return None


def microbatch_factor(case: FixCase) -> Fields | None:
    if not _integrity(case):
        return None
    ratio, m = case.ratio, case.found.microbatches
    if ratio is None or m < 2:
        return None
    if ratio == m:
        return {"m": m, "how": "large", "why": "the accumulated micro-batch losses are never "
                "divided by their number ('microbatches')"}
    if ratio == Fraction(1, m):
        return {"m": m, "how": "small", "why": "the loss is divided by the number of "
                "micro-batches on top of a normalisation that already covers the whole step"}
    return None


def constant_factor(case: FixCase) -> Fields | None:
    ratio = case.ratio if _integrity(case) else None
    if ratio is None or ratio <= 0 or ratio == 1:
        return None
    return {"k": ratio if ratio > 1 else 1 / ratio, "how": "large" if ratio > 1 else "small"}


def divergence_of(cause: Cause, *, elements: bool | None = None) -> Match:
    """A divergence of this cause; with ``elements``, only where the dropout check says the
    region's ranks hold different elements (True) or not (False)."""

    def match(case: FixCase) -> Fields | None:
        d = case.evidence
        if not isinstance(d, Divergence) or d.cause is not cause:
            return None
        if elements is not None and (case.facts.get("copies") is False) != elements:
            return None
        return {"axis": d.axis, **case.facts}

    return match


def tied_embedding_copies(case: FixCase) -> Fields | None:
    d = case.evidence
    if isinstance(d, Divergence) and d.cause is Cause.GRADIENT and \
            d.group is ParamGroup.EMBEDDING and d.axis in case.strategy.axes():
        return {"axis": d.axis}
    return None


def _size_product(strategy: Strategy, sizes: dict[str, int], ratio: Fraction) -> str | None:
    target = ratio if ratio > 1 else 1 / ratio
    axes = [p.axis for p in strategy.placements if sizes[p.axis] > 1]
    for r in range(1, len(axes) + 1):
        for combo in combinations(axes, r):
            if math.prod(sizes[a] for a in combo) == target:
                return " * ".join(combo)
    return None
