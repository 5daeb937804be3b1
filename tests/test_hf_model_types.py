"""Hugging Face model types beyond Llama's: phi3, gemma2, gemma3_text, and ``sandwich_norm``.

Parameter counts are derived by hand from the modelling code's rules (huggingface/transformers,
``models/phi3/modeling_phi3.py``: qkv_proj of heads x head_dim + 2 x kv_heads x head_dim and
gate_up_proj of 2 x intermediate_size, both without bias, two RMSNorms per layer;
``models/gemma2/modeling_gemma2.py`` ``Gemma2DecoderLayer``: input_layernorm,
post_attention_layernorm, pre_feedforward_layernorm and post_feedforward_layernorm over hidden;
``models/gemma3/modeling_gemma3.py``: the same four plus ``Gemma3Attention``'s q_norm and k_norm
over head_dim; tie_word_embeddings defaults to True in Gemma2Config and Gemma3TextConfig). The
fixtures are the public config.json files of Phi-3-mini-4k-instruct, gemma-2-9b and gemma-3-1b-it;
transformers 5.23.0 builds each from its config (on the meta device) with exactly these counts.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.cost import analyse
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.lower import load_text
from tests.seq_given import load_seq

HERE = Path(__file__).parent / "importers"
ZERO3 = HERE / "llama3-8b-zero3.json"


def _imported(config: str | Path):  # type: ignore[no-untyped-def]
    return load_seq(str(ZERO3), Options(model=str(config), world=8))


def test_phi3_mini_counts_as_its_fused_projections() -> None:
    # hidden 3072, 32 layers, 32 heads = 32 kv heads of 96, intermediate 8192, vocab 32064,
    # untied. Per layer: qkv_proj 3072 x (3072 + 2 x 3072) + o_proj 3072^2 = 4 x 3072^2 =
    # 37,748,736; gate_up_proj 3072 x 16384 + down_proj 8192 x 3072 = 75,497,472; two norms
    # 6,144 -> 113,252,352 x 32 = 3,624,075,264; embedding and lm_head 2 x 32064 x 3072 =
    # 197,001,216; final norm 3,072: 3,821,079,552 (Phi-3-mini's published 3.8B).
    layer = 4 * 3072 ** 2 + 3 * 3072 * 8192 + 2 * 3072
    psi = 32 * layer + 2 * 32064 * 3072 + 3072
    strategy, imported = _imported(HERE / "phi3-mini-4k-config.json")
    assert strategy.model.params == psi == 3_821_079_552
    assert "embeddings = untied" in imported.text and "sandwich_norm" not in imported.text


def test_phi3_residual_dropout_is_dropout(tmp_path: Path) -> None:
    config = json.loads((HERE / "phi3-mini-4k-config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "resid_pdrop": 0.1}))
    strategy, imported = _imported(path)
    assert strategy.model.arch is not None and strategy.model.arch.dropout
    assert "resid_pdrop" in imported.text


def test_gemma2_9b_has_four_norms_a_layer_and_tied_embeddings() -> None:
    # hidden 3584, 42 layers, 16 heads (8 kv) of 256, intermediate 14336, vocab 256000, tied
    # (Gemma2Config's default). Per layer: q, o 2 x 3584 x 4096 = 29,360,128; k, v 2 x 3584 x
    # 2048 = 14,680,064; gate, up, down 3 x 3584 x 14336 = 154,140,672; four RMSNorms 14,336 ->
    # 198,195,200 x 42 = 8,324,198,400; the embedding once 256000 x 3584 = 917,504,000; final
    # norm 3,584: 9,241,705,984.
    layer = 2 * 3584 * 4096 + 2 * 3584 * 2048 + 3 * 3584 * 14336 + 4 * 3584
    psi = 42 * layer + 256000 * 3584 + 3584
    strategy, imported = _imported(HERE / "gemma2-9b-config.json")
    assert strategy.model.params == psi == 9_241_705_984
    assert "sandwich_norm = true" in imported.text and "embeddings = tied" in imported.text
    assert "qk_norm" not in imported.text


def test_gemma2_soft_capping_says_the_attention_is_assumed() -> None:
    _, imported = _imported(HERE / "gemma2-9b-config.json")
    messages = [d.message for d, _ in imported.warnings]
    assert any("attn_logit_softcapping" in m and "model.attention=standard" in m
               for m in messages), messages


def test_gemma3_1b_adds_q_and_k_norms() -> None:
    # hidden 1152, 26 layers, 4 heads (1 kv) of 256, intermediate 6912, vocab 262144, tied.
    # Per layer: q, o 2 x 1152 x 1024 = 2,359,296; k, v 2 x 1152 x 256 = 589,824; MLP 3 x 1152 x
    # 6912 = 23,887,872; four norms 4,608; q_norm, k_norm 2 x 256 = 512 -> 26,842,112 x 26 =
    # 697,894,912; embedding 262144 x 1152 = 301,989,888; final norm 1,152: 999,885,952.
    layer = 2 * 1152 * 1024 + 2 * 1152 * 256 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256
    psi = 26 * layer + 262144 * 1152 + 1152
    strategy, imported = _imported(HERE / "gemma3-1b-config.json")
    assert strategy.model.params == psi == 999_885_952
    assert "qk_norm = true" in imported.text and "sandwich_norm = true" in imported.text


def test_multimodal_gemma3_is_refused_at_model_type(tmp_path: Path) -> None:
    text = json.loads((HERE / "gemma3-1b-config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": {**text, "model_type":
                                                                       "gemma3_text"},
                                "vision_config": {"model_type": "siglip_vision_model"}}))
    with pytest.raises(PlaceError) as caught:
        _imported(path)
    [d] = caught.value.diagnostics
    assert d.code.value == "not-modelled" and "text_config" in d.message
    assert d.span is not None and d.span.line == 1


def _layer_bytes(extra: str, profile: str) -> Fraction:
    text = ('strategy "s"\nmodel transformer { layers = 2, hidden = 64, heads = 4, kv_heads = 2, '
            'ffn = 256, vocab = 100, seq = 8, micro_batch = 1, attention = flash, '
            f'norm = rmsnorm{extra} }}\nprecision megatron\n'
            f'mesh {{ dp = 1, memory_profile = {profile} }}\nplace ddp over dp\n')
    activations = analyse(load_text(text, "s.place")).activations
    assert activations is not None
    return Fraction(activations.per_layer)


def test_sandwich_norms_save_what_two_more_norms_save() -> None:
    # s 8, b 1, hidden 64, 2-byte activations. The megatron profile's norm saves its input:
    # two more norms of 8 x 64 elements, 2 x 1,024 = 2,048 bytes a layer. The eager torch
    # profile's RMSNorm keeps an fp32 copy of its input, the normalised input and an fp32
    # reciprocal RMS per row: 2 x (4 x 512 + 2 x 512 + 4 x 8) = 6,208.
    for profile, more in (("megatron", 2048), ("torch", 6208)):
        assert _layer_bytes(", sandwich_norm = true", profile) - _layer_bytes("", profile) \
            == more, profile


def test_sandwich_norms_are_replicated_parameters() -> None:
    # four RMSNorms of 64 a layer where there were two: 2 layers x 2 x 64 = 256 more, all in the
    # norms group (replicated over tensor-parallel ranks)
    base = ('strategy "s"\nmodel transformer { layers = 2, hidden = 64, heads = 4, ffn = 256, '
            'vocab = 100, seq = 8, micro_batch = 1, norm = rmsnorm%s }\nmesh { dp = 1 }\n'
            'place ddp over dp\n')
    plain = load_text(base % "", "s.place").model
    sandwich = load_text(base % ", sandwich_norm = true", "s.place").model
    assert sandwich.params - plain.params == 256
    groups, plain_groups = sandwich.group_params(), plain.group_params()
    assert {g: groups[g] - plain_groups[g] for g in groups} == {
        g: (256 if g.value == "norms" else 0) for g in groups}
