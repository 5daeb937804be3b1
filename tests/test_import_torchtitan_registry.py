"""torchtitan's config registry (``config_registry.py`` functions building a ``Trainer.Config``),
read as data with ``ast`` and never run.

The rules the expectations follow are torchtitan's own, at pytorch/torchtitan b5bcd76:
``torchtitan/config/configs.py`` (TrainingConfig: num_tokens_per_microbatch_per_dp_rank 16384,
num_tokens_per_train_step -1, max_context_length 2048; ParallelismConfig: num_pp_microbatches 1),
``torchtitan/trainer.py`` lines 405-425 (a dp rank's tokens of one accumulation step are
num_tokens_per_microbatch_per_dp_rank x num_pp_microbatches; the global default is that times the
dp degree) and 108-110 (activation checkpointing defaults to SelectiveAC), and
``torchtitan/config/manager.py`` (``--config`` selects the function). The fixture
``tests/importers/torchtitan-registry/llama3/config_registry.py`` writes the two TOML fixtures in
the registry's words, so each must mean the same strategy as its TOML: the same costs to the byte.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from placeverify.api import check_strategy
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import import_file, load
from placeverify.report.data import check_document

HERE = Path(__file__).parent / "importers"
REGISTRY = HERE / "torchtitan-registry" / "llama3" / "config_registry.py"


def _costs(path: Path, world: int, config: str | None = None) -> dict[str, Any]:
    strategy, _ = load(str(path), Options(world=world, config=config))
    document = check_document(check_strategy(strategy, verify_conditions=False))

    def strip(node: Any) -> Any:  # where each line came from differs; what it means must not
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items()
                    if k not in ("file", "path", "title", "strategy", "line", "source", "name")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(document)


@pytest.mark.parametrize(("function", "toml", "world"), [
    ("llama3_70b", "llama3-70b-fsdp.toml", 64),
    ("llama3_405b", "llama3-405b-hsdp-pp.toml", 896),
])
def test_a_registry_function_means_what_its_toml_meant(function: str, toml: str,
                                                       world: int) -> None:
    registry = _costs(REGISTRY, world, function)
    assert registry == _costs(HERE / toml, world)
    assert json.dumps(registry)  # non-empty documents, compared whole


def _error(config: str | None, world: int = 64, path: Path = REGISTRY) -> PlaceError:
    with pytest.raises(PlaceError) as caught:
        import_file(str(path), Options(world=world, config=config))
    return caught.value


def _line_of(text: str, path: Path = REGISTRY) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_the_micro_batch_is_the_token_slots_over_the_context_length() -> None:
    # llama3_1b: num_tokens_per_microbatch_per_dp_rank 4 x 8192 in sequences of 8192 -> 4
    strategy, imported = load(str(REGISTRY), Options(world=64, config="llama3_1b"))
    assert strategy.model.arch is not None
    assert (strategy.model.arch.seq, strategy.model.arch.micro_batch) == (8192, 4)
    assert "training.num_tokens_per_microbatch_per_dp_rank" in imported.text


def test_the_pipeline_takes_num_pp_microbatches_per_accumulation_step() -> None:
    # llama3_405b: 8192-token micro-batches (1 sequence), 16 of them per dp rank and accumulation
    # step, dp 2 x 8 = 16 ranks: 256 sequences a step; num_tokens_per_train_step is 2048
    # sequences, so 8 accumulation steps of 16 micro-batches = 128 pipeline micro-batches.
    imported = import_file(str(REGISTRY), Options(world=896, config="llama3_405b"))
    assert "microbatches = 128" in imported.text
    assert "micro_batch = 1 " in imported.text


def test_llama3_1b_is_counted_as_torchtitan_builds_it() -> None:
    # models/llama3/__init__.py _1b at b5bcd76: dim 2048, 16 layers, 32 heads, 8 kv heads, vocab
    # 128256, an untied output Linear; FFN int(1.5 x int(2 x 4 x 2048 / 3)) = 8191 rounded up to
    # 1024 -> 8192. Per layer: q, o 2048^2; k, v 2048 x 512; SwiGLU 3 x 2048 x 8192; two norms.
    layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
    psi = 2 * 128256 * 2048 + 16 * layer + 2048
    strategy, _ = load(str(REGISTRY), Options(world=64, config="llama3_1b"))
    assert strategy.model.params == psi == 1_498_482_688


def test_assignments_change_the_configuration_they_name() -> None:
    # llama3_8b_async_tp: the 70B function's structure, then model, tp, compile and
    # activation_checkpoint set by assignment
    imported = import_file(str(REGISTRY), Options(world=64, config="llama3_8b_async_tp"))
    text = imported.text
    assert "model llama3_8b" in text
    assert "tp = 2 " in text and "dp = 32 " in text
    assert "place megatron(sequence_parallel, overlap = true) over tp" in text
    assert "recompute" not in text  # activation_checkpoint = None


def test_a_loop_that_may_change_the_configuration_is_refused_at_the_loop() -> None:
    error = _error("llama3_changed_in_a_loop")
    [d] = error.diagnostics
    assert d.code.value == "not-modelled" and d.span is not None
    assert d.span.line == _line_of("for degree in (2, 4):")


def test_a_computed_value_is_an_error_at_its_text() -> None:
    [d] = _error("llama3_computed_degree").diagnostics
    assert d.span is not None and d.span.line == _line_of("= len(config.model_spec")
    assert "len(...)" in d.message


def test_model_converters_are_refused() -> None:
    [d] = _error("llama3_float8").diagnostics
    assert "converters" in d.message and d.span is not None
    assert d.span.line == _line_of("converters=[Float8LinearConverter")


def test_without_config_a_registry_of_several_names_them() -> None:
    [d] = _error(None).diagnostics
    assert d.code.value == "missing"
    for name in ("llama3_70b", "llama3_405b", "llama3_1b"):
        assert name in d.message
    assert "--config" in d.message


def test_an_unknown_function_lists_the_ones_there() -> None:
    [d] = _error("llama3_9000b").diagnostics
    assert "llama3_9000b" in d.message and "llama3_70b" in d.message


def _write(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "llama3"
    folder.mkdir()
    path = folder / "config_registry.py"
    path.write_text(body)
    return path


def test_the_file_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = _write(tmp_path, f"""\
from torchtitan.trainer import Trainer
open({str(marker)!r}, "w").write("ran")
import sys; sys.exit(7)


