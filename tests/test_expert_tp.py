"""The experts' own mesh (issue 32, item 4, part b): Megatron's --expert-tensor-parallel-size
below --tensor-model-parallel-size, written ``place expert over tp * ep``.

Megatron-core (NVIDIA/Megatron-LM at d98e8a64dd, ``megatron/core/parallel_state.py:859-893``,
``initialize_model_parallel``; the order's default at line 617) builds the dense ranks as
``RankGenerator(tp=TP, ep=1, dp=DP, pp=PP, cp=CP)`` and the experts' as ``RankGenerator(tp=ETP,
ep=EP, dp=world // (ETP * EP * PP), pp=PP, cp=1)``, both in the order tp-cp-ep-dp-pp (first
fastest). At ETP 1 an expert-parallel group is EP consecutive ranks: TP / 1 dense tensor-parallel
groups side by side, so a mesh ``tp x ep' x dp`` with ep' = EP / TP and dp = world / (EP * PP)
refines both: dense tp = tp, dense dp = ep' x dp, expert ep = tp x ep', expert dp = dp.

Every number below is worked by hand from Mixtral 8x7B's published shape (hidden 4096, ffn
14336, 32 layers, 32 heads of 128 with 8 key/value heads, 8 experts of three SwiGLU matrices,
vocab 32000, untied, RMSNorm) and ``precision megatron`` (Θ 2, Ω 12, G 4 bytes per element),
never by running the cost model:

- experts: 8 x 32 x 3 x 4096 x 14336 = 45,097,156,608 elements; at EP 8, ETP 1 each device holds
  one whole expert per layer of its stage: 45,097,156,608 / 8 = 5,637,144,576 at PP 1, / 16 =
  2,818,572,288 at PP 2;
- attention: 32 x (4096 x 4096 (Q) + 2 x 4096 x 1024 (K, V) + 4096 x 4096 (O)) = 1,342,177,280,
  split over TP;
- word table and output layer: 32000 x 4096 = 131,072,000 each, split over TP (the vocabulary
  padded to a multiple of 128 x TP is 32000 at TP 2);
- left whole on every tensor rank: the norms, (2 x 32 + 1) x 4096 = 266,240, and the routers,
  32 x 4096 x 8 = 1,048,576: 1,314,816.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.api import check_strategy
from placeverify.cost import analyse
from placeverify.cost.domain import Exact
from placeverify.cost.memory import local_params
from placeverify.diagnostics import Code, PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import load
from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.lower import load_text
from placeverify.verdicts import Verdict

HERE = Path(__file__).parent / "importers"
SCRIPT = HERE / "mixtral-8x7b-megatron-etp1.sh"
CONFIG = HERE / "mixtral-8x7b-config.json"

EXPERTS_TOTAL = 8 * 32 * 3 * 4096 * 14336
assert EXPERTS_TOTAL == 45_097_156_608
ATTENTION = 32 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096)
TABLE = 32000 * 4096
WHOLE = (2 * 32 + 1) * 4096 + 32 * 4096 * 8

MIXTRAL = """\
strategy "Mixtral 8x7B, TP {tp} / ETP 1 / EP 8"
model transformer {{
    layers = 32, hidden = 4096, heads = 32, kv_heads = 8, ffn = 14336, mlp = gated
    vocab = 32000, embeddings = untied, norm = rmsnorm, bias = false, seq = 4096
    experts = 8, top_k = 2
}}
precision megatron
mesh {{ {mesh} }}
place megatron(sequence_parallel) over tp
place expert over tp * ep
place zero1 over ep * dp
{extra}"""

# TP 2, ETP 1, EP 8, PP 1 on 32 ranks: dense dp = 32 / 2 = 16, expert dp = 32 / (1 x 8) = 4,
# ep' = 8 / 2 = 4
TP2 = MIXTRAL.format(tp=2, mesh="dp = 4, ep = 4, tp = 2", extra="")
# TP 4, ETP 1, EP 8, PP 2 on 32 ranks: dense dp = 32 / (4 x 2) = 4, expert dp = 32 / (8 x 2) = 2,
# ep' = 8 / 4 = 2
TP4 = MIXTRAL.format(tp=4, mesh="pp = 2, dp = 2, ep = 2, tp = 4",
                     extra="place pipeline(1f1b, microbatches = 8) over pp\n")


def experts_per_device(strategy: Strategy) -> Fraction:
    return Fraction(local_params(Exact(), strategy)[ParamGroup.EXPERTS])


def test_mixtral_tp2_etp1_ep8_memory_by_hand() -> None:
    strategy = load_text(TP2)
    assert experts_per_device(strategy) == 5_637_144_576 == EXPERTS_TOTAL // 8
    # the rest per device: attention, word table and output layer over tp 2, the norms and
    # routers whole: 671,088,640 + 65,536,000 + 65,536,000 + 1,314,816 = 803,475,456
    rest = ATTENTION // 2 + 2 * (TABLE // 2) + WHOLE
    assert rest == 803_475_456
    got = analyse(strategy).device_bytes()
    assert got["params"] == 2 * (5_637_144_576 + rest) == 12_881_240_064
    assert got["gradients"] == 4 * (5_637_144_576 + rest)
    # the distributed optimizer: the experts' state over the expert data-parallel group (dp,
    # 4 ranks), the dense state over the dense one (ep x dp, 16 ranks)
    assert got["optimizer"] == 12 * 5_637_144_576 // 4 + 12 * rest // 16 == 17_514_040_320


def test_mixtral_tp4_etp1_ep8_pp2_experts_by_hand() -> None:
    strategy = load_text(TP4)
    # 16 layers per stage, one whole expert of each on every device: 16 x 3 x 4096 x 14336
    assert experts_per_device(strategy) == 16 * 3 * 4096 * 14336 == 2_818_572_288


def test_traffic_and_canonical_step_use_the_expert_groups() -> None:
    costs = analyse(load_text(TP4))
    routed = [c for c in costs.comm if c.op == "all_to_all"]
    # the token dispatch runs over the whole expert-parallel group: tp x ep' = 4 x 2 = 8 ranks
    assert [(c.axes, c.group_size) for c in routed] == [(("ep", "tp"), 8)]
    grads = {(c.op, c.what, c.axes) for c in costs.comm if c.state == "gradients"}
    # the expert gradients over the expert data-parallel group (dp: 2), the dense over ep x dp
    assert ("reduce_scatter", "grads[experts]", ("dp",)) in grads
    assert ("reduce_scatter", "grads[dense, embedding, norms]", ("dp", "ep")) in grads


def test_tensor_and_token_traffic_at_etp_1_by_hand() -> None:
    # TP 2 / ETP 1 / EP 8, one micro-batch of 1 x 4096 tokens, bf16 activations: the hidden
    # states are 4096 x 4096 x 2 = 33,554,432 bytes. Only attention has tensor-parallel
    # collectives (Megatron-core's MoE layer with ETP 1 has none): QKV column-parallel (AG
    # forward, AG again in backward, RS of the input gradient) and the output projection
    # row-parallel (RS forward, AG backward): 3 AG + 2 RS per layer, 96 and 64 calls; the token
    # all-to-all over the 8 ranks of tp x ep: each rank's 4096 / 2 tokens x top-2 x 4096 x 2
    # bytes = 33,554,432 per call, dispatch and combine forward and backward (4 x 32 = 128
    # calls), 7/8 of it moved: 3,758,096,384 bytes
    costs = analyse(load_text(TP2))
    tensor = {(c.op, c.calls, c.payload) for c in costs.comm if c.axes == ("tp",)
              and c.what.startswith("activations")}
    assert tensor == {("all_gather", 96, 33_554_432), ("reduce_scatter", 64, 33_554_432)}
    routed, = (c for c in costs.comm if c.op == "all_to_all")
    assert (routed.axes, routed.payload, routed.calls) == (("ep", "tp"), 33_554_432, 128)
    assert routed.bytes == 3_758_096_384
    assert not [c for c in costs.comm if "expert tensor-parallel" in c.what]



def _tp4_etp2(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The Mixtral launch at TP 4, ETP 2, EP 4 (the fixture's sizes replaced)."""
    text = SCRIPT.read_text(encoding="utf-8").replace(
        "--tensor-model-parallel-size 2 --expert-tensor-parallel-size 1",
        "--tensor-model-parallel-size 4 --expert-tensor-parallel-size 2").replace(
        "--expert-model-parallel-size 8", "--expert-model-parallel-size 4")
    script = tmp_path / "mixtral-tp4-etp2.sh"
    script.write_text(text, encoding="utf-8")
    strategy, _ = load(str(script), Options(model=str(CONFIG)))
    return strategy

