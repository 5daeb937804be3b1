"""A fine-tune's step time: the backward runs every matmul's input gradient but only the trained
weights' gradients, and LoRA's adapters add their own matmuls (PEFT's LoRA: x·Aᵀ·Bᵀ beside the
frozen W·x, r·(in + out) parameters per targeted linear).

Derived by hand for a tiny Llama-shaped model (2 layers, hidden 64, 4 heads of 16, SwiGLU 256,
vocabulary 128, untied, flash attention, sequence 32, one micro-batch) on one H100: per token the
weights' forward matmuls are W = 2 x 2·(64·192 + 64·64) + 2 x 3·2·64·256 + 2·64·128 = 278,528
FLOPs; LoRA rank 4 on q and v adds A = 2 layers x (4·(64 + 64) + 4·(64 + 64)) = 2,048 parameters,
2A = 4,096 forward FLOPs a token. Full training runs W forward and 2W backward; with every base
group frozen the backward runs W (input gradients) and the adapters 4A (their input and weight
gradients), the forward W + 2A. The attention core and the memory-bound work are the same in
both, so the compute differs by 32 tokens x (3W − (2W + 6A)) = 32 x (W − 6A) FLOPs at the
device's achieved matmul rate, and so do the model FLOPs of MFU.
"""

from __future__ import annotations

from placeverify import api
from placeverify.lower import load_text

BASE = ("layers = 2, hidden = 64, heads = 4, kv_heads = 4, ffn = 256, mlp = gated, vocab = 128, "
        "seq = 32, micro_batch = 1, attention = flash, embeddings = untied, norm = rmsnorm")
W = 2 * (2 * (64 * 192 + 64 * 64) + 3 * 2 * 64 * 256) + 2 * 64 * 128
A = 2 * (4 * (64 + 64) + 4 * (64 + 64))
TOKENS = 32


def _time(extra: str):  # type: ignore[no-untyped-def]
    text = (f'strategy "s"\nmodel transformer {{ {BASE}{extra} }}\nprecision bf16_adam\n'
            "mesh { dp = 1, device = h100_sxm }\nplace ddp over dp\n")
    time = api.estimate_time(load_text(text, "s.place"))
    assert time is not None and time.compute_seconds is not None
    return time


def test_hand_counts() -> None:
    assert (W, A) == (278_528, 2_048)


def test_a_lora_fine_tune_runs_the_frozen_weights_input_gradients_only() -> None:
    full = _time("")
    lora = _time(", frozen = all, adapter = lora, lora_rank = 4, lora_targets = [q, v]")
    rate = full.peak_flops * full.efficiency
    assert lora.efficiency == full.efficiency
    saved = full.compute_seconds - lora.compute_seconds
    assert abs(saved - TOKENS * (W - 6 * A) / rate) <= 1e-9 * full.compute_seconds
    assert full.model_flops - lora.model_flops == TOKENS * (W - 6 * A)


def test_a_frozen_embedding_alone_skips_only_its_gradient() -> None:
    # untied: the embedding's lookup is no matmul, so freezing it saves no matmul FLOPs; freezing
    # the dense group (every weight matrix and the output layer) saves all of W's gradients
    full = _time("")
    embedding = _time(", frozen = [embedding]")
    dense = _time(", frozen = [dense]")
    assert embedding.compute_seconds == full.compute_seconds
    rate = full.peak_flops * full.efficiency
    assert abs(full.compute_seconds - dense.compute_seconds - TOKENS * W / rate) \
        <= 1e-9 * full.compute_seconds
