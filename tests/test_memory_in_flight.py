"""Activations in flight per pipeline stage (issue 13, "per-rank memory": the fullest stage).

The expected counts come from replaying the schedules' loops as Megatron-LM writes them
(``megatron/core/pipeline_parallel/schedules.py``), counting the micro-batches whose forward has
run and whose backward has not, not from the cost model:

- ``forward_backward_pipelining_without_interleaving`` (1F1B): ``num_warmup_microbatches =
  total_stages - current_stage - 1``, capped at m; then, m - warm-up times, one forward and one
  backward; then the warm-up's backwards.
- ``get_pp_rank_microbatches`` for ``forward_backward_pipelining_with_interleaving``:
  ``(p - rank - 1) * 2 + (v - 1) * microbatch_group_size_per_vp_stage`` (the group size defaults
  to p, ``model_parallel_config.py``), capped at m·v virtual micro-batches, each one model chunk
  (1/v of the stage's layers); then the same steady 1F1B loop.
- GPipe: every forward, then every backward.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.cost import analyse
from placeverify.lower import load, load_text
from placeverify.report.data import check_document

ROOT = Path(__file__).resolve().parents[1]

MODEL = ("model transformer {{ layers = {layers}, hidden = 64, heads = 4, ffn = 256, vocab = 1000, "
         "seq = 32, micro_batch = 1, mlp = plain, attention = standard, dropout = false, "
         "embeddings = untied, bias = false, position = rotary, norm = layernorm }}")


def text(options: str, layers: int, pp: int) -> str:
    return (f'strategy "in flight"\n{MODEL.format(layers=layers)}\nprecision megatron\n'
            f"mesh {{\n    pp = {pp}\n}}\nplace pipeline({options}) over pp\n")


def replay(warmup: int, total: int) -> int:
    """Most virtual micro-batches alive at once: ``warmup`` forwards, then ``total - warmup``
    rounds of one forward and one backward, then the remaining backwards."""
    alive = peak = 0
    for _ in range(warmup):
        alive += 1
        peak = max(peak, alive)
    for _ in range(total - warmup):
        alive += 1
        peak = max(peak, alive)
        alive -= 1
    return peak


def megatron_1f1b(p: int, stage: int, m: int) -> Fraction:
    return Fraction(replay(min(p - stage - 1, m), m))


def megatron_interleaved(p: int, stage: int, m: int, v: int) -> Fraction:
    total = m * v
    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    return Fraction(replay(warmup, total), v)  # each virtual micro-batch: one chunk of v


def activations_per_kind(source: str) -> dict[int, Fraction]:
    """Activation bytes per stage kind, keyed by the kind's first stage."""
    costs = analyse(load_text(source))
    return {r.kind.stages[0]: sum((Fraction(i.bytes) for i in r.items
                                   if i.category == "activations" and not i.host), Fraction(0))
            for r in costs.ranks}


@pytest.mark.parametrize(("options", "per_stage", "expected"), [
    # distinct layer counts per stage: every stage is a rank kind of its own
    ("1f1b, microbatches = 8, layers = [1, 2, 3, 4]", (1, 2, 3, 4),
     [megatron_1f1b(4, i, 8) for i in range(4)]),
    ("1f1b, microbatches = 2, layers = [1, 2, 3, 4]", (1, 2, 3, 4),
     [megatron_1f1b(4, i, 2) for i in range(4)]),
    ("gpipe, microbatches = 3, layers = [1, 2, 3, 4]", (1, 2, 3, 4), [Fraction(3)] * 4),
    # interleaved, v = 2: stage s holds chunks s and 4 + s
    ("interleaved, chunks = 2, microbatches = 8, layers = [1, 1, 1, 1, 1, 2, 3, 4]",
     (2, 3, 4, 5), [megatron_interleaved(4, i, 8, 2) for i in range(4)]),
    # m = p: the first stage's warm-up (2·3 + 4 = 10) covers all m·v = 8 virtual micro-batches
    ("interleaved, chunks = 2, microbatches = 4, layers = [1, 1, 1, 1, 1, 2, 3, 4]",
     (2, 3, 4, 5), [megatron_interleaved(4, i, 4, 2) for i in range(4)]),
])
def test_each_stage_holds_its_own_micro_batches_in_flight(options: str, per_stage: tuple[int, ...],
                                                          expected: list[Fraction]) -> None:
    acts = activations_per_kind(text(options, sum(per_stage), len(per_stage)))
    assert sorted(acts) == list(range(len(per_stage)))
    # the same bytes per layer per micro-batch on every stage
    per_layer = {acts[i] / (per_stage[i] * expected[i]) for i in acts}
    assert len(per_layer) == 1 and per_layer.pop() > 0


