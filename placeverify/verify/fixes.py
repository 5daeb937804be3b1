"""One-line fixes for refutations that match a known bug pattern (REFERENCE §3), as one table.

Every fix suggestion of the integrity, update and consistency checks, and every public issue a fix
cites, is a row of :data:`FIXES`. A rule with a ``match`` is chosen from the evidence: the first
rule of the table (in order) whose ``match`` answers the template's fields wins
(:func:`suggest`). A rule without one is applied by the check that detects its pattern
(:meth:`FixRule.text`); the check already knows it found, say, a clip after the update.

Not here: :mod:`placeverify.verify.placement_step` builds each fix together with its reason from
the placement it compares, and :mod:`placeverify.verify.checks.composition` writes its own.
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
from placeverify.ir.step import Backward, Collective, CollectiveKind, CountKind, Free, Op, TermKind
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


@dataclass(frozen=True, slots=True)
class FixRule:
    """A fix: ``match`` answers the template's fields where the rule applies (None: the check
    applies it by name), ``template`` is a :meth:`str.format` template whose ``{reference[i]}``
    are the public issues the fix cites."""

    name: str
    match: Match | None
    template: str
    reference: tuple[str, ...] = ()

    def text(self, **fields: object) -> str:
        return self.template.format(reference=self.reference, **fields)


def _integrity(case: FixCase) -> bool:
    return isinstance(case.evidence, Counterexample)


def _tied_embedding(case: FixCase) -> Fields | None:
    if not _integrity(case) or case.view.group is not ParamGroup.EMBEDDING:
        return None
    ends = [a for a in case.missing if a in case.view.ends]
    return {"axis": ends[0]} if ends else None


def _sequence_parallel_norms(case: FixCase) -> Fields | None:
    if not _integrity(case) or case.view.group is not ParamGroup.NORMS:
        return None
    sp_axes = [a for a in case.missing if a in case.view.extra
               and case.strategy.placement(a).role is Role.TENSOR]
    return {"axis": sp_axes[0]} if sp_axes else None


def _token_mean(case: FixCase) -> Fields | None:
    strategy = case.strategy
    if _integrity(case) and strategy.loss.kind is LossKind.TOKEN_MEAN and \
            has_local_count(strategy) and case.found.microbatches > 1:
        return {"axes": ", ".join([*batch_axes(strategy), "step"])}
    return None


def _unreduced_data(case: FixCase) -> list[str]:
    return [a for a in case.missing if a in case.view.batch] if _integrity(case) else []


def _hsdp_replicas(case: FixCase) -> Fields | None:
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


def _missing_reduction(case: FixCase) -> Fields | None:
    data = _unreduced_data(case)
    return {"axes": " * ".join(data)} if data else None


def _free_before_update(case: FixCase) -> Fields | None:
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


def _context_loss_scale(case: FixCase) -> Fields | None:
    named = _too_large(case)
    cp = case.strategy.axes(Role.CONTEXT)
    return {"axes": named} if named is not None and cp and named == cp[0] else None


def _sum_without_average(case: FixCase) -> Fields | None:
    named = _too_large(case)
    return {"axes": named} if named is not None else None


def _double_division(case: FixCase) -> Fields | None:
    ratio = case.ratio if _integrity(case) else None
    if ratio is not None and ratio < 1 and case.named is not None:
        return {"axes": case.named}
    return None


def _loss_term_scale(case: FixCase) -> Fields | None:
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


def _free_in_loop(case: FixCase) -> Fields | None:
    """A free in the loop with no reduce-scatter there to keep a shard (ZeRO-2 frees after it)."""
    ops = [op for op in _loop_ops(case) if isinstance(op, Free | Collective)
           and op.target.applies_to(case.view.group)]
    freed = [op for op in ops if isinstance(op, Free)]
    if freed and not any(isinstance(op, Collective) and op.kind is CollectiveKind.REDUCE_SCATTER
                         for op in ops):
        return {"target": freed[0].target.label(), "line": freed[0].span.line}
    return None


def _overwritten_shard(case: FixCase) -> Fields | None:
    """Under a pipeline the composition check names the repair (reduce once, DeepSpeed#1629)."""
    if case.strategy.axes(Role.PIPELINE):
        return None
    scatters = [op for op in _loop_ops(case) if isinstance(op, Collective)
                and op.kind is CollectiveKind.REDUCE_SCATTER and not op.accumulate
                and op.target.applies_to(case.view.group)]
    return {"axes": scatters[0].group.label()} if scatters else None


def _reduced_in_loop(case: FixCase) -> Fields | None:
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


def _count_kind(case: FixCase) -> Fields | None:
    if not _integrity(case) or not wrong_count_kind(case.strategy):
        return None
    loss = case.strategy.loss.kind
    want, got = ("tokens", "samples") if loss is LossKind.TOKEN_MEAN else ("samples", "tokens")
    return {"want": want, "got": got, "loss": loss.value}


def _local_count(case: FixCase) -> Fields | None:
    if not _integrity(case):
        return None
    data = [a for a in case.view.batch if case.view.size(a, case.found.sizes) > 1]
    local = [k for k, axes in _loss_counts(case) if not axes]
    if data and local:
        return {"kind": local[0].value, "axes": ", ".join([*batch_axes(case.strategy), "step"])}
    return None


def _microbatch_factor(case: FixCase) -> Fields | None:
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


def _constant_factor(case: FixCase) -> Fields | None:
    ratio = case.ratio if _integrity(case) else None
    if ratio is None or ratio <= 0 or ratio == 1:
        return None
    return {"k": ratio if ratio > 1 else 1 / ratio, "how": "large" if ratio > 1 else "small"}


def _cause(cause: Cause, *, elements: bool | None = None) -> Match:
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


def _tied_embedding_copies(case: FixCase) -> Fields | None:
    d = case.evidence
    if isinstance(d, Divergence) and d.cause is Cause.GRADIENT and \
            d.group is ParamGroup.EMBEDDING and d.axis in case.strategy.axes():
        return {"axis": d.axis}
    return None


# Decided by the check that detects the pattern (verify.checks.update, verify.checks.integrity).
CLIP_MISSING = FixRule(
    "clip-missing", None,
    "clip(max_norm = {max_norm:g}) grads over the axes where gradients are sharded, after the "
    "last reduction and before update")
CLIP_POSITION = FixRule(
    "clip-position", None,
    "clip once, after the last gradient reduction and any unscaling and before 'update params', "
    "the gradients of every parameter group together")
CLIP_NORM = FixRule(
    "clip-norm", None,
    "sum the squared norm over every axis where gradients are sharded (tp, pp, and dp under "
    "ZeRO-2/3) and count replicated parameters once")
CLIP_COMBINE = FixRule(
    "clip-combine", None,
    "{clip}: the ranks' parts combined as one norm (squared 2-norms summed, inf norms maxed) "
    "over every axis where ranks hold different gradient elements, replicated elements counted "
    "once (a mean of per-rank norms is the global norm only where all ranks hold the same "
    "parameters, {reference[0]})", ("DeepSpeed#8475",))
CLIP_POLICY_NORM = FixRule(
    "clip-policy-norm", None, "{clip}: clip by the norm the declared policy names")
CLIP_INPUT = FixRule(
    "clip-input", None,
    "clip after the last gradient reduction and scale (the loss normalisation and any loss-scale "
    "unscaling), once, after the last micro-batch")
RECOMPUTE_RNG = FixRule(
    "recompute-rng", None,
    "restore the RNG state before recomputing (recompute full(restore_rng = true); "
    "torch.utils.checkpoint's preserve_rng_state; {reference[0]})", ("OLMo-core#828",))
OVERFLOW = FixRule(
    "overflow", None,
    "all_reduce(max) overflow over world, after the last backward and before 'update params'")
SHARD_MISMATCH = FixRule(
    "shard-mismatch", None,
    "reduce-scatter over exactly the axes the optimizer state is sharded over (and all-reduce "
    "over the others), or all_gather the gradient before the update")
LOST_UPDATE = FixRule(
    "lost-update", None, "broadcast each shard from its owner (from = owner) or all_gather")
UNUSED_GROUPS = FixRule(
    "unused-groups", None,
    "reduce every group after the last micro-batch, whichever micro-batches used it (drop "
    "'only = used': {reference[0]}'s sync of all gradients at the end of the batch; or count "
    "a group as used when any micro-batch of the window used it, {reference[1]})",
    ("composer#48", "pytorch#124193"))

# Asynchronous collectives (placeverify.verify.outcomes applies them to the late outcome).
ASYNC_READ = FixRule(
    "async-read-in-flight", None,
    "'wait {target}' before the gradients are read: '{collective}' (line {line}) completes only "
    "at its wait (line {wait}), and a clip or update before it can see them unreduced "
    "({reference[0]})", ("sc24-dl-tutorial#1",))
ASYNC_WRITE = FixRule(
    "async-write-in-flight", None,
    "start '{collective}' (line {line}) after the last write of the gradients it reduces (make "
    "its stream wait for every stream that writes them): a write that lands while it is in "
    "flight is overwritten by its result ({reference[0]}, {reference[1]})",
    ("Megatron-LM#3670", "DeepSpeed#8061"))
PARAM_GATHER = FixRule(
    "param-gather-in-flight", None,
    "'wait {target}' before the forward that reads them (before line {line}): '{collective}' "
    "completes only at its wait (line {wait}), and a forward before it computes with the other "
    "ranks' shards from before the update (the forward pre-hook waits for the gather of every "
    "bucket its module reads, dispatching one not yet dispatched; {reference[0]})",
    ("Megatron-LM#950",))
EMPTY_MICROBATCH = FixRule(
    "empty-microbatch", None,
    "normalise by a count over the step (sum / tokens(dp, step)), which stays > 0, or skip a "
    "micro-batch without tokens ({reference[0]})", ("EleutherAI/bergson#461",))

FIXES: tuple[FixRule, ...] = (
    # Integrity counterexamples (verify.checks.integrity), in order: the first match wins.
    FixRule("tied-embedding", _tied_embedding,
            "all_reduce(sum) grads[embedding] over ends({axis}) before the data-parallel "
            "reduction: both stages hold the tied embedding (Megatron's embedding group; "
            "{reference[0]})", ("Megatron-LM#656",)),
    FixRule("sequence-parallel-norms", _sequence_parallel_norms,
            "all_reduce(sum) grads[norms] over {axis}: under sequence parallelism each rank sees "
            "part of the sequence, so LayerNorm gradients are partial ({reference[0]}, "
            "{reference[1]})", ("gpt-neox#1257", "TransformerEngine#441")),
    FixRule("token-mean", _token_mean,
            "normalise by the global token count: 'backward sum / tokens({axes})' with sum "
            "reductions and no division by the number of micro-batches ({reference[0]})",
            ("transformers#34191",)),
    FixRule("hsdp-replicas", _hsdp_replicas,
            "all_reduce(sum) grads over {axis} after the reduce-scatter over {shard}: HSDP must "
            "synchronise replicas even when the shard group has {n} rank ({reference[0]})",
            ("verl#7493",)),
    FixRule("missing-reduction", _missing_reduction,
            "all_reduce(sum) grads over {axes} after the last micro-batch: without it each "
            "replica trains on its own data and they drift"),
    FixRule("free-before-update", _free_before_update,
            "'free {target}' (line {line}) drops the gradient before the update consumes it: "
            "free after 'update params', or reduce-scatter into the shard first"),
    FixRule("loss-term-scale", _loss_term_scale,
            "loss term {term}'s gradients are too {how} by a factor {factor}: {then} its "
            "backward by {factor} (the statements after the backwards treat every term alike, and this "
            "term's own scale is off: a rank-local count or size, or a factor meant for another "
            "term; {reference[0]}, {reference[1]}, {reference[2]}, {reference[3]})",
            ("Megatron-LM#5047", "ms-swift#10116", "Automodel#3359", "Automodel#1412")),
    FixRule("context-loss-scale", _context_loss_scale,
            "gradients are |{axes}|x too large: the loss is multiplied by |{axes}| while the "
            "reduction over the data and context axes is scaled by the data-parallel size only "
            "({reference[0]})", ("Megatron-LM#673",)),
    FixRule("sum-without-average", _sum_without_average,
            "gradients are |{axes}|x too large: a sum reduction over {axes} without dividing by "
            "|{axes}|; use all_reduce(mean) or divide the loss by the global count"),
    FixRule("double-division", _double_division,
            "gradients are |{axes}|x too small: the division by |{axes}| happens twice (the loss "
            "is already divided by the global count and the all-reduce averages); use "
            "all_reduce(sum) or drop one division"),
    # Matched only where none of the rules above does (examples/bugs/README.md's corpus).
    FixRule("free-in-loop", _free_in_loop,
            "'free {target}' (line {line}) inside the micro-batch loop drops what the earlier "
            "micro-batches accumulated: free after 'update params'"),
    FixRule("overwritten-shard", _overwritten_shard,
            "reduce_scatter(sum, accumulate) grads over {axes}: without accumulate every "
            "micro-batch's reduce-scatter overwrites the shard, and the update sees the last "
            "micro-batch only"),
    FixRule("reduced-in-loop", _reduced_in_loop,
            "all_reduce(sum) grads over {axes} once, after the last micro-batch: a reduction "
            "inside the loop reduces everything accumulated so far, so the earlier micro-batches "
            "are reduced again with every later one"),
    FixRule("count-kind", _count_kind,
            "divide by a {want} count: the declared loss {loss} is normalised by {want}, not by "
            "{got}"),
    FixRule("local-count", _local_count,
            "normalise by the global count: 'backward sum / {kind}({axes})', all-reduced over "
            "the data axes, not by this rank's own {kind}"),
    FixRule("microbatch-factor", _microbatch_factor,
            "gradients are {m}x too {how} (the number of micro-batches): {why}"),
    FixRule("constant-factor", _constant_factor,
            "gradients are {k}x too {how} by a constant factor: compare the numbers in the loss and "
            "the scales with the step's own counts (write 'microbatches' rather than a configured "
            "number)"),
    # Consistency divergences (verify.checks.consistency, verify.dropout).
    FixRule("stale-shard", _cause(Cause.STALE_SHARD),
            "all_gather params over {axis} after the update: each rank updated only its "
            "optimizer shard (ZeRO-1/2)"),
    FixRule("dropout-seed-differ", _cause(Cause.RNG, elements=True),
            "seed dropout({region}) differ over {axis}: fold the {axis} coordinate into the "
            "dropout seed ({reference[0]} for data parallelism, {reference[1]} for sequence "
            "parallelism)", ("transformers#31412", "PaddleFleetX#1005")),
    FixRule("dropout-seed-same", _cause(Cause.RNG, elements=False),
            "seed dropout(replicated) same over {axis}: replicated regions need one random "
            "stream across tensor-parallel ranks (Megatron's model-parallel RNG tracker; "
            "{reference[0]})", ("Megatron-DeepSpeed#276",)),
    FixRule("fp-order", _cause(Cause.BITWISE),
            "reduce in one fixed order on every rank (a ring or tree all-reduce gives every rank "
            "the same bits)"),
    FixRule("skip", _cause(Cause.SKIP), "all_reduce(max) overflow over world"),
    FixRule("clip-norm-divergence", _cause(Cause.CLIP),
            "sum the squared gradient norm over every axis where ranks hold different gradients"),
    FixRule("tied-embedding-copies", _tied_embedding_copies,
            "all_reduce(sum) grads[embedding] over ends({axis}): the first and last stage hold "
            "copies of the tied embedding ({reference[0]})", ("Megatron-LM#656",)),
    FixRule("unreduced-gradient", _cause(Cause.GRADIENT),
            "reduce the gradients over {axis} after the last backward"),
    CLIP_MISSING, CLIP_POSITION, CLIP_NORM, CLIP_COMBINE, CLIP_POLICY_NORM, CLIP_INPUT,
    RECOMPUTE_RNG, OVERFLOW, SHARD_MISMATCH, LOST_UPDATE, UNUSED_GROUPS, ASYNC_READ,
    ASYNC_WRITE, PARAM_GATHER,
)


def suggest(case: FixCase) -> str | None:
    """The fix of the first matching rule of :data:`FIXES`, or None."""
    for rule in FIXES:
        if rule.match is not None:
            fields = rule.match(case)
            if fields is not None:
                return rule.text(**fields)
    return None


def _size_product(strategy: Strategy, sizes: dict[str, int], ratio: Fraction) -> str | None:
    target = ratio if ratio > 1 else 1 / ratio
    axes = [p.axis for p in strategy.placements if sizes[p.axis] > 1]
    for r in range(1, len(axes) + 1):
        for combo in combinations(axes, r):
            if math.prod(sizes[a] for a in combo) == target:
                return " * ".join(combo)
    return None
