"""accelerate's distributed_type DEEPSPEED: the DeepSpeed configuration accelerate builds (inline
``deepspeed_config`` keys) or reads (``deepspeed_config_file``), read as the DeepSpeed importer reads
a JSON.

Expected lines and values are derived by hand from accelerate's source
(huggingface/accelerate): ``utils/dataclasses.py`` DeepSpeedPlugin (``zero_stage`` defaults to 2,
the offload devices to none, ``gradient_accumulation_steps`` and ``gradient_clipping`` to
"auto"; ``set_mixed_precision`` enables ``bf16`` for bf16 and ``fp16`` for fp16;
``_deepspeed_config_checks`` refuses ``zero_stage``, ``gradient_accumulation_steps``, ...,
``mixed_precision`` beside a ``deepspeed_config_file``; a file without
``gradient_accumulation_steps`` gets 1), ``accelerator.py`` ``_prepare_deepspeed`` (the
micro-batch from the dataloader, ``gradient_clipping`` "auto" becomes 1.0) and
``parallelism_config.py`` (``total_size`` counts ``sp_size``). Model-state bytes follow the ZeRO
paper's 2 + 2 + 12 bytes per parameter (Rajbhandari et al., arXiv 1910.02054; REFERENCE §2.1),
with Meta-Llama-3-8B's 8,030,261,248 parameters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.api import check_strategy
from placeverify.diagnostics import Code, PlaceError, Severity
from placeverify.importers import Options
from placeverify.importers.registry import load_text
from tests.seq_given import import_seq, load_seq

ROOT = Path(__file__).parent.parent
HERE = ROOT / "tests" / "importers"
LLAMA = str(HERE / "llama3-8b-config.json")
LLAMA3_8B = 8_030_261_248


def statements(text: str) -> list[str]:
    """The .place statements of an imported text, without comments and blank lines."""
    out = []
    for line in text.splitlines():
        code = line.split("#", 1)[0].strip()
        if code and not code.startswith("strategy"):
            out.append(code)
    return out


def same_costs(strategy, hand_written: str) -> None:  # type: ignore[no-untyped-def]
    hand = load_text(hand_written, "hand.place")
    a, b = check_strategy(strategy), check_strategy(hand)
    assert a.costs.device_bytes() == b.costs.device_bytes()
    assert a.costs.host_bytes() == b.costs.host_bytes()
    assert a.costs.network_bytes() == b.costs.network_bytes()
    assert a.verification is not None and b.verification is not None
    assert a.verification.verdicts() == b.verification.verdicts()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def errors_of(path: str, **options: object) -> list[tuple[str, int | None, Code]]:
    with pytest.raises(PlaceError) as error:
        import_seq(path, Options(model=LLAMA, **options))  # type: ignore[arg-type]
    return [(d.message, d.span.line if d.span else None, d.code)
            for d in error.value.diagnostics if d.severity is Severity.ERROR]


# ---- inline deepspeed_config keys -------------------------------------------------------------

def test_inline_zero3_with_offload() -> None:
    # zero_stage 3 -> zero_optimization.stage 3; both offload devices cpu; 16 processes;
    # gradient_accumulation_steps 4 -> 4 micro-batches; gradient_clipping 0.5; bf16 -> bf16.enabled
    strategy, imported = load_seq(str(HERE / "llama3-8b-zero3-offload-accelerate.yaml"),
                              Options(model=LLAMA))
    body = statements(imported.text)
    for line in ("micro_batch = 1", "precision bf16_adam", "dp = 16",
                 "memory_profile = deepspeed", "place zero3 over dp", "microbatches = 4",
                 "clip max_norm = 0.5", "offload optimizer to cpu", "offload params to cpu"):
        assert line in body, line
    assert imported.text.splitlines()[1] == (
        "# Read but without effect on placement, memory or communication: machine_rank "
        "deepspeed_config.zero3_init_flag deepspeed_config.deepspeed_multinode_launcher")
    # ZeRO-3 with the optimizer and the parameters offloaded: Θ 2, G 4 (DeepSpeed's CPU Adam
    # keeps the gradient partition in fp32 on the host, stage3.py: a subgroup_gradient_buffer of
    # the fp32 partition's dtype on the CPU) and Ω 12 bytes per parameter, each 1/16 per rank,
    # all on the host: 18 x 8,030,261,248 / 16 bytes, DeepSpeed's own
    # estimate_zero3_model_states_mem_needs with cpu_offload_params and zero_init
    # (cpu_mem = total_params * 18 * gpus_factor, before its 1.5 buffer factor)
    result = check_strategy(strategy)
    assert result.costs.host_bytes() == 18 * LLAMA3_8B // 16
    same_costs(strategy, """
