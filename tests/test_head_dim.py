"""A head width other than hidden / heads (``head_dim``; Megatron-LM's --kv-channels, Hugging
Face's ``head_dim``): Q and the attention output are heads x head_dim wide, K and V kv_heads x
head_dim. Every expected number is worked out by hand in the comments."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.cost import analyse
from placeverify.cost.time import model_flops_per_token
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import import_file
from placeverify.lower import load_text
from tests.seq_given import load_seq

NEMO_LIKE = ("layers = 40, hidden = 5120, heads = 32, kv_heads = 8, head_dim = 128, ffn = 14336, "
             "mlp = gated, vocab = 131072, embeddings = untied, norm = rmsnorm, seq = 4096, "
             "micro_batch = 1")


def strategy(model: str, extra: str = "mesh { dp = 1 }\nplace ddp over dp\n"):  # type: ignore[no-untyped-def]
    return load_text(f'strategy "s"\nmodel transformer {{ {model} }}\nprecision megatron\n'
                     + extra, "s.place")


def with_hf_model(tmp_path: Path, config: dict[str, object]):  # type: ignore[no-untyped-def]
    """A ZeRO-1 DeepSpeed JSON on 8 ranks with ``config`` as its Hugging Face model."""
    model = tmp_path / "config.json"
    model.write_text(json.dumps(config))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization":
                              {"stage": 1}, "bf16": {"enabled": True}}))
    return load_seq(str(ds), Options(model=str(model), world=8))


def test_parameters_of_a_model_whose_heads_are_not_hidden_over_heads_wide() -> None:
    # per layer: q 5120 x 4096 + k, v 2 x 5120 x 1024 + o 4096 x 5120 = 52,428,800;
    # SwiGLU 3 x 5120 x 14336 = 220,200,960; two RMSNorms 10,240 -> 272,640,000 x 40 layers
    # = 10,905,600,000; embedding and output 2 x 131072 x 5120 = 1,342,177,280; final norm 5120.
    assert strategy(NEMO_LIKE).model.params == 12_247_782_400
    # hidden / heads = 160 would make q, o 5120 x 5120 and k, v 5120 x 1280:
    # 5120 * (5120 + 2 * 1280 + 5120) = 65,536,000 per layer, 13,107,200 more than with 128.
    default = NEMO_LIKE.replace("head_dim = 128", "head_dim = 160")
    assert strategy(default).model.params == 12_247_782_400 + 40 * 13_107_200


def test_the_default_width_written_out_is_the_same_model() -> None:
    plain = NEMO_LIKE.replace("head_dim = 128, ", "")
    written = NEMO_LIKE.replace("head_dim = 128", "head_dim = 160")
    a, b = strategy(plain), strategy(written)
    assert a.model == b.model
    assert analyse(a).device_bytes() == analyse(b).device_bytes()


def test_activations_of_q_k_v_and_the_attention_output_follow_the_head_width() -> None:
    # hidden 64, 4 heads (2 kv), 2-byte activations, s 8, b 1. With head_dim 32: Q and the output
    # projection's input are 4 x 32 = 128 wide (64 before), K and V 2 x 32 = 64 (64 x 2/4 = 32
    # before): 2 x 8 x [2 x (128 - 64) + 2 x (64 - 32)] = 3,072 bytes more per layer.
    base = ("layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 256, vocab = 100, seq = 8, "
            "micro_batch = 1, attention = flash")
    narrow = analyse(strategy(base)).activations
    wide = analyse(strategy(base + ", head_dim = 32")).activations
    assert narrow is not None and wide is not None
    assert Fraction(wide.per_layer) - Fraction(narrow.per_layer) == 3072
    # tensor parallelism splits those four tensors: half the difference per rank at tp = 2
    mesh = "mesh { tp = 2 }\nplace megatron over tp\n"
    narrow2 = analyse(strategy(base, mesh)).activations
    wide2 = analyse(strategy(base + ", head_dim = 32", mesh)).activations
    assert narrow2 is not None and wide2 is not None
    assert Fraction(wide2.per_layer) - Fraction(narrow2.per_layer) == 1536


def test_model_flops_count_the_head_width() -> None:
    # hidden 64, 4 heads x 32 (q 128), 2 kv heads x 32 (kv 64), plain MLP 256, seq 8, vocab 100,
    # per token forward: projections 2 x (64 x (128 + 2 x 64) + 128 x 64) = 49,152;
    # MLP 2 x 2 x 64 x 256 = 65,536; attention core 4 x 8 keys x 128 = 4,096 -> 118,784 a layer;
    # output layer 2 x 64 x 100 = 12,800. Forward and backward: 3 x (2 x 118,784 + 12,800).
    s = strategy("layers = 2, hidden = 64, heads = 4, kv_heads = 2, head_dim = 32, ffn = 256, "
                 "vocab = 100, seq = 8, micro_batch = 1")
    assert s.model.arch is not None
    assert model_flops_per_token(s.model.arch) == 3 * (2 * 118_784 + 12_800)


def test_context_parallel_key_value_gathers_are_kv_heads_times_head_width() -> None:
    # K and V of one layer: 2 x b 1 x s 8 x (2 kv heads x 32) x 2 bytes / tp 1 = 2,048 bytes
    # per gather and per gradient reduce-scatter (hidden x kv / heads = 32 wide gives 1,024).
    s = strategy("layers = 2, hidden = 64, heads = 4, kv_heads = 2, head_dim = 32, ffn = 256, "
                 "vocab = 100, seq = 8, micro_batch = 1",
                 "mesh { cp = 2 }\nplace context(R, S, R, S) over cp\n")
    items = [i for i in analyse(s).comm if "K and V" in i.what]
    assert len(items) == 2 and all(i.payload == 2048 for i in items)  # gathers, gradients


def test_hugging_face_head_dim_is_read(tmp_path: Path) -> None:
    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
              "hidden_size": 5120, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 40,
              "vocab_size": 131072, "tie_word_embeddings": False,
              "max_position_embeddings": 4096}
    s, imported = with_hf_model(tmp_path, config)
    assert "head_dim = 128" in imported.text
    assert s.model.params == 12_247_782_400  # as above: Mistral-NeMo's published shape


def test_megatron_kv_channels_is_the_head_width(tmp_path: Path) -> None:
    args = tmp_path / "train.args"
    args.write_text("--num-layers 2 --hidden-size 512 --num-attention-heads 8 --kv-channels 128 "
                    "--seq-length 64 --max-position-embeddings 64 --vocab-size 1000 "
                    "--micro-batch-size 1 --qk-layernorm\n")
    text = import_file(str(args), Options(world=1)).text
    assert "head_dim = 128" in text and "qk_norm = true" in text
    bad = tmp_path / "bad.place"
    bad.write_text('strategy "s"\nmodel transformer { layers = 1, hidden = 64, heads = 4, '
                   'head_dim = 0, vocab = 10, seq = 8 }\nmesh { dp = 1 }\n')
    with pytest.raises(PlaceError):
        load_text(bad.read_text(), str(bad))


def test_qwen2_biases_on_q_k_v_only(tmp_path: Path) -> None:
    # Qwen2.5-7B's config.json shape (transformers' Qwen2Attention: q, k, v with biases, o and the
    # MLP without). Per layer: q, o 2 x 3584^2 = 25,690,112; k, v 2 x 3584 x 512 = 3,670,016;
    # q, k, v biases 3584 + 2 x 512 = 4,608; SwiGLU 3 x 3584 x 18944 = 203,685,888; two RMSNorms
    # 7,168 -> 233,057,792 x 28 = 6,525,618,176; untied embedding and output 2 x 152064 x 3584 =
    # 1,089,994,752; final norm 3,584: 7,615,616,512, the count Qwen publishes for Qwen2.5-7B.
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
              "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
              "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False,
              "max_position_embeddings": 32768, "max_window_layers": 28, "sliding_window": None,
              "use_sliding_window": False, "rope_theta": 1000000.0, "attention_dropout": 0.0}
    s, imported = with_hf_model(tmp_path, config)
    assert "qkv_bias = true" in imported.text and "bias = false" in imported.text
    assert s.model.params == 7_615_616_512


def test_qwen3_normalises_q_and_k_per_head(tmp_path: Path) -> None:
    # Qwen3-8B's config.json shape (transformers' Qwen3Attention: q_norm and k_norm, RMSNorms of
    # head_dim 128). Per layer: q, o 2 x 4096^2 = 33,554,432; k, v 2 x 4096 x 1024 = 8,388,608;
    # q_norm, k_norm 2 x 128 = 256; SwiGLU 3 x 4096 x 12288 = 150,994,944; two RMSNorms 8,192
    # -> 192,946,432 x 36 = 6,946,071,552; untied embedding and output 2 x 151936 x 4096 =
    # 1,244,659,712; final norm 4,096: 8,190,735,360.
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
              "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 128, "num_hidden_layers": 36, "vocab_size": 151936,
              "tie_word_embeddings": False, "attention_bias": False,
              "max_position_embeddings": 40960, "rope_theta": 1000000, "attention_dropout": 0.0}
    s, imported = with_hf_model(tmp_path, config)
    assert "qk_norm = true" in imported.text
    assert s.model.params == 8_190_735_360


def test_q_and_k_norms_save_their_inputs_over_the_heads_rows() -> None:
    # hidden 64, 4 heads (2 kv) of 16, s 8, b 1, 2-byte activations, megatron profile (a norm
    # saves its input): Q's norm input 8 x 64 and K's 8 x 32 elements: 2 x (512 + 256) = 1,536
    # bytes more per layer; under the eager torch profile an RMSNorm also keeps an fp32 copy in
    # place of the input, the normalised input and an fp32 reciprocal RMS per row (8 x 4 rows
    # of Q, 8 x 2 of K): 4 x 768 + 2 x 768 + 4 x 48 = 4,800.
    base = ("layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 256, vocab = 100, seq = 8, "
            "micro_batch = 1, attention = flash, norm = rmsnorm")
    for profile, more in (("megatron", 1536), ("torch", 4800)):
        mesh = f"mesh {{ dp = 1, memory_profile = {profile} }}\nplace ddp over dp\n"
        plain = analyse(strategy(base, mesh)).activations
        normed = analyse(strategy(base + ", qk_norm = true", mesh)).activations
        assert plain is not None and normed is not None
        assert Fraction(normed.per_layer) - Fraction(plain.per_layer) == more, profile


def test_qwen3_moe_experts_of_their_own_width(tmp_path: Path) -> None:
    # Qwen3-30B-A3B's config.json shape: 48 layers, hidden 2048, 32 heads (4 kv) of 128, every
    # layer a sparse block of 128 experts of width 768, 8 per token. Per layer: q, o 2 x 2048 x
    # 4096 = 16,777,216; k, v 2 x 2048 x 512 = 2,097,152; q_norm, k_norm 256; two RMSNorms 4,096;
    # router 2048 x 128 = 262,144; experts 128 x 3 x 2048 x 768 = 603,979,776 -> 623,120,640 x 48
    # = 29,909,790,720; untied embedding and output 2 x 151936 x 2048 = 622,329,856; final norm
    # 2,048: 30,532,122,624.
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
              "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
              "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
              "vocab_size": 151936, "tie_word_embeddings": False, "attention_bias": False,
              "max_position_embeddings": 40960}
    s, imported = with_hf_model(tmp_path, config)
    assert "expert_ffn = 768" in imported.text and "qk_norm = true" in imported.text
    assert s.model.params == 30_532_122_624
    # a dense layer among the sparse ones is refused at its key
    with pytest.raises(PlaceError) as error:
        with_hf_model(tmp_path, {**config, "mlp_only_layers": [0]})
    assert any("mlp_only_layers" in d.message for d in error.value.diagnostics)
