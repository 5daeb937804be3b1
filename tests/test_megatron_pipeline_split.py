"""Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
as the importer reads them (megatron/core/transformer/transformer_block.py,
``get_num_layers_to_build``; megatron/training/arguments.py, ``validate_args``): the embedding
and the loss count as a layer each, L + 1 (+ 1) split evenly over the p · v virtual stages, the
first (last) virtual stage building one transformer layer fewer. Expected splits worked by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.diagnostics import Code, PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import import_file, load


def args(tmp_path: Path, layers: int, pp: int, flags: str) -> Path:
    path = tmp_path / "run.args"
    path.write_text(f"--num-layers {layers} --hidden-size 1024 --num-attention-heads 8 "
                    "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 "
                    f"--global-batch-size 64 --bf16 --vocab-size 32000 "
                    f"--pipeline-model-parallel-size {pp} {flags}\n", encoding="utf-8")
    return path


BOTH = "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"


@pytest.mark.parametrize("layers, pp, flags, written", [
    # (world 2 x pp: dp 2, 64 / 2 = 32 micro-batches) 126 + 2 = 128 over 8 x 8 = 64 virtual
    # stages: 2 each, 1 at both ends (Llama 3 405B in
    # Megatron-Bridge's recipe)
    (126, 8, f"--num-virtual-stages-per-pipeline-rank 8 {BOTH}",
     "pipeline(interleaved, chunks = 8, microbatches = 32, layers = [1, "
     + ", ".join(["2"] * 62) + ", 1])"),
    # the same chunks given as 2 layers per virtual stage: (126 + 2) / 8 = 16 per rank, 8 chunks
    (126, 8, f"--num-layers-per-virtual-pipeline-stage 2 {BOTH}",
     "pipeline(interleaved, chunks = 8, microbatches = 32, layers = [1, "
     + ", ".join(["2"] * 62) + ", 1])"),
    # 30 + 2 = 32 over 4 stages: 8 each, 7 at both ends
    (30, 4, BOTH, "pipeline(1f1b, microbatches = 32, layers = [7, 8, 8, 7])"),
    # the embedding only: 31 + 1 = 32 over 4: 8 each, 7 on the first
    (31, 4, "--account-for-embedding-in-pipeline-split",
     "pipeline(1f1b, microbatches = 32, layers = [7, 8, 8, 8])"),
    # 6 + 2 = 8 over 4 x 2 virtual stages: 1 each, none left at the ends: the first virtual
    # stage holds only the embedding, the last only the output layer and the loss
    # (get_num_layers_to_build asserts >= 0; Llama 3's 126 + 2 over 16 x 8 likewise)
    (6, 4, f"--num-virtual-stages-per-pipeline-rank 2 {BOTH}",
     "pipeline(interleaved, chunks = 2, microbatches = 32, layers = [0, 1, 1, 1, 1, 1, 1, 0])"),
])
def test_accounted_split(tmp_path: Path, layers: int, pp: int, flags: str, written: str) -> None:
    path = args(tmp_path, layers, pp, flags)
    strategy, imported = load(str(path), Options(world=2 * pp))
    assert f"place {written} over pp" in imported.text
    assert not [w for w, _ in imported.warnings if "account" in w.message]
    pipe = strategy.pipeline
    assert pipe is not None and pipe.layers is not None and sum(pipe.layers) == layers


@pytest.mark.parametrize("layers, pp, flags, code, said", [
    # 30 + 1 = 31 does not divide by 4 (validate_args asserts it)
    (30, 4, "--account-for-embedding-in-pipeline-split", Code.NOT_DIVISIBLE, "does not split"),
    # 30 + 2 = 32 over 4 x 3 virtual stages: 8 per rank does not divide into 3 chunks
    (30, 4, f"--num-virtual-stages-per-pipeline-rank 3 {BOTH}", Code.NOT_DIVISIBLE,
     "does not split"),
    # with an explicit first-stage count (get_num_layers_to_build asserts they do not combine)
    (30, 4, f"--decoder-first-pipeline-num-layers 6 {BOTH}", Code.CONFLICT, "do not combine"),
])
def test_accounted_split_refused_at_the_flag(tmp_path: Path, layers: int, pp: int, flags: str,
                                             code: Code, said: str) -> None:
    path = args(tmp_path, layers, pp, flags)
    with pytest.raises(PlaceError) as caught:
        import_file(str(path), Options(world=2 * pp))
    [d] = [d for d in caught.value.diagnostics if d.code is code]
    assert said in d.message, d.message
    text = path.read_text(encoding="utf-8")
    assert d.span is not None and text[d.span.column - 1:].startswith("--account-for-")
