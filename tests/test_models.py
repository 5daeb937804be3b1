"""Exact parameter counts of the bundled models, derived by hand from the public configurations.

Every expected number below is written out as arithmetic on the published configuration
(layers, hidden, heads, KV heads, FFN width, vocabulary, tied/untied embeddings, biases, norms,
positions); nothing is obtained from placeverify. The reference counts are the ones the model
cards publish (Llama 3 8B = 8,030,261,248; 70B = 70,553,706,496; 405B = 405,853,388,800;
Mixtral 8x7B = 46,702,792,704; GPT-2 small = 124,439,808).
"""

from __future__ import annotations

import pytest

from placeverify.ir.model import (
    ARCHITECTURES,
    BARE_MODELS,
    GPT3_175B,
    LLAMA3_8B,
    LLAMA3_70B,
    LLAMA3_405B,
    MIXTRAL_8X7B,
    ParamGroup,
    Transformer,
)
from placeverify.lower import load_text

# ---- Llama 3 8B (arXiv 2407.21783 Table 3; HF config): L 32, h 4096, 32 heads, 8 KV heads
# (head dim 128, so K and V are 8 * 128 = 1024 wide), SwiGLU ffn 14336, vocab 128256, untied,
# RMSNorm (weight only), no biases, rotary positions (no position table).
L8, H8, KV8, F8, V8 = 32, 4096, 8 * 128, 14336, 128256
ATTN_8B = H8 * H8 + H8 * KV8 + H8 * KV8 + H8 * H8  # q, k, v, o = 41,943,040
MLP_8B = 3 * H8 * F8  # gate, up, down = 176,160,768
NORMS_PER_LAYER_8B = 2 * H8  # input and post-attention RMSNorm = 8,192
LAYER_8B = ATTN_8B + MLP_8B + NORMS_PER_LAYER_8B  # 218,112,000
EMB_8B = V8 * H8  # 525,336,576 (the untied output layer has the same size)
PSI_LLAMA3_8B = L8 * LAYER_8B + EMB_8B + V8 * H8 + H8  # layers + embedding + output + final norm

# ---- Llama 3 70B: L 80, h 8192, 64 heads, 8 KV heads (head dim 128), ffn 28672.
L70, H70, KV70, F70 = 80, 8192, 8 * 128, 28672
LAYER_70B = (2 * H70 * H70 + 2 * H70 * KV70) + 3 * H70 * F70 + 2 * H70  # 855,654,400
PSI_LLAMA3_70B = L70 * LAYER_70B + 2 * V8 * H70 + H70

# ---- Llama 3 405B: L 126, h 16384, 128 heads, 8 KV heads (head dim 128), ffn 53248.
L405, H405, KV405, F405 = 126, 16384, 8 * 128, 53248
LAYER_405B = (2 * H405 * H405 + 2 * H405 * KV405) + 3 * H405 * F405 + 2 * H405  # 3,187,703,808
PSI_LLAMA3_405B = L405 * LAYER_405B + 2 * V8 * H405 + H405

# ---- Mixtral 8x7B (arXiv 2401.04088): Llama-style layers (h 4096, 32 heads, 8 KV heads), the
# MLP replaced by 8 SwiGLU experts of width 14336 and a router (h x 8, no bias); vocab 32000,
# untied.
LM, HM, KVM, FM, EM, VM = 32, 4096, 8 * 128, 14336, 8, 32000
EXPERTS_PER_LAYER_MIXTRAL = EM * 3 * HM * FM  # 1,409,286,144
ROUTER_MIXTRAL = HM * EM  # 32,768
LAYER_MIXTRAL = (2 * HM * HM + 2 * HM * KVM) + EXPERTS_PER_LAYER_MIXTRAL + ROUTER_MIXTRAL + 2 * HM
PSI_MIXTRAL = LM * LAYER_MIXTRAL + 2 * VM * HM + HM