def test_the_dispatcher_gathers_over_the_expert_tensor_axis_by_hand(tmp_path: Path) -> None:
    # TP 4, ETP 2, EP 4 (the launch below), 32 micro-batches, full recomputation: the
    # dispatcher all-gathers the routed tokens over etp (2 ranks) and reduce-scatters the expert
    # outputs, forward, recomputed forward and backward: 3 x 32 layers x 32 = 3,072 calls each;
    # each rank's 4096 / 4 tokens x top-2, gathered from 2 ranks: 2048 x 2 x 4096 x 2 =
    # 33,554,432 bytes, half of it moved: 51,539,607,552 bytes each
    strategy = _tp4_etp2(tmp_path)
    dispatcher = {(c.op, c.axes, c.payload, c.calls, c.bytes) for c in analyse(strategy).comm
                  if "expert tensor-parallel" in c.what}
    assert dispatcher == {(op, ("etp",), 33_554_432, 3072, 51_539_607_552)
                          for op in ("all_gather", "reduce_scatter")}


SMALL = """\
model transformer {{ layers = 2, hidden = 64, heads = 4, vocab = 1024, seq = 128
                    experts = 8, top_k = 2 }}
precision megatron
mesh {{ dp = 2, ep = 2, tp = 2 }}
place megatron(sequence_parallel) over tp
place expert over tp * ep
place ddp over dp
step {{
    backward sum / tokens(ep, dp, step)
    all_reduce(sum) grads[norms] over tp
    all_reduce(sum) grads[dense, embedding, norms] over ep * dp
    all_reduce(sum) grads[experts] over {experts}
    update params
}}
"""


