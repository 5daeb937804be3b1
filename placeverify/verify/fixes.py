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

from dataclasses import dataclass

from placeverify.evidence import Cause
from placeverify.verify.fix_matchers import (
    FixCase,
    Match,
    constant_factor,
    context_loss_scale,
    count_kind,
    divergence_of,
    double_division,
    free_before_update,
    free_in_loop,
    hsdp_replicas,
    local_count,
    loss_term_scale,
    microbatch_factor,
    missing_reduction,
    overwritten_shard,
    reduced_in_loop,
    scaled_in_loop,
    sequence_parallel_norms,
    sum_without_average,
    tied_embedding,
    tied_embedding_copies,
    token_mean,
)


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
FLAG_BROADCAST = FixRule(
    "flag-broadcast", None,
    "all_reduce(max) overflow over {group} in place of the broadcast: every rank's flag, ORed, "
    "so an overflow on any rank skips the step on all ({reference[0]})",
    ("WeatherGenerator#2718",))
NO_UPDATE = FixRule(
    "no-update", None,
    "update params after the last gradient reduction: every step runs the optimizer step "
    "({reference[0]})", ("TorchSharp#414",))
SHARD_MISMATCH = FixRule(
    "shard-mismatch", None,
    "reduce-scatter over exactly the axes the optimizer state is sharded over (and all-reduce "
    "over the others), or all_gather the gradient before the update")
