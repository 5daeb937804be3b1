"""Lowering's divisibility checks: every dimension a role shards splits evenly (issue 10, item 3).

Each rule is the one Megatron-LM asserts (cited in ``placeverify/lower/shapes.py``); the expected
messages below are written from the rule, not copied from a run. Every rejected case has an
accepted neighbour, so a check that rejected everything (or nothing) fails here.
"""

from __future__ import annotations

import pytest

from placeverify.diagnostics import Code, PlaceError, Severity
from placeverify.lower import load_text

GPT = ("model transformer {{ layers = {layers}, hidden = {hidden}, heads = {heads}{extra}, "
       "vocab = 32000, seq = {seq} }}")


def model(layers: int = 8, hidden: int = 1024, heads: int = 16, seq: int = 2048,
          extra: str = "") -> str:
    return GPT.format(layers=layers, hidden=hidden, heads=heads, seq=seq, extra=extra)


def errors(text: str) -> list[tuple[int, str, Code, tuple[str, ...]]]:
    """(line, message, code, notes) of every error lowering raises, or [] when it lowers."""
    try:
        load_text(text)
    except PlaceError as raised:
        return [(d.span.line if d.span else 0, d.message, d.code, d.notes)
                for d in raised.diagnostics if d.severity is Severity.ERROR]
    return []


SP_CP = "mesh {{ tp = {tp}, cp = {cp} }}\nplace megatron(sequence_parallel) over tp\nplace context over cp"


def test_sequence_parallel_inside_context_parallel_splits_seq_by_tp_times_cp() -> None:
    # 2052 splits over tp = 4 and into 2 x cp = 4 chunks, but each cp rank's 1026 tokens do not
    # split over tp = 4: Megatron's _split_along_first_dim asserts (seq / cp) % tp == 0
    found = errors(model(seq=2052) + "\n" + SP_CP.format(tp=4, cp=2))
    assert found == [(3, "tp x cp (4 x 2 = 8) does not divide seq (2,052)", Code.NOT_DIVISIBLE,
                      ("sequence parallelism splits the seq / cp tokens of each context-parallel "
                       "rank again over tp",))]
    assert errors(model(seq=2048) + "\n" + SP_CP.format(tp=4, cp=2)) == []
    # the same sequence is fine without sequence parallelism
    assert errors(model(seq=2052) + "\nmesh { tp = 4, cp = 2 }\nplace megatron over tp\n"
                  "place context over cp") == []


def test_context_parallel_needs_two_chunks_per_rank_only_when_it_splits() -> None:
    found = errors(model(seq=2050) + "\nmesh { cp = 2 }\nplace context over cp")
    assert [(line, message) for line, message, _, _ in found] == [
        (3, "2 x cp (2 x 2 = 4) does not divide seq (2,050)")]
    # Megatron asserts seq % (2 cp) only for context_parallel_size > 1
    assert errors(model(seq=2049) + "\nmesh { cp = 1, dp = 2 }\nplace context over cp\n"
                  "place ddp over dp") == []


def test_both_sequence_rules_are_reported_when_both_fail() -> None:
    found = errors(model(seq=1000) + "\n" + SP_CP.format(tp=4, cp=8))
    assert [message for _, message, _, _ in found] == [
        "tp x cp (4 x 8 = 32) does not divide seq (1,000)",
        "2 x cp (2 x 8 = 16) does not divide seq (1,000)"]


def test_a_dimension_split_over_two_axes_divides_by_their_product() -> None:
    def text(a: int, b: int) -> str:
        return (model(hidden=1536, heads=12) + f"\nmesh {{ ta = {a}, tb = {b} }}\n"
                "place megatron over ta\nplace megatron over tb")

    # 12 heads split over ta = 2 and over tb = 4, but not over both (8 ranks)
    assert errors(text(2, 4)) == [
        (4, "ta x tb (2 x 4 = 8) does not divide heads (12)", Code.NOT_DIVISIBLE, ())]
    assert errors(text(2, 2)) == []


def test_experts_over_two_expert_axes_divide_by_their_product() -> None:
    text = "model mixtral_8x7b\nmesh {{ ea = {a}, eb = {b} }}\nplace expert over ea\n" \
        "place expert over eb"
    assert errors(text.format(a=4, b=4)) == [
        (4, "ea x eb (4 x 4 = 16) does not divide experts (8)", Code.NOT_DIVISIBLE, ())]
    assert errors(text.format(a=2, b=4)) == []


def test_sequence_over_two_context_axes() -> None:
    text = model(seq=2056) + "\nmesh { ca = 4, cb = 4 }\nplace context over ca\n" \
        "place context over cb"
    assert [message for _, message, _, _ in errors(text)] == [
        "2 x ca x cb (2 x 4 x 4 = 32) does not divide seq (2,056)"]


@pytest.mark.parametrize(("kv_heads", "tp", "note"), [
    (8, 16, "Megatron-LM shards whole key/value head groups over tp; with tp a multiple of kv_heads "
            "it instead all-gathers the fused QKV output over tp and each rank slices out its head, "
            "which placeverify does not model"),
    (6, 4, "Megatron-LM shards whole key/value head groups over tp, and rejects kv_heads that is "
           "neither a multiple nor a divisor of the tensor-parallel size"),
])
def test_kv_heads_must_split_over_tp(kv_heads: int, tp: int, note: str) -> None:
    text = (model(hidden=3072, heads=48, extra=f", kv_heads = {kv_heads}")
            + f"\nmesh {{ tp = {tp} }}\nplace megatron over tp")
    assert errors(text) == [(3, f"tp ({tp}) does not divide kv_heads ({kv_heads})",
                             Code.NOT_DIVISIBLE, (note,))]


def test_kv_heads_a_multiple_of_tp_is_accepted() -> None:
    text = model(hidden=3072, heads=48, extra=", kv_heads = 8") + "\nmesh { tp = 4 }\n" \
        "place megatron over tp"
    assert errors(text) == []


def test_interleaving_needs_two_stages_and_whole_groups_of_microbatches() -> None:
    text = "model llama3_8b\nmesh {{ pp = {pp} }}\n" \
        "place pipeline(interleaved, chunks = 2, microbatches = {m}) over pp"
    assert [(message, code) for _, message, code, _ in errors(text.format(pp=1, m=4))] == [
        ("the interleaved schedule needs at least 2 pipeline stages, but pp = 1", Code.BAD_VALUE)]
    assert [message for _, message, _, _ in errors(text.format(pp=4, m=6))] == [
        "the interleaved schedule needs microbatches (6) divisible by pp (4)"]
    assert errors(text.format(pp=4, m=8)) == []
    # layers % (pp x chunks): 32 layers over 4 stages of 2 chunks, not of 3
    assert [message for _, message, _, _ in errors(text.format(pp=4, m=8).replace(
        "chunks = 2", "chunks = 3"))] == ["pp x chunks (4 x 3 = 12) does not divide layers (32)"]


def test_layers_over_pipeline_stages() -> None:
    def text(pp: int) -> str:
        return model(layers=30) + f"\nmesh {{ pp = {pp} }}\nplace pipeline(1f1b, microbatches = 8) over pp"

    assert [message for _, message, _, _ in errors(text(4))] == ["pp (4) does not divide layers (30)"]
    assert errors(text(5)) == []
