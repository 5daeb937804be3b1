"""axolotl and TRL YAML configurations (issue 33, item 1).

Expected lines and numbers are derived by hand from the frameworks' sources and published shapes,
never from placeverify:

- axolotl (axolotl-ai-cloud/axolotl 067b021): ``utils/schemas/`` defaults (sequence_len 512,
  micro_batch_size 1, gradient_accumulation_steps 1, optimizer adamw_torch_fused),
  ``normalize_config`` (accumulation = batch_size // micro_batch_size), ``resolve_dtype`` (bf16
  loads the model in bf16), ``loaders/model.py`` (QLoRA: nf4 with double quantisation),
  ``loaders/adapter.py`` (``lora_target_linear``: every linear but the output layer);
- TRL (huggingface/trl f2cd577): ``SFTConfig`` (max_length 1024, gradient_checkpointing true, bf16
  unless fp16), ``ModelConfig`` (dtype float32, lora_r 16, PEFT's default targets q_proj and
  v_proj for Llama), ``TrlParser`` (``env`` is not an argument);
- PEFT's LoRA: r·(in + out) parameters per targeted linear, kept in fp32 over a 16-bit base;
  torch AdamW: two states in the parameter's dtype; bitsandbytes 8-bit Adam: one byte per state
  and one fp32 absmax per 256 elements; bitsandbytes NF4 with double quantisation: two codes a
  byte, one byte per block of 64 and one fp32 absmax per 256 blocks plus one fp32 offset per
  tensor (``bitsandbytes/functional.py``);
- Llama 3 8B (arXiv 2407.21783, Table 3): 32 layers, hidden 4096, K/V 1024 wide, SwiGLU 14336,
  8,030,261,248 parameters; ring all-reduce moves 2(n-1)/n of its payload (REFERENCE §2.2).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.api import check_strategy
from placeverify.diagnostics import Code, PlaceError, Severity, Source
from placeverify.importers import Options
from placeverify.importers.registry import detect, import_file, load
from tests.test_accelerate_deepspeed import statements

F = Fraction
HERE = Path(__file__).parent / "importers"
MODEL = str(HERE / "llama3-8b-config.json")
QLORA = HERE / "llama3-8b-qlora-axolotl.yml"
ZERO3 = HERE / "llama3-8b-lora-zero3-axolotl.yml"
TRL = HERE / "llama3-8b-sft-trl.yaml"
L, H, KV, FFN = 32, 4096, 1024, 14336
LLAMA = 8_030_261_248
LINEARS = {"q": (H, H), "k": (H, KV), "v": (H, KV), "o": (H, H), "gate": (H, FFN),
           "up": (H, FFN), "down": (FFN, H)}
QUANTISED = L * sum(i * o for i, o in LINEARS.values())


def lora(rank: int, *names: str) -> int:
    return L * sum(rank * (LINEARS[n][0] + LINEARS[n][1]) for n in names)


def nf4_dq_scales() -> int:
    total = 0
    for i, o in LINEARS.values():
        blocks = i * o // 64  # every Llama 3 8B matrix is a multiple of 64 x 256 elements
        total += blocks + 4 * (blocks // 256) + 4
    return L * total


def line_of(path: Path, start: str) -> int:
    """The 1-based line of the fixture that starts with ``start``."""
    lines = path.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.startswith(start))


def costs(path: Path | str, world: int = 8) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    strategy, _ = load(str(path), Options(MODEL, world))
    result = check_strategy(strategy, verify_conditions=False)
    moved: dict[str, Fraction] = {}
    for item in result.costs.comm:
        moved[item.what] = moved.get(item.what, F(0)) + F(item.bytes)
    return {k: F(v) for k, v in result.costs.device_bytes().items()}, moved


def refused(path: Path | str, model: str | None = MODEL, world: int | None = 8) -> PlaceError:
    with pytest.raises(PlaceError) as caught:
        import_file(str(path), Options(model, world))
    return caught.value


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_formats_are_told_from_the_content() -> None:
    for path, fmt in ((QLORA, "axolotl"), (ZERO3, "axolotl"), (TRL, "trl"),
                      (HERE / "trl-fsdp2.yaml", "accelerate")):
        assert detect(Source(str(path), path.read_text())) == fmt


def test_axolotl_qlora_on_every_linear() -> None:
    imported = import_file(str(QLORA), Options(MODEL, 8))
    got = statements(imported.text)
    for line in ("seq = 4096", "micro_batch = 2", "adapter = qlora", "lora_rank = 32",
                 "lora_targets = [q, k, v, o, gate, up, down]", "base_dtype = nf4_dq",
                 "dp = 8", "place ddp over dp", "microbatches = 4", "loss token_mean",
                 "clip max_norm = 1", "recompute full",
                 # bf16 base, fp32 adapters (G), bitsandbytes' 32-bit Adam (8 B)
                 "precision { params = bf16, compute = bf16, grads = fp32, optimizer = 8, "
                 "activations = bf16, loss_scale = none }"):
        assert line in got, line
    header = imported.text.splitlines()[1]
    for key in ("sample_packing", "tf32", "attn_implementation", "lora_alpha", "datasets"):
        assert f" {key}" in header
    adapters = lora(32, *LINEARS)
    assert adapters == 83_886_080
    device, moved = costs(QLORA)
    rest = LLAMA - QUANTISED + adapters  # embedding, output layer, norms, adapters: bf16
    assert device["params"] == rest * 2 + QUANTISED // 2 + nf4_dq_scales()
    assert device["gradients"] == adapters * 4
    assert device["optimizer"] == adapters * 8
    assert moved["grads"] == F(adapters * 4 * 2 * 7, 8)


def test_axolotl_warnings_stand_at_their_keys() -> None:
    imported = import_file(str(QLORA), Options(MODEL, 8))
    where = {d.message.split(":")[0]: (d.span.line, d.span.column) for d, _ in imported.warnings
             if d.span is not None}
    assert where["bf16"] == (line_of(QLORA, "bf16: auto"), 1)
    assert where["not modelled"] == (line_of(QLORA, "liger_rms_norm"), 1)
    assert where["optimizer paged_adamw_32bit"] == (line_of(QLORA, "optimizer:"), 1)
    assert where["PEFT keeps the adapters in fp32 over a bf16 base; placeverify stores every Θ in "
                 "one dtype"] == (line_of(QLORA, "adapter: qlora"), 1)


def test_a_hub_id_needs_the_model_config() -> None:
    error = refused(QLORA, model=None)
    first = error.diagnostics[0]
    assert first.message == (
        "base_model 'NousResearch/Meta-Llama-3-8B' is a Hugging Face hub id (no such folder beside "
        "this file): placeverify reads no hub; give the model's config.json with --model "
        "config.json")
    assert first.span is not None
    assert (first.span.line, first.span.column) == (line_of(QLORA, "base_model:"), 1)
    trl = refused(TRL, model=None).diagnostics[0]
    assert trl.message.startswith("model_name_or_path 'meta-llama/Meta-Llama-3-8B' is a Hugging "
                                  "Face hub id")
    assert trl.span is not None and trl.span.line == line_of(TRL, "model_name_or_path:")


def test_a_local_base_model_folder_is_read(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(Path(MODEL).read_text())
    path = write(tmp_path, "run.yml", "base_model: ./llama\nsequence_len: 2048\n")
    got = statements(import_file(str(path), Options(None, 4)).text)
    assert "layers = 32" in got and "seq = 2048" in got and "micro_batch = 1" in got


def test_the_world_is_the_launchers() -> None:
    error = refused(QLORA, world=None)
    assert error.diagnostics[0].message.startswith("world size unknown: an axolotl config leaves "
                                                   "it to the launcher")


def test_axolotl_lora_under_deepspeed_zero3() -> None:
    got = statements(import_file(str(ZERO3), Options(MODEL, 8)).text)
    for line in ("seq = 8192", "micro_batch = 1", "adapter = lora", "lora_rank = 16",
                 "lora_targets = [q, k, v, o]", "precision bf16_adam", "place zero3 over dp",
                 "microbatches = 8",  # batch_size 8 // micro_batch_size 1
                 "clip max_norm = 0.5", "recompute full"):
        assert line in got, line
    adapters = lora(16, "q", "k", "v", "o")
    assert adapters == 13_631_488
    device, _ = costs(ZERO3)
    assert device["params"] == F((LLAMA + adapters) * 2, 8)
    assert device["gradients"] == F(adapters * 2, 8)
    assert device["optimizer"] == F(adapters * 12, 8)


def test_a_missing_deepspeed_json_is_an_error_at_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "run.yml", "base_model: x\nsequence_len: 2048\n"
                 "deepspeed: configs/none.json\n")
    error = refused(path)
    first = error.diagnostics[0]
    assert first.message.startswith("deepspeed configs/none.json: no such file relative to this "
                                    "file's folder")
    assert first.span is not None and (first.span.line, first.span.column) == (3, 1)


def test_full_fine_tune_with_8_bit_adam_in_bf16(tmp_path: Path) -> None:
    path = write(tmp_path, "fft.yml", "base_model: x\nsequence_len: 2048\nbf16: true\n"
                 "optimizer: adamw_bnb_8bit\n")
    device, moved = costs(path)
    assert device["params"] == LLAMA * 2  # loaded in bf16 and trained so
    assert device["gradients"] == LLAMA * 2
    assert device["optimizer"] == LLAMA * (2 + F(8, 256))
    assert moved["grads"] == F(LLAMA * 2 * 2 * 7, 8)


def test_fsdp_upcasts_the_trained_parameters(tmp_path: Path) -> None:
    path = write(tmp_path, "fsdp.yml", "base_model: x\nsequence_len: 2048\nbf16: true\n"
                 "fsdp_version: 2\nfsdp_config:\n  offload_params: false\n"
                 "  reshard_after_forward: true\n  state_dict_type: FULL_STATE_DICT\n")
    imported = import_file(str(path), Options(MODEL, 8))
    got = statements(imported.text)
    assert "place fsdp over dp" in got
    assert ("precision { params = fp32, gather = bf16, grads = fp32, reduce = bf16, "
            "optimizer = 8, activations = bf16, loss_scale = none }") in got
    assert "fsdp_config.state_dict_type" in imported.text.splitlines()[1]
    device, _ = costs(path)
    assert device["params"] == F(LLAMA * 4, 8)
    assert device["optimizer"] == F(LLAMA * 8, 8)


@pytest.mark.parametrize("pattern, targets", [
    (r"model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj",
     "[q, k, v, o, gate, up, down]"),
    (r".*\.self_attn\.(q|v)_proj", "[q, v]"),
])
def test_a_target_pattern_is_matched_against_the_module_names(tmp_path: Path, pattern: str,
                                                              targets: str) -> None:
    path = write(tmp_path, "p.yml", f"base_model: x\nsequence_len: 2048\nadapter: lora\n"
                 f"lora_target_modules: '{pattern}'\n")
    assert f"lora_targets = {targets}" in statements(import_file(str(path), Options(MODEL, 8)).text)


def test_a_pattern_on_some_layers_only_is_not_modelled(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yml", "base_model: x\nsequence_len: 2048\nadapter: lora\n"
                 "lora_target_modules: '.*\\.layers\\.(3|7)\\.self_attn\\.q_proj'\n")
    first = refused(path).diagnostics[0]
    assert first.code is Code.NOT_MODELLED and "some layers only" in first.message
    assert first.span is not None and first.span.line == 4


def test_a_preference_trainer_is_refused_at_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, "dpo.yml", "base_model: x\nsequence_len: 2048\nrl: dpo\n")
    first = refused(path).diagnostics[0]
    assert first.message.startswith("not modelled: rl (a preference")
    assert first.span is not None and (first.span.line, first.span.column) == (3, 1)


def test_trl_qlora_sft() -> None:
    imported = import_file(str(TRL), Options(MODEL, 8))
    got = statements(imported.text)
    for line in ("seq = 2048", "micro_batch = 4", "adapter = qlora", "lora_rank = 16",
                 "lora_targets = [q, v]", "base_dtype = nf4_dq", "microbatches = 2",
                 "recompute full", "loss token_mean", "clip max_norm = 1",
                 "precision { params = bf16, compute = bf16, grads = fp32, optimizer = 8, "
                 "activations = bf16, loss_scale = none }"):
        assert line in got, line
    assert " env " in imported.text.splitlines()[1]
    unknown = [d for d, _ in imported.warnings if d.message == "not modelled: TRL key "
               "'use_liger_kernel'"]
    assert unknown and unknown[0].span is not None
    assert unknown[0].span.line == line_of(TRL, "use_liger_kernel")
    adapters = lora(16, "q", "v")
    assert adapters == 6_815_744
    device, _ = costs(TRL)
    assert device["gradients"] == adapters * 4
    assert device["optimizer"] == adapters * 8


def test_trl_defaults_are_sfts(tmp_path: Path) -> None:
    path = write(tmp_path, "sft.yaml", "model_name_or_path: x\n")
    got = statements(import_file(str(path), Options(MODEL, 8)).text)
    for line in ("seq = 1024", "micro_batch = 8", "recompute full",
                 "precision { params = fp32, compute = bf16, grads = fp32, optimizer = 8, "
                 "activations = bf16, loss_scale = none }"):
        assert line in got, line
    assert not any(line.startswith("microbatches") for line in got)
    device, _ = costs(path)
    assert device["params"] == LLAMA * 4 and device["optimizer"] == LLAMA * 8


def test_trl_num_processes_is_the_world(tmp_path: Path) -> None:
    path = write(tmp_path, "sft.yaml", "model_name_or_path: x\nnum_processes: 4\n")
    assert "world = 4" in statements(import_file(str(path), Options(MODEL, None)).text)
    error = refused(path, world=8)
    assert error.diagnostics[0].message == "--world 8 contradicts num_processes 4"
    assert error.diagnostics[0].severity is Severity.ERROR


def test_trl_accelerate_config_names_what_to_do(tmp_path: Path) -> None:
    path = write(tmp_path, "sft.yaml", "model_name_or_path: x\naccelerate_config: zero3\n")
    first = refused(path).diagnostics[0]
    assert first.message.startswith("not modelled: accelerate_config (the accelerate configuration")
    assert "placeverify check it" in first.message
    assert first.span is not None and first.span.line == 2


def test_a_deepspeed_json_named_from_a_folder_above_is_found(tmp_path: Path) -> None:
    """axolotl's examples name ``deepspeed_configs/zero2.json`` from the repository's root."""
    (tmp_path / "deepspeed_configs").mkdir()
    (tmp_path / "deepspeed_configs" / "zero2.json").write_text(
        '{"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"},\n'
        ' "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}\n')
    (tmp_path / "examples" / "llama").mkdir(parents=True)
    path = write(tmp_path / "examples" / "llama", "run.yml", "base_model: x\nsequence_len: 2048\n"
                 "micro_batch_size: 2\ngradient_accumulation_steps: 3\nbf16: true\n"
                 "deepspeed: deepspeed_configs/zero2.json\n")
    imported = import_file(str(path), Options(MODEL, 8))
    got = statements(imported.text)
    for line in ("place zero2(overlap = none) over dp", "micro_batch = 2", "microbatches = 3",
                 "seq = 2048", "precision bf16_adam"):
        assert line in got, line
    found = [d for d, _ in imported.warnings if "as when the run is launched from the folder "
             "above" in d.message]
    assert found and found[0].span is not None and found[0].span.line == 6


@pytest.mark.parametrize("optimizer, state", [("adamw_torch_8bit", "2"), ("adamw_torch_4bit", "1"),
                                              ("adamw_torch", "4")])
def test_optimizer_state_bytes(tmp_path: Path, optimizer: str, state: str) -> None:
    path = write(tmp_path, "o.yml", f"base_model: x\nsequence_len: 2048\nbf16: true\n"
                 f"optimizer: {optimizer}\n")
    imported = import_file(str(path), Options(MODEL, 8))
    assert (f"precision {{ params = bf16, compute = bf16, grads = bf16, optimizer = {state}, "
            "activations = bf16, loss_scale = none }") in statements(imported.text)
    scales = [d for d, _ in imported.warnings if "per-block scales" in d.message]
    assert bool(scales) == optimizer.startswith("adamw_torch_")


def test_an_optimizer_not_modelled_is_an_error_at_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, "o.yml", "base_model: x\nsequence_len: 2048\noptimizer: muon\n")
    first = refused(path).diagnostics[0]
    assert first.message.startswith("not modelled: optimizer muon")
    assert first.span is not None and (first.span.line, first.span.column) == (3, 1)


def test_trl_dtype_auto_asks_for_the_dtype(tmp_path: Path) -> None:
    path = write(tmp_path, "sft.yaml", "model_name_or_path: x\ndtype: auto\n")
    first = refused(path).diagnostics[0]
    assert first.code is Code.NOT_STATIC and "auto is the checkpoint's dtype: write it" in \
        first.message
    assert first.span is not None and first.span.line == 2


def test_sarif_points_at_the_key(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "placeverify", "check", str(QLORA), "--world", "8",
                           "--output-format", "sarif"], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=300)
    assert done.returncode == 2
    result = json.loads(done.stdout)["runs"][0]["results"][0]
    region = result["locations"][0]["physicalLocation"]["region"]
    line = line_of(QLORA, "base_model:")
    # the key "base_model" spans columns 1-10; SARIF's endColumn is the column after it
    assert region == {"startLine": line, "startColumn": 1, "endLine": line, "endColumn": 11}
    assert "--model config.json" in result["message"]["text"]


def test_trl_fsdp_through_training_arguments(tmp_path: Path) -> None:
    """TrainingArguments' fsdp words and fsdp_config (its fsdp_ prefixes stripped); the model
    loaded in fp32 (ModelConfig's default) and sharded so, gathered and reduced in bf16."""
    path = write(tmp_path, "sft.yaml", "model_name_or_path: x\ngradient_checkpointing: false\n"
                 "fsdp: full_shard auto_wrap\nfsdp_config:\n  fsdp_version: 2\n"
                 "  activation_checkpointing: true\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n")
    imported = import_file(str(path), Options(MODEL, 8))
    got = statements(imported.text)
    for line in ("place fsdp over dp", "recompute full",
                 "precision { params = fp32, gather = bf16, grads = fp32, reduce = bf16, "
                 "optimizer = 8, activations = bf16, loss_scale = none }"):
        assert line in got, line
    assert "fsdp_config.state_dict_type" in imported.text.splitlines()[1]
    device, _ = costs(path)
    assert device["params"] == F(LLAMA * 4, 8) and device["gradients"] == F(LLAMA * 4, 8)


def test_trl_fsdp_config_alone_has_no_effect(tmp_path: Path) -> None:
    path = write(tmp_path, "sft.yaml", "model_name_or_path: x\nfsdp_config:\n  version: 2\n")
    imported = import_file(str(path), Options(MODEL, 8))
    assert "place ddp over dp" in statements(imported.text)
    found = [d for d, _ in imported.warnings if d.message.startswith("fsdp_config has no effect")]
    assert found and found[0].span is not None and found[0].span.line == 2


@pytest.mark.parametrize("words, preset", [("[shard_grad_op, auto_wrap]", "fsdp(grad_op)"),
                                           ("[full_shard, offload]", "fsdp")])
def test_axolotl_fsdp_words(tmp_path: Path, words: str, preset: str) -> None:
    path = write(tmp_path, "f.yml", f"base_model: x\nsequence_len: 2048\nfsdp: {words}\n")
    got = statements(import_file(str(path), Options(MODEL, 8)).text)
    assert f"place {preset} over dp" in got
    assert ("offload optimizer, gradients, params to cpu" in got) == ("offload" in words)


def test_hybrid_shard_is_not_modelled_at_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, "f.yml", "base_model: x\nsequence_len: 2048\nfsdp_config:\n"
                 "  fsdp_sharding_strategy: HYBRID_SHARD\n")
    first = refused(path).diagnostics[0]
    assert first.message.startswith("not modelled: FSDP sharding strategy HYBRID_SHARD")
    assert first.span is not None and (first.span.line, first.span.column) == (4, 3)