FROZEN_GROUP = FixRule(
    "frozen-group", None,
    "leave the frozen groups ({groups}) out of the gradient statements and the update: only "
    "the trained groups are reduced and stepped")
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
    FixRule("tied-embedding", tied_embedding,
            "all_reduce(sum) grads[embedding] over ends({axis}) before the data-parallel "
            "reduction: both stages hold the tied embedding (Megatron's embedding group; "
            "{reference[0]})", ("Megatron-LM#656",)),
    FixRule("sequence-parallel-norms", sequence_parallel_norms,
            "all_reduce(sum) grads[norms] over {axis}: under sequence parallelism each rank sees "
            "part of the sequence, so LayerNorm gradients are partial ({reference[0]}, "
            "{reference[1]})", ("gpt-neox#1257", "TransformerEngine#441")),
    FixRule("token-mean", token_mean,
            "normalise by the global token count: 'backward sum / tokens({axes})' with sum "
            "reductions and no division by the number of micro-batches ({reference[0]})",
            ("transformers#34191",)),
    FixRule("hsdp-replicas", hsdp_replicas,
            "all_reduce(sum) grads over {axis} after the reduce-scatter over {shard}: HSDP must "
            "synchronise replicas even when the shard group has {n} rank ({reference[0]})",
            ("verl#7493",)),
    FixRule("missing-reduction", missing_reduction,
            "all_reduce(sum) grads over {axes} after the last micro-batch: without it each "
            "replica trains on its own data and they drift"),
    FixRule("free-before-update", free_before_update,
            "'free {target}' (line {line}) drops the gradient before the update consumes it: "
            "free after 'update params', or reduce-scatter into the shard first"),
    FixRule("loss-term-scale", loss_term_scale,
            "loss term {term}'s gradients are too {how} by a factor {factor}: {then} its "
            "backward by {factor} (the statements after the backwards treat every term alike, and this "
            "term's own scale is off: a rank-local count or size, or a factor meant for another "
            "term; {reference[0]}, {reference[1]}, {reference[2]}, {reference[3]})",
            ("Megatron-LM#5047", "ms-swift#10116", "Automodel#3359", "Automodel#1412")),
    FixRule("context-loss-scale", context_loss_scale,
            "gradients are |{axes}|x too large: the loss is multiplied by |{axes}| while the "
            "reduction over the data and context axes is scaled by the data-parallel size only "
            "({reference[0]})", ("Megatron-LM#673",)),
    FixRule("sum-without-average", sum_without_average,
            "gradients are |{axes}|x too large: a sum reduction over {axes} without dividing by "
            "|{axes}|; use all_reduce(mean) or divide the loss by the global count"),
    FixRule("double-division", double_division,
            "gradients are |{axes}|x too small: the division by |{axes}| happens twice (the loss "
            "is already divided by the global count and the all-reduce averages); use "
            "all_reduce(sum) or drop one division"),
    # Matched only where none of the rules above does (examples/bugs/README.md's corpus).
    FixRule("free-in-loop", free_in_loop,
            "'free {target}' (line {line}) inside the micro-batch loop drops what the earlier "
            "micro-batches accumulated: free after 'update params'"),
    FixRule("overwritten-shard", overwritten_shard,
            "reduce_scatter(sum, accumulate) grads over {axes}: without accumulate every "
            "micro-batch's reduce-scatter overwrites the shard, and the update sees the last "
            "micro-batch only"),
    FixRule("reduced-in-loop", reduced_in_loop,
            "all_reduce(sum) grads over {axes} once, after the last micro-batch: a reduction "
            "inside the loop reduces everything accumulated so far, so the earlier micro-batches "
            "are reduced again with every later one"),
    FixRule("scaled-in-loop", scaled_in_loop,
            "scale the gradients once, after the last micro-batch, or fold the factor into the "
            "loss: the scale at line {line} runs before the last micro-batch, so what the earlier "
            "micro-batches accumulated is scaled again at every later run ({reference[0]})",
            ("torchtitan#1733",)),
    FixRule("count-kind", count_kind,
            "divide by a {want} count: the declared loss {loss} is normalised by {want}, not by "
            "{got}"),
    FixRule("local-count", local_count,
            "normalise by the global count: 'backward sum / {kind}({axes})', all-reduced over "
            "the data axes, not by this rank's own {kind}"),
    FixRule("microbatch-factor", microbatch_factor,
            "gradients are {m}x too {how} (the number of micro-batches): {why}"),
    FixRule("constant-factor", constant_factor,
            "gradients are {k}x too {how} by a constant factor: compare the numbers in the loss and "
            "the scales with the step's own counts (write 'microbatches' rather than a configured "
            "number)"),
    # Consistency divergences (verify.checks.consistency, verify.dropout).
    FixRule("stale-shard", divergence_of(Cause.STALE_SHARD),
            "all_gather params over {axis} after the update: each rank updated only its "
            "optimizer shard (ZeRO-1/2)"),
    FixRule("dropout-seed-differ", divergence_of(Cause.RNG, elements=True),
            "seed dropout({region}) differ over {axis}: fold the {axis} coordinate into the "
            "dropout seed ({reference[0]} for data parallelism, {reference[1]} for sequence "
            "parallelism)", ("transformers#31412", "PaddleFleetX#1005")),
    FixRule("dropout-seed-same", divergence_of(Cause.RNG, elements=False),
            "seed dropout(replicated) same over {axis}: replicated regions need one random "
            "stream across tensor-parallel ranks (Megatron's model-parallel RNG tracker; "
            "{reference[0]})", ("Megatron-DeepSpeed#276",)),
    FixRule("fp-order", divergence_of(Cause.BITWISE),
            "reduce in one fixed order on every rank (a ring or tree all-reduce gives every rank "
            "the same bits)"),
    FixRule("skip", divergence_of(Cause.SKIP), "all_reduce(max) overflow over world"),
    FixRule("clip-norm-divergence", divergence_of(Cause.CLIP),
            "sum the squared gradient norm over every axis where ranks hold different gradients"),
    FixRule("tied-embedding-copies", tied_embedding_copies,
            "all_reduce(sum) grads[embedding] over ends({axis}): the first and last stage hold "
            "copies of the tied embedding ({reference[0]})", ("Megatron-LM#656",)),
    FixRule("unreduced-gradient", divergence_of(Cause.GRADIENT),
            "reduce the gradients over {axis} after the last backward"),
    CLIP_MISSING, CLIP_POSITION, CLIP_NORM, CLIP_COMBINE, CLIP_POLICY_NORM, CLIP_INPUT,
    RECOMPUTE_RNG, OVERFLOW, FLAG_BROADCAST, NO_UPDATE, SHARD_MISMATCH, FROZEN_GROUP, LOST_UPDATE,
    UNUSED_GROUPS, ASYNC_READ, ASYNC_WRITE, PARAM_GATHER,
)


def suggest(case: FixCase) -> str | None:
    """The fix of the first matching rule of :data:`FIXES`, or None."""
    for rule in FIXES:
        if rule.match is not None:
            fields = rule.match(case)
            if fields is not None:
                return rule.text(**fields)
    return None