def refuted(text: str) -> set[str]:
    result = check_strategy(load_text(text))
    assert result.verification is not None
    return {o.condition.value for o in result.verification.obligations
            if o.verdict is Verdict.REFUTED}


def test_expert_gradients_over_the_expert_data_parallel_group_are_proved() -> None:
    result = check_strategy(load_text(SMALL.format(experts="dp")))
    assert result.verification is not None
    assert result.verification.overall() is Verdict.PROVED


@pytest.mark.parametrize("wrong", ["ep * dp", "tp * ep * dp"])
def test_expert_gradients_over_the_dense_group_are_refuted(wrong: str) -> None:
    # ep * dp is the dense data-parallel group: its ep ranks hold different experts (the
    # expert group is tp x ep), so summing over it adds different experts' gradients
    assert "gradient_integrity" in refuted(SMALL.format(experts=wrong))


def errors(text: str) -> list[tuple[Code, str, int]]:
    with pytest.raises(PlaceError) as caught:
        load_text(text)
    return [(e.code, e.message, e.span.line if e.span else 0)
            for e in caught.value.diagnostics]


def test_the_expert_count_divides_over_the_whole_expert_group() -> None:
    # 6 experts over tp x ep = 2 x 2: Megatron-core asserts num_moe_experts % ep_size == 0
    text = SMALL.format(experts="dp").replace("experts = 8", "experts = 6")
    (code, message, line), = errors(text)
    assert code is Code.NOT_DIVISIBLE and "tp x ep" in message and line == 6


def test_experts_split_over_tp_need_sequence_parallelism() -> None:
    text = SMALL.format(experts="dp").replace("megatron(sequence_parallel)", "megatron")
    (code, message, line), = errors(text)
    assert code is Code.CONFLICT and "sequence parallelism" in message and line == 6


def test_an_expert_product_without_a_tensor_axis_is_an_error() -> None:
    text = SMALL.format(experts="dp").replace("place expert over tp * ep",
                                              "place expert over ep * dp")
    assert any("already a data axis" in m for _, m, _ in errors(text))


def test_megatron_import_at_etp_1_gives_the_hand_figures() -> None:
    strategy, _ = load(str(SCRIPT), Options(model=str(CONFIG)))
    assert {a.name: a.size for a in strategy.mesh.axes} == {"dp": 4, "ep": 4, "tp": 2}
    assert strategy.placement("tp").experts_split
    assert experts_per_device(strategy) == 5_637_144_576
    got = analyse(strategy).device_bytes()
    rest = ATTENTION // 2 + 2 * (TABLE // 2) + WHOLE
    assert got["params"] == 12_881_240_064
    assert got["optimizer"] == 12 * 5_637_144_576 // 4 + 12 * rest // 16