strategy "hand"
model llama3_8b { seq = 8192, micro_batch = 1 }
precision bf16_adam
mesh { dp = 16, memory_profile = deepspeed }
place zero3 over dp
microbatches = 4
loss microbatch_mean
clip max_norm = 0.5
offload optimizer, gradients, params to cpu
""")


def test_inline_is_what_the_json_importer_writes_for_the_same_configuration(
        tmp_path: Path) -> None:
    # the configuration DeepSpeedPlugin builds for the fixture, with the dataloader's micro-batch
    # of 1: the DeepSpeed importer writes the same statements for it
    equivalent = write(tmp_path, "same.json", """{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 0.5,
  "bf16": {"enabled": true},
  "fp16": {"enabled": false},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                        "offload_param": {"device": "cpu"}}
}
""")
    from_yaml = import_seq(str(HERE / "llama3-8b-zero3-offload-accelerate.yaml"),
                            Options(model=LLAMA))
    from_json = import_seq(equivalent, Options(model=LLAMA, world=16))
    assert statements(from_yaml.text) == statements(from_json.text)


def test_inline_defaults(tmp_path: Path) -> None:
    # DeepSpeedPlugin: zero_stage 2, no offload, accumulation and clipping "auto" (the training
    # script's accumulation; clipping 1.0), no mixed_precision -> neither bf16 nor fp16
    path = write(tmp_path, "bare.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\n")
    _, imported = load_seq(path, Options(model=LLAMA))
    body = statements(imported.text)
    # no overlap_comm: false below stage 3 (DeepSpeed's ZeRO config, overlap_comm_valid)
    assert "place zero2(overlap = none) over dp" in body and "precision fp32_adam" in body
    assert "clip max_norm = 1.0" in body and "dp = 4" in body
    assert not [line for line in body if line.startswith(("microbatches", "offload"))]
    [assumed] = [w for w, _ in imported.warnings if w.code is Code.MISSING
                 and "training script" in w.message]
    assert "micro_batch = 1" in assumed.message and "no accumulation" in assumed.message
    assert "max_norm 1.0" in assumed.message
    assert assumed.span is not None and assumed.span.line == 1  # at distributed_type
    assert 'strategy "bare.yaml: accelerate DeepSpeed ZeRO-2, dp = 4"' in imported.text


def test_inline_fp16_without_clipping(tmp_path: Path) -> None:
    # fp16 -> fp16.enabled, no loss_scale (DeepSpeed's 0: dynamic) -> mixed_adam; a clipping of 0
    # is left out of the configuration (DeepSpeedPlugin: ``if self.gradient_clipping``)
    path = write(tmp_path, "fp16.yaml", "distributed_type: DEEPSPEED\nnum_processes: 8\n"
                 "mixed_precision: fp16\ndeepspeed_config:\n  zero_stage: 1\n"
                 "  gradient_clipping: 0.0\n  gradient_accumulation_steps: 2\n")
    imported = import_seq(path, Options(model=LLAMA))
    body = statements(imported.text)
    assert "precision mixed_adam" in body and "place zero1(overlap = none) over dp" in body
    assert "microbatches = 2" in body
    assert not [line for line in body if line.startswith("clip")]


def test_inline_keys_ignored_and_unknown(tmp_path: Path) -> None:
    text = ("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n"
            "  zero_stage: 2\n  zero3_save_16bit_model: true\n  wobble: 3\n"
            "fsdp_config:\n  fsdp_version: 2\n")
    imported = import_seq(write(tmp_path, "keys.yaml", text), Options(model=LLAMA))
    warned = [(w.message, w.span.line if w.span else None) for w, _ in imported.warnings]
    assert ("not modelled: deepspeed_config.wobble", 6) in warned
    assert ("fsdp_config has no effect with distributed_type DEEPSPEED", 7) in warned
    assert "deepspeed_config.zero3_save_16bit_model" in imported.text.splitlines()[1]


def test_world_must_agree(tmp_path: Path) -> None:
    path = write(tmp_path, "w.yaml", "distributed_type: DEEPSPEED\nnum_processes: 8\n")
    assert errors_of(path, world=4) == [("--world 4 contradicts num_processes 8", 2,
                                         Code.WORLD_MISMATCH)]


# ---- deepspeed_config_file ----------------------------------------------------------------------

def test_config_file_is_read_with_num_processes_as_the_world() -> None:
    # llama3-8b-zero3.json: 64 = 1 x 8 x 8 with the 8 processes; bf16, ZeRO-3, clipping 1.0
    strategy, imported = load_seq(str(HERE / "llama3-8b-zero3-file-accelerate.yaml"),
                              Options(model=LLAMA))
    body = statements(imported.text)
    for line in ("micro_batch = 1", "precision bf16_adam", "dp = 8", "place zero3 over dp",
                 "microbatches = 8", "clip max_norm = 1.0", "memory_profile = deepspeed"):
        assert line in body, line
    same_costs(strategy, """