# ---- GPT-3 175B (arXiv 2005.14165 Table 2.1): L 96, h 12288, 96 heads, ffn 4h, GPT-2
# vocabulary 50257, 2048 learned positions, LayerNorm (weight + bias), biases on every linear,
# output layer tied to the word embedding.
LG, HG, VG, PG = 96, 12288, 50257, 2048
ATTN_GPT3 = 4 * HG * HG + (3 * HG + HG)  # q, k, v, o weights; qkv bias 3h, output bias h
MLP_GPT3 = 2 * HG * (4 * HG) + (4 * HG + HG)  # two matrices; biases 4h and h
LN_GPT3 = 2 * (2 * HG)  # two LayerNorms, weight and bias each
LAYER_GPT3 = ATTN_GPT3 + MLP_GPT3 + LN_GPT3  # 12h^2 + 13h = 1,812,099,072
EMB_GPT3 = VG * HG + PG * HG  # word + position tables = 642,723,840
PSI_GPT3_175B = LG * LAYER_GPT3 + EMB_GPT3 + 2 * HG  # + final LayerNorm; tied: no output layer

# ---- GPT-2 small (124M; HF gpt2): L 12, h 768, 12 heads, ffn 3072, vocab 50257, 1024
# positions, LayerNorm, biases, tied.
PSI_GPT2_SMALL = 12 * (12 * 768 * 768 + 13 * 768) + 50257 * 768 + 1024 * 768 + 2 * 768


def test_hand_derivations_match_the_published_model_card_counts() -> None:
    # Guards the arithmetic above against typos: the published totals.
    assert PSI_LLAMA3_8B == 8_030_261_248
    assert PSI_LLAMA3_70B == 70_553_706_496
    assert PSI_LLAMA3_405B == 405_853_388_800
    assert PSI_MIXTRAL == 46_702_792_704
    assert PSI_GPT2_SMALL == 124_439_808
    assert LAYER_GPT3 == 12 * HG**2 + 13 * HG
    assert PSI_GPT3_175B == 174_604_259_328
    # The headline sizes the papers quote, to their rounding.
    assert round(PSI_GPT3_175B / 1e9) == 175
    assert round(PSI_LLAMA3_405B / 1e9) == 406  # "405B" is the truncated headline
    assert int(PSI_LLAMA3_405B / 1e9) == 405
    assert round(PSI_MIXTRAL / 1e9) == 47  # "47B total parameters"
    # Mixtral: 13B active parameters per token (top-2 of 8 experts).
    active = PSI_MIXTRAL - LM * EXPERTS_PER_LAYER_MIXTRAL * (EM - 2) // EM
    assert active == 12_879_925_248 and round(active / 1e9) == 13


@pytest.mark.parametrize(("arch", "expected"), [
    (LLAMA3_8B, PSI_LLAMA3_8B),
    (LLAMA3_70B, PSI_LLAMA3_70B),
    (LLAMA3_405B, PSI_LLAMA3_405B),
    (MIXTRAL_8X7B, PSI_MIXTRAL),
    (GPT3_175B, PSI_GPT3_175B),
], ids=["llama3_8b", "llama3_70b", "llama3_405b", "mixtral_8x7b", "gpt3_175b"])
def test_bundled_architecture_parameter_count(arch: Transformer, expected: int) -> None:
    assert arch.params() == expected


def test_every_bundled_model_is_covered() -> None:
    assert set(ARCHITECTURES) == {"gpt3_175b", "llama3_8b", "llama3_70b", "llama3_405b",
                                  "mixtral_8x7b"}
    assert BARE_MODELS == {"zero_7_5b": 7_500_000_000}


@pytest.mark.parametrize(("name", "expected"), [
    ("llama3_8b", PSI_LLAMA3_8B),
    ("llama3_70b", PSI_LLAMA3_70B),
    ("llama3_405b", PSI_LLAMA3_405B),
    ("mixtral_8x7b", PSI_MIXTRAL),
    ("gpt3_175b", PSI_GPT3_175B),
    ("zero_7_5b", 7_500_000_000),
])
def test_model_named_in_a_place_file_has_the_hand_derived_count(name: str, expected: int) -> None:
    strategy = load_text(f"model {name}\nmesh {{ dp = 2 }}\nplace ddp over dp\n")
    assert strategy.model.params == expected


def test_gpt2_small_written_out_in_a_place_file() -> None:
    text = """
    model transformer {
        layers = 12, hidden = 768, heads = 12, ffn = 3072, mlp = plain, vocab = 50257,
        embeddings = tied, position = learned, max_position = 1024, norm = layernorm,
        bias = true, seq = 1024
    }
    mesh { dp = 2 }
    place ddp over dp
    """
    strategy = load_text(text)
    assert strategy.model.params == PSI_GPT2_SMALL


