"""Statements judged where they stand: clip, the skip decision, sharded updates, seeds, frees.

Each case is a small step written as a user would, with the verdict its public bug report (or, for
correct steps, the single-device semantics) implies — derived by hand, not by running the verifier.
The torch replay confirms the same cases in tests/test_replay_positions.py.
"""

from __future__ import annotations

import pytest

from placeverify.lower import load_text
from placeverify.verdicts import Verdict
from placeverify.verify import verify

CASES: dict[str, tuple[str, str | None, str, str]] = {
    "clip-before-ar": (
        "refuted", 'clip-input',
        'clip of the local gradient before the data-parallel all-reduce (accelerate#641, diffusers#721)',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision megatron
mesh { tp = 2, dp = 2 }
place megatron over tp
place ddp over dp
step {
    backward sum / tokens(dp, step)
    clip(max_norm = 1.0, replicated = once) grads over tp
    all_reduce(sum) grads over dp
    update params
}
"""),
    "clip-in-loop": (
        "refuted", 'clip',
        'clip inside the accumulation loop on partial sums (lingua#59, tt-metal#17568)',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision megatron
mesh { tp = 2, dp = 2 }
place megatron over tp
place ddp over dp
step {
    microbatches = 2
    each microbatch {
        backward sum / tokens(dp, step)
        clip(max_norm = 1.0, replicated = once) grads over tp
    }
    all_reduce(sum) grads over dp
    update params
}
"""),
    "clip-after-update": (
        "refuted", 'clip',
        'clip after the optimizer step is a no-op for that update (graphstorm#1366)',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision megatron
mesh { tp = 2, dp = 2 }
place megatron over tp
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    update params
    clip(max_norm = 1.0, replicated = once) grads over tp
}
"""),
    "clip-per-group": (
        "refuted", 'clip',
        'per-group clipping where the policy is the global norm (transformers#614)',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision megatron
mesh { tp = 2, dp = 2 }
place megatron over tp
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    clip(max_norm = 1.0, replicated = once) grads[dense] over tp
    update params
}
"""),
    "clip-scaled": (
        "refuted", 'clip-input',
        'clip of loss-scaled gradients before unscaling (waifu-diffusion#64)',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision mixed_adam
mesh { dp = 2 }
place ddp over dp
step {
    backward sum * loss_scale / tokens(dp, step)
    all_reduce(sum) grads over dp
    clip(max_norm = 1.0) grads
    scale grads by 1 / loss_scale
    all_reduce(max) overflow over world
    update params
}
"""),
    "clip-twice": (
        "refuted", 'clip',
        'a second clip of a clipped gradient rescales it (the norm + 1e-6 divisor): found by '
        'benchmarks/soundness.py',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision megatron
mesh { dp = 2 }
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    clip(max_norm = 1) grads
    clip(max_norm = 1) grads
    update params
}
"""),
    "overflow-after-update": (
        "refuted", 'overflow',
        'overflow flag reduced after the update (DeepSpeed#994 family)',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
precision mixed_adam
mesh { tp = 2, dp = 2 }
place megatron over tp
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    update params
    all_reduce(max) overflow over world
}
"""),
    "free-before-update": (
        "refuted", 'coefficient',
        'the gradient is freed before the update consumes it',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
mesh { dp = 2 }
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    free grads
    update params
}
"""),
    "rs-over-cp": (
        "refuted", 'shard-mismatch',
        'reduce-scatter over dp * cp with the optimizer sharded over dp only',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 8192 }
precision megatron
mesh { dp = 2, cp = 2 }
place zero1 over dp
place context over cp
step {
    backward sum / tokens(dp, cp, step)
    reduce_scatter(sum) grads over dp * cp
    update params
    all_gather params over dp
}
"""),
    "seed-same-dp": (
        "refuted", 'rng',
        'the same dropout seed on every data-parallel rank (transformers#31412)',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048,
                    dropout = true }
mesh { dp = 2 }
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    update params
    seed dropout(sharded) same over dp
}
"""),
    "seed-differ-dp": (
        "proved", None,
        'a dropout seed per data-parallel rank',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048,
                    dropout = true }
mesh { dp = 2 }
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads over dp
    update params
    seed dropout(sharded) differ over dp
}
"""),
    "ddp-rs-ag": (
        "proved", None,
        'DDP written as reduce_scatter + all_gather of the gradients',
        """
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }
mesh { dp = 2 }
place ddp over dp
step {
    backward sum / tokens(dp, step)
    reduce_scatter(sum) grads over dp
    all_gather grads over dp
    update params
}
"""),
    "tie-over-pp2": (
        "proved", None,
        'the tied embedding all-reduced over pp when pp = 2 (ends(pp) is the whole axis)',
        """
model transformer { layers = 8, hidden = 1024, heads = 16, vocab = 32000, seq = 2048,
                    embeddings = tied }
precision megatron
mesh { pp = 2, dp = 2 }
place pipeline(1f1b, microbatches = 4) over pp
place ddp over dp
step {
    backward sum / tokens(dp, step)
    all_reduce(sum) grads[embedding] over pp
    all_reduce(sum) grads over dp
    update params
}
"""),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_statement_position_verdicts(name: str) -> None:
    verdict, kind, _why, text = CASES[name]
    verification = verify(load_text(text, f"{name}.place"))
    assert verification.overall().value == verdict
    if kind is not None:
        kinds = {o.kind for o in verification.obligations if o.verdict is Verdict.REFUTED}
        assert kind in kinds, kinds
