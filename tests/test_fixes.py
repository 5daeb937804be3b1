"""The fix table (:data:`placeverify.verify.fixes.FIXES`) against the bug library.

What each bug calls for comes from the bug file itself: the issues its header comment names
(``owner/repo#N``, cited by fixes as ``repo#N``) and, below, the repair its description asks for.
Neither is taken from the code under test.
"""

from __future__ import annotations

import re
import string
from functools import cache
from pathlib import Path

import pytest

from placeverify.api import check, check_strategy
from placeverify.lower import load_text
from placeverify.verdicts import Verdict
from placeverify.verify.fixes import FIXES, FixRule
from tests.conftest import example_files

ROOT = Path(__file__).resolve().parents[1]

BUGS = example_files("bugs")

# The repair each bug's header describes, as a fragment the fix must contain.
CALLS_FOR: dict[str, str] = {
    "clip-after-step": "clip once, after the last gradient reduction",
    "clip-before-allreduce": "clip after the last gradient reduction",
    "clip-every-microbatch": "clip once",
    # DeepSpeed#8478: the squared norms summed over the expert ranks, each expert once
    "clip-mean-of-rank-norms": "clip(max_norm = 1) grads over ep",
    # torchtitan#649: the stages' inf norms all-reduced with max over the pipeline mesh
    "clip-inf-norm-pipeline": "clip(max_norm = 1, norm = inf) grads over pp",
    # DeepSpeed#8613: the expert gradients folded into the one norm that scales them all
    "clip-norm-without-experts": "the gradients of every parameter group together",
    "clip-norm-tensor-parallel": "sum the squared norm over every axis where gradients are sharded",
    "clip-per-group": "the gradients of every parameter group together",
    "clip-scaled-gradients": "any loss-scale unscaling",
    "context-parallel-loss-scale": "gradients are |cp|x too large",
    "distributed-optimizer-wrong-group": "reduce-scatter over exactly the axes the optimizer state",
    "double-division": "gradients are |dp|x too small",
    "dropout-seed-data-parallel": "seed dropout(sharded) differ over dp",
    "dropout-seed-sequence-parallel": "seed dropout(sharded) differ over tp",
    "free-before-update": "free after 'update params'",
    "ga-token-normalisation": "normalise by the global token count",
    "hsdp-shard-group-of-one": "all_reduce(sum) grads over replica after the reduce-scatter",
    "hsdp-divide-factor-replicas": "gradients are |replica|x too small",
    "moe-aux-loss-local-tokens": "loss term aux's gradients are too small by a factor |tp|",
    "rl-aux-loss-accumulation-scale": "loss term aux's gradients are too large by a factor "
                                      "microbatches: divide its backward by microbatches",
    "moe-aux-loss-accumulation": "loss term aux's gradients are too large by a factor "
                                 "microbatches: divide its backward by microbatches",
    "moe-aux-loss-fsdp-average": "loss term aux's gradients are too small by a factor |dp|: "
                                 "multiply its backward by |dp|",
    "ddp-unused-params-no-sync": "reduce every group after the last micro-batch, whichever "
                                 "micro-batches used it",
    # bergson#461: the model's mean loss over a micro-batch of padding is 0/0
    "empty-microbatch-mean": "normalise by a count over the step",
    # TorchSharp#414, SfmLearner-Pytorch#5: the optimizer step is called every step
    "optimizer-step-never-runs": "update params after the last gradient reduction",
    # WeatherGenerator#2718: the ranks' flags combined with an all-reduce MAX
    "skip-decided-on-rank-zero": "all_reduce(max) overflow over dp in place of the broadcast",
    # lightly#1980: torch.distributed.nn.all_reduce, whose backward carries the gradient
    "barlow-twins-detached-all-reduce": "make it differentiable (torch.distributed.nn)",
    # DeCLUTR#212: the contrastive loss multiplied by the world size
    "contrastive-gather-without-gradient": "multiply the loss by |dp|",
    "missing-allreduce": "all_reduce(sum) grads over dp",
    "overflow-after-update": "all_reduce(max) overflow over world",
    "rank-dependent-order": "reduce in one fixed order on every rank",
    "recompute-rng": "restore the RNG state before recomputing",
    "sequence-parallel-norm-grads": "all_reduce(sum) grads[norms] over tp",
    "sum-without-average": "gradients are |dp|x too large",
    "tied-embedding-no-sync": "all_reduce(sum) grads[embedding] over ends(pp)",
    "tp-dropout-seed": "seed dropout(replicated) same over tp",
    "zero1-no-allgather": "all_gather params over dp after the update",
    "zero2-pipeline": "reduce once after the last micro-batch",
    # The corpus of examples/bugs/README.md.
    "clip-ddp-norm-summed-again": "count replicated parameters once",
    "clip-experts-not-summed": "sum the squared norm over every axis where gradients are sharded",
    "clip-replicated-every-rank": "count replicated parameters once",
    "context-parallel-ddp-group": "all_reduce(sum) grads over cp",
    "dp-local-token-count": "normalise by the global count",
    "dropout-seed-whole-mesh": "seed dropout(sharded) differ over dp",
    "expert-grads-not-divided": "gradients are |ep|x too large",
    "fsdp-ep-expert-divide-factor": "gradients are |ep|x too large",
    "fsdp-gloo-avg-as-sum": "gradients are |dp|x too large",
    "ddp-divide-by-processes": "gradients are |local|x too large",
    "ga-loss-not-divided": "never divided by their number",
    "ga-tail-window": "by a constant factor",
    "grads-not-zeroed": "write 'zero grads' after 'update params'",
    "generation-batch-token-count": "count the step's own window: write (..., step)",
    "local-mean-times-dp": "never divided by their number",
    "overflow-not-over-tp": "all_reduce(max) overflow over world",
    "pipeline-grads-wiped": "inside the micro-batch loop drops what the earlier micro-batches",
    "pipeline-schedule-extra-division": "divided by the number of micro-batches on top of",
    "sample-count-for-token-loss": "divide by a tokens count",
    "sequence-parallel-norm-grads-mean": "gradients are |tp|x too small",
    "tied-embedding-norm-twice": "count replicated parameters once",
    "zero2-accumulation-overwrite": "reduce_scatter(sum, accumulate) grads over dp",
    "zero-reduce-every-microbatch": "once, after the last micro-batch",
    "zero-grad-every-microbatch": "inside the micro-batch loop drops what the earlier micro-batches",
    "zero-grad-before-last-microbatch": "drops what the earlier micro-batches accumulated",
    "clip-norm-pipeline-stages": "sum the squared norm over every axis where gradients are sharded",
    # per-group meshes (issue 12, construct 5)
    "fsdp-replicated-params-norm": "count replicated parameters once",
    "expert-grads-gtp-factor": "gradients are |gtp|x too large",
    # Asynchronous collectives: order the writes before the start; wait before the read.
    "overlap-reduce-before-grad-write": "after the last write of the gradients it reduces",
    "overlap-update-before-wait": "'wait grads' before the gradients are read",
    # FastVideo#1666, transformers#48792: the adapters' gradients averaged over the replicas
    "lora-adapters-not-reduced": "all_reduce(sum) grads over dp",
    # Megatron-LM#950: a parameter bucket waited before the forward that reads it
    "param-gather-after-forward": "'wait params[dense]' before the forward that reads them",
    # The fresh corpus (issue 34)
    "trainer-loss-times-processes": "gradients are |tp|x too large",
    "ulysses-loss-times-dp": "gradients are |cp|x too small",
    # torchtitan#1732: scale_grads=False, the loss divided by n x k instead
    "pipeline-scale-grads-every-step": "scale the gradients once, after the last micro-batch, "
                                       "or fold the factor into the loss",
}

