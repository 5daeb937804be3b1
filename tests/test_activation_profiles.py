"""A layer's saved tensors follow the memory profile's implementation (issue 13,
"implementation-dependent activations"; placeverify/ir/profiles.py, LAYER_KERNELS).

Expected bytes are counted by hand, tensor by tensor, from the implementations' sources:

- Megatron-core (``memory_profile = megatron``, the default): with --swiglu the bias-SwiGLU
  fusion is on (``--no-bias-swiglu-fusion`` is ``store_false``), and ``SwiGLUFunction``
  (``core/fusions/fused_bias_swiglu.py``) saves its input, the fc1 output with gate and up side
  by side (2·e·s·b·f); linear_fc2 saves its input (e·s·b·f): 3 f-wide tensors. Norms keep their
  input (Korthikanti et al.).
- Eager torch / Hugging Face (``torch``, ``torch_cpu``, ``deepspeed``): ``LlamaMLP``
  ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` saves the gate output, the SiLU output, the up
  output and the product: 4 f-wide. ``LlamaRMSNorm`` saves its fp32 copy (``.pow(2)`` and the
  multiply by the rstd), the fp32 rstd per token and the normalised input in the activation dtype
  (``self.weight * hidden_states.to(input_dtype)``), but not its bf16 input.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from placeverify.cost import analyse
from placeverify.lower import load_text

# a small Llama: h = 64, 4 heads (2 kv), ffn 160, 2 layers, seq 32, micro-batch 2, bf16
S, B, H, A, KV, FF = 32, 2, 64, 4, 2, 160
LLAMA = f"""strategy "kernels"
model transformer {{
    layers = 2, hidden = {H}, heads = {A}, kv_heads = {KV}, ffn = {FF}, vocab = 256, seq = {S},
    micro_batch = {B}, mlp = gated, norm = rmsnorm, bias = false, position = rotary,
    attention = flash, embeddings = untied, dropout = false
}}
precision megatron
mesh {{ dp = 2{{profile}} }}
place ddp over dp
"""


def per_layer(profile: str | None) -> Fraction:
    mesh = "" if profile is None else f", memory_profile = {profile}"
    costs = analyse(load_text(LLAMA.replace("{profile}", mesh)))
    assert costs.activations is not None
    return Fraction(costs.activations.per_layer)


E = 2  # bf16 activations
SBH = S * B * H
ATTENTION = E * SBH * 3 + 2 * E * SBH * Fraction(KV, A) + 4 * A * S * B  # QKV in, Q, out in; K, V; LSE
MLP_INPUT = E * SBH


def test_megatron_default_fused_swiglu_keeps_three_ffn_wide_tensors() -> None:
    norms = 2 * E * SBH  # the two norms' inputs
    mlp = 3 * E * S * B * FF
    expected = norms + ATTENTION + MLP_INPUT + mlp
    assert per_layer(None) == expected
    assert per_layer("megatron") == expected


@pytest.mark.parametrize("profile", ["torch", "torch_cpu", "deepspeed"])
def test_eager_profiles_keep_four_and_the_rmsnorm_fp32_copies(profile: str) -> None:
    # per RMSNorm: fp32 copy 4·sbh, rstd 4·s·b, normalised input e·sbh
    norms = 2 * (4 * SBH + 4 * S * B + E * SBH)
    mlp = 4 * E * S * B * FF
    assert per_layer(profile) == norms + ATTENTION + MLP_INPUT + mlp


@pytest.mark.parametrize(("profile", "extra"), [
    ("megatron", 0),
    # torch's native_layer_norm also saves its fp32 mean and rstd per token: 2 norms x 2 x 4·s·b
    ("torch", 2 * 2 * 4 * 32),
    ("deepspeed", 2 * 2 * 4 * 32),
    # and on CPU dropout multiplies by a mask of the activation dtype (2 bytes here), where
    # Korthikanti count 1 byte: one more byte for the attention mask a·s²·b and the two
    # residual masks s·b·h each
    ("torch_cpu", 2 * 2 * 4 * 32 + 4 * 32 * 32 + 2 * 32 * 64),
])
def test_plain_gpt_layer_is_korthikantis_plus_what_torch_keeps(profile: str, extra: int) -> None:
    # GELU MLP and LayerNorm, dropout, bf16: Korthikanti's sbh(34 + 5as/h)
    gpt = ("model transformer { layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 256, "
           "seq = 32, micro_batch = 1, mlp = plain, norm = layernorm, bias = true, "
           "position = learned, attention = standard, dropout = true, embeddings = tied }")
    text = (f'strategy "gpt"\n{gpt}\nprecision megatron\n'
            f"mesh {{ dp = 2, memory_profile = {profile} }}\nplace ddp over dp\n")
    costs = analyse(load_text(text))
    assert costs.activations is not None
    korthikanti = 32 * 1 * 64 * (34 + Fraction(5 * 4 * 32, 64))
    assert Fraction(costs.activations.per_layer) == korthikanti + extra