def only() -> Trainer.Config:
    open({str(marker)!r}, "w").write("ran")
    return Trainer.Config(model_spec=model_registry("8B"))
""")
    imported = import_file(str(path), Options(world=8))
    assert "model llama3_8b" in imported.text
    assert not marker.exists()
    assert "torchtitan" not in sys.modules


def test_a_python_syntax_error_points_at_it(tmp_path: Path) -> None:
    path = _write(tmp_path, "from torchtitan.trainer import Trainer\n\n"
                  "def only() -> Trainer.Config:\n    return Trainer.Config(\n")
    [d] = _error(None, 8, path).diagnostics
    assert d.code.value == "syntax" and d.span is not None and d.span.line >= 4


def test_token_slots_not_a_whole_number_of_sequences_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
def only() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("8B"),
        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=3000,
                                max_context_length=2048),
    )
""")
    [d] = _error(None, 8, path).diagnostics
    assert d.span is not None and d.span.line == 4 and "3000" in d.message


def test_the_defaults_are_torchtitans(tmp_path: Path) -> None:
    # TrainingConfig() defaults: 16384 token slots in 2048-token sequences -> micro-batch 8;
    # activation checkpointing defaults to SelectiveAC (per-op)
    path = _write(tmp_path, """\
def only() -> Trainer.Config:
    return Trainer.Config(model_spec=model_registry("8B"))
""")
    strategy, imported = load(str(path), Options(world=8))
    assert strategy.model.arch is not None
    assert (strategy.model.arch.seq, strategy.model.arch.micro_batch) == (2048, 8)
    assert "recompute selective_op" in imported.text


def test_an_expression_nested_too_deeply_is_an_error_not_a_crash(tmp_path: Path) -> None:
    # 900 additions parse (a left-deep tree) but nest deeper than a reader recurses
    sum_ = "+".join(["1"] * 900)
    path = _write(tmp_path, "def only() -> Trainer.Config:\n    return Trainer.Config(\n"
                  "        model_spec=model_registry(\"8B\"),\n"
                  f"        training=TrainingConfig(max_context_length={sum_}))\n")
    [d] = _error(None, 8, path).diagnostics
    assert d.code.value == "syntax" and "nested too deeply" in d.message
    assert d.span is not None and d.span.line == 1


def test_qwen3_moe_flavors_are_data(tmp_path: Path) -> None:
    # torchtitan's qwen3 30B-A3B (models/qwen3/__init__.py _30b_a3b at b5bcd76): 48 layers,
    # dim 2048, 32 heads (4 kv) of 128, 128 experts of 768, top 8, vocab 151936, untied. Per
    # layer: q, o 2 x 2048 x 4096; k, v 2 x 2048 x 512; q/k norms 2 x 128; two norms 2 x 2048;
    # the router 2048 x 128; experts 128 x 3 x 2048 x 768; embedding and lm_head 2 x 151936 x
    # 2048; final norm 2048: 30,532,122,624 (Qwen3-30B-A3B's own count).
    folder = tmp_path / "qwen3"
    folder.mkdir()
    path = folder / "config_registry.py"
    path.write_text("def qwen3_30b_a3b() -> Trainer.Config:\n"
                    "    return Trainer.Config(model_spec=model_registry(\"30B-A3B\"),\n"
                    "                          activation_checkpoint=FullAC.Config())\n")
    layer = (2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 2 * 2048 + 2048 * 128
             + 128 * 3 * 2048 * 768)
    strategy, _ = load(str(path), Options(world=8))
    assert strategy.model.params == 48 * layer + 2 * 151936 * 2048 + 2048 == 30_532_122_624
