"""The per-tensor cost model of the real torch implementations (placeverify.cost.implementations), against
numbers derived by hand from the tensors' shapes and the implementations' documented rules.
No torch needed.

The tiny model used throughout ("A"): 1 layer, hidden 16, 2 heads (2 KV heads, head dim 8), a
plain MLP of width 24, vocabulary 37, LayerNorm, no linear biases, rotary positions, standard
attention, tied embeddings, seq 8, micro-batch 2. Its tensors, in registration order:

    0 embed [37, 16] 592   1 attn_norm.w [16]   2 attn_norm.b [16]   3 q [16, 16] 256
    4 k [16, 16] 256       5 v [16, 16] 256     6 o [16, 16] 256     7 mlp_norm.w [16]
    8 mlp_norm.b [16]      9 up [24, 16] 384    10 down [16, 24] 384 11 norm.w [16]  12 norm.b [16]

592 + 4·256 + 2·384 + 6·16 = 2480 parameters, 9920 bytes in fp32.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from placeverify.cost.implementations import predict
from placeverify.cost.implementations.common import chunk
from placeverify.cost.implementations.ddp import ddp_buckets
from placeverify.cost.implementations.params import transformer_params
from placeverify.cost.implementations.spec import Implementation, Mlp, OptimizerKind, RunSpec
from placeverify.cost.implementations.zero1 import zero_partition
from placeverify.ir.model import Transformer
from placeverify.ir.placement import Schedule

A = Transformer(layers=1, hidden=16, heads=2, kv_heads=2, ffn=24, gated=False, vocab=37, seq=8,
                micro_batch=2, tied_embeddings=True, position="rotary", norm="layernorm",
                bias=False, dropout=False, attention="standard")
B = Transformer(layers=1, hidden=16, heads=2, kv_heads=2, ffn=24, gated=False, vocab=38, seq=8,
                micro_batch=2, tied_embeddings=False, position="rotary", norm="layernorm",
                bias=False, dropout=False, attention="standard")


def comm(prediction: object) -> dict[tuple[str, str, str], tuple[int, int]]:
    out: dict[tuple[str, str, str], tuple[int, int]] = {}
    for c in prediction.comm:  # type: ignore[attr-defined]
        calls, payload = out.get(c.key, (0, 0))
        out[c.key] = (calls + c.calls, payload + c.payload)
    return out


def test_tensor_list_matches_the_hand_count() -> None:
    tensors = transformer_params(A)
    assert [t.numel for t in tensors] == [592, 16, 16, 256, 256, 256, 256, 16, 16, 384, 384, 16, 16]
    assert sum(t.numel for t in tensors) == 2480 == A.params()
    assert tensors[0].name == "embed.weight" and tensors[-1].name == "norm.bias"
    # untied: the output layer comes last; 38 rows
    assert transformer_params(B)[-1].name == "output.weight"
    assert transformer_params(B)[-1].shape == (38, 16)


@pytest.mark.parametrize(("size", "parts", "pieces"), [
    (10, 4, [3, 3, 3, 1]), (2, 4, [1, 1, 0, 0]), (37, 2, [19, 18]), (9, 3, [3, 3, 3]),
    (7, 3, [3, 3, 1]),
])
def test_chunk_follows_torch_chunk(size: int, parts: int, pieces: list[int]) -> None:
    assert [chunk(size, parts, i) for i in range(parts)] == pieces


def test_zero_partition_is_greedy_by_size() -> None:
    # sorted 8, 5, 3, 3, 2 -> r0 8; r1 5; r1 3 (5 < 8); r0 3 (8 = 8: first rank); r1 2 (10 < 11)
    assert zero_partition([5, 3, 3, 2, 8], 2) == [1, 1, 0, 1, 0]


def test_ddp_buckets_close_at_their_caps() -> None:
    mib = 1024 * 1024
    assert ddp_buckets([600_000, 600_000, 30 * mib]) == [1_200_000, 30 * mib]
    assert ddp_buckets([100, 200]) == [300]


def test_ddp() -> None:
    spec = RunSpec(Implementation.DDP, OptimizerKind.ADAM, dp=2, arch=A)
    for p in predict(spec):
        assert p.states["params"] == p.states["grads"] == p.states["ddp_buckets"] == 9920
        assert p.states["optimizer"] == 2480 * 8 + 13 * 4  # exp_avg, exp_avg_sq, step per tensor
        assert comm(p) == {("backward", "all_reduce", "dp"): (1, 9920)}


def test_zero1_partitions_whole_parameters_unevenly() -> None:
    # sorted: 592 (0), 384 (9), 384 (10), 256 (3, 4, 5, 6), 16 (1, 2, 7, 8, 11, 12)
    # r0 0 [592, 0]; r1 9 [592, 384]; r1 10 [592, 768]; r0 3 [848, 768]; r1 4 [848, 1024];
    # r0 5 [1104, 1024]; r1 6 [1104, 1280]; the six 16s all go to r0 -> [1200, 1280]
    spec = RunSpec(Implementation.ZERO1, OptimizerKind.ADAM, dp=2, arch=A)
    r0, r1 = predict(spec)
    assert r0.states["optimizer"] == 1200 * 8 + 9 * 4
    assert r1.states["optimizer"] == 1280 * 8 + 4 * 4
    for p in (r0, r1):
        assert p.states["params"] == p.states["grads"] == 9920
        assert comm(p) == {("backward", "all_reduce", "dp"): (1, 9920),
                           ("optimizer", "broadcast", "dp"): (13, 9920)}


def test_fsdp2_pads_dim_zero() -> None:
    # root unit: embed 37 rows -> 19 per rank (304 elements, rank 1 holds 18 rows = 288), two
    # norm vectors 8 + 8: 320 padded elements per rank, all-gather payload 2·320·4 = 2560.
    # layer unit: norms 4·8, q k v o 4·(8·16), up 12·16, down 8·24: 928, payload 7424.
    spec = RunSpec(Implementation.FSDP2, OptimizerKind.ADAM, dp=2, arch=A)
    r0, r1 = predict(spec)
    assert r0.states["params"] == (320 + 928) * 4
    assert r1.states["params"] == (304 + 928) * 4
    assert r0.states["params_storage"] == r1.states["params_storage"] == (320 + 928) * 4
    assert r1.states["optimizer"] == (304 + 928) * 8 + 13 * 4
    assert r0.states["params_after_forward"] == 2560 + 928 * 4  # the root stays gathered
    assert comm(r0) == {("forward", "all_gather", "dp"): (2, 2560 + 7424),
                        ("backward", "all_gather", "dp"): (1, 7424),
                        ("backward", "reduce_scatter", "dp"): (2, 2560 + 7424)}
    kept = RunSpec(Implementation.FSDP2, OptimizerKind.ADAM, dp=2, arch=A,
                   reshard_after_forward=False)
    r0 = predict(kept)[0]
    assert r0.states["params_after_forward"] == 2560 + 7424
    assert ("backward", "all_gather", "dp") not in comm(r0)


def test_tensor_parallel() -> None:
    # B over tp = 2: embed and output 19 x 16 rows each, q k v 8 x 16, o 16 x 8, up 12 x 16,
    # down 16 x 12, three LayerNorms whole (32 each): 1600 elements. The embedding's gradient is
    # the whole table (608). Hidden states b·s·h·4 = 1024 bytes.
    spec = RunSpec(Implementation.TP, OptimizerKind.ADAM, tp=2, arch=B)
    for p in predict(spec):
        assert p.states["params"] == 1600 * 4
        assert p.states["grads"] == (1600 - 304 + 608) * 4
        assert p.states["optimizer"] == 1600 * 8 + 14 * 4
        # forward: embedding, o and down outputs, and loss_parallel's 3 reductions of b·s floats;
        # backward: the input gradients of q, k, v, up and the output layer
        assert comm(p) == {("forward", "all_reduce", "tp"): (6, 3 * 1024 + 3 * 64),
                           ("backward", "all_reduce", "tp"): (5, 5 * 1024)}


def test_pipeline() -> None:
    two = Transformer(**{**{f: getattr(B, f) for f in B.__slots__}, "layers": 2})
    spec = RunSpec(Implementation.PIPELINE, OptimizerKind.ADAM, pp=2, microbatches=2,
                   schedule=Schedule.ONE_F_ONE_B, arch=two)
    r0, r1 = predict(spec)
    layer = 32 + 4 * 256 + 32 + 2 * 384  # 1856
    assert r0.states["params"] == (608 + layer) * 4
    assert r1.states["params"] == (layer + 32 + 608) * 4
    hidden = 2 * 8 * 16 * 4
    assert comm(r0) == {("forward", "send", "pp"): (2, 2 * hidden),
                        ("backward", "recv", "pp"): (2, 2 * hidden)}
    assert comm(r1) == {("forward", "recv", "pp"): (2, 2 * hidden),
                        ("backward", "send", "pp"): (2, 2 * hidden)}
    # 1F1B: stage 0 holds 2 micro-batches in flight, the last stage 1
    assert r0.activations["peak"] == 2 * (r0.activations["layers"] + r0.activations["other"])
    assert r1.activations["peak"] == r1.activations["layers"] + r1.activations["other"]


def test_layer_activations() -> None:
    # Korthikanti et al. Table 2 in fp32 for A: s·b·h = 256 elements; attention norm input, QKV
    # input, Q, K, V, output-projection input, MLP norm input, MLP input: 8·256; softmax output
    # a·s²·b = 256; GELU input and second linear input 2·s·b·f = 768: 3072 elements.
    spec = RunSpec(Implementation.DDP, OptimizerKind.ADAM, dp=2, arch=A)
    p = predict(spec)[0]
    assert p.activations["layers_korthikanti"] == 3072 * 4
    # torch also keeps each LayerNorm's mean and rstd (2 norms x 2 x b·s floats) and the rotary
    # cos and sin tables (2 x s x head_dim)
    assert p.activations["layers"] == 3072 * 4 + 2 * 2 * 16 * 4 + 2 * 8 * 8 * 4
    # outside: final norm input + mean + rstd, output-layer input, log-probs, total weight
    assert p.activations["other"] == 256 * 4 + 2 * 16 * 4 + 256 * 4 + 16 * 37 * 4 + 4


def test_mlp() -> None:
    mlp = Mlp(width=8, depth=4, batch=8)
    ddp = predict(RunSpec(Implementation.DDP, OptimizerKind.SGD, dp=2, mlp=mlp))[0]
    assert ddp.states["params"] == 4 * (64 + 8) * 4
    assert ddp.states["optimizer"] == 0
    tp = predict(RunSpec(Implementation.TP, OptimizerKind.SGD_MOMENTUM, tp=2, mlp=mlp))[0]
    # even layers column-parallel (4 x 8 weight, 4 bias), odd row-parallel (8 x 4, bias 8 whole)
    assert tp.states["params"] == 2 * (36 + 40) * 4
    assert tp.states["optimizer"] == 2 * (36 + 40) * 4  # one momentum buffer per element
    row = 8 * 8 * 4
    assert comm(tp) == {("forward", "all_reduce", "tp"): (2, 2 * row),
                        ("backward", "all_reduce", "tp"): (1, row)}


def test_specs_round_trip_through_json() -> None:
    spec = RunSpec(Implementation.FSDP2_TP, OptimizerKind.ADAM, dp=2, tp=2, arch=B,
                   reshard_after_forward=False)
    assert RunSpec.from_json(spec.to_json()) == spec
    mlp = RunSpec(Implementation.DDP, OptimizerKind.SGD, dp=3, mlp=Mlp(8, 4, 8))
    assert RunSpec.from_json(mlp.to_json()) == mlp
    assert Fraction(predict(mlp)[0].states["params"], 4) == 288
