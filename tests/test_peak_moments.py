"""The peak's moments checked tensor by tensor (issue 32, item 7; placeverify/cost/peak.py).

Each test lists by hand what is alive at a moment, with its size: Ψ per group from the
architecture, the bytes per element of the precision, the activations per layer from Korthikanti
et al. (arXiv 2205.05198) §4.1 / Table 2 as docs/models/costs.md generalises them, computed here
from the formula and never by the code under test. Each asserts the moment's bytes exactly and
which moment is the peak. Before the fix: (a) the end of forward held the recompute working set,
(b) ZeRO-3 had no moment with the output layer's unsharded gradient, (c) nor with a layer's,
(d) offloaded gradients were counted on the host at the model's 2 bytes.
"""

from __future__ import annotations

from fractions import Fraction as F

from placeverify.api import load_text
from placeverify.cost import Costs, analyse

# A Llama-shaped model: L = 2, h = 64, a = 4 heads of 16, a_kv = 2, f = 176 (SwiGLU), V = 1024
# (a multiple of 128: no padding), RMSNorm, no biases, rotary, flash attention, untied, no dropout.
LLAMA = """strategy "moments"
model transformer {{
    layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 176, vocab = 1024, seq = {seq},
    micro_batch = 2, mlp = gated, norm = rmsnorm, bias = false, position = rotary,
    attention = flash, embeddings = untied, dropout = false
}}
precision mixed_adam
mesh {{ dp = {dp}{profile} }}
place {place} over dp
{rest}
"""
H, A, KV, FF, V, L = 64, 4, 2, 176, 1024, 2
# Ψ per layer: Q h·h, K and V h·(a_kv·h/a) each, O h·h; gate, up, down h·f each; 2 RMSNorms h
LAYER = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64  # 46,208
WORD = OUT = V * H  # 65,536 each
PSI = L * LAYER + WORD + OUT + H  # + the final norm: 223,552
# mixed_adam (the ZeRO paper's): Θ 2 (fp16), G 2 (fp16), Ω 12 (fp32 master, m, v); A 2
THETA, GRAD, OMEGA, E = 2, 2, 12, 2


def costs(text: str) -> Costs:
    return analyse(load_text(text, "moments.place"))


def moments(c: Costs) -> dict[str, F]:
    assert c.peak is not None
    return {m.name: m.total for m in c.peak.moments}


