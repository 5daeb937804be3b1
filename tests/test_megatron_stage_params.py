"""The parameters one device of the fullest pipeline stage holds, against Megatron-LM's own
modules (issue 32, item 4). Expected numbers are worked out by hand from the shapes Megatron-LM
builds (NVIDIA/Megatron-LM at d98e8a64dd):

- ``megatron/core/models/common/embeddings/language_model_embedding.py:59`` the word table is a
  ``VocabParallelEmbedding`` (``megatron/core/tensor_parallel/layers.py:272``: each rank holds
  ``num_embeddings_per_partition`` = padded vocab / tp rows); ``:71`` the learned position table
  is a plain ``torch.nn.Embedding(max_sequence_length, hidden_size)``: whole on every tensor
  rank. The vocabulary is padded to a multiple of ``make_vocab_size_divisible_by * tp``
  (``megatron/training/vocab_utils.py:58``).
- ``layers.py:1038`` a ``ColumnParallelLinear`` holds output/tp columns and its bias with them
  (``:1112``); ``:1408`` a ``RowParallelLinear`` input/tp rows and its whole bias (``:1484``);
  LayerNorm weights and biases are whole.

Megatron's own estimate, ``megatron/training/theoretical_memory_usage.py``
``compute_weight_and_optimizer_memory``, agrees on the rotary Llama layouts (no biases, no
position table: ``:248-255``, "(1/pp_size transformer layers + 1 embedding layer) / tp_size" plus
the replicated norms) but counts neither biases nor the position table (``:95`` embedding_size =
hidden x padded vocab only), so for GPT-3 the module shapes are the reference.

The first stage is counted on the ``params`` item of the fullest rank's report: with the
distributed optimizer (ZeRO-1) Θ is whole on every data-parallel rank, so params bytes over the
bytes of one parameter are the elements one device holds.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from placeverify.cost.domain import Exact
from placeverify.cost.memory import memory_by_rank
from placeverify.importers import Options
from placeverify.importers.registry import load

HERE = Path(__file__).parent / "importers"


def stage_params(path: Path, world: int | None = None) -> dict[str, Fraction]:
    strategy, _ = load(str(path), Options(world=world))
    ranks, _ = memory_by_rank(Exact(), strategy)
    per = Fraction(strategy.precision.params)
    return {r.kind.name: sum((Fraction(i.bytes) for i in r.items
                              if i.category == "params" and not i.host), Fraction(0)) / per
            for r in ranks}


def close(got: Fraction, expected: int) -> bool:
    return abs(got - expected) <= Fraction(expected, 1000)  # 0.1%


def test_gpt3_175b_first_stage_keeps_the_whole_position_table() -> None:
    # tests/importers/gpt3-175b-megatron.sh: TP 8, PP 8, 96 layers, h 12288, seq and
    # --max-position-embeddings 2048, GPT-2 BPE 50257 padded to a multiple of 128 x 8 = 1024:
    # 51200 rows, 6400 per rank. LayerNorm, biases, tied embeddings.
    h, t, layers = 12288, 8, 96 // 8
    column = (3 * h * h + 3 * h) + (4 * h * h + 4 * h)  # QKV and fc1 with their biases: / t
    row = (h * h) + (4 * h * h)  # proj and fc2 weights: / t
    whole = h + h + 2 * (2 * h)  # proj and fc2 biases, two LayerNorms (weight, bias)
    layer = (column + row) // t + whole
    word = 51200 // t * h
    positions = 2048 * h  # nn.Embedding(max_sequence_length, hidden): not divided by t
    expected = layers * layer + word + positions
    assert expected == 2_822_731_776
    got = stage_params(HERE / "gpt3-175b-megatron.sh")
    assert got["first"] == expected  # placeverify split the position table by 8: 0.78% low
    assert close(got["first"], expected)
    # the last stage: its layers, the final LayerNorm and the tied word table's copy
    assert got["last"] == layers * layer + 2 * h + word
    assert max(got, key=lambda k: got[k]) == "first"


def test_llama3_405b_first_stage_equals_megatrons_formula() -> None:
    # tests/importers/llama3-405b-megatron.args: TP 8, PP 14, 126 layers -> 9 per stage;
    # h 16384, 128 heads, 8 query groups (kv width 8 x 128), ffn 53248 with --swiglu, RMSNorm,
    # no biases, rotary (no position table), untied, vocab 128256 (divisible by 1 x 8).
    h, f, t, pp, layers, vocab = 16384, 53248, 8, 14, 126, 128256
    # theoretical_memory_usage.py:82-93 attention 2h^2 (1 + groups/heads) x (kv_channels x
    # heads / h); :103 MLP 2 h f x 3/2; :127 two norms h each; :251 + embedding, all / tp
    attention = 2 * h * h * (1 + Fraction(8, 128))
    mlp = 2 * h * f * Fraction(3, 2)
    sharded = ((attention + mlp) * layers / pp + h * vocab) / t
    replicated = 2 * h * layers / pp
    expected = sharded + replicated
    assert expected == 3_849_093_120
    got = stage_params(HERE / "llama3-405b-megatron.args", world=1792)
    assert got["first"] == expected and close(got["first"], int(expected))


def test_llama3_70b_first_stage_equals_megatrons_formula(tmp_path: Path) -> None:
    # Llama-3 70B (arXiv 2407.21783 Table 3) under TP 8, PP 4 on 64 GPUs: 80 layers -> 20.
    args = tmp_path / "llama3-70b.args"
    args.write_text("\n".join([
        "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
        "--sequence-parallel", "--num-layers 80", "--hidden-size 8192",
        "--ffn-hidden-size 28672", "--num-attention-heads 64", "--group-query-attention",
        "--num-query-groups 8", "--swiglu", "--normalization RMSNorm",
        "--position-embedding-type rope", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights", "--vocab-size 128256",
        "--make-vocab-size-divisible-by 128", "--seq-length 8192",
        "--max-position-embeddings 8192", "--micro-batch-size 1", "--global-batch-size 64",
        "--bf16", "--use-distributed-optimizer", "--recompute-granularity full",
        ""]), encoding="utf-8")
    h, f, t, pp, layers = 8192, 28672, 8, 4, 80
    # vocab_utils.py:58: 128256 rounded up to a multiple of 128 x 8 = 1024 (125.25 of them)
    padded = 126 * 1024
    attention = 2 * h * h * (1 + Fraction(8, 64))
    mlp = 2 * h * f * Fraction(3, 2)
    expected = ((attention + mlp) * layers / pp + h * padded) / t + 2 * h * layers / pp
    got = stage_params(args, world=64)
    assert got["first"] == expected and close(got["first"], int(expected))
