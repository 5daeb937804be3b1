"""The model keys of layers other than Llama's (``docs/language/model.md``, "Latent attention,
shared experts and dense layers"): counts, errors at the key, costs.

The small model is the small DeepSeek config of ``tests/test_hf_layer_kinds.py`` written as
``.place`` keys; its counts are derived by hand there, from transformers 5.23.0's
``models/deepseek_v3/modeling_deepseek_v3.py`` (``DeepseekV3Attention.__init__`` lines 370-403,
``DeepseekV3DecoderLayer`` line 492, ``DeepseekV3NaiveMoe`` 167-171, ``DeepseekV3MoE`` 211,
``DeepseekV3TopkRouter`` 126), and the costs below by hand from the formulas each test names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.diagnostics import PlaceError
from placeverify.lower import load_text

# ---- the .place keys ---------------------------------------------------------------------

SMALL_PLACE = """
model transformer {{
    layers = 5, hidden = 64, heads = 4, ffn = 96, mlp = gated, vocab = 1000, seq = 32
    norm = rmsnorm, attention = flash
    {extra}
}}
precision megatron
mesh {{ dp = 2, ep = 2 }}
place zero1 over ep * dp
place expert over ep
"""
LATENT = ("q_lora_rank = 24, kv_lora_rank = 16, qk_rope_head_dim = 8, qk_nope_head_dim = 10, "
          "v_head_dim = 12")
MOE = "experts = 8, top_k = 2, expert_ffn = 32, shared_experts = 2, dense_layers = 2"


def test_the_place_keys_give_the_same_count_and_costs() -> None:
    h, heads = 64, 4
    # q_a 64·24, its norm 24, q_b 24·4·(10 + 8); kv_a 64·(16 + 8), its norm 16, kv_b
    # 16·4·(10 + 12); o 4·12·64
    attention = h * 24 + 24 + 24 * heads * 18 + h * 24 + 16 + 16 * heads * 22 + heads * 12 * h
    moe = 8 * 3 * h * 32 + 3 * h * (2 * 32) + 8 * h  # routed, the shared MLP, the router
    layers = 2 * (attention + 2 * h + 3 * h * 96) + 3 * (attention + 2 * h + moe)
    strategy = load_text(SMALL_PLACE.format(extra=f"{LATENT}\n    {MOE}"))
    assert strategy.model.params == layers + 2 * 1000 * h + h == 398_024


@pytest.mark.parametrize(("extra", "word"), [
    ("q_lora_rank = 24, experts = 8, top_k = 2", "kv_lora_rank"),
    ("kv_lora_rank = 16, experts = 8, top_k = 2", "qk_rope_head_dim"),
    (f"{LATENT}, head_dim = 16, experts = 8, top_k = 2", "head_dim"),
    (f"{LATENT}, kv_heads = 2, experts = 8, top_k = 2", "kv_heads"),
    ("experts = 8, top_k = 2, dense_layers = 5", "no MoE layer"),
    ("experts = 8, top_k = 2, moe_every = 6", "no MoE layer"),
    ("shared_experts = 1", "mixture of experts"),
    ("experts = 8, top_k = 2, dense_layers = -1", "dense_layers"),
])
def test_bad_keys_are_errors_at_the_key(extra: str, word: str) -> None:
    text = SMALL_PLACE.format(extra=extra)
    with pytest.raises(PlaceError) as error:
        load_text(text)
    diag = error.value.diagnostics[0]
    assert word in diag.message and diag.span is not None
    assert diag.span.line == 5  # the model block's line with the keys


@pytest.mark.parametrize(("mesh", "place", "word"), [
    ("{ dp = 2, tp = 2 }", "place tp over tp", "tensor parallelism"),
    ("{ dp = 2, pp = 5 }", "place pipeline(1f1b, microbatches = 8) over pp",
     "pipeline stages"),
])
def test_unmodelled_parallelism_is_refused_at_its_placement(mesh: str, place: str,
                                                            word: str) -> None:
    text = SMALL_PLACE.format(extra=f"{LATENT}\n    {MOE}").replace(
        "mesh { dp = 2, ep = 2 }", f"mesh {mesh}").replace(
        "place zero1 over ep * dp\nplace expert over ep", f"place ddp over dp\n{place}")
    with pytest.raises(PlaceError) as error:
        load_text(text)
    assert any(word in d.message and "not modelled" in d.message
               for d in error.value.diagnostics)


# ---- costs -------------------------------------------------------------------------------

def _small() -> object:
    return load_text(SMALL_PLACE.format(extra=f"{LATENT}\n    {MOE}"))


def test_model_flops_per_token_of_latent_attention_and_mixed_layers() -> None:
    from placeverify.cost.flops import model_flops_per_token

    # per token, forward, 2 per multiply-add. Projections: q_a 64·24, q_b 24·72, kv_a 64·24,
    # kv_b 16·88, o 48·64 = 9,280 multiply-adds; the core (full s² as PaLM counts it): Q·Kᵀ over
    # qk_head_dim 18 and the weights times V over v_head_dim 12, 32 keys, 4 heads
    projections, core = 2 * 9_280, 2 * 32 * 4 * (18 + 12)
    moe_mlp = 2 * ((2 + 2) * 3 * 64 * 32 + 64 * 8)  # top-2 routed + 2 shared, the router
    dense_mlp = 2 * 3 * 64 * 96
    layers = 5 * (projections + core) + 3 * moe_mlp + 2 * dense_mlp
    output = 2 * 64 * 1000
    strategy = _small()
    assert model_flops_per_token(strategy.model.arch) == pytest.approx(3 * (layers + output),
                                                                       rel=1e-12)


def test_activations_of_latent_attention_and_mixed_layers() -> None:
    from placeverify.cost import analyse

    # Korthikanti et al.'s count, Megatron's kernels (fused SwiGLU, flash, precision megatron:
    # 2-byte activations), s = 32, b = 1, no tensor parallelism. Per layer: the attention norm's
    # and the down projections' input (h each), the query latent's norm and its up projection's
    # input (24 each), the key/value latent's (16 each), Q and K (4·18 each), V and the output
    # projection's input (4·12 each), the MLP norm's input and the MLP's input (h each), 2 bytes;
    # the fp32 log-sum-exp, 4 bytes per head and token
    per_layer = 2 * 32 * (4 * 64 + 2 * 24 + 2 * 16 + 2 * 72 + 2 * 48) + 4 * 4 * 32
    # the MLP's fc1 output (gate and up) and the down projection's input, 3 tensors of its width
    # per token: 32·(2 + 2) in the 3 MoE layers, 96 in the 2 dense ones
    mlp = 2 * 32 * 3 * (3 * 32 * 4 + 2 * 96)
    costs = analyse(_small())
    assert costs.activations is not None
    assert costs.activations.kept == 5 * per_layer + mlp == 297_472


def test_expert_all_to_all_runs_in_the_moe_layers_only() -> None:
    from placeverify.cost import analyse

    costs = analyse(_small())
    a2a = [c for c in costs.comm if c.op == "all_to_all"]
    # dispatch and combine, forward and backward, in the 3 MoE layers of 5
    assert len(a2a) == 1 and a2a[0].calls == 4 * 3


def test_parameter_memory_splits_the_routed_experts_over_ep_only() -> None:
    from placeverify.cost import analyse

    experts = 3 * 8 * 3 * 64 * 32  # the routed experts of the 3 MoE layers
    rest = 398_024 - experts  # attention, shared experts, dense MLPs, norms, routers, embeddings
    costs = analyse(_small())
    params = sum(i.bytes for i in costs.memory if i.label.startswith("Θ"))
    assert params == 2 * (rest + experts // 2)  # bf16 Θ (precision megatron), ep = 2


DEEPSEEK_PLACE = """
strategy "DeepSeek-V3 671B: ZeRO-1 over ep * dp, routed experts split over ep"
model transformer {
    layers = 61, hidden = 7168, heads = 128, ffn = 18432, mlp = gated, vocab = 129280
    seq = 4096, micro_batch = 1, norm = rmsnorm, attention = flash
    q_lora_rank = 1536, kv_lora_rank = 512, qk_rope_head_dim = 64, qk_nope_head_dim = 128
    v_head_dim = 128
    experts = 256, top_k = 8, expert_ffn = 2048, shared_experts = 1, dense_layers = 3
}
precision megatron
mesh { dp = 4, ep = 64, device = h100_sxm }
place zero1 over ep * dp
place expert over ep
"""


def test_check_of_deepseek_v3_gives_costs_and_proofs(tmp_path: Path) -> None:
    from placeverify import api
    from placeverify.verdicts import Verdict

    path = tmp_path / "deepseek.place"
    path.write_text(DEEPSEEK_PLACE)
    result = api.check(str(path), formulas=True)
    h = 7168
    attention = (h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256
                 + 128 * 128 * h)
    moe = 256 * 3 * h * 2048 + 3 * h * 2048 + 256 * h
    psi = 3 * (attention + 2 * h + 3 * h * 18432) + 58 * (attention + 2 * h + moe) \
        + 2 * 129280 * h + h
    assert result.strategy.model.params == psi == 671_026_404_352
    assert result.overall() is Verdict.PROVED
    assert result.time is not None and result.costs.activations is not None
    # the formulas evaluate to the exact numbers (cost/domain.py's contract)
    assert result.formulas is not None
    exact = {i.label: i.bytes for i in result.costs.memory}
    for item in result.formulas.memory:
        assert result.formulas.domain.evaluate(item.bytes) == exact[item.label]