# Issues a bug header names that its fix does not cite, and why.
UNCITED: dict[str, str] = {
    # A detached collective inside the loss: one generic fix (verify/checks/loss_gather.py).
    "lightly#1977": "loss-gather fix", "lightly#1980": "loss-gather fix",
    "verl-SpeCo#29": "loss-gather fix", "DeCLUTR#212": "loss-gather fix",
    # The clip fixes are generic: one repair for many reports.
    "graphstorm#1366": "clip fix", "accelerate#641": "clip fix", "diffusers#721": "clip fix",
    "lingua#59": "clip fix", "tt-metal#17568": "clip fix", "transformers#614": "clip fix",
    "waifu-diffusion#64": "clip fix",
    "torchtitan#596": "clip-combine fix", "torchtitan#649": "clip-combine fix",
    "DeepSpeed#8613": "clip fix",
    "DeepSpeed#5618": "shard-mismatch fix",
    "DN-DETR#18": "free-before-update fix is generic",
    "SfmLearner-Pytorch#5": "the no-update fix cites the first report (TorchSharp#414)",
    "WeatherGenerator#2724": "the tracking issue of WeatherGenerator#2718, which the fix cites",
    "torchforge#71": "the carried-state fix is generic (verify/checks/carried_state.py)",
    "trl#6024": "the count-across-steps fix is generic (verify/checks/run_counts.py)",
    "trl#5619": "the count-across-steps fix is generic (verify/checks/run_counts.py)",
    "DeepSpeed#994": "overflow fix is generic", "ColossalAI#1175": "overflow fix is generic",
    "pytorch#155903": "double-division fix is generic",
    "pytorch#69031": "unused-groups fix cites the fixes", "composer#9": "unused-groups fix",
    # Cited by the composition check's reason, not by a fix.
    "DeepSpeed#1629": "composition reason",
    # The corpus of examples/bugs/README.md: generic fixes, one repair for many reports.
    "gpt-neox#1259": "double-division fix", "open-instruct#1498": "overwritten-shard fix",
    "pytorch#160285": "sum-without-average fix", "torchtitan#1551": "sum-without-average fix",
    "Megatron-LM#5956": "sum-without-average fix", "torchtitan#1793": "sum-without-average fix",
    "ColossalAI#2192": "clip fix", "Megatron-LM#5916": "clip fix", "RL#3788": "clip fix",
    "TransformerEngine#715": "clip fix", "pytorch#88955": "clip fix", "twinkle#290": "clip fix",
    "DeepSpeed#1252": "clip fix", "tt-metal#55947": "dropout fix", "verl#3332": "microbatch fix",
    "Automodel#3830": "microbatch fix", "AReaL#1273": "microbatch fix",
    "OpenNMT-py#526": "count-kind fix", "Automodel#3530": "free-in-loop fix",
    "prime-rl#2562": "local-count fix", "safe-rlhf#153": "local-count fix",
    "VeOmni#1115": "missing-reduction fix", "ColossalAI#18": "overflow fix",
    "Speech#3088": "overflow fix",
    "pytorch#162338": "sum-without-average fix", "pytorch#162344": "sum-without-average fix",
    "ColossalAI#247": "reduced-in-loop fix",
    "modalities#313": "clip fix", "RAE#67": "free-in-loop fix",
    "hyper-parallel#526": "clip fix", "Megatron-LM#7160": "sum-without-average fix",
    "torchtitan#3575": "free-in-loop fix", "starVLA#395": "free-in-loop fix",
    "pytorch#36516": "sum-without-average fix",
    "transformers#38872": "constant-factor fix",
    "DeepSpeed#7898": "async-write fix cites the other two reports of the race",
    "FastVideo#1666": "missing-reduction fix", "transformers#48792": "missing-reduction fix",
    "sd-scripts#989": "missing-reduction fix",
    # The fresh corpus (issue 34)
    "transformers#45994": "sum-without-average fix", "transformers#39648": "sum-without-average fix",
    "VeOmni#338": "double-division fix",
    "torchtitan#1732": "the scaled-in-loop fix cites the issue it fixes (torchtitan#1733)",
}

