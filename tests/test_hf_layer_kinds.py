"""Hugging Face ``deepseek_v3`` and ``llama4_text``: latent attention, shared experts, dense layers
among MoE ones.

Every expected count is derived by hand below from transformers 5.23.0's modelling code
(huggingface/transformers, ``src/transformers/models/``), never by calling placeverify:

- ``deepseek_v3/modeling_deepseek_v3.py``: ``DeepseekV3Attention.__init__`` lines 370-403 (q_proj
  hidden -> heads·qk_head_dim when q_lora_rank is None, else q_a_proj hidden -> q_lora_rank,
  q_a_layernorm over q_lora_rank, q_b_proj q_lora_rank -> heads·qk_head_dim; kv_a_proj_with_mqa
  hidden -> kv_lora_rank + qk_rope_head_dim; kv_a_layernorm over kv_lora_rank; kv_b_proj
  kv_lora_rank -> heads·(qk_nope_head_dim + v_head_dim); o_proj heads·v_head_dim -> hidden; biases
  on q_a, kv_a and o only with attention_bias); ``DeepseekV3DecoderLayer`` line 492 (layer i MoE
  when i >= first_k_dense_replace); ``DeepseekV3NaiveMoe`` lines 167-171 (gate_up_proj
  E × 2f × h, down_proj E × h × f); ``DeepseekV3MoE`` line 211 (shared_experts: one MLP of
  f × n_shared_experts); ``DeepseekV3TopkRouter`` lines 126 and 131 (a weight E × h; the
  e_score_correction_bias is a buffer); two RMSNorms per layer, a final RMSNorm, untied
  embeddings.
- ``llama4/modeling_llama4.py``: ``Llama4TextAttention`` lines 319-332 (q, k, v, o of head_dim;
  the L2 qk_norm has no weight); ``Llama4TextDecoderLayer`` lines 399-403 (MoE when i is in
  moe_layers = range(step - 1, L, step), ``configuration_llama4.py`` 176-185, else an MLP of
  intermediate_size_mlp); ``Llama4TextMoe`` lines 155-163 (experts E × h × 2f and E × f × h, a
  router Linear(h, E) without bias, one shared expert MLP of intermediate_size).

transformers 5.23.0 built on the meta device gives the same counts
(``benchmarks/hf_layer_kinds_counts.py``, not run here: the project's environment has no
transformers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.ir.model import ParamGroup
from tests.seq_given import load_seq

HERE = Path(__file__).parent / "importers"
ZERO1_EP = HERE / "llama3-8b-zero3.json"

# DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3 on the Hugging Face hub), its model keys
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "attention_bias": False,
    "attention_dropout": 0.0, "num_nextn_predict_layers": 1, "ep_size": 1,
    "rope_theta": 10000, "aux_loss_alpha": 0.001, "seq_aux": True,
}
SMALL_DEEPSEEK = {
    "model_type": "deepseek_v3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "num_hidden_layers": 5, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_shared_experts": 2, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "kv_lora_rank": 16,
    "q_lora_rank": 24, "qk_rope_head_dim": 8, "v_head_dim": 12, "qk_nope_head_dim": 10,
    "first_k_dense_replace": 2,
}
SCOUT = {  # Llama-4-Scout-17B-16E's text_config
    "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48,
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 16,
    "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "vocab_size": 202048,
    "tie_word_embeddings": False, "attention_chunk_size": 8192, "use_qk_norm": True,
    "no_rope_layers": [], "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
}


def _config(tmp_path: Path, data: dict[str, object], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2))
    return path


def _imported(config: Path):  # type: ignore[no-untyped-def]
    return load_seq(str(ZERO1_EP), Options(model=str(config), world=8))


def test_deepseek_v3_671b_counts_as_transformers_builds_it(tmp_path: Path) -> None:
    h, heads, f, f_e, vocab = 7168, 128, 18432, 2048, 129280
    # attention, lines 375-403: q_a 7168·1536 = 11,010,048; q_a_layernorm 1,536;
    # q_b 1536·128·(128 + 64) = 37,748,736; kv_a 7168·(512 + 64) = 4,128,768; kv_a_layernorm
    # 512; kv_b 512·128·(128 + 128) = 16,777,216; o 128·128·7168 = 117,440,512
    attention = (h * 1536 + 1536 + 1536 * heads * 192 + h * 576 + 512 + 512 * heads * 256
                 + heads * 128 * h)
    assert attention == 187_107_328
    norms = 2 * h  # input_layernorm, post_attention_layernorm
    dense_mlp = 3 * h * f  # DeepseekV3MLP(intermediate_size): 396,361,728
    # 256 routed experts of 3·h·f_e, one shared expert MLP of f_e·1, the router 256 x h
    moe_mlp = 256 * 3 * h * f_e + 3 * h * f_e + 256 * h
    assert moe_mlp == 11_320_164_352
    layers = 3 * (attention + norms + dense_mlp) + 58 * (attention + norms + moe_mlp)
    psi = layers + 2 * vocab * h + h  # embed_tokens, lm_head (untied), final norm
    assert psi == 671_026_404_352  # DeepSeek's "671B total parameters", the MTP module apart
    strategy, imported = _imported(_config(tmp_path, DEEPSEEK_V3))
    assert strategy.model.params == psi
    groups = strategy.model.group_params()
    assert groups[ParamGroup.EXPERTS] == 58 * 256 * 3 * h * f_e
    # replicated over tp (DeepSeek's inference/model.py: wq_a and wkv_a are plain Linear): the
    # down projections, the latent norms, the layer norms, the routers, the final norm
    assert groups[ParamGroup.NORMS] == 61 * (h * 1536 + 1536 + h * 576 + 512 + 2 * h) \
        + 58 * 256 * h + h
    for line in ("q_lora_rank = 1536", "kv_lora_rank = 512", "shared_experts = 1",
                 "dense_layers = 3", "expert_ffn = 2048", "experts = 256"):
        assert line in imported.text


def test_deepseek_v3_warns_that_the_mtp_module_is_not_counted(tmp_path: Path) -> None:
    _, imported = _imported(_config(tmp_path, DEEPSEEK_V3))
    assert any("num_nextn_predict_layers" in d.message for d, _ in imported.warnings)


def test_small_deepseek_with_and_without_a_query_rank(tmp_path: Path) -> None:
    h, heads = 64, 4
    # q_a 64·24 + q_a_layernorm 24 + q_b 24·4·18; kv_a 64·(16 + 8) + kv_a_layernorm 16 +
    # kv_b 16·4·(10 + 12); o 4·12·64
    attention = h * 24 + 24 + 24 * heads * 18 + h * 24 + 16 + 16 * heads * 22 + heads * 12 * h
    assert attention == 9_320
    moe = 8 * 3 * h * 32 + 3 * h * (32 * 2) + 8 * h  # routed, shared (f_e·2), router
    dense = 3 * h * 96
    psi = 2 * (attention + 2 * h + dense) + 3 * (attention + 2 * h + moe) + 2 * 1000 * h + h
    assert psi == 398_024
    strategy, _ = _imported(_config(tmp_path, SMALL_DEEPSEEK))
    assert strategy.model.params == psi
    # q_lora_rank null: a plain q_proj 64 x 4·18 in place of q_a, its norm and q_b
    plain = psi + 5 * (h * heads * 18 - (h * 24 + 24 + 24 * heads * 18))
    assert plain == 404_624
    strategy, imported = _imported(_config(tmp_path, {**SMALL_DEEPSEEK, "q_lora_rank": None}))
    assert strategy.model.params == plain and "q_lora_rank" not in imported.text


def test_llama4_scout_and_maverick_text_models(tmp_path: Path) -> None:
    h, q, kv = 5120, 40 * 128, 8 * 128
    attention = 2 * h * q + 2 * h * kv  # q, o; k, v (the L2 qk_norm has no weight)
    expert = 3 * h * 8192
    moe = 16 * expert + expert + 16 * h  # routed, the shared expert, the router
    psi = 48 * (attention + 2 * h + moe) + 2 * 202048 * h + h
    assert psi == 107_769_861_120
    strategy, imported = _imported(_config(tmp_path, SCOUT))
    assert strategy.model.params == psi
    assert any("attention_chunk_size" in d.message for d, _ in imported.warnings)
    # Maverick: 128 experts in every second layer (moe_layers 1, 3, ..., 47), the other 24
    # layers a dense MLP of intermediate_size_mlp 16384
    moe = 128 * expert + expert + 128 * h
    psi = 24 * (attention + 2 * h + moe) + 24 * (attention + 2 * h + 3 * h * 16384) \
        + 2 * 202048 * h + h
    assert psi == 400_711_848_960
    maverick = {**SCOUT, "num_local_experts": 128, "interleave_moe_layer_step": 2}
    strategy, imported = _imported(_config(tmp_path, maverick))
    assert strategy.model.params == psi and "moe_every = 2" in imported.text


def test_small_llama4_interleaves_every_third_layer(tmp_path: Path) -> None:
    h = 64
    attention = h * 96 + 2 * h * 48 + 96 * h  # 4 heads and 2 kv heads of 24
    moe = 4 * 3 * h * 32 + 3 * h * 32 + 4 * h
    dense = 3 * h * 80
    # moe_layers = range(2, 6, 3) = [2, 5]: two MoE layers, four dense
    psi = 2 * (attention + 2 * h + moe) + 4 * (attention + 2 * h + dense) + 2 * 500 * h + h
    assert psi == 298_816
    small = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 6,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
             "intermediate_size": 32, "intermediate_size_mlp": 80, "num_local_experts": 4,
             "num_experts_per_tok": 1, "interleave_moe_layer_step": 3, "vocab_size": 500}
    strategy, _ = _imported(_config(tmp_path, small))
    assert strategy.model.params == psi
    with pytest.raises(PlaceError) as error:  # a list other than the interleave
        _imported(_config(tmp_path, {**small, "moe_layers": [1, 5]}))
    assert any("moe_layers" in d.message for d in error.value.diagnostics)


@pytest.mark.parametrize(("change", "word"), [
    ({"model_type": "llama4"}, "text_config"),
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
    ({"attention_bias": True}, "biases"),
])
def test_refused_with_the_reason(tmp_path: Path, change: dict[str, object], word: str) -> None:
    config = _config(tmp_path, {**SMALL_DEEPSEEK, **change})
    with pytest.raises(PlaceError) as error:
        _imported(config)
    assert any(word in d.message for d in error.value.diagnostics)
    assert error.value.source is not None and error.value.source.path == str(config)


def test_other_model_types_still_refuse_latent_attention(tmp_path: Path) -> None:
    config = _config(tmp_path, {"model_type": "llama", "num_hidden_layers": 2,
                                "hidden_size": 64, "num_attention_heads": 4,
                                "intermediate_size": 96, "vocab_size": 100, "kv_lora_rank": 8})
    with pytest.raises(PlaceError) as error:
        _imported(config)
    assert any("kv_lora_rank" in d.message for d in error.value.diagnostics)
