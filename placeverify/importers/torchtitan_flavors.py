"""torchtitan's model flavors as data: those that are placeverify's bundled models (``PRESETS``)
and those written out entry by entry (``FLAVORS``), each from torchtitan's own model arguments,
so that a job config or config registry naming ``flavor = "8B"`` needs no config.json."""

from __future__ import annotations

PRESETS = {("llama3", "8B"): "llama3_8b", ("llama3", "70B"): "llama3_70b",
           ("llama3", "405B"): "llama3_405b"}
# Flavors described entry by entry, from torchtitan's own model arguments (before the move to
# Python config registries, commit 9810191bb): torchtitan/models/llama3/__init__.py (debugmodel:
# dim 256, 6 layers, 16 heads, n_kv_heads None = n_heads, vocab 2048; the SwiGLU width of
# model.py's FeedForward: int(2 x 4 x 256 / 3) = 682 rounded up to multiple_of 256 = 768; an
# untied output layer) and torchtitan/models/qwen3/__init__.py (Qwen3ModelArgs: head_dim 128,
# qk_norm, enable_weight_tying as given, default False).
_QWEN3 = ("mlp = gated, norm = rmsnorm, bias = false, position = rotary, attention = flash, "
          "qk_norm = true, head_dim = 128")
# Qwen3's MoE flavors at b5bcd76 (models/qwen3/__init__.py _debugmodel_moe, _30b_a3b,
# _235b_a22b: every layer a MoE of num_experts SwiGLU experts of moe_hidden_dim, top_k routed,
# a bias-free router (common/config_utils.py make_router_config: bias False), no shared experts
# (make_moe_config: shared_experts None), an untied lm_head, q/k norms over head_dim 128)
_QWEN3_MOE = ("mlp = gated, norm = rmsnorm, bias = false, position = rotary, attention = flash, "
              "qk_norm = true, head_dim = 128, embeddings = untied, top_k = 8")
FLAVORS: dict[tuple[str, str], str] = {
    ("llama3", "debugmodel"): "layers = 6, hidden = 256, heads = 16, kv_heads = 16, ffn = 768, "
                              "vocab = 2048, embeddings = untied, mlp = gated, norm = rmsnorm, "
                              "bias = false, position = rotary, attention = flash",
    # Llama 3.2 1B and 3B as torchtitan builds them at b5bcd76 (models/llama3/__init__.py _1b,
    # _3b: an untied output Linear; models/common/feed_forward.py compute_ffn_hidden_dim:
    # int(1.5 x int(2 x 4 x 2048 / 3)) = 8191 and int(2 x 4 x 3072 / 3) = 8192, rounded up to
    # multiple_of 1024: 8192 both)
    ("llama3", "1B"): "layers = 16, hidden = 2048, heads = 32, kv_heads = 8, ffn = 8192, "
                      "vocab = 128256, embeddings = untied, mlp = gated, norm = rmsnorm, "
                      "bias = false, position = rotary, attention = flash",
    ("llama3", "3B"): "layers = 28, hidden = 3072, heads = 24, kv_heads = 8, ffn = 8192, "
                      "vocab = 128256, embeddings = untied, mlp = gated, norm = rmsnorm, "
                      "bias = false, position = rotary, attention = flash",
    ("qwen3", "debugmodel"): "layers = 8, hidden = 256, heads = 16, kv_heads = 8, ffn = 3072, "
                             f"vocab = 2048, embeddings = tied, {_QWEN3}",
    ("qwen3", "0.6B"): "layers = 28, hidden = 1024, heads = 16, kv_heads = 8, ffn = 3072, "
                       f"vocab = 151936, embeddings = tied, {_QWEN3}",
    ("qwen3", "1.7B"): "layers = 28, hidden = 2048, heads = 16, kv_heads = 8, ffn = 6144, "
                       f"vocab = 151936, embeddings = tied, {_QWEN3}",
    ("qwen3", "4B"): "layers = 36, hidden = 2560, heads = 32, kv_heads = 8, ffn = 9728, "
                     f"vocab = 151936, embeddings = tied, {_QWEN3}",
    ("qwen3", "8B"): "layers = 36, hidden = 4096, heads = 32, kv_heads = 8, ffn = 12288, "
                     f"vocab = 151936, embeddings = untied, {_QWEN3}",
    ("qwen3", "14B"): "layers = 40, hidden = 5120, heads = 40, kv_heads = 8, ffn = 17408, "
                      f"vocab = 151936, embeddings = untied, {_QWEN3}",
    ("qwen3", "debugmodel_moe"): "layers = 8, hidden = 256, heads = 16, kv_heads = 8, "
                                 "ffn = 768, expert_ffn = 768, experts = 64, vocab = 2048, "
                                 f"{_QWEN3_MOE}",
    ("qwen3", "30B-A3B"): "layers = 48, hidden = 2048, heads = 32, kv_heads = 4, ffn = 768, "
                          f"expert_ffn = 768, experts = 128, vocab = 151936, {_QWEN3_MOE}",
    ("qwen3", "235B-A22B"): "layers = 94, hidden = 4096, heads = 64, kv_heads = 4, ffn = 1536, "
                            f"expert_ffn = 1536, experts = 128, vocab = 151936, {_QWEN3_MOE}",
    ("qwen3", "32B"): "layers = 64, hidden = 5120, heads = 64, kv_heads = 8, ffn = 25600, "
                      f"vocab = 151936, embeddings = untied, {_QWEN3}",
}
