"""The Megatron-LM flags the importer does not read: those without effect on placement, memory
or communication (named once in the header) and those it does not model (a warning each).
"""

from __future__ import annotations

from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Plan, Reader, ignored_header
from placeverify.importers.megatron_model import REFUSED

# Flags with no effect on placement, memory or communication: listed once in the header.
IGNORED = frozenset({
    "--lr", "--min-lr", "--weight-decay", "--init-method-std", "--train-iters", "--train-samples",
    "--split", "--save", "--load", "--vocab-file", "--merge-file", "--tokenizer-model", "--seed",
    "--distributed-backend", "--use-mcore-models", "--transformer-impl", "--num-workers",
    "--dataloader-type", "--norm-epsilon", "--rotary-base", "--rotary-percent",
    "--use-rotary-position-embeddings", "--attention-softmax-in-fp32", "--mock-data",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion", "--no-rope-fusion", "--cross-entropy-loss-fusion",
    "--use-checkpoint-args", "--manual-gc", "--profile", "--timing-log-level", "--mmap-warmup",
    "--no-mmap-bin-files", "--moe-aux-loss-coeff", "--moe-router-load-balancing-type",
    "--moe-z-loss-coeff", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
    "--untie-embeddings-and-output-weights", "--adam-beta1", "--adam-beta2", "--adam-eps",
    "--check-for-nan-in-loss-and-grad", "--sgd-momentum",
    "--position-embedding-type",
    # Megatron-DeepSpeed (bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py)
    "--abort-on-unmet-fused-kernel-constraints", "--kill-switch-path", "--valid-num-workers",
    "--train-weighted-split-paths-path", "--valid-weighted-split-paths-path",
    "--test-weighted-split-paths-path", "--reset-progress", "--skip-train-iteration-range",
    "--universal-checkpoint", "--no-query-key-layer-scaling",
})
IGNORED_PREFIXES = ("--log-", "--wandb-", "--tensorboard-", "--eval-", "--save-", "--exit-",
                    "--ckpt-", "--lr-", "--data-", "--no-load-", "--no-save-", "--dist-ckpt-")
NOT_MODELLED = {
    "--rampup-batch-size": "a batch-size ramp-up; the final --global-batch-size is used",
    "--step-batch-size-schedule": "a batch-size schedule; --global-batch-size is used",
    "--recompute-method": "partial recomputation; every layer is recomputed as modelled",
    "--recompute-num-layers": "partial recomputation; every layer is recomputed as modelled",
    "--fp8-format": "FP8 GEMMs (parameters, gradients and optimizer keep the --bf16/--fp16 sizes)",
    "--num-distributed-optimizer-instances": "several distributed-optimizer instances",
    "--sync-tp-duplicated-parameters": "Megatron-DeepSpeed's all-reduce of the parameters every "
                                       "tensor-parallel rank duplicates (the LayerNorms) each "
                                       "step; its traffic is not counted",
}


def leftovers(args: Arguments, runner: Arguments, reader: Reader, plan: Plan) -> None:
    """Every flag no step read: a warning at a training flag placeverify does not model, else
    one header line naming those without effect (the launcher's included)."""
    ignored: list[str] = []
    for name, (word, _) in args.flags.items():
        if name in args.used:
            continue
        if name in NOT_MODELLED:
            reader.warning(f"not modelled: {name}: {NOT_MODELLED[name]}", args.origin(word))
        elif name in REFUSED:
            pass  # reported with the model
        elif name in IGNORED or name.startswith(IGNORED_PREFIXES):
            ignored.append(name)
        else:
            reader.warning(f"not modelled: {name} (placeverify does not read this argument)",
                           args.origin(word))
    for name in runner.flags:
        if name not in runner.used:
            ignored.append(name)
    ignored_header(plan, sorted(set(ignored)))