# Rules no bug example reaches, and why.
UNUSED: dict[str, str] = {
    # A declared clip policy with no clip statement: the bug library's clip bugs all clip.
    "clip-missing": "no bug declares a clip without clipping",
    # A clip by the 2-norm under a declared inf-norm policy (or back): tests/test_clip_norms.py.
    "clip-policy-norm": "no bug clips by another norm than its policy",
    # A step naming a frozen group (verify/checks/frozen.py): tests/test_frozen.py.
    "frozen-group": "no public report of a step that updates a frozen group",
    # A broadcast of the parameters from one rank under a sharded optimizer.
    "lost-update": "no bug broadcasts from a single rank",
    # Integrity's tied-embedding rule refutes the same bug first; consistency's divergence is a
    # plain unreduced gradient over pp there.
    "tied-embedding-copies": "tied-embedding-no-sync is matched by the integrity rule",
}


def header_references(path: Path) -> set[str]:
    """``repo#N`` for every ``owner/repo#N`` the leading comment block names."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    return {f"{repo}#{n}" for repo, n in re.findall(r"[\w.-]+/([\w.-]+)#(\d+)", "\n".join(header))}


@cache
def fixes_of(path: Path) -> tuple[str, ...]:
    verification = check(str(path)).verification
    assert verification is not None
    return tuple(o.fix for o in verification.obligations if o.verdict is Verdict.REFUTED and o.fix)


def pattern(rule: FixRule) -> re.Pattern[str]:
    """The rule's template as a regular expression: its references literally, other fields as
    any text."""
    out = []
    for literal, name, _, _ in string.Formatter().parse(rule.template):
        out.append(re.escape(literal))
        if name is None:
            continue
        index = re.fullmatch(r"reference\[(\d+)\]", name)
        out.append(re.escape(rule.reference[int(index.group(1))]) if index else ".+?")
    return re.compile("".join(out))


def test_every_bug_has_an_expected_fix() -> None:
    assert {p.stem for p in BUGS} == set(CALLS_FOR)


@pytest.mark.parametrize("path", BUGS, ids=lambda p: p.stem)
def test_bug_gets_the_fix_and_reference_it_calls_for(path: Path) -> None:
    fixes = fixes_of(path)
    assert any(CALLS_FOR[path.stem] in f for f in fixes), fixes
    for reference in sorted(header_references(path) - set(UNCITED)):
        assert any(reference in f for f in fixes), (reference, fixes)


def test_every_rule_is_used_by_a_bug_or_said_why_not() -> None:
    fixes = [f for path in BUGS for f in fixes_of(path)]
    unused = {r.name for r in FIXES if not any(pattern(r).fullmatch(f) for f in fixes)}
    assert unused == set(UNUSED)


def test_every_cited_issue_is_named_by_a_bug() -> None:
    named = set().union(*(header_references(p) for p in BUGS))
    cited = {ref for rule in FIXES for ref in rule.reference}
    assert cited <= named
    assert set(UNCITED) <= named
    assert len({r.name for r in FIXES}) == len(FIXES)


def test_the_hsdp_fix_names_the_axes_by_what_they_hold_not_by_mesh_order() -> None:
    # verl#7493 with the replica axis declared first: `place hsdp over shard * replica` still
    # shards over `shard` (the first axis written), so the fix must add the all-reduce over
    # `replica` after the reduce-scatter over `shard`.
    text = (ROOT / "examples" / "bugs" / "hsdp-shard-group-of-one.place").read_text(encoding="utf-8")
    swapped = text.replace("mesh { shard = 1, replica = 4 }", "mesh { replica = 4, shard = 1 }")
    assert swapped != text
    result = check_strategy(load_text(swapped, "hsdp-swapped.place"))
    assert result.verification is not None
    fixes = [o.fix for o in result.verification.obligations if o.fix]
    assert any("all_reduce(sum) grads over replica after the reduce-scatter over shard" in f
               for f in fixes), fixes