def test_hand_counts_of_the_replay() -> None:
    # the replay itself, against counts written by hand: 1F1B p = 4, m = 8: 4, 3, 2, 1
    assert [megatron_1f1b(4, i, 8) for i in range(4)] == [4, 3, 2, 1]
    # interleaved p = 4, v = 2, m = 8: warm-ups 10, 8, 6, 4 (+1 steady forward), halved
    assert [megatron_interleaved(4, i, 8, 2) for i in range(4)] == [
        Fraction(11, 2), Fraction(9, 2), Fraction(7, 2), Fraction(5, 2)]
    # stage 0 is Korthikanti et al.'s p(1 + (p - 1)/(pv))
    assert megatron_interleaved(4, 0, 8, 2) == 4 * (1 + Fraction(3, 8))


def test_even_stages_middle_kind_is_its_first_stage() -> None:
    # 8 even layers over 4 stages, 1F1B with m = 8: stages hold 4, 3, 2, 1 micro-batches of 2
    # layers; the middle kind (stages 1-2) shows stage 1's
    acts = activations_per_kind(text("1f1b, microbatches = 8", 8, 4))
    assert sorted(acts) == [0, 1, 3]
    assert acts[0] / 4 == acts[1] / 3 == acts[3] / 1 > 0


def test_llama3_405b_uneven_fullest_is_stage_1() -> None:
    # 7, 8 x 14, 7 layers over 16 stages, 1F1B with m = 32: stage 0 holds 16 · 7 = 112
    # layer-micro-batches, stage 1 15 · 8 = 120 (the most), the last 1 · 7. Full recomputation
    # keeps the layer input, e·s·h / (t·cp) with sequence and context parallelism.
    path = ROOT / "examples" / "strategies" / "llama3-405b-uneven.place"
    costs = analyse(load(str(path)))
    kept = Fraction(2 * 8192 * 16384, 8 * 2)
    acts = {r.kind.name: sum((Fraction(i.bytes) for i in r.items if i.category == "activations"),
                             Fraction(0)) for r in costs.ranks}
    assert acts == {"first": 112 * kept, "middle": 120 * kept, "last": 7 * kept}
    assert costs.activations is not None
    assert Fraction(costs.activations.kept) == 120 * kept
    doc = check_document_json(path)
    ranks = {r["kind"]: r for r in doc["memory"]["ranks"]}
    assert ranks["middle"]["fullest"] and ranks["middle"]["figures_of_stage"] == 1
    assert "figures_of_stage" not in ranks["first"]
    # a middle stage holds nothing outside the layers: its peak is a backward, with the 15
    # micro-batches' checkpoints and one layer rebuilt by the recomputation (issue 32, item 7)
    assert doc["memory"]["peak_at"] == "backward of the last layer, middle pipeline stage (stage 1)"
    assert doc["activations"]["in_flight_microbatches"] == 15


def check_document_json(path: Path) -> dict[str, object]:
    from placeverify.api import check

    result = check(str(path), verify_conditions=False)
    return json.loads(json.dumps(check_document(result)))  # type: ignore[no-any-return]


@pytest.mark.parametrize(("options", "with_grads"), [
    # GPipe: every forward before any backward: no gradient exists when the activations peak
    ("gpipe, microbatches = 4", {"first": False, "last": False}),
    # 1F1B, p = 2, m = 2: stage 0 runs F0 F1 B0 B1 (peak after F1, before any backward);
    # stage 1 runs F0 B0 F1 B1 (after F1 one micro-batch in flight and B0's gradients)
    ("1f1b, microbatches = 2", {"first": False, "last": True}),
    # m = 4: stage 0 runs F0 F1 B0 F2 ...: the peak after F2 meets B0's gradients
    ("1f1b, microbatches = 4", {"first": True, "last": True}),
])
def test_torch_gradients_exist_at_the_peak_only_after_a_backward(options: str,
                                                                  with_grads: dict[str, bool]) -> None:
    source = text(options, 4, 2).replace("mesh {\n    pp = 2\n}",
                                         "mesh {\n    pp = 2\n    memory_profile = torch\n}")
    costs = analyse(load_text(source))
    assert costs.peak is not None and costs.peak.profile == "torch"
    for m in costs.peak.moments:
        if m.name == "end of forward":
            grads = dict(m.parts)["G gradients"]
            assert (grads > 0) is with_grads[m.rank], (m.rank, grads)