def test_megatron_import_tp4_pp2(tmp_path: Path) -> None:
    text = SCRIPT.read_text(encoding="utf-8").replace(
        "--tensor-model-parallel-size 2", "--tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 2")
    script = tmp_path / "mixtral-tp4-pp2.sh"
    script.write_text(text, encoding="utf-8")
    strategy, _ = load(str(script), Options(model=str(CONFIG)))
    assert {a.name: a.size for a in strategy.mesh.axes} == {"dp": 2, "ep": 2, "tp": 4, "pp": 2}
    assert experts_per_device(strategy) == 2_818_572_288


def test_megatron_import_tp4_etp2_ep4(tmp_path: Path) -> None:
    # TP 4, ETP 2, EP 4 on 32 ranks: expert dp = 32 / (2 x 4) = 4, dense dp = 32 / 4 = 8; the
    # expert mesh's etp 2 is the fastest half of each dense tp group of 4, an expert-parallel
    # group of 4 spans two dense tp groups: etp 2 x tp' 2 x ep' 2 x dp 4. Each device holds two
    # experts of each layer (8 / 4), each halved over etp: 45,097,156,608 / (4 x 2)
    strategy = _tp4_etp2(tmp_path)
    assert {a.name: a.size for a in strategy.mesh.axes} == {"dp": 4, "ep": 2, "tp": 2, "etp": 2}
    assert strategy.placement("tp").experts_split and not strategy.placement("etp").experts_split
    assert experts_per_device(strategy) == EXPERTS_TOTAL // 8 == 5_637_144_576
    routed = [c for c in analyse(strategy).comm if c.op == "all_to_all"]
    assert [c.group_size for c in routed] == [4]


@pytest.mark.parametrize(("sizes", "line"), [
    # EP 2 below TP 4 at ETP 1: an expert-parallel group is half a tensor-parallel group
    ("--tensor-model-parallel-size 4 --expert-model-parallel-size 2", 14),
    # ETP 2 below TP 4 at EP 1: every expert on all four tensor ranks, split over two
    ("--tensor-model-parallel-size 4 --expert-tensor-parallel-size 2", 14),
    # ETP 3 does not divide TP 4
    ("--tensor-model-parallel-size 4 --expert-model-parallel-size 4 "
     "--expert-tensor-parallel-size 3", 14),
])
def test_other_expert_meshes_stay_refused(tmp_path: Path, sizes: str, line: int) -> None:
    text = SCRIPT.read_text(encoding="utf-8").replace("--expert-model-parallel-size 8\n", "\n")
    text = text.replace("--tensor-model-parallel-size 2 --expert-tensor-parallel-size 1",
                        sizes + (" --expert-tensor-parallel-size 1" if "expert-tensor" not in sizes
                                 else ""))
    script = tmp_path / "moe.sh"
    script.write_text(text, encoding="utf-8")
    with pytest.raises(PlaceError) as caught:
        load(str(script), Options(model=str(CONFIG)))
    error = next(e for e in caught.value.diagnostics if "--expert-tensor-parallel-size" in e.message)
    assert error.code is Code.NOT_MODELLED and error.span is not None and error.span.line == line
    assert "ETP dividing TP with CP 1 and ETP x EP a multiple of TP" in error.message


def test_the_report_says_which_tensor_axis_splits_the_experts_whole() -> None:
    import json

    import jsonschema

    from placeverify.report.data import check_document

    schema = json.loads((Path(__file__).parent.parent / "placeverify" / "schemas"
                         / "check.schema.json").read_text("utf-8"))
    document = check_document(check_strategy(load_text(TP2), verify_conditions=False))
    jsonschema.validate(document, schema)
    assert document["placement"]["tp"]["experts_split"] is True
    assert "experts_split" not in document["placement"]["ep"]


def test_the_replay_refuses_experts_split_over_a_tensor_axis() -> None:
    from placeverify.replay.layout import Unsupported, layout_of

    with pytest.raises(Unsupported, match="not modelled: the replay splits the experts"):
        layout_of(load_text(SMALL.format(experts="dp")))
