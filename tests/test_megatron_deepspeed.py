"""Megatron-DeepSpeed launch scripts (placeverify/importers/megatron_deepspeed.py).

Expected values come from outside the code under test: BigScience's own record of the BLOOM
176B layout (train/tr11-176B-ml/README.md in bigscience-workshop/bigscience: "pp rank 0: [embed |
5 transformer blocks] ... pp rank 1-10: [6 transformer blocks] ... pp rank 11: [5 transformer
blocks | embed]", and its size formula l(12h² + 13h) + vh + 4h), DeepSpeed's rules read from its
source (the pipeline engine's assertion on ZeRO stages, the batch assertion), brute force over
every split for ``partition_balanced``'s objective, and bytes worked out by hand.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from placeverify.cli import main
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.megatron_deepspeed import (
    partition_balanced,
    partition_balanced_before_4312,
)
from placeverify.importers.registry import import_file

FIXTURE = Path(__file__).parent / "importers" / "bloom-176b-megatron-deepspeed.slurm"


def imported(path: Path | str, **options: object) -> str:
    return import_file(str(path), Options(**options)).text  # type: ignore[arg-type]


def errors(path: Path | str, **options: object) -> list[tuple[str, int, int]]:
    with pytest.raises(PlaceError) as error:
        import_file(str(path), Options(**options))  # type: ignore[arg-type]
    return [(d.message, d.span.line if d.span else 0, d.span.column if d.span else 0)
            for d in error.value.diagnostics]


def report(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    path = tmp_path / "bloom.place"
    path.write_text(imported(FIXTURE))
    result = CliRunner().invoke(main, ["check", "--json", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def line_of(text: str, start: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith(start))


# ---- BLOOM 176B -----------------------------------------------------------------------------

def test_bloom_is_imported_as_bigscience_records_it() -> None:
    text = imported(FIXTURE)
    # 48 nodes of 8 GPUs (#SBATCH --nodes=48); DP = 384 / (TP 4 x PP 12) = 8
    assert "world = 384" in text and line_of(text, "dp =").startswith("dp = 8")
    # BigScience's README: embed + 5, then 6 x 10, then 5 + embed
    layers = ", ".join(["5", *["6"] * 10, "5"])
    # 2,048 / (2 x 8) = 128 micro-batches per step
    assert f"place pipeline(1f1b, microbatches = 128, layers = [{layers}]) over pp" in text
    # "ZERO_STAGE=0 ... bf16 must use z0! it implements its own zero stage 1 equivalent"
    assert "place zero1(overlap = none) over dp" in text
    assert line_of(text, "precision").startswith("precision megatron")
    assert "memory_profile = megatron_deepspeed" in text
    assert line_of(text, "recompute").startswith("recompute full")
    assert line_of(text, "clip").startswith("clip max_norm = 1.0")
    assert line_of(text, "position").startswith("position = none")  # ALiBi
    assert line_of(text, "vocab =").startswith("vocab = 250880")
    assert line_of(text, "attention").startswith("attention = standard")
    assert "$SLURM_NNODES = 48, from #SBATCH at line 6" in text


def test_bloom_has_the_published_parameter_count(tmp_path: Path) -> None:
    document = report(tmp_path)
    h, layers, vocab = 14336, 70, 250880
    # BigScience's formula counts both LayerNorms outside the layers (4h); placeverify leaves the
    # embedding LayerNorm (2h) out, and says so
    published = layers * (12 * h * h + 13 * h) + vocab * h + 4 * h
    assert document["model"]["params"] == published - 2 * h == 176_247_242_752
    assert set(document["verdicts"].values()) == {"proved"}


def test_the_bf16_optimizer_keeps_16_bit_gradients_beside_the_fp32_ones(tmp_path: Path) -> None:
    moments = report(tmp_path)["memory"]["moments"]
    first = next(m for m in moments if m["rank"] == "first" and m["moment"] == "end of backward")
    # stage 0 holds 5 layers (12h² + 13h each) and the embedding (vh), tensor-sharded 4 ways: the
    # 16-bit .grad of every parameter it holds, 2 bytes each, beside 4-byte fp32 gradients
    h, vocab = 14336, 250880
    elements = (5 * (12 * h * h + 13 * h) + vocab * h) / 4
    extra = first["parts"]["16-bit gradients beside the fp32 accumulation (BF16_Optimizer)"]
    assert extra == pytest.approx(2 * elements, rel=1e-4)
    assert first["parts"]["G gradients"] == pytest.approx(4 * elements, rel=1e-4)


# ---- DeepSpeed's rules ------------------------------------------------------------------------

SCRIPT = """#!/bin/bash
GBS=64
cat <<EOF > ds.json
{{
  "train_micro_batch_size_per_gpu": {micro},
  "train_batch_size": $GBS,
  "zero_optimization": {{"stage": {stage}}},
  {precision}
}}
EOF
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 \\
    --pipeline-model-parallel-size {pp} --num-layers 8 --hidden-size 512 \\
    --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256 \\
    --micro-batch-size 2 --global-batch-size $GBS --vocab-size 1000 {flags} \\
    --deepspeed --deepspeed_config ds.json