strategy "hand"
model llama3_8b { seq = 8192, micro_batch = 1 }
precision bf16_adam
mesh { dp = 8, memory_profile = deepspeed }
place zero3 over dp
microbatches = 8
loss microbatch_mean
clip max_norm = 1.0
""")


def test_config_file_batch_is_judged_on_num_processes(tmp_path: Path) -> None:
    # the same JSON on 16 processes: 64 != 1 x 8 x 16 = 128, DeepSpeed's assertion, at the JSON key
    json_text = (HERE / "llama3-8b-zero3.json").read_text()
    write(tmp_path, "ds.json", json_text)
    path = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 16\n"
                 "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    with pytest.raises(PlaceError) as error:
        import_seq(path, Options(model=LLAMA))
    [d] = error.value.diagnostics
    assert "train_batch_size 64 !=" in d.message and "= 128" in d.message
    assert error.value.source is not None and error.value.source.path.endswith("ds.json")
    assert d.span is not None and d.span.line == 2


def test_config_file_auto_values(tmp_path: Path) -> None:
    # batch sizes "auto": the dataloader's (1 assumed); gradient_clipping "auto": 1.0; a file
    # without gradient_accumulation_steps: 1 (DeepSpeedPlugin adds it)
    write(tmp_path, "ds.json", '{\n  "train_batch_size": "auto",\n'
          '  "train_micro_batch_size_per_gpu": "auto",\n  "gradient_clipping": "auto",\n'
          '  "fp16": {"enabled": true, "loss_scale": 0},\n'
          '  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}\n}\n')
    path = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\n"
                 "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    imported = import_seq(path, Options(model=LLAMA))
    body = statements(imported.text)
    for line in ("micro_batch = 1", "precision mixed_adam", "place zero2(overlap = none) over dp",
                 "clip max_norm = 1.0", "offload optimizer to cpu", "dp = 4"):
        assert line in body, line
    assert not [line for line in body if line.startswith("microbatches")]
    [assumed] = [(w, s) for w, s in imported.warnings if w.code is Code.MISSING
                 and "training script" in w.message]
    assert assumed[1].path.endswith("ds.json") and assumed[0].span is not None
    assert assumed[0].span.line == 3  # at "train_micro_batch_size_per_gpu": "auto"


def test_config_file_precision_auto_is_not_static(tmp_path: Path) -> None:
    # bf16.enabled "auto" takes the mixed precision of the launch or the script (the YAML may not
    # give one beside a file)
    write(tmp_path, "ds.json", '{\n  "train_micro_batch_size_per_gpu": 2,\n'
          '  "bf16": {"enabled": "auto"},\n  "zero_optimization": {"stage": 3}\n}\n')
    path = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\n"
                 "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    [(message, line, code)] = errors_of(path)
    assert message.startswith('bf16.enabled is "auto": accelerate fills it')
    assert (line, code) == (3, Code.NOT_STATIC)


def test_config_file_refuses_what_accelerate_refuses_beside_it(tmp_path: Path) -> None:
    write(tmp_path, "ds.json", '{"train_micro_batch_size_per_gpu": 1, '
          '"zero_optimization": {"stage": 3}}\n')
    path = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\n"
                 "mixed_precision: bf16\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n"
                 "  zero_stage: 3\n  gradient_accumulation_steps: 2\n  zero3_init_flag: true\n")
    found = errors_of(path)
    assert [(line, code) for _, line, code in found] == [(6, Code.CONFLICT), (7, Code.CONFLICT),
                                                         (3, Code.CONFLICT)]
    assert "deepspeed_config.zero_stage beside deepspeed_config_file" in found[0][0]
    assert found[2][0].startswith("mixed_precision beside deepspeed_config_file")


def test_config_file_without_zero_optimization(tmp_path: Path) -> None:
    write(tmp_path, "ds.json", '{"train_micro_batch_size_per_gpu": 1}\n')
    path = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\n"
                 "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    [(message, _, code)] = errors_of(path)
    assert "without zero_optimization" in message and code is Code.MISSING


def test_missing_config_file_is_a_read_error_at_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 4\n"
                 "deepspeed_config:\n  deepspeed_config_file: absent/ds.json\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "placeverify", "import", "--model", LLAMA,
                             path], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 4, result.stderr  # README exit codes: a file cannot be read
    assert f"{path}:4:3: error: deepspeed_config_file absent/ds.json: cannot read file" \
        in result.stderr
    assert "Traceback" not in result.stderr and not result.stdout


# ---- parallelism_config_sp_size ------------------------------------------------------------------

def test_sequence_parallel_size_is_not_modelled_at_its_key(tmp_path: Path) -> None:
    # dp_shard 2 x sp 2 = 4 = num_processes: no size mismatch, the reason is the sp key
    text = ("distributed_type: DEEPSPEED\nnum_processes: 4\nparallelism_config:\n"
            "  parallelism_config_dp_shard_size: 2\n  parallelism_config_sp_size: 2\n"
            "  parallelism_config_sp_backend: deepspeed\n"
            "  parallelism_config_sp_attn_implementation: sdpa\n")
    [(message, line, code)] = errors_of(write(tmp_path, "sp.yaml", text))
    assert message.startswith("not modelled: parallelism_config_sp_size > 1")
    assert (line, code) == (5, Code.NOT_MODELLED)


def test_sizes_count_sp(tmp_path: Path) -> None:
    # with sp 1 written out, the product dp_shard x sp is still checked against num_processes,
    # and the sp_* keys are read without effect
    text = ("distributed_type: FSDP\nnum_processes: 8\nparallelism_config:\n"
            "  parallelism_config_dp_shard_size: 4\n  parallelism_config_sp_size: 1\n"
            "  parallelism_config_sp_backend: deepspeed\n")
    [(message, line, code)] = errors_of(write(tmp_path, "sp1.yaml", text))
    assert message == "dp_replicate 1 x dp_shard 4 x tp 1 x cp 1 x sp 1 != num_processes 8"
    assert (line, code) == (3, Code.WORLD_MISMATCH)
    good = write(tmp_path, "sp1ok.yaml", text.replace("dp_shard_size: 4", "dp_shard_size: 8"))
    imported = import_seq(good, Options(model=LLAMA))
    assert "parallelism_config.parallelism_config_sp_backend" in imported.text.splitlines()[1]
    assert "place fsdp over dp" in statements(imported.text)


def test_deepspeed_refuses_tensor_parallel_sizes(tmp_path: Path) -> None:
    text = ("distributed_type: DEEPSPEED\nnum_processes: 8\nparallelism_config:\n"
            "  parallelism_config_dp_shard_size: 4\n  parallelism_config_tp_size: 2\n")
    [(message, line, code)] = errors_of(write(tmp_path, "tp.yaml", text))
    assert message.startswith("not modelled: parallelism_config_tp_size > 1 with "
                              "distributed_type DEEPSPEED")
    assert (line, code) == (5, Code.NOT_MODELLED)


def test_deepspeed_config_without_effect_elsewhere(tmp_path: Path) -> None:
    text = ("distributed_type: MULTI_GPU\nnum_processes: 2\ndeepspeed_config:\n"
            "  zero_stage: 3\n")
    imported = import_seq(write(tmp_path, "ddp.yaml", text), Options(model=LLAMA))
    assert [(w.message, w.span.line if w.span else None) for w, _ in imported.warnings
            if w.code is Code.CONFLICT] == [
        ("deepspeed_config has no effect with distributed_type MULTI_GPU", 3)]
    assert "place ddp over dp" in statements(imported.text)


def test_sizes_must_be_whole_numbers(tmp_path: Path) -> None:
    text = ("distributed_type: FSDP\nnum_processes: 8\nparallelism_config:\n"
            "  parallelism_config_tp_size: two\n")
    [(message, line, code)] = errors_of(write(tmp_path, "bad.yaml", text))
    assert "must be a whole number >= 1, not 'two'" in message
    assert (line, code) == (4, Code.BAD_VALUE)


def test_inline_fp8_is_modelled_as_bf16_with_a_warning(tmp_path: Path) -> None:
    # set_mixed_precision: fp8 enables bf16 (autocast) beside the fp8 matrix multiplications
    path = write(tmp_path, "fp8.yaml", "distributed_type: DEEPSPEED\nnum_processes: 8\n"
                 "mixed_precision: fp8\n")
    imported = import_seq(path, Options(model=LLAMA))
    assert "precision bf16_adam" in statements(imported.text)
    assert [w.span.line for w, _ in imported.warnings
            if w.span is not None and "fp8" in w.message] == [3]


def test_ulysses_communication_dtype_says_what_it_is(tmp_path: Path) -> None:
    # deepspeed/runtime/constants.py: seq_parallel_communication_data_type is the dtype of
    # DeepSpeed-Ulysses' all-to-alls, whose sequence-parallel size is not in the JSON
    path = write(tmp_path, "u.json", '{"train_micro_batch_size_per_gpu": 1,\n'
                 ' "seq_parallel_communication_data_type": "bf16",\n'
                 ' "zero_optimization": {"stage": 3}}\n')
    imported = import_seq(path, Options(model=LLAMA, world=4))
    [warning] = [w for w, _ in imported.warnings if "seq_parallel" in w.message]
    assert "sequence parallelism" in warning.message and "none assumed" in warning.message
    assert warning.span is not None and warning.span.line == 2


def test_config_file_accumulation_auto_with_both_batch_sizes(tmp_path: Path) -> None:
    # DeepSpeed's _batch_assertion fixes the accumulation the script must use: 64 / (2 x 8) = 4
    write(tmp_path, "ds.json", '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, '
          '"gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2}}\n')
    path = write(tmp_path, "a.yaml", "distributed_type: DEEPSPEED\nnum_processes: 8\n"
                 "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    imported = import_seq(path, Options(model=LLAMA))
    body = statements(imported.text)
    assert "microbatches = 4" in body and "micro_batch = 2" in body
    assert not [w for w, _ in imported.warnings if "accumulation" in w.message]
