"""Per-group meshes (issue 12, construct 5): a data preset over a product group (``place zero1
over dp * cp``) and a parameter group placed over its own data-parallel group (``place ddp over
dp for norms``).

Every expected number below is worked out by hand in the comments, from the bytes per element of
``precision megatron`` (Θ 2, Ω 12, G 4) and the ring factors (reduce-scatter and all-gather move
(n - 1)/n of the payload, all-reduce 2(n - 1)/n), never by running the cost model.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.api import check_strategy
from placeverify.cost import analyse
from placeverify.diagnostics import Code, PlaceError
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Mode, State
from placeverify.ir.render import step_text
from placeverify.lower import load_text
from placeverify.roles.queries import optimizer_axes
from placeverify.verdicts import Verdict

R, S, SS = Mode.R, Mode.S, Mode.S_STAR

CP = """\
model transformer {{ layers = 2, hidden = 1024, heads = 16, vocab = 32000, seq = 8192 }}
precision megatron
mesh {{ dp = 2, cp = 2 }}
{place}
"""

BARE = """\
model {{ params = 1.2e9 }}
precision megatron
mesh {{ dp = 2, dq = 2 }}
{place}
"""

# layers = 2, hidden = 1024, LayerNorm with a bias: the norms group holds two LayerNorms per layer
# (weight and bias, 2 x 1024 each) and the final one: N = 2 * 2 * 2 * 1024 + 2 * 1024 = 10240.
N_NORMS = 10240
GROUPS = """\
model transformer {{ layers = 2, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }}
precision megatron
mesh {{ dp = 2 }}
place fsdp over dp
{extra}
clip max_norm = 1.0
microbatches = {m}
"""


def columns(text: str) -> list[tuple[str, str, tuple[Mode, ...]]]:
    return [(p.axis, p.role.value, p.modes) for p in load_text(text).placements]


def bytes_of(text: str) -> dict[str, Fraction]:
    return {k: Fraction(v) for k, v in analyse(load_text(text)).device_bytes().items()}


def comm_of(text: str) -> dict[tuple[str, tuple[str, ...], str], Fraction]:
    return {(c.op, tuple(c.axes), c.what): Fraction(c.bytes) for c in analyse(load_text(text)).comm}


# ---- a data preset over a product group ------------------------------------------------------


def test_zero1_over_dp_cp_is_the_context_column_with_a_sharded_optimizer() -> None:
    product = CP.format(place="place zero1 over dp * cp\nplace context over cp")
    by_hand = CP.format(place="place zero1 over dp\nplace context(R, S, R, S) over cp")
    assert columns(product) == columns(by_hand) == [
        ("dp", "data", (R, S, R, R)), ("cp", "context", (R, S, R, S))]
    # the statements in either order
    swapped = CP.format(place="place context over cp\nplace zero1 over dp * cp")
    assert columns(swapped) == columns(product)


def test_zero1_over_dp_cp_canonical_step_reduces_over_the_product() -> None:
    text = CP.format(place="place zero1 over dp * cp\nplace context over cp")
    assert step_text(load_text(text)).splitlines()[5:8] == [
        "    reduce_scatter(sum) grads over dp * cp",
        "    update params",
        "    all_gather params over dp * cp"]
    result = check_strategy(load_text(text))
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED


def test_product_of_two_data_axes_is_two_statements() -> None:
    assert columns(BARE.format(place="place zero1 over dp * dq")) == columns(
        BARE.format(place="place zero1 over dp\nplace zero1 over dq")) == [
        ("dp", "data", (R, S, R, R)), ("dq", "data", (R, S, R, R))]


def test_product_memory_and_traffic_by_hand() -> None:
    # Ψ = 1.2e9 parameters, Ω sharded over dp * dq = 4 ranks: Θ 2Ψ = 2.4e9, Ω 12Ψ/4 = 3.6e9,
    # G 4Ψ = 4.8e9 bytes. Traffic: reduce-scatter of 4Ψ bytes over 4 ranks moves 3/4 of it,
    # 3.6e9; the all-gather of 2Ψ bytes after the update, 3/4 of it, 1.8e9.
    text = BARE.format(place="place zero1 over dp * dq")
    got = bytes_of(text)
    assert (got["params"], got["optimizer"], got["gradients"]) == (
        Fraction(24 * 10**8), Fraction(36 * 10**8), Fraction(48 * 10**8))
    comm = comm_of(text)
    assert comm[("reduce_scatter", ("dp", "dq"), "grads")] == 36 * 10**8
    assert comm[("all_gather", ("dp", "dq"), "params")] == 18 * 10**8


@pytest.mark.parametrize(("place", "code", "words", "line"), [
    ("place zero1 over dp * cp\nplace megatron over cp", Code.BAD_VALUE, "a tensor axis", 4),
    ("place zero1 over dp * cp\nplace ddp over cp", Code.DUPLICATE, "placed twice", 4),
    ("place zero1 over dp * cp\nplace zero2 over dp * cp", Code.DUPLICATE, "placed twice", 5),
])
def test_product_errors(place: str, code: Code, words: str, line: int) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(CP.format(place=place), "f.place")
    first = raised.value.diagnostics[0]
    assert first.code is code and words in first.message
    assert first.span is not None and first.span.line == line  # the product statement's


# ---- a parameter group over its own data-parallel group ----------------------------------------


def test_norms_replicated_inside_fsdp_memory_by_hand() -> None:
    # FSDP over dp = 2 halves every state; the norms (N elements) placed ddp keep all of theirs:
    # Θ gains 2N - 2N/2 = N bytes, Ω 12N - 6N = 6N, G 4N - 2N = 2N.
    plain = bytes_of(GROUPS.format(extra="", m=1))
    split = bytes_of(GROUPS.format(extra="place ddp over dp for norms", m=1))
    assert split["params"] - plain["params"] == N_NORMS
    assert split["optimizer"] - plain["optimizer"] == 6 * N_NORMS
    assert split["gradients"] - plain["gradients"] == 2 * N_NORMS


def test_norms_replicated_inside_fsdp_traffic_by_hand() -> None:
    # The FSDP gathers no longer carry the norms: 2N bytes of payload, 1/2 of it moved on 2 ranks,
    # N bytes less per gather; the norms' gradient is all-reduced: 4N bytes, 2(2 - 1)/2 = 1 of it.
    plain = comm_of(GROUPS.format(extra="", m=1))
    split = comm_of(GROUPS.format(extra="place ddp over dp for norms", m=1))
    for what in ("params (gather for forward)", "params (gather for backward)"):
        key = ("all_gather", ("dp",), what)
        assert plain[key] - split[key] == N_NORMS
    assert split[("all_reduce", ("dp",), "grads[norms]")] == 4 * N_NORMS
    assert ("reduce_scatter", ("dp",), "grads[dense, embedding]") in split


def test_norms_replicated_inside_fsdp_canonical_step() -> None:
    one = load_text(GROUPS.format(extra="place ddp over dp for norms", m=1))
    assert step_text(one).splitlines()[5:9] == [
        "    reduce_scatter(sum) grads[dense, embedding] over dp",
        "    all_reduce(sum) grads[norms] over dp",
        "    clip(max_norm = 1) grads over dp",
        "    update params"]
    # with accumulation the sharded groups reduce into their shard each micro-batch and free
    # their full buffer; the norms accumulate in full and are all-reduced once
    two = load_text(GROUPS.format(extra="place ddp over dp for norms", m=2))
    assert step_text(two).splitlines()[2:10] == [
        "    each microbatch {",
        "        backward sum / tokens(dp, step)",
        "        reduce_scatter(sum, accumulate) grads[dense, embedding] over dp",
        "        free grads[dense, embedding]",
        "    }",
        "    all_reduce(sum) grads[norms] over dp",
        "    clip(max_norm = 1) grads over dp",
        "    update params"]
    for strategy in (one, two):
        result = check_strategy(strategy)
        assert result.verification is not None
        assert result.verification.overall() is Verdict.PROVED
    assert optimizer_axes(one, ParamGroup.NORMS) == ()
    assert optimizer_axes(one, ParamGroup.DENSE) == ("dp",)
    dp = one.placement("dp")
    assert dp.mode_of(State.PARAMS, ParamGroup.NORMS) is R
    assert dp.mode_of(State.PARAMS, ParamGroup.DENSE) is SS
    assert dp.mode_of(State.ACTIVATIONS, ParamGroup.NORMS) is R


def test_a_step_that_shards_the_replicated_group_is_refuted_on_composition() -> None:
    # the placement keeps the norms whole over dp; a step that reduce-scatters them does not
    text = GROUPS.format(extra="place ddp over dp for norms", m=1) + """\
