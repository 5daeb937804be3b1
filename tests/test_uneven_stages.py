"""Uneven pipeline stages: ``pipeline(..., layers = [l0, ..., lp-1])`` (issue 12, construct 8).

Expected numbers are derived by hand in each test (FLOPs from the matmul shapes, parameters from
the layer's matrices); the list's semantics is Megatron-LM's ``--decoder-first-pipeline-num-layers``
/ ``--decoder-last-pipeline-num-layers`` (the given stages hold those counts, the others the rest
evenly) written out per stage.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from placeverify.cost import analyse
from placeverify.cost.time import Calibration, step_time
from placeverify.diagnostics import Code, PlaceError, Severity
from placeverify.lower import load_text
from placeverify.lower.resize import resize
from placeverify.roles.pipeline import stage_layers
from placeverify.verify import verify

# a small plain transformer: h = 64, 4 heads, ffn 256, vocabulary 1000, 32 tokens, no dropout
MODEL = ("model transformer { layers = 6, hidden = 64, heads = 4, ffn = 256, vocab = 1000, "
         "seq = 32, micro_batch = 1, mlp = plain, attention = standard, dropout = false, "
         "embeddings = untied, bias = false, position = rotary, norm = layernorm }")


def text(options: str, pp: int = 2, extra: str = "") -> str:
    return (f'strategy "uneven"\n{MODEL}\nprecision megatron\n'
            f"mesh {{\n    pp = {pp}\n    dp = 2\n    device = h100_sxm\n}}\n"
            f"place pipeline({options}) over pp\nplace ddp over dp\n{extra}")


def errors(source: str) -> list[tuple[int, int, str, Code]]:
    try:
        load_text(source)
    except PlaceError as raised:
        return [(d.span.line if d.span else 0, d.span.column if d.span else 0, d.message, d.code)
                for d in raised.diagnostics if d.severity is Severity.ERROR]
    return []


# ---- the list is checked, at the list ------------------------------------------------------------

def test_a_list_that_adds_up_and_has_one_entry_per_stage_lowers() -> None:
    assert errors(text("1f1b, microbatches = 4, layers = [2, 4]")) == []
    # without the list 6 layers split evenly over 2 stages, and 7 would not
    assert errors(text("1f1b, microbatches = 4")) == []


def test_the_list_replaces_the_divisibility_rule() -> None:
    assert errors(text("1f1b, microbatches = 4, layers = [2, 2, 2]", pp=3)) == []
    seven = text("1f1b, microbatches = 4", pp=2).replace("layers = 6", "layers = 7")
    assert [m for _, _, m, _ in errors(seven)] == ["pp (2) does not divide layers (7)"]
    seven_listed = text("1f1b, microbatches = 4, layers = [3, 4]").replace("layers = 6,",
                                                                          "layers = 7,")
    assert errors(seven_listed) == []


def test_wrong_length_is_an_error_at_the_list() -> None:
    source = text("1f1b, microbatches = 4, layers = [1, 2, 3]")
    column = source.splitlines()[8].index("[") + 1
    assert errors(source) == [(9, column, "layers lists 3 stages, but pp (2) has 2",
                               Code.BAD_VALUE)]


def test_wrong_sum_is_an_error_at_the_list() -> None:
    source = text("1f1b, microbatches = 4, layers = [2, 5]")
    column = source.splitlines()[8].index("[") + 1
    assert errors(source) == [(9, column, "layers per stage add up to 7, but the model has 6 "
                               "layers", Code.BAD_VALUE)]


def test_a_negative_entry_and_a_bare_number_are_errors_at_the_value() -> None:
    source = text("1f1b, microbatches = 4, layers = [-1, 7]")
    column = source.splitlines()[8].index("[-1") + 2
    assert [(line, col, code) for line, col, _, code in errors(source)] == \
        [(9, column, Code.BAD_VALUE)]
    source = text("1f1b, microbatches = 4, layers = 3")
    column = source.splitlines()[8].index("= 3") + 3
    assert errors(source) == [(9, column, "layers is a list of whole numbers in brackets, e.g. "
                               "'layers = [7, 8, 8, 7]'", Code.BAD_VALUE)]


def test_a_list_elsewhere_is_refused_as_a_value() -> None:
    found = errors(text("1f1b, microbatches = [4]"))
    assert [(m, c) for _, _, m, c in found] == [("microbatches must be a number", Code.BAD_VALUE)]


def test_interleaved_lists_virtual_stages_in_megatron_order() -> None:
    # pp = 2, chunks = 2: virtual stages 0..3 are (stage 0, chunk 0), (1, 0), (0, 1), (1, 1)
    s = load_text(text("interleaved, chunks = 2, microbatches = 4, layers = [1, 2, 1, 2]"))
    assert stage_layers(s) == (1 + 1, 2 + 2)
    found = errors(text("interleaved, chunks = 2, microbatches = 4, layers = [3, 3]"))
    assert [m for _, _, m, _ in found] == [
        "layers lists 2 stages, but pp x chunks (2 x 2 = 4 virtual stages) has 4"]


# ---- costs follow the stages ---------------------------------------------------------------------

H, F, V, S = 64, 256, 1000, 32
LAYER_PARAMS = 4 * H * H + 2 * H * F + 2 * 2 * H  # q, k, v, o; the MLP; two LayerNorms (γ, β)
# forward FLOPs of one micro-batch: QKV 2bs·3h², projection 2bsh², MLP 2·2bsh·f, scores 4bs²h
LAYER_FLOPS = 2 * S * 3 * H * H + 2 * S * H * H + 2 * 2 * S * H * F + 4 * S * S * H
OUTPUT_FLOPS = 2 * S * H * V


@pytest.mark.parametrize(("layers", "per_microbatch"), [
    ("", 3 * (3 * LAYER_FLOPS + OUTPUT_FLOPS)),  # even: the last stage, 3 layers + output layer
    ("layers = [5, 1]", 3 * 5 * LAYER_FLOPS),  # the first stage's 5 layers outweigh 1 + output
    ("layers = [1, 5]", 3 * (5 * LAYER_FLOPS + OUTPUT_FLOPS)),  # the last stage: 5 + output
])
def test_the_slowest_stage_sets_the_pace(layers: str, per_microbatch: int) -> None:
    options = "1f1b, microbatches = 4" + (", " + layers if layers else "")
    s = load_text(text(options))
    result = step_time(s, analyse(s))
    assert result is not None
    assert result.flops_per_microbatch == pytest.approx(per_microbatch, rel=1e-12)


def test_the_stage_with_most_layers_is_the_fullest() -> None:
    # [5, 1]: stage 0 holds 5 layers and the word embedding; stage 1 one layer, the output layer
    # and the final norm. Megatron precision: 2 + 4 + 12 bytes per parameter, ddp keeps them all.
    s = load_text(text("1f1b, microbatches = 4, layers = [5, 1]"))
    costs = analyse(s)
    first = 5 * LAYER_PARAMS + V * H  # rotary positions: no table
    last = 1 * LAYER_PARAMS + V * H + 2 * H  # untied output layer, final LayerNorm
    by_kind = {r.kind.name: r for r in costs.ranks}
    assert sorted(by_kind) == ["first", "last"]
    assert Fraction(sum((i.bytes for i in by_kind["first"].items if i.category == "params"),
                        Fraction(0))) == 2 * first
    assert Fraction(sum((i.bytes for i in by_kind["last"].items if i.category == "params"),
                        Fraction(0))) == 2 * last
    # the activations of 5 layers against 1 on the other stage; under 1F1B (m = 4 >= p = 2)
    # stage 0 holds p = 2 micro-batches in flight, stage 1 (the last) p - 1 = 1
    acts = {k: Fraction(sum((i.bytes for i in r.items if i.category == "activations"),
                            Fraction(0))) for k, r in by_kind.items()}
    assert acts["first"] == 5 * 2 * acts["last"] > 0
    assert costs.rank_bytes(by_kind["first"])["total"] == costs.device_bytes()["total"]


def test_a_stage_of_no_layer_holds_only_the_embedding() -> None:
    # [0, 6]: stage 0 holds only the word embedding (Llama 3's first model chunk, Megatron-LM's
    # --account-for-embedding-in-pipeline-split at one layer per virtual stage); stage 1 the six
    # layers, the output layer and the final norm. Megatron precision 2 bytes of Θ per parameter.
    s = load_text(text("1f1b, microbatches = 4, layers = [0, 6]"))
    costs = analyse(s)
    by_kind = {r.kind.name: r for r in costs.ranks}
    params = {k: Fraction(sum((i.bytes for i in r.items if i.category == "params"), Fraction(0)))
              for k, r in by_kind.items()}
    assert params["first"] == 2 * V * H
    assert params["last"] == 2 * (6 * LAYER_PARAMS + V * H + 2 * H)
    acts = Fraction(sum((i.bytes for i in by_kind["first"].items if i.category == "activations"),
                        Fraction(0)))
    assert acts == 0  # no layer, no layer's activations
    # the last stage sets the pace: 6 layers and the output layer, forward and backward; the
    # first stage has no matmul to add, so nothing is left for the bubble
    result = step_time(s, costs)
    assert result is not None and result.bubble_seconds is not None
    assert result.flops_per_microbatch == pytest.approx(3 * (6 * LAYER_FLOPS + OUTPUT_FLOPS),
                                                        rel=1e-12)
    assert result.bubble_seconds == 0.0
    assert verify(s).verdicts() == {
        "gradient_integrity": "proved", "state_consistency": "proved",
        "composition_safety": "proved"}


def test_the_bubble_is_the_other_stages_work() -> None:
    # [2, 4]: the last stage (4 layers + output) sets the pace; the first stage's 2 layers are
    # the fill and drain: bubble = 2·L / (4·L + O) of the last stage's micro-batch time
    # (matmuls only, and a pipeline link with no time to speak of: the micro-batch time is
    # its FLOPs at one rate)
    source = text("1f1b, microbatches = 4, layers = [2, 4]").replace(
        "    pp = 2\n", "    pp = 2 { bandwidth = 1000 TB/s, latency = 1 ns }\n")
    s = load_text(source)
    flops_only = Calibration(efficiency=(("default", 0.5),), score_passes=0.0, hidden_passes=0.0,
                             attention_efficiency=1.0, link_efficiency=1.0, fp8_cast_bytes=0.0,
                             memory_efficiency=1.0)
    result = step_time(s, analyse(s), flops_only)
    assert result is not None and result.bubble_seconds is not None
    assert result.compute_seconds is not None
    others = Fraction(2 * LAYER_FLOPS, 4 * LAYER_FLOPS + OUTPUT_FLOPS)
    assert others < Fraction(1, 2)  # where (p - 1) micro-batch times would be 1
    # (the link's nanoseconds add about 2% to this small model's micro-batch)
    assert result.bubble_seconds == pytest.approx(float(others) * result.compute_seconds / 4,
                                                  rel=0.03)


def test_middle_stages_with_different_counts_are_kinds_of_their_own() -> None:
    s = load_text(text("1f1b, microbatches = 4, layers = [1, 2, 2, 1]", pp=4))
    names = [(r.kind.name, r.kind.stages) for r in analyse(s).ranks]
    assert names == [("first", (0,)), ("middle", (1, 2)), ("last", (3,))]
    s = load_text(text("1f1b, microbatches = 4, layers = [1, 3, 1, 1]", pp=4))
    names = [(r.kind.name, r.kind.stages) for r in analyse(s).ranks]
    assert names == [("first", (0,)), ("middle (3 layers)", (1,)), ("middle (1 layers)", (2,)),
                     ("last", (3,))]


# ---- gradients do not depend on the split ---------------------------------------------------------

def test_verdicts_are_proved_and_a_resized_mesh_drops_the_list() -> None:
    s = load_text(text("1f1b, microbatches = 4, layers = [5, 1]"))
    verification = verify(s)
    assert verification.verdicts() == {
        "gradient_integrity": "proved", "state_consistency": "proved",
        "composition_safety": "proved"}
    smaller = resize(s, {"pp": 3})
    assert smaller.pipeline is not None and smaller.pipeline.layers is None
    assert stage_layers(smaller) is None
    same = resize(s, {"dp": 3})
    assert stage_layers(same) == (5, 1)


def test_measure_refuses_uneven_stages_at_the_list() -> None:
    from placeverify.measure.plan import plan

    source = text("1f1b, microbatches = 4, layers = [5, 1]").replace("    dp = 2\n", "").replace(
        "place ddp over dp\n", "")
    with pytest.raises(PlaceError) as raised:
        plan(load_text(source))
    [diagnostic] = raised.value.diagnostics
    assert diagnostic.message.startswith("uneven pipeline stages (a list of layers per stage) have "
                                         "no torch implementation in measure")
    assert diagnostic.span is not None and diagnostic.span.line == 8
    even = source.replace(", layers = [5, 1]", "")
    plan(load_text(even))  # the same file with an even split is planned