def test_untying_adds_exactly_one_vocab_by_hidden_output_layer() -> None:
    base = "layers = 12, hidden = 768, heads = 12, ffn = 3072, vocab = 50257, seq = 1024"
    tied = load_text(f"model transformer {{ {base}, embeddings = tied }}\nmesh {{ dp = 2 }}\n"
                     "place ddp over dp\n").model.params
    untied = load_text(f"model transformer {{ {base}, embeddings = untied }}\nmesh {{ dp = 2 }}\n"
                       "place ddp over dp\n").model.params
    assert untied - tied == 50257 * 768


# ---- parameter groups (Megatron's split: TP-sharded dense, TP-replicated norms, embedding,
# experts) ----


def test_llama3_8b_parameter_groups() -> None:
    groups = LLAMA3_8B.group_params()
    assert groups[ParamGroup.DENSE] == L8 * (ATTN_8B + MLP_8B) + V8 * H8  # + untied output layer
    assert groups[ParamGroup.DENSE] == 7_504_658_432
    assert groups[ParamGroup.NORMS] == L8 * 2 * H8 + H8 == 266_240  # RMSNorm weights only
    assert groups[ParamGroup.EMBEDDING] == V8 * H8 == 525_336_576  # rotary: no position table
    assert groups[ParamGroup.EXPERTS] == 0
    assert sum(groups.values()) == PSI_LLAMA3_8B


def test_gpt3_175b_parameter_groups() -> None:
    groups = GPT3_175B.group_params()
    # Column-parallel biases (qkv 3h, first MLP 4h) are sharded with their matrices.
    assert groups[ParamGroup.DENSE] == LG * (12 * HG * HG + 3 * HG + 4 * HG) == 173_954_433_024
    # Replicated over tp: 2 LayerNorms (4h), row-parallel biases (attention output h, MLP
    # output h), plus the final LayerNorm (2h).
    assert groups[ParamGroup.NORMS] == LG * (4 * HG + HG + HG) + 2 * HG == 7_102_464
    assert groups[ParamGroup.EMBEDDING] == EMB_GPT3 == 642_723_840  # tied: no output layer
    assert groups[ParamGroup.EXPERTS] == 0
    assert sum(groups.values()) == PSI_GPT3_175B


def test_mixtral_parameter_groups() -> None:
    groups = MIXTRAL_8X7B.group_params()
    # Dense: attention only, plus the untied output layer.
    assert groups[ParamGroup.DENSE] == LM * (2 * HM * HM + 2 * HM * KVM) + VM * HM == 1_473_249_280
    # Norms: two RMSNorms and the router per layer, and the final norm.
    assert groups[ParamGroup.NORMS] == LM * (2 * HM + ROUTER_MIXTRAL) + HM == 1_314_816
    assert groups[ParamGroup.EMBEDDING] == VM * HM == 131_072_000
    assert groups[ParamGroup.EXPERTS] == LM * EXPERTS_PER_LAYER_MIXTRAL == 45_097_156_608
    assert sum(groups.values()) == PSI_MIXTRAL


@pytest.mark.parametrize(("arch", "layer", "embedding"), [
    (LLAMA3_8B, LAYER_8B, EMB_8B),
    (LLAMA3_70B, LAYER_70B, V8 * H70),
    (LLAMA3_405B, LAYER_405B, V8 * H405),
    (MIXTRAL_8X7B, LAYER_MIXTRAL, VM * HM),
    (GPT3_175B, LAYER_GPT3, EMB_GPT3),
], ids=["llama3_8b", "llama3_70b", "llama3_405b", "mixtral_8x7b", "gpt3_175b"])
def test_largest_reconstruction_unit_is_max_of_layer_and_embedding(arch: Transformer, layer: int,
                                                                   embedding: int) -> None:
    # Documented S* rule: the gather unit is FSDP's wrapping unit, a layer or an embedding
    # (the untied output layer has the embedding's size).
    assert sum(arch.layer_params().values()) == layer
    assert arch.largest_unit_params() == max(layer, embedding)


def test_gpt3_vocabulary_padding_for_tensor_parallel_divisibility() -> None:
    # Megatron pads 50257 to a multiple of 128 * t: 51200 at t = 8 (counts use the real 50257).
    assert GPT3_175B.padded_vocab(8) == 51200
    assert GPT3_175B.padded_vocab(1) == 50304
    assert LLAMA3_8B.padded_vocab(8) == 128256