step {
    backward sum / tokens(dp, step)
    reduce_scatter(sum) grads over dp
    clip(max_norm = 1.0) grads over dp
    update params
}
"""
    result = check_strategy(load_text(text))
    assert result.verification is not None
    refuted = {o.condition.value for o in result.verification.obligations
               if o.verdict is Verdict.REFUTED}
    assert "composition_safety" in refuted


@pytest.mark.parametrize(("extra", "code", "words", "line"), [
    ("place ddp over dp for norm", Code.UNKNOWN_NAME, "did you mean 'norms'", 5),
    ("place ddp over dp for experts", Code.BAD_VALUE, "has no 'experts' parameters", 5),
    ("place megatron over dp for norms", Code.BAD_VALUE, "is a data preset", 5),
    ("place ddp over dp for norms\nplace zero1 over dp for norms", Code.DUPLICATE,
     "placed twice", 6),
    ("place ddp over dp for norms\noffload optimizer", Code.BAD_VALUE, "not modelled", 6),
    # a group's own options would be dropped (only its modes apply): refused, not ignored
    ("place ddp(overlap = none) over dp for norms", Code.NOT_MODELLED, "overlap on a placement",
     5),
    ("place zero3(reshard_after_forward = false) over dp for norms", Code.NOT_MODELLED,
     "reshard_after_forward on a placement", 5),
    ("place zero2(reduce = step) over dp for norms", Code.NOT_MODELLED, "reduce on a placement",
     5),
])
def test_per_group_errors(extra: str, code: Code, words: str, line: int) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(GROUPS.format(extra=extra, m=1), "f.place")
    first = raised.value.diagnostics[0]
    assert first.code is code and words in first.message, first
    assert first.span is not None and first.span.line == line


def test_replay_emit_refuses_per_group_placements_by_name() -> None:
    from placeverify.replay.emit import EmitRefused, check_layout

    with pytest.raises(EmitRefused, match="for norms"):
        check_layout(load_text(GROUPS.format(extra="place ddp over dp for norms", m=1)))
    check_layout(load_text(GROUPS.format(extra="", m=1)))  # plain FSDP is emitted


# ---- a data preset over a product with an expert axis: place zero1 over ep * dp ----------------

# Megatron-LM's distributed optimizer with expert parallelism: the dense groups' optimizer state is
# sharded over the whole data-parallel group (dp x ep ranks hold the same dense parameters), the
# experts' over the expert data-parallel group (dp: the experts are already split over ep).
# The model, counted by hand (plain MLP experts: up h x f and down f x h, no biases; RMSNorm, a
# weight of h; rotary positions, no table; tied embeddings, no output layer; 16 heads of 64, so
# k and v are h x h):
#   attention per layer 4 h^2 = 4 * 1024^2 = 4,194,304 (dense)
#   norms per layer 2 h = 2,048, the router h x experts = 4,096: 6,144 (norms)
#   experts per layer 4 x 2 x 1024 x 2816 = 23,068,672 (experts)
#   two layers: dense 8,388,608, norms 12,288 + the final norm 1,024 = 13,312, experts 46,137,344
#   embedding 32,000 x 1,024 = 32,768,000
# Ψ_d (every group but the experts) = 8,388,608 + 13,312 + 32,768,000 = 41,169,920; Ψ_e =
# 46,137,344, each ep rank holding Ψ_e / 2 = 23,068,672.
PSI_D, PSI_E = 41_169_920, 46_137_344
MOE = """\
model transformer {{
    layers = 2, hidden = 1024, heads = 16, vocab = 32000, seq = 2048,
    experts = 4, top_k = 2, expert_ffn = 2816,
    mlp = plain, norm = rmsnorm, bias = false, position = rotary, embeddings = tied
}}
precision megatron
mesh {{ dp = 2, ep = 2 }}
{place}
"""
EP_DP = MOE.format(place="place zero1 over ep * dp\nplace expert over ep")


def test_moe_model_counted_by_hand() -> None:
    groups = load_text(EP_DP).model.group_params()
    assert groups[ParamGroup.EXPERTS] == PSI_E
    assert sum(groups.values()) - groups[ParamGroup.EXPERTS] == PSI_D


def test_zero1_over_ep_dp_columns() -> None:
    strategy = load_text(EP_DP)
    assert [(p.axis, p.role.value, p.modes) for p in strategy.placements] == [
        ("dp", "data", (R, S, R, R)), ("ep", "expert", (S, S, S, R))]
    ep = strategy.placement("ep")
    for group in (ParamGroup.DENSE, ParamGroup.NORMS, ParamGroup.EMBEDDING):
        assert [ep.mode_of(st, group.value) for st in (State.PARAMS, State.OPTIMIZER,
                                                        State.GRADIENTS)] == [R, S, R]
        assert optimizer_axes(strategy, group) == ("dp", "ep")
    assert ep.mode_of(State.OPTIMIZER, ParamGroup.EXPERTS.value) is S
    assert optimizer_axes(strategy, ParamGroup.EXPERTS) == ("dp",)
    # the product in either order, the statements in either order
    for place in ("place zero1 over dp * ep\nplace expert over ep",
                  "place expert over ep\nplace zero1 over ep * dp"):
        other = load_text(MOE.format(place=place)).placements
        assert other == tuple(replace(p, span=q.span)
                              for p, q in zip(strategy.placements, other, strict=True))


def test_zero1_over_ep_dp_memory_by_hand() -> None:
    # Θ: every group whole along dp; the dense groups whole along ep, the experts split:
    #   2 (Ψ_d + Ψ_e / 2) = 2 x 64,238,592 = 128,477,184
    # Ω: the dense groups over dp x ep = 4 ranks, the experts (Ψ_e / 2 per ep rank) over dp = 2:
    #   12 Ψ_d / 4 + 12 (Ψ_e / 2) / 2 = 3 Ψ_d + 3 Ψ_e = 3 x 87,307,264 = 261,921,792
    # G: whole, 4 (Ψ_d + Ψ_e / 2) = 256,954,368
    got = bytes_of(EP_DP)
    assert (got["params"], got["optimizer"], got["gradients"]) == (
        Fraction(128_477_184), Fraction(261_921_792), Fraction(256_954_368))
    assert 3 * PSI_D + 3 * PSI_E == 261_921_792
    # zero1 over dp only keeps the dense Ω whole along ep: 12 Ψ_d / 2 + 3 Ψ_e, 3 Ψ_d more
    plain = bytes_of(MOE.format(place="place zero1 over dp\nplace expert over ep"))
    assert plain["optimizer"] - got["optimizer"] == 3 * PSI_D
    # zero2 shards G the same way: 4 Ψ_d / 4 + 4 (Ψ_e / 2) / 2 = Ψ_d + Ψ_e = 87,307,264
    zero2 = bytes_of(MOE.format(place="place zero2 over ep * dp\nplace expert over ep"))
    assert (zero2["optimizer"], zero2["gradients"]) == (Fraction(261_921_792),
                                                        Fraction(87_307_264))


def test_zero1_over_ep_dp_traffic_by_hand() -> None:
    # dense: reduce-scatter of 4 Ψ_d bytes over 4 ranks moves 3/4 of it, 3 Ψ_d = 123,509,760;
    #        all-gather of 2 Ψ_d bytes, 3/4 of it, 61,754,880.
    # experts: reduce-scatter of 4 (Ψ_e / 2) bytes over dp = 2 moves 1/2 of it, Ψ_e = 46,137,344;
    #        all-gather of 2 (Ψ_e / 2) bytes, 1/2 of it, Ψ_e / 2 = 23,068,672.
    comm = comm_of(EP_DP)
    assert comm[("reduce_scatter", ("dp", "ep"), "grads[dense, embedding, norms]")] == 123_509_760
    assert comm[("all_gather", ("dp", "ep"), "params[dense, embedding, norms]")] == 61_754_880
    assert comm[("reduce_scatter", ("dp",), "grads[experts]")] == 46_137_344
    assert comm[("all_gather", ("dp",), "params[experts]")] == 23_068_672
    assert not any(op == "all_reduce" and what.startswith("grads") for op, _, what in comm)


def test_zero1_over_ep_dp_canonical_step_is_proved() -> None:
    strategy = load_text(EP_DP)
    assert step_text(strategy).splitlines()[3:10] == [
        "        backward sum / tokens(dp, ep, step)",
        "    }",
        "    reduce_scatter(sum) grads[dense, embedding, norms] over dp * ep",
        "    reduce_scatter(sum) grads[experts] over dp",
        "    update params",
        "    all_gather params[dense, embedding, norms] over dp * ep",
        "    all_gather params[experts] over dp"]
    result = check_strategy(strategy)
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED


def test_ddp_over_dp_ep_is_ddp_over_dp() -> None:
    # ddp shards nothing: the dense groups are data-parallel along ep already
    assert load_text(MOE.format(place="place ddp over dp * ep\nplace expert over ep")).placements \
        == tuple(replace(p, span=q.span) for p, q in zip(
            load_text(MOE.format(place="place ddp over dp\nplace expert over ep")).placements,
            load_text(MOE.format(place="place ddp over dp * ep\nplace expert over ep")).placements,
            strict=True))


WRONG_GROUP = EP_DP + """\
step {
    backward sum / tokens(dp, ep, step)
    reduce_scatter(sum) grads over RS
    update params
    all_gather params over AG
}
"""


@pytest.mark.parametrize(("rs", "ag", "refuted"), [
    # every group over the expert data-parallel group: the dense gradient never summed over ep
    ("dp", "dp", {"gradient_integrity", "state_consistency", "composition_safety"}),
    # the gradient over the whole data-parallel group: the experts summed with other experts; the
    # gather over dp: the dense shards updated along ep never reach the other ep ranks
    ("dp * ep", "dp", {"gradient_integrity", "state_consistency", "composition_safety"}),
])
def test_one_group_for_both_is_refuted(rs: str, ag: str, refuted: set[str]) -> None:
    result = check_strategy(load_text(WRONG_GROUP.replace("RS", rs).replace("AG", ag)))
    assert result.verification is not None
    got = {o.condition.value for o in result.verification.obligations
           if o.verdict is Verdict.REFUTED}
    assert got == refuted


# ---- parameters sharded over a product with an expert axis: place fsdp over ep * dp ----------

# torchtitan's FSDP2 with expert parallelism (torchtitan/distributed/fsdp.py, apply_fsdp_to_decoder;
# earlier torchtitan/experiments/llama4/infra/parallelize.py, apply_fsdp): the dense parameters
# fully_shard'ed over dp_shard, which includes the ep ranks, the routed experts over
# dp_shard_mod_ep, the expert data-parallel group.
FSDP_EP = MOE.format(place="place fsdp over ep * dp\nplace expert over ep")


def test_fsdp_over_ep_dp_columns() -> None:
    strategy = load_text(FSDP_EP)
    ep = strategy.placement("ep")
    for group in (ParamGroup.DENSE, ParamGroup.NORMS, ParamGroup.EMBEDDING):
        # the dense groups: Θ gathered before use (S*), Ω and G sharded, along ep as along dp
        assert [ep.mode_of(st, group.value) for st in (State.PARAMS, State.OPTIMIZER,
                                                        State.GRADIENTS)] == [SS, S, S]
        assert optimizer_axes(strategy, group) == ("dp", "ep")
    # the experts keep the expert column's modes: split over ep, not gathered along it
    assert ep.mode_of(State.PARAMS, ParamGroup.EXPERTS.value) is S
    assert optimizer_axes(strategy, ParamGroup.EXPERTS) == ("dp",)


def test_fsdp_over_ep_dp_memory_by_hand() -> None:
    # Every rank holds its ep rank's half of the experts (Ψ_e / 2) and a copy of the dense groups.
    # Θ: the dense groups over dp x ep = 4 ranks, the experts' half over dp = 2:
    #   2 Ψ_d / 4 + 2 (Ψ_e / 2) / 2 = 20,584,960 + 23,068,672 = 43,653,632
    # Ω: 12 Ψ_d / 4 + 12 (Ψ_e / 2) / 2 = 3 Ψ_d + 3 Ψ_e = 261,921,792
    # G: 4 Ψ_d / 4 + 4 (Ψ_e / 2) / 2 = Ψ_d + Ψ_e = 87,307,264
    got = bytes_of(FSDP_EP)
    assert (got["params"], got["optimizer"], got["gradients"]) == (
        Fraction(43_653_632), Fraction(261_921_792), Fraction(87_307_264))
    assert PSI_D // 2 + PSI_E // 2 == 43_653_632
    # fsdp over dp keeps the dense groups whole along ep: Θ 2 Ψ_d / 2, Ω 12 Ψ_d / 2, G 4 Ψ_d / 2,
    # so Ψ_d / 2, 3 Ψ_d and Ψ_d more bytes
    plain = bytes_of(MOE.format(place="place fsdp over dp\nplace expert over ep"))
    assert plain["params"] - got["params"] == Fraction(PSI_D, 2)
    assert plain["optimizer"] - got["optimizer"] == 3 * PSI_D
    assert plain["gradients"] - got["gradients"] == PSI_D
    # the gather buffer is one whole unit whatever its shards: the embedding, 32,768,000
    # elements x 2 bytes (a layer holds 4,194,304 + 6,144 + 23,068,672 / 2 = 15,734,784)
    assert got["buffers"] == plain["buffers"] == 65_536_000


def test_fsdp_over_ep_dp_peak_by_hand() -> None:
    # persistent states: Θ + Ω + G above, 43,653,632 + 261,921,792 + 87,307,264 = 392,882,688;
    # the optimizer step (fused Adam, profile megatron) holds just them; the end of backward holds
    # them and one gathered unit, the embedding's 65,536,000 bytes
    peak = analyse(load_text(FSDP_EP)).peak
    assert peak is not None and peak.persistent == 392_882_688
    moments = {m.name: sum(b for _, b in m.parts) for m in peak.moments}
    assert moments["optimizer step"] == 392_882_688
    assert moments["end of backward"] == 392_882_688 + 65_536_000


PRODUCT_FSDP = """strategy "fsdp over two data axes"
model {{ params = 1000000 }}
precision megatron
mesh {{ dp = 2, dq = 4 }}
{place}
"""


@pytest.mark.parametrize("place", ["place fsdp over dp * dq",
                                   "place fsdp over dp\nplace fsdp over dq"])
def test_parameters_sharded_over_two_axes_are_gathered_once_over_their_product(place: str) -> None:
    # By hand: 10^6 bf16 parameters, 2,000,000 bytes, sharded over the 2 x 4 = 8 ranks; one
    # all-gather over the 8 ranks (FSDP2 over the flattened mesh) brings each rank the 7/8 it
    # lacks: 1,750,000 bytes, once for forward and once for backward. One gather per axis, each
    # with the whole payload, gave 1/2 + 3/4 of it: 2,500,000 bytes (a hierarchical gather, over
    # dq of the 1/8 shards then over dp of the 1/2 pieces, also moves 3/8 + 1/2 = 7/8).
    comm = comm_of(PRODUCT_FSDP.format(place=place))
    gathers = {k: v for k, v in comm.items() if k[0] == "all_gather"}
    assert gathers == {("all_gather", ("dp", "dq"), "params (gather for forward)"): 1_750_000,
                       ("all_gather", ("dp", "dq"), "params (gather for backward)"): 1_750_000}
    # the same bytes as one axis of the same 8 ranks
    flat = comm_of(PRODUCT_FSDP.format(place="place fsdp over dp").replace(
        "mesh { dp = 2, dq = 4 }", "mesh { dp = 8 }"))
    assert sorted(v for k, v in flat.items() if k[0] == "all_gather") == [1_750_000] * 2


def test_fsdp_over_ep_dp_traffic_by_hand() -> None:
    # each gather once for forward and once for backward (reshard after forward):
    # dense: all-gather of 2 Ψ_d bytes over dp x ep moves 3/4 of it, 1.5 Ψ_d = 61,754,880
    # experts: all-gather of 2 (Ψ_e / 2) bytes over dp moves 1/2 of it, 23,068,672
    # reduce-scatters as zero2 over ep * dp: 3 Ψ_d = 123,509,760 and Ψ_e = 46,137,344
    comm = comm_of(FSDP_EP)
    for when in ("forward", "backward"):
        assert comm[("all_gather", ("dp", "ep"),
                     f"params[dense, embedding, norms] (gather for {when})")] == 61_754_880
        assert comm[("all_gather", ("dp",), f"params[experts] (gather for {when})")] \
            == 23_068_672
    assert comm[("reduce_scatter", ("dp", "ep"), "grads[dense, embedding, norms]")] == 123_509_760
    assert comm[("reduce_scatter", ("dp",), "grads[experts]")] == 46_137_344
    assert not any(op == "all_gather" and axes == ("ep",) for op, axes, _ in comm)


@pytest.mark.parametrize("preset", ["fsdp", "zero3"])
def test_fsdp_over_ep_dp_canonical_step_is_proved(preset: str) -> None:
    strategy = load_text(MOE.format(place=f"place {preset} over ep * dp\nplace expert over ep"))
    assert "    reduce_scatter(sum) grads[dense, embedding, norms] over dp * ep" in \
        step_text(strategy).splitlines()
    assert "    reduce_scatter(sum) grads[experts] over dp" in step_text(strategy).splitlines()
    result = check_strategy(strategy)
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED


FSDP_STEP = FSDP_EP + """\
step {
    backward sum / tokens(dp, ep, step)
    reduce_scatter(sum) grads[dense, embedding, norms] over DENSE
    reduce_scatter(sum) grads[experts] over EXPERTS
    update params
}
"""


@pytest.mark.parametrize(("dense", "experts", "refuted"), [
    ("dp * ep", "dp", set()),
    # the dense gradient over the expert data-parallel group only: never summed over ep, and its
    # shard is not the one the optimizer (over dp x ep) updates
    ("dp", "dp", {"gradient_integrity", "composition_safety"}),
    # the experts over the whole data-parallel group: different experts summed
    ("dp * ep", "dp * ep", {"gradient_integrity", "composition_safety"}),
])
def test_fsdp_over_ep_dp_groups(dense: str, experts: str, refuted: set[str]) -> None:
    text = FSDP_STEP.replace("DENSE", dense).replace("EXPERTS", experts)
    result = check_strategy(load_text(text))
    assert result.verification is not None
    got = {o.condition.value for o in result.verification.obligations
           if o.verdict is Verdict.REFUTED}
    assert got == refuted


@pytest.mark.parametrize("order", ["place hsdp over dp * ep\nplace expert over ep",
                                   "place expert over ep\nplace hsdp over ep * dp"])
def test_hsdp_over_an_expert_axis_is_not_modelled(order: str) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(MOE.format(place=order), "f.place")
    first = raised.value.diagnostics[0]
    assert first.code is Code.BAD_VALUE
    assert "'hsdp' over the expert axis 'ep': not modelled" in first.message
    assert first.span is not None and first.span.line == 9  # the second statement


def test_hsdp_with_experts_is_fsdp_over_ep_dp_and_ddp_over_the_replicas() -> None:
    # torchtitan's HSDP with EP: the dense groups sharded over dp_shard (dp x ep here), the
    # experts over dp_shard_mod_ep (dp), both replicated over dp_replicate (rep)
    text = FSDP_EP.replace("mesh { dp = 2, ep = 2 }", "mesh { rep = 2, dp = 2, ep = 2 }") + \
        "place ddp over rep\n"
    strategy = load_text(text)
    lines = step_text(strategy).splitlines()
    assert "    reduce_scatter(sum) grads[dense, embedding, norms] over dp * ep" in lines
    assert "    reduce_scatter(sum) grads[experts] over dp" in lines
    assert "    all_reduce(sum) grads over rep" in lines
    result = check_strategy(strategy)
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED
    # memory as fsdp over ep * dp: nothing is sharded over rep
    assert bytes_of(text)["params"] == 43_653_632


def test_fsdp_over_data_times_context_shards_and_gathers_over_the_product() -> None:
    # FSDP2 over the flattened dp_shard x cp mesh (accelerate parallelism_config.py:136-143,
    # torchtitan parallel_dims.py:281): Θ, Ω, G each 1/4 on dp = cp = 2; the gathers and the
    # reduce-scatter over dp x cp. Θ 2 B, Ω 12 B, G 4 B per element (precision megatron), each
    # divided by |dp x cp| = 4 (the model's Ψ is counted elsewhere: test_model.py)
    text = CP.format(place="place fsdp over dp * cp\nplace context over cp")
    strategy = load_text(text, "f.place")
    psi = strategy.model.params
    got = bytes_of(text)
    assert (got["params"], got["optimizer"], got["gradients"]) == (
        Fraction(2 * psi, 4), Fraction(12 * psi, 4), Fraction(4 * psi, 4))
    comm = comm_of(text)
    assert ("reduce_scatter", ("dp", "cp"), "grads") in comm
    assert ("all_gather", ("dp", "cp"), "params (gather for forward)") in comm
    assert "    reduce_scatter(sum) grads over dp * cp" in step_text(strategy).splitlines()
    result = check_strategy(strategy)
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED


# ---- a reduce-scatter whose mixed shard is overwritten before it is read ----------------------

# Found by the soundness harness (change_selector on examples/ok/distributed-optimizer-ep-dp): the
# experts' gradients reduce-scattered with the dense groups over dp * ep (summing different
# experts), then over dp on their own. The second reduce-scatter reduces the full buffer again and
# replaces the shard, so the update consumes the right gradient: gradient integrity holds (it was
# refuted, and the replay matched), and composition safety refutes the wasted collective's group.
DEAD_MIX = EP_DP + """\
step {
    backward sum / tokens(dp, ep, step)
    reduce_scatter(sum) grads over dp * ep
    SECOND
    update params
    all_gather params[dense, embedding, norms] over dp * ep
    all_gather params[experts] over dp
}
"""


@pytest.mark.parametrize(("second", "refuted"), [
    # the mixed shard overwritten: only the group is wrong
    ("reduce_scatter(sum) grads[experts] over dp", {"composition_safety"}),
    # the mixed shard read: the update consumes sums of different experts
    ("scale grads[experts] by 1", {"gradient_integrity", "composition_safety"}),
    # accumulated into: the mixed sums stay in the shard
    ("reduce_scatter(sum, accumulate) grads[experts] over dp * ep",
     {"gradient_integrity", "composition_safety"}),
])
def test_a_mixed_shard_counts_once_something_reads_it(second: str, refuted: set[str]) -> None:
    result = check_strategy(load_text(DEAD_MIX.replace("SECOND", second)))
    assert result.verification is not None
    got = {o.condition.value for o in result.verification.obligations
           if o.verdict is Verdict.REFUTED}
    assert got == refuted


STALE_ALONG_EP = EP_DP + """\
step {
    backward sum / tokens(dp, ep, step)
    all_reduce(sum) grads[dense, embedding, norms] over dp * ep
    reduce_scatter(sum) grads[experts] over dp
    update params
    all_gather params over dp
}
"""


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(("text", "rc", "words"), [
    # the dense groups updated on shards over dp x ep, each group gathered over its own group
    (EP_DP, 0, "the replay agrees with Z3 (proved; the real run matches)"),
    # the dense shards updated along ep, gathered over dp only: ep ranks keep stale parameters
    (STALE_ALONG_EP, 1, "the replay agrees with Z3 (refuted; the real run diverges)"),
    # fsdp over ep * dp: the dense parameters gathered over dp x ep, the experts over dp
    (FSDP_EP, 0, "the replay agrees with Z3 (proved; the real run matches)"),
    # the experts' reduce-scatter over dp * ep: different experts summed, and the run shows it
    (FSDP_STEP.replace("DENSE", "dp * ep").replace("EXPERTS", "dp * ep"), 1,
     "the replay agrees with Z3 (refuted; the real run diverges)"),
    # the mixed shard overwritten before it is read: the values are right (composition safety
    # refutes the group, which no run can show: exit 1, the replay matches)
    (DEAD_MIX.replace("SECOND", "reduce_scatter(sum) grads[experts] over dp"), 1,
     "the replay agrees with Z3 (proved; the real run matches)"),
    # a max reduction: integrity does not model it (unknown), so composition's refutation of the
    # group is what the run must show, and it does
    (FSDP_STEP.replace("DENSE", "dp * ep").replace("reduce_scatter(sum) grads[experts] over EXPERTS",
                                                    "reduce_scatter(max) grads[experts] over dp"),
     1, "the replay agrees with Z3 (refuted; the real run diverges)"),
])
def test_zero1_over_ep_dp_replay(tmp_path: Path, text: str, rc: int, words: str) -> None:
    path = tmp_path / "ep-dp.place"
    path.write_text(text, encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "placeverify", "check", "--replay", "-q",
                          "--width", "200", str(path)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == rc, run.stdout + run.stderr
    assert words in run.stdout


# ---- a per-group placement along an expert axis: place zero1 over ep for dense, ... -----------

# The groups an expert axis does not split are copies along it (data-parallel there), so a data
# preset may place them along it as along a data axis; the experts, split over it, may not.
PER_GROUP_EP = MOE.format(place="place PRESET over dp\nplace expert over ep\n"
                                "place PRESET over ep for GROUPS")


def _columns(text: str) -> list[tuple[str, str, tuple[Mode, ...], tuple[object, ...]]]:
    return [(p.axis, p.role.value, p.modes, tuple(sorted(p.group_modes)))
            for p in load_text(text).placements]


@pytest.mark.parametrize("preset", ["zero1", "zero2", "fsdp"])
def test_every_copied_group_over_ep_is_the_product(preset: str) -> None:
    # zero1 over dp and zero1 over ep for the dense groups is zero1 over ep * dp, column by column
    text = PER_GROUP_EP.replace("PRESET", preset).replace("GROUPS", "dense, norms, embedding")
    assert _columns(text) == _columns(MOE.format(place=f"place {preset} over ep * dp\n"
                                                      "place expert over ep"))
    assert bytes_of(text) == bytes_of(MOE.format(place=f"place {preset} over ep * dp\n"
                                                       "place expert over ep"))


def test_only_the_dense_group_over_ep_by_hand() -> None:
    # dense Ψ = 8,388,608 (two layers of 4 h^2); norms and embedding, N = 13,312 + 32,768,000 =
    # 32,781,312, stay replicas along ep: Ω = 12 x 8,388,608 / 4 + 12 x 32,781,312 / 2
    # + 12 (Ψ_e / 2) / 2 = 25,165,824 + 196,687,872 + 138,412,032 = 360,265,728
    dense, rest = 8_388_608, 13_312 + 32_768_000
    assert dense + rest == PSI_D
    text = PER_GROUP_EP.replace("PRESET", "zero1").replace("GROUPS", "dense")
    got = bytes_of(text)
    assert got["optimizer"] == 3 * dense + 6 * rest + 3 * PSI_E == 360_265_728
    strategy = load_text(text)
    assert optimizer_axes(strategy, ParamGroup.DENSE) == ("dp", "ep")
    assert optimizer_axes(strategy, ParamGroup.NORMS) == ("dp",)
    lines = step_text(strategy).splitlines()
    assert "    reduce_scatter(sum) grads[dense] over dp * ep" in lines
    assert "    all_reduce(sum) grads[embedding, norms] over ep" in lines
    result = check_strategy(strategy)
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED


def test_the_experts_cannot_be_placed_along_their_own_axis() -> None:
    text = PER_GROUP_EP.replace("PRESET", "zero1").replace("GROUPS", "dense, experts")
    with pytest.raises(PlaceError) as raised:
        load_text(text, "f.place")
    first = raised.value.diagnostics[0]
    assert first.code is Code.BAD_VALUE
    assert "the experts are split over the expert axis 'ep'" in first.message
    # line 10, at 'experts': 'place zero1 over ep for dense, ' is 31 characters
    assert first.span is not None and (first.span.line, first.span.column) == (10, 32)


def test_a_group_placed_over_ep_twice_is_an_error() -> None:
    text = MOE.format(place="place zero1 over ep * dp\nplace expert over ep\n"
                            "place ddp over ep for norms")
    with pytest.raises(PlaceError) as raised:
        load_text(text, "f.place")
    assert raised.value.diagnostics[0].code is Code.DUPLICATE


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_trace_of_a_dead_mix_is_unconfirmed_and_says_why(tmp_path: Path) -> None:
    # the only refutation is composition safety's group, which changes no value: the replay of
    # its trace cannot confirm it (exit 3, never 0), and says so at the same mesh
    path, trace = tmp_path / "dead.place", tmp_path / "dead.json"
    path.write_text(DEAD_MIX.replace("SECOND", "reduce_scatter(sum) grads[experts] over dp"),
                    encoding="utf-8")
    check = subprocess.run([sys.executable, "-m", "placeverify", "check", "-q", "--trace",
                            str(trace), str(path)], capture_output=True, text=True, timeout=300,
                           check=False)
    assert check.returncode == 1, check.stdout + check.stderr
    run = subprocess.run([sys.executable, "-m", "placeverify", "replay", "-q", "--width", "400",
                          str(trace)], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "UNCONFIRMED: Z3 says refuted at dp = 2, ep = 2 on a condition about no value" \
        in run.stdout