def megatron_layer(s: int, b: int) -> F:
    """One Llama layer's saved tensors under the megatron profile's kernels (fused RMSNorm keeps
    its input, the fused SwiGLU the fc1 output and the down projection's input), e = 2:
    attention norm input, QKV input, Q, output-projection input, MLP norm input, MLP input
    (6 · e·sbh); K and V (2 · e·sbh·a_kv/a); the fp32 log-sum-exp 4·a·s·b; fc1 output 2·e·sbf;
    down-projection input e·sbf."""
    sbh, sbf = s * b * H, s * b * FF
    return F(6 * E * sbh + 2 * E * sbh * KV // A + 4 * A * s * b + 2 * E * sbf + E * sbf)


def outside(s: int, b: int) -> dict[str, F]:
    """The last stage's tensors outside the layers (Korthikanti §4.3, Megatron-core): the final
    norm's and the output layer's inputs e·sbh each, the logits e·s·b·V, their fp32 copy 4·s·b·V."""
    return {"final norm input": F(E * s * b * H), "output layer input": F(E * s * b * H),
            "logits": F(E * s * b * V), "fp32 logits": F(4 * s * b * V)}


def test_the_parameter_count_is_the_hand_count() -> None:
    strategy = load_text(LLAMA.format(seq=32, dp=2, profile="", place="ddp", rest=""), "x.place")
    assert strategy.model.params == PSI == 223_552


def test_a_full_recompute_without_zero3_keeps_the_working_set_out_of_the_end_of_forward() -> None:
    # DDP over dp = 2, s = 32, b = 2, recompute full, megatron profile
    s, b = 32, 2
    c = costs(LLAMA.format(seq=s, dp=2, profile="", place="ddp", rest="recompute full"))
    states = (THETA + GRAD + OMEGA) * F(PSI)  # replicated: 3,576,832
    kept = L * F(E * s * b * H)  # full recompute keeps each layer's input: 2 · 8,192
    working = megatron_layer(s, b)  # one layer rebuilt in backward: 125,952
    assert working == 125_952
    out = sum(outside(s, b).values(), F(0))  # 8,192 + 8,192 + 131,072 + 262,144 = 409,600
    got = moments(c)
    # end of forward: Θ, Ω, G (Megatron's persistent buffers), the checkpoints, the logits and
    # the rest outside the layers; no layer is being rebuilt
    assert got["end of forward"] == states + kept + out == 4_002_816
    # backward of the last layer: the checkpoints and the rebuilt layer; the loss's and the
    # output layer's tensors are freed by then (one micro-batch, no pipeline)
    assert got["backward of the last layer"] == states + kept + working == 3_719_168
    assert got["end of backward"] == states
    assert c.peak is not None and c.peak.peak.name == "end of forward"
    assert c.peak.bytes == 4_002_816


def test_b_zero3_backward_of_the_output_layer_holds_its_unsharded_gradient() -> None:
    # ZeRO-3 over dp = 4, s = 16, b = 2, no recompute, megatron profile
    s, b, n = 16, 2, 4
    c = costs(LLAMA.format(seq=s, dp=n, profile="", place="zero3", rest=""))
    shards = (THETA + GRAD + OMEGA) * F(PSI, n)  # 894,208
    acts = L * megatron_layer(s, b)  # 2 · 62,976
    assert acts == 125_952
    out = outside(s, b)
    gather = THETA * F(max(LAYER, WORD, OUT))  # the gather buffer: the largest unit, 131,072
    got = moments(c)
    assert got["end of forward"] == shards + acts + sum(out.values(), F(0)) + gather == 1_356_032
    # the output layer's backward: every layer's activations, its input, the final norm's and
    # the loss's fp32 copy (the 16-bit logits went when the forward returned), the output layer
    # gathered (2 bytes) and its whole gradient before its reduce-scatter (2 bytes)
    held = out["final norm input"] + out["output layer input"] + out["fp32 logits"]
    assert got["backward of the output layer"] == \
        shards + acts + held + THETA * OUT + GRAD * OUT == 1_421_568
    # the last transformer layer's: that layer gathered and its unsharded gradient
    assert got["backward of the last layer"] == \
        shards + acts + THETA * LAYER + GRAD * LAYER == 1_204_992
    assert c.peak is not None and c.peak.peak.name == "backward of the output layer"


def test_c_gpt3_175b_zero3_peaks_in_a_layers_backward() -> None:
    # GPT-3 175B (96 layers, h = 12288, a = 96, s = 2048, b = 1, V 50257 padded to 50304 by
    # Megatron's multiple of 128, learned positions 2048, tied, LayerNorm with biases, dropout),
    # fp16 mixed Adam, ZeRO-3 over dp = 512, full recomputation
    text = """strategy "gpt3 zero3"
model gpt3_175b { seq = 2048, micro_batch = 1 }
precision mixed_adam
mesh { dp = 512 }
place zero3 over dp
recompute full
"""
    c = costs(text)
    h, a, s, b, n = 12288, 96, 2048, 1, 512
    layer = 12 * h * h + 13 * h  # 4h² + 4h attention, 8h² + 5h MLP, 2 LayerNorms 4h
    word, positions, final_norm = 50304 * h, 2048 * h, 2 * h
    psi = 96 * layer + word + positions + final_norm  # the tied output layer is the word table
    shards = (THETA + GRAD + OMEGA) * F(psi, n)
    sbh = s * b * h
    kept = 96 * F(E * sbh)  # 2sbh per layer (Korthikanti Table 2, full recompute)
    # one layer's full activations, Korthikanti Table 2 without parallelism: sbh(34 + 5as/h)
    working = F(34 * sbh + 5 * a * s * s * b)
    assert working == 2_868_903_936
    mask = F(sbh)  # the embedding's dropout mask, 1 byte, kept until the embedding's backward
    got = moments(c)
    last = shards + kept + mask + THETA * layer + GRAD * layer + working
    assert got["backward of the last layer"] == last == 20_430_705_408
    logits = F(E * s * b * 50304)
    out = 2 * F(E * sbh) + logits + 4 * F(s * b * 50304) + mask
    assert got["end of forward"] == shards + kept + out + THETA * layer  # the gather buffer
    assert c.peak is not None and c.peak.peak.name == "backward of the last layer"
    assert c.peak.bytes == last  # 14% above the end of forward as it was counted before


def test_d_deepspeed_offloaded_gradients_are_fp32_on_the_host() -> None:
    # ZeRO-2 with the optimizer offloaded (ZeRO-Offload: the gradient partition moves too) over
    # dp = 4: DeepSpeed keeps the partition's gradient in fp32 on the host for CPU Adam
    # (runtime/zero/stage_1_and_2.py, initialize_optimizer_states: torch.zeros(partition_size,
    # dtype=single_partition_of_fp32_groups[i].dtype, device='cpu') under cpu_offload)
    s, b, n = 16, 2, 4
    text = LLAMA.format(seq=s, dp=n, profile=", memory_profile = deepspeed", place="zero2",
                        rest="offload optimizer to cpu")
    c = costs(text)
    host = {i.label: F(i.bytes) for i in c.memory if i.host}
    assert host == {"Ω optimizer (offloaded)": OMEGA * F(PSI, n),
                    "G gradients (offloaded)": 4 * F(PSI, n)}
    assert c.host_bytes() == 16 * F(PSI, n) == 894_208
    # the device: Θ whole (2 bytes); the layers as DeepSpeed runs the eager model (profiles.py:
    # each RMSNorm its fp32 copy 4·sbh, the normalised input e·sbh and the fp32 rstd 4·s·b; the
    # SwiGLU four f-wide tensors), the outside tensors as above; the peak is the end of forward
    sbh, sbf = s * b * H, s * b * FF
    norm = 4 * sbh + E * sbh + 4 * s * b
    layer = 2 * norm + 4 * E * sbh + 2 * E * sbh * KV // A + 4 * A * s * b + 4 * E * sbf
    assert layer == 90_880
    peak = THETA * F(PSI) + L * layer + sum(outside(s, b).values(), F(0))
    assert c.peak is not None and c.peak.peak.name == "end of forward"
    assert c.peak.bytes == peak == 833_664
    # the megatron profile keeps the gradients' own dtype on the host
    other = costs(LLAMA.format(seq=s, dp=n, profile="", place="zero2",
                               rest="offload optimizer to cpu"))
    assert {i.label: F(i.bytes) for i in other.memory if i.host}["G gradients (offloaded)"] == \
        GRAD * F(PSI, n)
