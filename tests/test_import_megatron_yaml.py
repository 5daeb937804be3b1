"""Megatron-LM's own test configurations (``MODEL_ARGS`` in YAML) imported as the arguments
Megatron-LM's test harness passes (``tests/functional_tests/shell_test_utils/_run_training.sh``:
``true`` is the bare flag, anything else the flag's value). The fixtures are written here in
the shape of that repository's ``tests/functional_tests/test_cases/*/*/model_config.yaml``;
expected values are worked out by hand in the comments."""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.diagnostics import PlaceError, Severity, Source
from placeverify.importers import Options
from placeverify.importers.megatron_yaml import arguments
from placeverify.importers.registry import import_file, load
from placeverify.lower.overrides import parse_settings

CONFIG = """\
ENV_VARS:
  CUDA_DEVICE_MAX_CONNECTIONS: 1
  CUBLAS_WORKSPACE_CONFIG: :4096:8
BEFORE_SCRIPT: |
  echo "a shell block: never run, never read" | tee $LOG
MODEL_ARGS:
  --num-layers: 12
  --hidden-size: 512
  --num-attention-heads: 8
  --seq-length: 1024
  --max-position-embeddings: 1024
  --micro-batch-size: 4
  --global-batch-size: 32
  --vocab-size: 50304
  --tensorboard-dir: ${TENSORBOARD_PATH}
  --tensor-model-parallel-size: 2
  --pipeline-model-parallel-size: 2
  --use-distributed-optimizer: true
  --bf16: true
  --clip-grad: 1.0
METRICS:
  - "lm loss"
TEST_TYPE: regular
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "model_config.yaml"
    path.write_text(text)
    return str(path)


def test_model_args_are_the_training_arguments(tmp_path: Path) -> None:
    # world 8 / (tp 2 x pp 2) = dp 2; micro-batches = 32 / (4 x 2) = 4;
    # --use-distributed-optimizer: true is the bare flag -> ZeRO-1 over dp.
    strategy, imported = load(write(tmp_path, CONFIG), Options(world=8))
    assert {a.name: a.size for a in strategy.mesh.axes} == {"tp": 2, "dp": 2, "pp": 2}
    assert {p.axis: p.preset for p in strategy.placements}["dp"] == "zero1"
    assert "place pipeline(1f1b, microbatches = 4) over pp" in imported.text
    assert "layers = 12" in imported.text and "vocab = 50304" in imported.text
    assert "precision megatron" in imported.text and "clip max_norm = 1.0" in imported.text
    # the keys' lines are the file's own: --tensor-model-parallel-size is line 16
    spans = {(o.span.line, o.span.column) for o in imported.origins.values()
             if o.key == "--tensor-model-parallel-size" and o.span is not None}
    assert spans == {(16, 3)}


def test_world_comes_from_the_command_line(tmp_path: Path) -> None:
    with pytest.raises(PlaceError) as error:
        import_file(write(tmp_path, CONFIG))
    assert any("--world" in d.message for d in error.value.diagnostics)


def test_a_flag_written_twice_counts_once_its_last_value(tmp_path: Path) -> None:
    # yq's to_entries keeps both entries, the harness passes both, argparse keeps the last.
    text = CONFIG.replace("  --clip-grad: 1.0\n", "  --clip-grad: 1.0\n  --clip-grad: 0.5\n")
    imported = import_file(write(tmp_path, text), Options(world=8))
    assert "clip max_norm = 0.5" in imported.text
    [twice] = [d for d, _ in imported.warnings if "given twice" in d.message]
    assert twice.severity is Severity.WARNING and twice.span is not None
    assert twice.span.line == 20  # at the first of the two (line 20)


def test_a_value_on_the_line_after_its_key(tmp_path: Path) -> None:
    text = CONFIG.replace("  --use-distributed-optimizer: true\n",
                          "  --use-distributed-optimizer:\n    true\n    # a comment\n")
    strategy, _ = load(write(tmp_path, text), Options(world=8))
    assert {p.axis: p.preset for p in strategy.placements}["dp"] == "zero1"


def test_list_values_and_false_are_passed_as_the_harness_passes_them() -> None:
    source = Source("c.yaml", "MODEL_ARGS:\n  --a: [1, 2]\n  --b: false\n  --c: true\n"
                              "  --d: ${DATA}/x\nNEXT: 1\n")
    words = arguments(source)
    assert [w.text for w in words] == ["--a", "1", "2", "--b", "false", "--c", "--d", "${DATA}/x"]
    assert words[-1].unresolved == "${DATA}"
    assert words[0].span is not None and (words[0].span.line, words[0].span.column) == (2, 3)


def test_a_harness_variable_deciding_placement_is_an_error_at_its_key(tmp_path: Path) -> None:
    text = CONFIG.replace("--tensor-model-parallel-size: 2", "--tensor-model-parallel-size: ${TP}")
    with pytest.raises(PlaceError) as error:
        import_file(write(tmp_path, text), Options(world=8))
    [d] = [d for d in error.value.diagnostics if "${TP}" in d.message]
    assert d.code.value == "not-static" and d.span is not None and d.span.line == 16


def test_a_merge_key_is_refused_at_its_text(tmp_path: Path) -> None:
    text = "BASE: &BASE\n  --num-layers: 2\nMODEL_ARGS:\n  <<: *BASE\n  --hidden-size: 64\n"
    with pytest.raises(PlaceError) as error:
        import_file(write(tmp_path, text), Options(world=8))
    [d] = error.value.diagnostics
    assert "merge key" in d.message and d.span is not None
    assert (d.span.line, d.span.column) == (4, 3)


def test_the_vocabulary_an_override_gives(tmp_path: Path) -> None:
    # Megatron's GPT tests name a BPE vocabulary file, not its size: the size is the user's to
    # give. With --set model.vocab=50257 it is padded to a multiple of 128 x tp = 256: 50432.
    text = CONFIG.replace("  --vocab-size: 50304\n", "  --vocab-file: ${DATA_PATH}/vocab.json\n")
    path = write(tmp_path, text)
    with pytest.raises(PlaceError) as error:
        import_file(path, Options(world=8))
    assert any("--set model.vocab=N" in d.message for d in error.value.diagnostics)
    strategy, _ = load(path, Options(world=8), parse_settings(["model.vocab=50257"]))
    assert strategy.model.arch is not None and strategy.model.arch.vocab == 50257
    assert strategy.model.arch.padded_vocab(2) == 50432


def test_kv_channels_is_the_head_width(tmp_path: Path) -> None:
    # Megatron's kv_channels defaults to hidden / heads = 512 / 8 = 64 (transformer_config.py):
    # written out it is the same model. 128 makes Q, K, V and the output projection 8 x 128 =
    # 1024 wide: per layer 512 x 1024 x 4 = 2,097,152 weights (4 x 512^2 = 1,048,576 at 64) and
    # column biases 3 x 1024 (3 x 512), so 12 layers x (1,048,576 + 1,536) more parameters.
    same = CONFIG.replace("  --num-attention-heads: 8\n", "  --num-attention-heads: 8\n"
                          "  --kv-channels: 64\n")
    plain, _ = load(write(tmp_path, CONFIG), Options(world=8))
    written, _ = load(write(tmp_path, same), Options(world=8))
    assert written.model.params == plain.model.params
    other = CONFIG.replace("  --num-attention-heads: 8\n", "  --num-attention-heads: 8\n"
                           "  --kv-channels: 128\n")
    wide, imported = load(write(tmp_path, other), Options(world=8))
    assert "head_dim = 128" in imported.text
    assert wide.model.params - plain.model.params == 12 * (1_048_576 + 1_536)


@pytest.mark.parametrize(("extra", "flag"), [
    ("  --model-provider: mamba\n", "--model-provider mamba"),
    ("  --hybrid-layer-pattern: M*M*\n", "--hybrid-layer-pattern"),
    ("  --is-hybrid-model: true\n", "--is-hybrid-model"),
])
def test_a_model_other_than_a_gpt_transformer_is_refused_at_its_flag(
        tmp_path: Path, extra: str, flag: str) -> None:
    # Read as a GPT transformer, a hybrid Mamba stack would get a wrong model and costs.
    text = CONFIG.replace("  --seq-length: 1024\n", extra + "  --seq-length: 1024\n")
    with pytest.raises(PlaceError) as error:
        import_file(write(tmp_path, text), Options(world=8))
    [d] = [d for d in error.value.diagnostics if flag in d.message]
    assert d.code.value == "not-modelled" and d.span is not None
    assert (d.span.line, d.span.column) == (10, 3)


def test_an_inference_test_is_refused_at_its_mode(tmp_path: Path) -> None:
    # MODE: inference runs text generation (no backward, no optimizer): not a training step.
    with pytest.raises(PlaceError) as error:
        import_file(write(tmp_path, CONFIG + "MODE: inference\n"), Options(world=8))
    [d] = error.value.diagnostics
    assert d.code.value == "not-modelled" and "inference" in d.message
    assert d.span is not None and d.span.line == 24
    assert import_file(write(tmp_path, CONFIG + "MODE: pretraining\n"), Options(world=8)).text


def test_a_model_args_word_without_its_colon_is_an_error_not_a_crash(tmp_path: Path) -> None:
    # found by fuzzing: 'MODEL_ARGS' on a line and ':' on the next made the detection and the
    # reader disagree (an internal error); the file is now not a test configuration at all.
    text = CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS\n:\n")
    with pytest.raises(PlaceError):
        import_file(write(tmp_path, text), Options(world=8))
