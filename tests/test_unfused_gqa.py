"""Grouped-query attention without a fused kernel (``attention = standard``) saves K and V
repeated over each group's heads: the matmuls' operands are the copies (Megatron-core
``DotProductAttention``: ``key.repeat_interleave(heads // groups, dim=2)``; transformers'
``repeat_kv``: ``expand`` then ``reshape``, a copy; the measure model's ``repeat_interleave``),
and ``matmul`` saves its operands (``tools/autograd/derivatives.yaml``), not the un-repeated
K and V. Fused attention takes the groups as they are (``F.scaled_dot_product_attention(...,
enable_gqa=True)``). ``benchmarks/peak_memory.py`` measures transformers' Llama with eager
attention (``benchmarks/models/llama``): K and V counted kv_heads/heads wide left every rank
2-3% under its peak. Counted here by hand, per layer.
"""

from __future__ import annotations

from fractions import Fraction

from placeverify.cost import analyse
from placeverify.lower import load_text

S, B, H, A, FF = 32, 2, 64, 4, 160
E = 2  # bf16 activations (precision megatron)
TEXT = """strategy "gqa"
model transformer {{
    layers = 2, hidden = 64, heads = 4, kv_heads = {kv}, ffn = 160, vocab = 256, seq = 32,
    micro_batch = 2, mlp = gated, norm = rmsnorm, bias = false, position = rotary,
    attention = {attention}, embeddings = untied, dropout = false
}}
precision megatron
mesh {{ dp = 2 }}
place ddp over dp
"""


def per_layer(kv: int, attention: str) -> Fraction:
    costs = analyse(load_text(TEXT.format(kv=kv, attention=attention)))
    assert costs.activations is not None
    return Fraction(costs.activations.per_layer)


def test_unfused_attention_saves_heads_wide_k_and_v_and_fused_the_groups() -> None:
    sbh = S * B * H
    # the megatron profile's layer (tests/test_activation_profiles.py): the two norms' inputs,
    # the QKV input, Q, the output projection's input, K and V repeated (heads wide), the
    # softmax output a·s²·b, the MLP input, the fused SwiGLU's fc1 output (2 f-wide) and the
    # down projection's input
    expected = (2 * E * sbh + 3 * E * sbh + 2 * E * sbh + E * A * S * S * B + E * sbh
                + 3 * E * S * B * FF)
    assert per_layer(2, "standard") == expected == per_layer(4, "standard")
    assert per_layer(1, "standard") == expected
    # fused attention keeps the groups' K and V: a_kv/a of that
    assert per_layer(4, "flash") - per_layer(2, "flash") == 2 * E * sbh * Fraction(4 - 2, A)
