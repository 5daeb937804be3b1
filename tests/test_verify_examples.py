"""Golden tests of the verifier on the bug library and on every correct example.

Each bug file marks the line its refutation must name with ``# <--``; the expected refuted
conditions and the counterexample kind below come from the bug reports (REFERENCE §3), not from
running the verifier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placeverify.api import check
from placeverify.trace import SCHEMA, load, write
from placeverify.verdicts import Verdict
from tests.conftest import EXAMPLES, example_files

BUGS: dict[str, tuple[set[str], str]] = {
    # REFERENCE §3 (1-12) and the others: (conditions refuted, counterexample kind of the first)
    "ga-token-normalisation": ({"gradient_integrity"}, "coefficient"),
    "missing-allreduce": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    "sum-without-average": ({"gradient_integrity"}, "coefficient"),
    "double-division": ({"gradient_integrity"}, "coefficient"),
    "context-parallel-loss-scale": ({"gradient_integrity"}, "coefficient"),
    "zero1-no-allgather": ({"state_consistency"}, "stale-shard"),
    "tied-embedding-no-sync": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    "sequence-parallel-norm-grads": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    "tp-dropout-seed": ({"state_consistency"}, "rng"),
    "recompute-rng": ({"gradient_integrity"}, "recompute"),
    "zero2-pipeline": ({"gradient_integrity", "composition_safety"}, "coefficient"),
    "hsdp-shard-group-of-one": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    "rank-dependent-order": ({"state_consistency"}, "fp-order"),
    "clip-norm-tensor-parallel": ({"gradient_integrity", "state_consistency"}, "clip"),
    # statements judged where they stand: clips, the skip decision, the optimizer shard, seeds
    "clip-before-allreduce": ({"gradient_integrity"}, "clip-input"),
    # a clip inside the loop runs before the last backward: refuted for its position (lingua#59)
    "clip-every-microbatch": ({"gradient_integrity"}, "clip"),
    "clip-scaled-gradients": ({"gradient_integrity"}, "clip-input"),
    "clip-after-step": ({"gradient_integrity"}, "clip"),
    "clip-per-group": ({"gradient_integrity"}, "clip"),
    # the rank that skips leaves its tp-replicated norms behind the ranks that step
    "overflow-after-update": ({"gradient_integrity", "state_consistency"}, "overflow"),
    # the update reads a dp * cp shard: unreduced elements (integrity), and a gradient sharded
    # where zero1 places it replicated (the placement and the step disagree: composition)
    "distributed-optimizer-wrong-group": ({"gradient_integrity", "composition_safety"},
                                          "shard-mismatch"),
    "dropout-seed-data-parallel": ({"gradient_integrity"}, "rng"),
    "dropout-seed-sequence-parallel": ({"gradient_integrity"}, "rng"),
    # the update consumes a freed (zero) gradient: the coefficient is 0, at the free
    "free-before-update": ({"gradient_integrity"}, "coefficient"),
    # a divide factor split between the shard and replica groups, divided again by the replicas'
    # average (pytorch#155903); the fixed twin splits it as 1/sqrt(N) before and after
    "hsdp-divide-factor-replicas": ({"gradient_integrity"}, "coefficient"),
    # a second loss term (the MoE load-balancing loss) scaled by the sequence-parallel rank's
    # local token count: its gradient is |tp|x too small (Megatron-LM#5047)
    "moe-aux-loss-local-tokens": ({"gradient_integrity"}, "coefficient"),
    # the accumulation steps multiplied into an auxiliary micro-batch-mean term too, undoing the
    # Trainer's division for it (ms-swift#10116): m times too large
    "rl-aux-loss-accumulation-scale": ({"gradient_integrity"}, "coefficient"),
    # the MoE aux loss never divided by the accumulation micro-batches (Automodel#3359)
    "moe-aux-loss-accumulation": ({"gradient_integrity"}, "coefficient"),
    # the MoE aux loss's gradient averaged over dp by FSDP, meant to count in full per rank
    # (Automodel#1412)
    "moe-aux-loss-fsdp-average": ({"gradient_integrity"}, "coefficient"),
    # FSDP over ep * dp: the experts' reduce-scatter averaged over the expert data-parallel group
    # only, |ep|x too large (Megatron-LM#5956, torchtitan#1793)
    "fsdp-ep-expert-divide-factor": ({"gradient_integrity"}, "coefficient"),
    # asynchronous collectives: the last micro-batch's gradient written while the reduce-scatter
    # is in flight, lost under its result (Megatron-LM#3670, DeepSpeed#8061)
    "overlap-reduce-before-grad-write": ({"gradient_integrity"}, "coefficient"),
    # the update reads the gradients before the asynchronous all-reduce completes
    # (sc24-dl-tutorial#1): each rank consumes its own unreduced share, and the replicas diverge
    "overlap-update-before-wait": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    # a parameter gather in flight: the next step's first forward reads a bucket whose
    # all-gather has not completed, with the other ranks' shards from before the update
    # (Megatron-LM#950)
    "param-gather-after-forward": ({"state_consistency"}, "stale-shard"),
    # The corpus of examples/bugs/README.md (each header names its report): a normalisation
    # off by a factor, a reduction missing or averaging, an overwritten or wiped accumulation
    "sequence-parallel-norm-grads-mean": ({"gradient_integrity"}, "coefficient"),
    "zero2-accumulation-overwrite": ({"gradient_integrity"}, "coefficient"),
    "expert-grads-not-divided": ({"gradient_integrity"}, "coefficient"),
    "ga-loss-not-divided": ({"gradient_integrity"}, "coefficient"),
    "ga-tail-window": ({"gradient_integrity"}, "coefficient"),
    "grads-not-zeroed": ({"gradient_integrity"}, "coefficient"),
    "generation-batch-token-count": ({"gradient_integrity"}, "coefficient"),
    "sample-count-for-token-loss": ({"gradient_integrity"}, "coefficient"),
    "pipeline-schedule-extra-division": ({"gradient_integrity"}, "coefficient"),
    "pipeline-grads-wiped": ({"gradient_integrity"}, "coefficient"),
    "dp-local-token-count": ({"gradient_integrity"}, "coefficient"),
    "local-mean-times-dp": ({"gradient_integrity"}, "coefficient"),
    "fsdp-gloo-avg-as-sum": ({"gradient_integrity"}, "coefficient"),
    "ddp-divide-by-processes": ({"gradient_integrity"}, "coefficient"),
    "zero-reduce-every-microbatch": ({"gradient_integrity"}, "coefficient"),
    "zero-grad-every-microbatch": ({"gradient_integrity"}, "coefficient"),
    "zero-grad-before-last-microbatch": ({"gradient_integrity"}, "coefficient"),
    # the sequence chunks never reduced: the cp ranks' replicas drift too
    "context-parallel-ddp-group": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    # norms counted too often (the same wrong norm everywhere) or too rarely (a norm per rank,
    # so the replicated dense parameters drift)
    "clip-replicated-every-rank": ({"gradient_integrity"}, "clip"),
    "clip-ddp-norm-summed-again": ({"gradient_integrity"}, "clip"),
    "tied-embedding-norm-twice": ({"gradient_integrity"}, "clip"),
    "clip-norm-pipeline-stages": ({"gradient_integrity"}, "clip"),
    "clip-experts-not-summed": ({"gradient_integrity", "state_consistency"}, "clip"),
    "overflow-not-over-tp": ({"gradient_integrity", "state_consistency"}, "overflow"),
    "dropout-seed-whole-mesh": ({"gradient_integrity"}, "rng"),
    # the per-rank 2-norms averaged over expert-parallel ranks that hold different experts
    # (DeepSpeed#8475); the fixed twin sums the squares, the dense copies counted once
    "clip-mean-of-rank-norms": ({"gradient_integrity"}, "clip"),
    # each pipeline stage clips by its own largest element (torchtitan#596); the fixed twin
    # all-reduces the inf norms with max over pp (torchtitan#649)
    "clip-inf-norm-pipeline": ({"gradient_integrity"}, "clip"),
    # the norm of the shared parameters only, applied to the expert gradients too (DeepSpeed#8613)
    "clip-norm-without-experts": ({"gradient_integrity"}, "clip"),
    # DDP's find_unused_parameters reducer under no_sync reduces only the groups the last
    # micro-batch used (pytorch#69031, composer#9): a skipped block keeps its local gradient
    "ddp-unused-params-no-sync": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    # a micro-batch of padding rows: the model's mean loss over it is 0/0 = NaN, weighted by its
    # token count it stays NaN (bergson#461)
    "empty-microbatch-mean": ({"gradient_integrity"}, "coefficient"),
    # a collective inside the loss without gradient, the ranks' shares then averaged by DDP:
    # |dp|x too small, the refutation at the detached collective (lightly#1977, DeCLUTR#212)
    "barlow-twins-detached-all-reduce": ({"gradient_integrity"}, "coefficient"),
    "contrastive-gather-without-gradient": ({"gradient_integrity"}, "coefficient"),
    # per-group meshes: FSDP's replicated (unsharded) parameters counted |dp| times in the clip
    # norm (hyper-parallel#526); the expert gradients prescaled by the dense data-parallel size,
    # off by GTP/EGTP (Megatron-LM#7160)
    "fsdp-replicated-params-norm": ({"gradient_integrity"}, "clip"),
    "expert-grads-gtp-factor": ({"gradient_integrity"}, "coefficient"),
    # LoRA adapters attached after the model was sharded: no reduction covers them
    # (FastVideo#1666, transformers#48792, sd-scripts#989)
    "lora-adapters-not-reduced": ({"gradient_integrity", "state_consistency"}, "coefficient"),
    # the optimizer step never runs (TorchSharp#414): nothing consumed, the replicas unchanged
    "optimizer-step-never-runs": ({"gradient_integrity"}, "coefficient"),
    # the skip taken on rank 0's broadcast flag (WeatherGenerator#2718): the ranks agree, but
    # another rank's overflow is applied
    "skip-decided-on-rank-zero": ({"gradient_integrity"}, "overflow"),
    # The fresh corpus (issue 34): the loss multiplied by every process where the tp ranks share
    # a batch, |tp|x too large (transformers#45994); by the dp size where FSDP averages over
    # dp x sp, |sp|x too small (VeOmni#338); the pipeline schedule's division by n at each of
    # the k step() calls of one accumulation window (torchtitan#1733)
    "trainer-loss-times-processes": ({"gradient_integrity"}, "coefficient"),
    "ulysses-loss-times-dp": ({"gradient_integrity"}, "coefficient"),
    "pipeline-scale-grads-every-step": ({"gradient_integrity"}, "coefficient"),
}

REFERENCE_BUGS = 12


def marked_line(path: Path) -> int:
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1) if "# <--" in text]
    assert len(lines) == 1, f"{path} must mark exactly one line with '# <--'"
    return lines[0]


def test_the_bug_library_is_complete() -> None:
    files = {p.stem for p in example_files("bugs")}
    assert files == set(BUGS)
    assert len(BUGS) >= REFERENCE_BUGS
    for name in BUGS:
        assert (EXAMPLES / "ok" / f"{name}-fixed.place").is_file(), f"{name} has no fixed twin"


@pytest.mark.parametrize("name", sorted(BUGS))
def test_bug_is_refuted_with_the_right_condition_line_and_kind(name: str) -> None:
    path = EXAMPLES / "bugs" / f"{name}.place"
    conditions, kind = BUGS[name]
    result = check(str(path))
    verification = result.verification
    assert verification is not None
    verdicts = verification.verdicts()
    assert {c for c, v in verdicts.items() if v == "refuted"} == conditions
    assert "unknown" not in verdicts.values()
    assert verification.overall() is Verdict.REFUTED
    first = verification.first_refuted()
    assert first is not None and first.span is not None
    assert first.span.line == marked_line(path), first
    trace = verification.trace
    assert trace is not None and trace.kind == kind
    assert trace.condition is first.condition
    assert all(o.verdict is not Verdict.UNKNOWN for o in verification.obligations)


@pytest.mark.parametrize("path", example_files("ok", "strategies", "zero-paper", "measure"),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_other_example_is_proved(path: Path) -> None:
    result = check(str(path))
    assert result.verification is not None
    refuted_or_unknown = [(o.condition.value, o.claim, o.reason) for o in
                          result.verification.obligations if o.verdict is not Verdict.PROVED]
    assert refuted_or_unknown == []


def test_the_trace_round_trips_through_its_schema(tmp_path: Path) -> None:
    result = check(str(EXAMPLES / "bugs" / "ga-token-normalisation.place"))
    assert result.verification is not None and result.verification.trace is not None
    out = tmp_path / "trace.json"
    write(result.verification.trace, str(out))
    loaded = load(str(out))
    assert loaded == result.verification.trace
    assert json.loads(out.read_text())["schema"] == SCHEMA
    assert out.read_text() == json.dumps(loaded.to_json(), indent=2, ensure_ascii=False) + "\n"
    # the example: dp = 1, micro-batch 0 has 1 token, micro-batch 1 has 3 (or any
    # unequal pair); the consumed gradient differs from the single-device one on some device
    assert loaded.microbatches == 2
    counts = sorted(t.count for t in loaded.tokens)
    assert len(set(counts)) > 1
    assert any(d.consumed != loaded.reference for d in loaded.devices)
    # the trace carries the source text, not a pickle, and nothing else is needed to replay it
    assert loaded.source == (EXAMPLES / "bugs" / "ga-token-normalisation.place").read_text()


def test_ga_counterexample_values_match_a_hand_computation() -> None:
    """transformers#34191: per-micro-batch means averaged over 2 micro-batches vs the token mean."""
    result = check(str(EXAMPLES / "bugs" / "ga-token-normalisation.place"))
    trace = result.verification.trace  # type: ignore[union-attr]
    assert trace is not None
    tokens = {t.microbatch: t.count for t in trace.tokens}
    sums = {g.microbatch: float(eval_fraction(g.sum)) for g in trace.gradients}
    per_microbatch_means = [sums[k] / tokens[k] for k in sorted(tokens)]
    buggy = sum(per_microbatch_means) / len(per_microbatch_means)
    reference = sum(sums.values()) / sum(tokens.values())
    assert float(eval_fraction(trace.devices[0].consumed or "")) == pytest.approx(buggy)
    assert float(eval_fraction(trace.reference or "")) == pytest.approx(reference)
    assert buggy != pytest.approx(reference)


def eval_fraction(text: str) -> float:
    from fractions import Fraction

    return float(Fraction(text))