"""


def script(tmp_path: Path, *, stage: int = 0, pp: int = 2, micro: int = 2,
           precision: str = '"bf16": {"enabled": true}', flags: str = "--bf16") -> Path:
    path = tmp_path / "run.sh"
    path.write_text(SCRIPT.format(stage=stage, pp=pp, micro=micro, precision=precision,
                                  flags=flags))
    return path


def test_zero_2_under_the_pipeline_engine_is_deepspeeds_error_at_the_stage(tmp_path: Path) -> None:
    found = errors(script(tmp_path, stage=2))
    # line 7 of the script, inside the here-document: '  "zero_optimization": {"stage": 2}',
    # the key "stage" after 2 blanks, 19 characters of key, ':', a blank and '{': column 25
    assert any("incompatible with pipeline parallelism" in m and (line, column) == (7, 25)
               for m, line, column in found)


def test_zero_2_without_the_pipeline_is_deepspeeds_zero_2(tmp_path: Path) -> None:
    text = imported(script(tmp_path, stage=2, pp=1, flags="--bf16 --no-pipeline-parallel"))
    # no overlap_comm below stage 3: reductions after the backward; 64 / (2 x 4) = 8 steps
    assert "place zero2(overlap = none) over dp" in text
    assert line_of(text, "precision").startswith("precision bf16_adam")
    assert line_of(text, "microbatches").startswith("microbatches = 8")


def test_fp16_without_zero_is_everything_replicated(tmp_path: Path) -> None:
    text = imported(script(tmp_path, precision='"fp16": {"enabled": true}', flags="--fp16"))
    assert "place ddp(overlap = none) over dp" in text
    assert line_of(text, "precision").startswith("precision mixed_adam")


def test_a_micro_batch_the_engine_disagrees_with_is_an_error(tmp_path: Path) -> None:
    found = errors(script(tmp_path, micro=4))
    # line 5, the key after two blanks
    assert any("train_micro_batch_size_per_gpu 4 is not --micro-batch-size 2" in m
               and (line, column) == (5, 3) for m, line, column in found)


def test_the_model_and_the_engine_must_agree_on_precision(tmp_path: Path) -> None:
    found = errors(script(tmp_path, flags="--fp16"))
    assert any("--bf16 is not given" in m for m, _, _ in found)
    assert any("--fp16 is given" in m for m, _, _ in found)


def test_a_config_another_command_writes_is_an_error_at_its_flag(tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text('sed "s/MBS/2/" template.json > ds.json\n'
                    "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 8 "
                    "--hidden-size 512 --num-attention-heads 8 --seq-length 256 "
                    "--vocab-size 1000 --deepspeed --deepspeed_config ds.json\n")
    found = errors(path)
    assert any("writes it with `sed` at line 1" in m and line == 2 for m, line, _ in found)


def test_a_config_beside_the_script_is_read(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 2, '
                                      '"zero_optimization": {"stage": 1}, '
                                      '"bf16": {"enabled": true}}')
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 8 "
                    "--hidden-size 512 --num-attention-heads 8 --seq-length 256 "
                    "--micro-batch-size 2 --vocab-size 1000 --bf16 "
                    "--pipeline-model-parallel-size 2 --deepspeed --deepspeed_config ds.json\n")
    text = imported(path)
    # ZeRO-1 in the pipeline engine: reduced in its ReduceGrads instruction, after the schedule
    assert "place zero1(overlap = none) over dp" in text


def test_the_deepspeed_launcher_gives_the_world(tmp_path: Path) -> None:
    path = script(tmp_path)
    path.write_text(path.read_text().replace("torchrun --nproc_per_node 8",
                                             "deepspeed --num_nodes 2 --num_gpus 8"))
    text = imported(path)
    # 2 x 8 = 16 ranks; DP = 16 / (2 x 2) = 4; 64 / (2 x 4) = 8 micro-batches
    assert "world = 16" in text and line_of(text, "dp =").startswith("dp = 4")
    assert "microbatches = 8" in text


# ---- partition_balanced -----------------------------------------------------------------------

def splits(n: int, parts: int) -> list[list[int]]:
    """Every way to cut n items into ``parts`` contiguous runs (possibly empty), as bounds."""
    return [[0, *cuts, n] for cuts in itertools.combinations_with_replacement(range(n + 1),
                                                                                parts - 1)]


def runs(weights: list[int], bounds: list[int]) -> list[int]:
    return [sum(weights[bounds[i]:bounds[i + 1]]) for i in range(len(bounds) - 1)]


@pytest.mark.parametrize("weights,parts", [
    ([0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0], 3),
    ([0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0], 4),
    ([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 4),
    ([0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0], 5),
])
def test_the_current_split_has_the_least_spread_of_all_splits(weights: list[int],
                                                             parts: int) -> None:
    best = min(max(runs(weights, b)) - min(runs(weights, b)) for b in splits(len(weights), parts))
    got = runs(weights, partition_balanced(weights, parts))
    assert max(got) - min(got) == best


@pytest.mark.parametrize("weights,parts", [
    ([0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0], 3),
    ([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 4),
    ([0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0], 5),
])
def test_the_older_split_has_the_lightest_heaviest_stage(weights: list[int], parts: int) -> None:
    best = min(max(runs(weights, b)) for b in splits(len(weights), parts))
    assert max(runs(weights, partition_balanced_before_4312(weights, parts))) == best


def test_a_version_dependent_split_is_a_warning(tmp_path: Path) -> None:
    # 70 layers over 12 stages by 'type:transformer': the older search finds the heaviest stage
    # can hold ceil(70 / 12) = 6 and fills greedily, 11 stages of 6 and 4 for the last; the
    # current one keeps the spread at 1 (70 = 10 x 6 + 2 x 5)
    path = tmp_path / "run.sh"
    path.write_text(FIXTURE.read_text().replace("'type:transformer|embedding'",
                                                "'type:transformer'"))
    result = import_file(str(path), Options())
    written = line_of(result.text, "place pipeline").split("layers = [")[1].split("]")[0]
    assert sorted(int(n) for n in written.split(", ")) == [5, 5, *[6] * 10]
    assert any(", ".join(["6"] * 11 + ["4"]) in d.message for d, _ in result.warnings)


def test_a_stage_per_layer_and_embedding_holds_only_the_embedding(tmp_path: Path) -> None:
    # BigScience's tr13 shape: 'type:transformer|embedding' weighs the 8 layers and the two
    # embedding entries 1 each, 10 units over 10 stages (world 20 = TP 2 x PP 10): the first
    # stage runs only the embedding, the last only the logits
    path = script(tmp_path, pp=10, flags="--bf16 --pp-partition-method 'type:transformer|embedding'")
    path.write_text(path.read_text().replace("--nproc_per_node 8", "--nproc_per_node 20"))
    text = imported(path)
    layers = ", ".join(["0", *["1"] * 8, "0"])
    assert f"place pipeline(1f1b, microbatches = 32, layers = [{layers}]) over pp" in text


@pytest.mark.parametrize("pp", [11, 16])
def test_a_split_with_more_stages_than_units_is_refused_at_the_method(tmp_path: Path,
                                                                     pp: int) -> None:
    # 10 units over 11 or 16 stages: some stage gets none of them, so the logits land before
    # the last stage or a stage runs nothing, which the language cannot place
    path = script(tmp_path, pp=pp,
                  flags="--bf16 --pp-partition-method 'type:transformer|embedding'")
    path.write_text(path.read_text().replace("--nproc_per_node 8", f"--nproc_per_node {2 * pp}"))
    found = errors(path)
    assert any(m.startswith("not modelled: --pp-partition-method type:transformer|embedding")
               and line == 14 for m, line, _ in found), found
