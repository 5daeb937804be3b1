"""Per-group meshes (issue 12, construct 5): a data preset over a product group (``place zero1
over dp * cp``) and a parameter group placed over its own data-parallel group (``place ddp over
dp for norms``).

Every expected number below is worked out by hand in the comments, from the bytes per element of
``precision megatron`` (Θ 2, Ω 12, G 4) and the ring factors (reduce-scatter and all-gather move
(n - 1)/n of the payload, all-reduce 2(n - 1)/n), never by running the cost model.
"""

from __future__ import annotations

from fractions import Fraction

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
    ("place zero3 over dp * cp\nplace context over cp", Code.BAD_VALUE, "not modelled", 4),
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
