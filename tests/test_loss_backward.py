"""The backward of the loss under the torch memory profiles (issue 32, item 7;
placeverify/cost/peak.py, placeverify/cost/torch_moments.py ``loss_backward_parts``).

``F.cross_entropy`` is ``log_softmax`` then ``nll_loss``; ``_log_softmax`` saves its output
(torch's ``tools/autograd/derivatives.yaml``), and in backward ``nll_loss_backward`` makes a new
input-sized gradient (``LossNLL.cpp``, ``nll_loss_backward_out_cpu``: ``grad_input.zero_()``) and
``_log_softmax_backward_data`` another (``SoftMax.cpp``), while the saved output is alive: three
logit-sized fp32 tensors at once where the end of forward holds one. Under ``loss_parallel``
(``torch/distributed/tensor/parallel/loss.py``, ``_nll_loss_and_log_softmax_backward``:
``grad_input = torch.zeros_like(x)``, ``(grad_input + torch.exp(x)) * grad_output``) three of the
local shard beside it. Every figure below is counted by hand from the architecture; before the
fix no torch profile had this moment and the peak of the nanoGPT-shaped DDP run was the end of
forward, 2·4·b·s·V below what ``benchmarks/peak_memory.py`` measures.
"""

from __future__ import annotations

from fractions import Fraction as F

from placeverify.api import load_text
from placeverify.cost import Costs, analyse

# nanoGPT-shaped (benchmarks/models/nanogpt/ddp.place): L = 2, h = 64, a = 4 heads, f = 256,
# V = 512, s = 64, b = 2, LayerNorm with biases, learned positions, plain GELU MLP, written-out
# attention, untied head, no dropout; fp32 Adam.
TEXT = """strategy "loss backward"
model transformer {{
    layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 512, seq = 64, micro_batch = 2,
    mlp = plain, norm = layernorm, bias = true, position = learned, attention = standard,
    embeddings = untied{extra}
}}
precision {precision}
mesh {{ {axis} = {size}, memory_profile = {profile} }}
place {place} over {axis}
{rest}
"""
L, H, A, FF, V, S, B = 2, 64, 4, 256, 512, 64, 2
# Ψ per layer: Q, K, V, O h·h + h each; two LayerNorms 2h each; fc1 h·f + f; fc2 f·h + h
LAYER = 4 * (H * H + H) + 2 * 2 * H + (H * FF + FF) + (FF * H + H)  # 49,984
PSI = L * LAYER + V * H + S * H + 2 * H + V * H  # + wte, wpe (s rows), ln_f, lm_head: 169,728
SBH, SBF, SB = S * B * H, S * B * FF, S * B
LOGITS = 4 * S * B * V  # one micro-batch's fp32 logits: 262,144


def by_rank(**fields: object) -> dict[tuple[str, str], F]:
    """Every moment's bytes by (moment, rank kind)."""
    values = {"extra": "", "precision": "fp32_adam", "axis": "dp", "size": 2,
              "profile": "torch_cpu", "place": "ddp", "rest": ""}
    values.update(fields)
    c: Costs = analyse(load_text(TEXT.format(**values), "loss.place"))
    assert c.peak is not None
    return {(m.name, m.rank): m.total for m in c.peak.moments}


def moments(**fields: object) -> dict[str, F]:
    """The moments of a strategy with one rank kind, by name."""
    got = by_rank(**fields)
    assert len({rank for _, rank in got}) == 1
    return {name: total for (name, _), total in got.items()}


def fp32_layer() -> int:
    """One layer's saved tensors in fp32 under torch, no dropout (Korthikanti et al. §4.1's list
    without the masks): the attention LayerNorm's input and its fp32 mean and rstd per token,
    the shared Q/K/V input, Q and K (for QKᵀ), the softmax output a·s²·b, V, the output
    projection's input; the MLP LayerNorm's input, mean and rstd, fc1's input, GELU's input
    (fc1's output, s·b·f), fc2's input (s·b·f)."""
    return 4 * (8 * SBH + A * S * S * B + 2 * SBF) + 2 * (2 * 4 * SB)


def test_ddp_peaks_in_the_backward_of_the_loss_with_two_more_logits() -> None:
    assert PSI == 169_728 and fp32_layer() == 657_408
    got = moments()
    states = (4 + 8) * PSI  # Θ fp32, Ω Adam's m and v: 2,036,736
    buckets = 4 * PSI  # DDP's bucket buffers, one gradient's worth: 678,912
    activations = L * fp32_layer()
    # outside the layers: the final norm's input, the output layer's input (4·sbh each) and the
    # loss's saved log-probabilities (4·s·b·V; fp32 logits are the model's output itself)
    outside = 2 * 4 * SBH + LOGITS
    # the gradients are freed between steps (one micro-batch): none in forward
    assert got["end of forward"] == states + buckets + activations + outside == 4_358_144
    # the loss's backward: nll_loss's input gradient and log_softmax's, both s·b·V fp32
    assert got["backward of the loss"] == \
        states + buckets + activations + outside + 2 * LOGITS == 4_882_432
    assert max(got, key=lambda k: got[k]) == "backward of the loss"


def test_zero1_holds_the_same_two_gradients_beside_its_optimizer_shard() -> None:
    got = moments(place="zero1")
    # Θ whole, Ω split over the two ranks (ZeroRedundancyOptimizer), DDP's buckets
    held = 4 * PSI + F(8 * PSI, 2) + 4 * PSI + L * fp32_layer() + 2 * 4 * SBH + LOGITS
    assert got["end of forward"] == held
    assert got["backward of the loss"] == held + 2 * LOGITS


def test_tensor_parallel_loss_parallel_holds_three_of_the_local_shard() -> None:
    got = moments(axis="tp", place="megatron")
    # V = 512 is a multiple of 128·t: no padding; each rank's logits are s·b·V/2 fp32
    shard = F(LOGITS, 2)
    assert got["backward of the loss"] - got["end of forward"] == 3 * shard == 393_216


def test_sixteen_bit_logits_are_gone_and_the_fp32_copy_is_what_the_loss_works_in() -> None:
    # bf16 activations on CUDA's profile: the end of forward holds the model's 2-byte logits
    # and the loss's fp32 copy; at the loss's backward the model's forward has returned (its
    # 2-byte logits freed) and two fp32 gradients are made
    got = moments(precision="mixed_adam", profile="torch")
    assert got["backward of the loss"] - got["end of forward"] == 2 * LOGITS - 2 * S * B * V
    # the profiles of other frameworks keep their own moments
    for profile in ("megatron", "deepspeed"):
        assert "backward of the loss" not in moments(precision="mixed_adam", profile=profile)


def test_gpipe_makes_one_micro_batchs_loss_gradients_on_the_last_stage_only() -> None:
    # four micro-batches, GPipe over pp = 2: the last stage keeps every micro-batch's
    # log-probabilities but runs one loss backward at a time; the first stage has no loss
    got = by_rank(axis="pp", place="pipeline(gpipe, microbatches = 4)")
    assert got[("backward of the loss", "last")] - got[("end of forward", "last")] == 2 * LOGITS
    assert ("backward of the loss", "first") not in got