def test_trl_per_rank_token_counts_are_not_modelled(tmp_path: Path) -> None:
    path = write(tmp_path, "sft.yaml", "model_name_or_path: x\naverage_tokens_across_devices: false\n")
    first = refused(path).diagnostics[0]
    assert first.message.startswith("not modelled: average_tokens_across_devices false")
    assert first.span is not None and first.span.line == 2
    same = write(tmp_path, "same.yaml", "model_name_or_path: x\naverage_tokens_across_devices: true\n")
    assert "loss token_mean" in statements(import_file(str(same), Options(MODEL, 8)).text)


def test_a_deepspeed_value_other_than_the_trainers_is_refused(tmp_path: Path) -> None:
    """HfTrainerDeepSpeedConfig.fill_match: a written value must equal the Trainer's."""
    (tmp_path / "ds.json").write_text('{\n  "zero_optimization": {"stage": 1},\n'
                                      '  "train_micro_batch_size_per_gpu": 4\n}\n')
    path = write(tmp_path, "run.yml", "base_model: x\nsequence_len: 2048\nmicro_batch_size: 2\n"
                 "deepspeed: ds.json\n")
    first = refused(path).diagnostics[0]
    assert first.message.startswith("train_micro_batch_size_per_gpu 4 differs from "
                                    "micro_batch_size 2: transformers' Trainer refuses")
    assert first.span is not None and (first.span.line, first.span.column) == (3, 3)
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 1}, '
                                      '"train_micro_batch_size_per_gpu": 2}\n')
    assert "micro_batch = 2" in statements(import_file(str(path), Options(MODEL, 8)).text)


@pytest.mark.parametrize(("fixture", "fmt"), [(QLORA, "axolotl"), (TRL, "trl")])
def test_format_is_a_cli_choice(fixture: Path, fmt: str) -> None:
    """``--format axolotl|trl`` reads the file as detection does (a file whose first key is
    neither ``base_model`` nor ``model_name_or_path`` needs it)."""
    from click.testing import CliRunner

    from placeverify.cli import main

    args = ["import", str(fixture), "--world", "8", "--model", MODEL]
    detected = CliRunner().invoke(main, args)
    told = CliRunner().invoke(main, [*args, "--format", fmt])
    assert detected.exit_code == told.exit_code == 0, told.output
    assert told.stdout == detected.stdout and "strategy " in told.stdout
