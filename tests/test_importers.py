"""Importers: real-format configuration files -> .place -> the same strategy as written by hand.

Fixtures under tests/importers/ use the frameworks' own key names:
- Megatron-LM flags: megatron/training/arguments.py, megatron/core/model_parallel_config.py,
  megatron/core/transformer/transformer_config.py (NVIDIA/Megatron-LM);
- DeepSpeed keys: deepspeed/runtime/constants.py, deepspeed/runtime/zero/config.py;
- torchtitan keys: torchtitan/config/job_config.py ([parallelism], [training],
  [activation_checkpoint]);
- accelerate keys: src/accelerate/commands/config/config_args.py, commands/launch.py
  (parallelism_config_*_size);
- Hugging Face config.json: transformers models/llama/configuration_llama.py,
  models/mixtral/configuration_mixtral.py.
JSON has no comments, so the DeepSpeed and config.json fixtures' keys are cited here: DeepSpeed's
"Configuration JSON" documentation (docs/_pages/config-json.md) and runtime/zero/config.py,
offload_config.py for train_batch_size, train_micro_batch_size_per_gpu,
gradient_accumulation_steps, fp16.{enabled, loss_scale, initial_scale_power, loss_scale_window,
hysteresis, min_loss_scale}, bf16.enabled, gradient_clipping, zero_optimization.{stage,
offload_optimizer.{device, pin_memory}, allgather_partitions, allgather_bucket_size,
reduce_scatter, reduce_bucket_size, overlap_comm, contiguous_gradients,
stage3_prefetch_bucket_size}, steps_per_print, wall_clock_breakdown; the config.json files
carry the keys and dimensions of the published configs of meta-llama/Meta-Llama-3-{8B,70B},
Llama-3.1-405B and mistralai/Mixtral-8x7B-v0.1 (keys of LlamaConfig and MixtralConfig).

Coverage: Llama 3 8B (DeepSpeed ZeRO-3, accelerate FSDP2 HSDP x TP), 70B (torchtitan FSDP x TP,
DeepSpeed ZeRO-2 with CPU offload, a DeepSpeed file with a batch contradiction), 405B (Megatron-LM
argument file TP x PP x CP, torchtitan HSDP x TP x PP, torchtitan's published FSDP x TP preset),
GPT-3 175B (Megatron-LM launch script) and Mixtral 8x7B, a mixture of experts (Megatron-LM
expert parallelism, accelerate FSDP). Each is checked against a .place file written by hand from
the framework's semantics (same_costs: memory, traffic, bubble, parameters and verdicts).
Expected values are derived by hand from the files in each test's comments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from placeverify.api import check_strategy
from placeverify.diagnostics import Diagnostic, PlaceError, Severity, Source
from placeverify.importers import Options
from placeverify.importers.registry import import_file, load, load_text
from placeverify.ir.placement import Overlap
from tests.seq_given import import_seq, load_seq

HERE = Path(__file__).parent / "importers"
DEFAULT = Options()
ROOT = Path(__file__).parent.parent


def fixture(name: str) -> str:
    return str(HERE / name)


def strategy_of(name: str, **options: object):  # type: ignore[no-untyped-def]
    strategy, imported = load(fixture(name), Options(**options))  # type: ignore[arg-type]
    return strategy, imported


def strategy_of_seq(name: str, **options: object):  # type: ignore[no-untyped-def]
    """strategy_of with --set model.seq=8192: a DeepSpeed or accelerate file gives no sequence
    length, and the model's max_position_embeddings is not taken for it (tests/seq_given.py)."""
    return load_seq(fixture(name), Options(**options))  # type: ignore[arg-type]


def summary(strategy):  # type: ignore[no-untyped-def]
    return ({a.name: a.size for a in strategy.mesh.axes},
            {p.axis: p.preset for p in strategy.placements})


def same_costs(imported_strategy, hand_written: str) -> None:  # type: ignore[no-untyped-def]
    """check on the imported strategy gives the costs and verdicts of the hand-written file."""
    hand = load_text(hand_written, "hand.place")
    a = check_strategy(imported_strategy)
    b = check_strategy(hand)
    assert a.costs.device_bytes() == b.costs.device_bytes()
    assert a.costs.network_bytes() == b.costs.network_bytes()
    assert a.costs.bubble == b.costs.bubble
    assert imported_strategy.model.params == hand.model.params
    assert a.verification is not None and b.verification is not None
    assert a.verification.verdicts() == b.verification.verdicts()


# ---- Megatron-LM -----------------------------------------------------------------------------

def test_megatron_gpt3_175b_script() -> None:
    # 8 GPUs x 128 nodes = 1024; TP 8, PP 8 -> DP = 1024 / 64 = 16;
    # micro-batches = 1024 / (1 x 16) = 64; GPT-2 BPE vocabulary 50257, padded to 128 x tp.
    strategy, imported = strategy_of("gpt3-175b-megatron.sh")
    sizes, presets = summary(strategy)
    assert sizes == {"tp": 8, "dp": 16, "pp": 8}
    assert presets["tp"].startswith("megatron") and presets["dp"] == "zero1"
    assert strategy.model.params == 174_604_259_328  # README: GPT-3's exact count
    assert "place pipeline(1f1b, microbatches = 64) over pp" in imported.text
    assert "precision megatron" in imported.text
    assert "tp = 8" in imported.text and "# --tensor-model-parallel-size" in imported.text
    # --overlap-grad-reduce (line 44) without --overlap-param-gather: the distributed
    # optimizer's reduce-scatter overlaps with the backward, its all-gather runs after the update
    assert not imported.warnings
    assert "place zero1(overlap = grads) over dp" in imported.text
    assert strategy.placement("dp").data_overlap is Overlap.GRADS
    assert "--save" in imported.text.splitlines()[1]  # the ignored flags are listed, not dropped
    same_costs(strategy, """
strategy "hand"
model gpt3_175b { seq = 2048, micro_batch = 1, attention = flash }  # --attention-backend auto
precision megatron
mesh { tp = 8, dp = 16, pp = 8, world = 1024 }
place megatron(sequence_parallel) over tp
place zero1(overlap = grads) over dp
place pipeline(1f1b, microbatches = 64) over pp
loss microbatch_mean
clip max_norm = 1.0
recompute selective
""")


def test_megatron_llama3_405b_argument_file() -> None:
    # world 1792 / (tp 8 x pp 14 x cp 2) = 8; micro-batches = 224 / (1 x 8) = 28
    strategy, _ = strategy_of("llama3-405b-megatron.args", world=1792)
    sizes, presets = summary(strategy)
    assert sizes == {"tp": 8, "cp": 2, "dp": 8, "pp": 14}
    assert presets["dp"] == "zero1"
    assert strategy.model.params == 405_853_388_800
    same_costs(strategy, """
strategy "hand"
model llama3_405b { seq = 8192, micro_batch = 1 }
precision megatron
mesh { tp = 8, cp = 2, dp = 8, pp = 14 }
place megatron(sequence_parallel) over tp
place context(R, S, R, S) over cp
place zero1 over dp
place pipeline(1f1b, microbatches = 28) over pp
loss microbatch_mean
clip max_norm = 1.0
recompute full
""")


def test_megatron_mixtral_expert_parallel_with_hf_model() -> None:
    # world 32, tp = pp = cp = 1 -> DP 32; EP 8 comes out of DP: dp = 4; m = 256 / 32 = 8.
    strategy, imported = strategy_of("mixtral-8x7b-megatron.sh",
                                     model=fixture("mixtral-8x7b-config.json"))
    sizes, presets = summary(strategy)
    assert sizes == {"ep": 8, "dp": 4}
    assert presets == {"ep": "expert", "dp": "zero1"}
    assert "microbatches = 8" in imported.text
    # --sequence-parallel with TP = 1: Megatron switches it off -> a warning at line 16, col 5
    warning = next(w for w, _ in imported.warnings if "--sequence-parallel" in w.message)
    assert warning.span is not None and (warning.span.line, warning.span.column) == (16, 5)
    # The distributed optimizer shards the dense state over the dense data-parallel group, all
    # 32 ranks (ep x dp), and the experts' over the expert data-parallel group, dp 4
    # (megatron/core/distributed/distributed_data_parallel.py:280-290 at d98e8a6:
    # expert-parallel buffers over intra_expt_dp_group, the others over intra_dp_cp_group).
    # Mixtral 8x7B: experts 8 x 32 x 3 x 4096 x 14336 = 45,097,156,608, the rest 1,605,636,096;
    # Ω (12 B) = 1,605,636,096 x 12 / 32 + 45,097,156,608 / 8 x 12 / 4 = 17,513,547,264.
    assert check_strategy(strategy, verify_conditions=False).costs.device_bytes()[
        "optimizer"] == 1_605_636_096 * 12 // 32 + 45_097_156_608 // 8 * 12 // 4 \
        == 17_513_547_264
    same_costs(strategy, """
strategy "hand"
model mixtral_8x7b { seq = 4096, micro_batch = 1 }
precision megatron
mesh { ep = 8, dp = 4 }
place expert over ep
place zero1 over ep * dp
microbatches = 8
loss microbatch_mean
clip max_norm = 1.0
recompute full
""")


def test_megatron_world_not_divisible_points_at_the_flag(tmp_path: Path) -> None:
    # Megatron-LM's own examples/gpt3 script: TP 8 x PP 16 = 128 on 8 GPUs.
    script = tmp_path / "train.sh"
    script.write_text("GPUS=8\ntorchrun --nproc_per_node $GPUS pretrain_gpt.py \\\n"
                      "    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 \\\n"
                      "    --num-layers 96 --hidden-size 12288 --num-attention-heads 96\n")
    with pytest.raises(PlaceError) as error:
        import_file(str(script))
    [d] = [d for d in error.value.diagnostics if "not divisible" in d.message]
    assert d.span is not None and (d.span.line, d.span.column) == (3, 5)


def test_an_override_can_give_a_non_divisible_world_its_mesh(tmp_path: Path) -> None:
    # The same script, TP 8 x PP 16 on 8 GPUs: --set mesh.pp=1 gives 8 x 1 = 8 devices, so
    # Megatron-LM would derive DP = 8 / 8 = 1 and run it; global batch 16 / (micro 1 x dp 1) = 16
    # micro-batches. An override that leaves the product at 4 x 16 = 64 stays an error, at
    # the flag with the override noted, and says 8 is not divisible by 64.
    script = tmp_path / "train.sh"
    script.write_text("GPUS=8\ntorchrun --nproc_per_node $GPUS pretrain_gpt.py \\\n"
                      "    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 \\\n"
                      "    --num-layers 96 --hidden-size 12288 --num-attention-heads 96 \\\n"
                      "    --vocab-size 50257 --seq-length 2048 --global-batch-size 16\n")
    with pytest.raises(PlaceError) as error:
        import_file(str(script))  # as written: at the flag
    [d] = error.value.diagnostics
    assert d.span is not None and (d.span.line, d.span.column) == (3, 5)
    assert "8 processes" in d.message and "128 devices" in d.message
    strategy, _ = load(str(script), DEFAULT, settings("mesh.pp=1"))
    assert strategy.mesh.world == 8 and strategy.mesh.size("dp") == 1
    assert strategy.microbatches == 16
    assert strategy.name == "train.sh: Megatron-LM with overrides, pp = 1, dp = 1, tp = 8"
    with pytest.raises(PlaceError) as error:
        load(str(script), DEFAULT, settings("mesh.tp=4"))
    [d] = error.value.diagnostics  # the file breaks it too: at the flag, the override noted
    assert d.span is not None and (d.span.line, d.span.column) == (3, 5)
    assert d.notes == ("checked with --set mesh.tp=4",)
    assert "64 devices" in d.message and "8 is not divisible by" in d.message
    # a mesh of the launcher's world with the sizes and dp set together holds too: tp 2 x pp 4
    # = 8 leaves dp 1; tp 2 x pp 2 needs dp 2, which the hint gives
    with pytest.raises(PlaceError) as error:
        load(str(script), DEFAULT, settings("mesh.tp=2", "mesh.pp=2"))
    assert "data-parallel size of 2" in error.value.diagnostics[0].message
    strategy, _ = load(str(script), DEFAULT, settings("mesh.tp=2", "mesh.pp=2", "mesh.dp=2",
                                                       "place.pp=pipeline(1f1b, microbatches = 8)"))
    assert strategy.mesh.world == 8


def test_megatron_missing_world_says_so(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("python pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 2 "
                      "--hidden-size 64 --num-attention-heads 4 --vocab-size 100 --seq-length 32\n")
    with pytest.raises(PlaceError) as error:
        import_file(str(script))
    assert any("--world" in d.message for d in error.value.diagnostics)
    text = import_file(str(script), Options(world=4)).text
    assert "dp = 2" in text and "world = 4" in text


@pytest.mark.parametrize("payload", ["$(rm -rf {victim})", "`rm -rf {victim}`",
                                     "<(rm -rf {victim})"])
def test_nothing_is_executed(tmp_path: Path, payload: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    script = tmp_path / "train.sh"
    script.write_text("TP=" + payload.format(victim=victim) + "\n"
                      "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size $TP\n")
    with pytest.raises(PlaceError) as error:
        import_file(str(script))
    # TP is assigned but unknown: the error is where its value is needed, the `$TP` of line 2
    # (column 74: "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size " is
    # 73 characters), and says where the value comes from
    [d] = [d for d in error.value.diagnostics if "--tensor-model-parallel-size" in d.message]
    assert d.code.value == "not-static" and d.span is not None
    assert (d.span.line, d.span.column) == (2, 74)
    assert "$TP is assigned from" in d.message and "at line 1" in d.message
    assert victim.exists()


def test_unresolved_variable_in_a_placement_flag_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py \\\n"
                      "  --tensor-model-parallel-size $TP --num-layers 2\n")
    with pytest.raises(PlaceError) as error:
        import_file(str(script))
    d = error.value.diagnostics[0]
    assert "$TP" in d.message and d.span is not None and (d.span.line, d.span.column) == (2, 32)


# ---- DeepSpeed -------------------------------------------------------------------------------

def test_deepspeed_llama3_8b_zero3() -> None:
    # 64 = 1 x 8 x world 8: consistent; stage 3 -> zero3; accumulation 8 -> microbatches = 8
    strategy, imported = strategy_of_seq("llama3-8b-zero3.json", world=8,
                                     model=fixture("llama3-8b-config.json"))
    sizes, presets = summary(strategy)
    assert sizes == {"dp": 8} and presets == {"dp": "zero3"}
    assert strategy.model.params == 8_030_261_248
    assert "precision bf16_adam" in imported.text and "microbatches = 8" in imported.text
    # a DeepSpeed JSON has no sequence length: without --set model.seq the import is refused
    # at max_position_embeddings (line 11 of config.json), which it does not take for it
    with pytest.raises(PlaceError) as refused:
        import_file(fixture("llama3-8b-zero3.json"),
                    Options(world=8, model=fixture("llama3-8b-config.json")))
    [d] = refused.value.diagnostics
    assert refused.value.source.path.endswith("llama3-8b-config.json") and d.span is not None
    assert (d.span.line, d.span.column) == (11, 3) and "--set model.seq=N" in d.notes[0]
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


def test_deepspeed_llama3_70b_zero2_cpu_offload() -> None:
    # DeepSpeed docs (config-json): 512 = 2 x 4 x 64; fp16 with loss_scale 0 is dynamic loss
    # scaling; stage 2 shards Ω and G; offload_optimizer.device cpu keeps Ω in host memory; no
    # gradient_clipping key: no clipping (DeepSpeed's default 0.0).
    strategy, imported = strategy_of_seq("llama3-70b-zero2-offload.json", world=64,
                                     model=fixture("llama3-70b-config.json"))
    sizes, presets = summary(strategy)
    assert sizes == {"dp": 64} and presets == {"dp": "zero2"}
    assert strategy.model.params == 70_553_706_496
    assert "clip" not in imported.text.split("loss microbatch_mean")[1]
    same_costs(strategy, """
strategy "hand"
model llama3_70b { seq = 8192, micro_batch = 2 }
precision mixed_adam
mesh { dp = 64, memory_profile = deepspeed }
place zero2 over dp
microbatches = 4
loss microbatch_mean
offload optimizer to cpu
""")


def test_deepspeed_batch_contradiction_at_the_key() -> None:
    # 1000 != 2 x 4 x 64 = 512
    with pytest.raises(PlaceError) as error:
        import_seq(fixture("llama3-70b-offload-bad-batch.json"),
                    Options(world=64, model=fixture("llama3-70b-config.json")))
    [d] = error.value.diagnostics
    assert "512" in d.message and d.span is not None and (d.span.line, d.span.column) == (2, 3)


def test_deepspeed_needs_world() -> None:
    with pytest.raises(PlaceError) as error:
        import_file(fixture("llama3-8b-zero3.json"))
    assert "--world" in error.value.diagnostics[0].message


def test_deepspeed_offload_and_unknown_keys(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(Path(fixture("llama3-70b-offload-bad-batch.json")).read_text()
                      .replace('"train_batch_size": 1000', '"train_batch_size": 512'))
    imported = import_seq(str(config), Options(world=64, model=fixture("llama3-70b-config.json")))
    # no overlap_comm: DeepSpeed's ZeRO config (overlap_comm_valid) makes it false below stage 3
    assert "offload optimizer to cpu" in imported.text
    assert "place zero2(overlap = none) over dp" in imported.text
    assert "precision mixed_adam" in imported.text and "microbatches = 4" in imported.text
    [w] = [w for w, _ in imported.warnings if "my_custom_key" in w.message]
    assert w.span is not None and (w.span.line, w.span.column) == (11, 3)


def test_deepspeed_auto_values_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{\n  "train_micro_batch_size_per_gpu": "auto"\n}\n')
    with pytest.raises(PlaceError) as error:
        import_seq(str(config), Options(world=8, model=fixture("llama3-8b-config.json")))
    d = error.value.diagnostics[0]
    assert "auto" in d.message and d.span is not None and (d.span.line, d.span.column) == (2, 3)


# ---- torchtitan ------------------------------------------------------------------------------

def test_torchtitan_llama3_70b_fsdp_tp() -> None:
    # world 64: dp_shard -1 = 64 / 8 = 8; no PP -> reshard after forward ("default")
    strategy, _ = strategy_of("llama3-70b-fsdp.toml", world=64)
    sizes, presets = summary(strategy)
    assert sizes == {"tp": 8, "dp": 8}
    assert presets["dp"] == "fsdp" and presets["tp"].startswith("megatron")
    assert strategy.model.params == 70_553_706_496
    same_costs(strategy, """
strategy "hand"
model llama3_70b { seq = 8192, micro_batch = 8 }
precision torchtitan_bf16
mesh { tp = 8, dp = 8, memory_profile = torch }
place megatron(sequence_parallel) over tp
place fsdp over dp
loss token_mean
clip max_norm = 1.0
recompute full
""")


def test_torchtitan_llama3_405b_hsdp_pipeline() -> None:
    # 2 x 8 x 8 x 7 = 896; accumulation = 2048 / (16 x 16) = 8; pipeline micro-batches
    # = 16 / 1 x 8 = 128. torchtitan splits 126 layers + 1 (embedding) + 1 (output) = 128
    # "effective" layers over 7 stages: 18 each, one more on the first two (128 = 7 x 18 + 2),
    # less one on the first and the last: 18, 19, 18, 18, 18, 18, 17
    strategy, imported = strategy_of("llama3-405b-hsdp-pp.toml", world=896)
    sizes, _ = summary(strategy)
    assert sizes == {"tp": 8, "shard": 8, "replica": 2, "pp": 7}
    assert ("place pipeline(1f1b, microbatches = 128, layers = [18, 19, 18, 18, 18, 18, 17]) "
            "over pp") in imported.text
    # torchtitan's llama3 parallelize.py, apply_fsdp: fsdp_reshard_after_forward "default" is
    # reshard_after_forward = not pp_enabled, for HSDP (fully_shard on the 2-D mesh) too; and
    # torch.distributed.pipelining (stage.py, torch 2.13) runs every backward of an FSDP stage
    # with set_requires_gradient_sync(False), then perform_reduce_grad after the last one
    assert ("place hsdp(reshard_after_forward = false, reduce = step) over shard * replica"
            in imported.text)
    same_costs(strategy, """
strategy "hand"
model llama3_405b { seq = 8192, micro_batch = 1 }
precision torchtitan_bf16
mesh { tp = 8, shard = 8, replica = 2, pp = 7, memory_profile = torch }
place megatron(sequence_parallel) over tp
place hsdp(reshard_after_forward = false, reduce = step) over shard * replica
place pipeline(1f1b, microbatches = 128, layers = [18, 19, 18, 18, 18, 18, 17]) over pp
loss token_mean
clip max_norm = 1.0
recompute selective_op
""")
    # [activation_checkpoint] mode "selective", selective_ac_option "op": the op-level policy
    assert "recompute selective_op" in imported.text
    assert strategy.recompute.kind.value == "selective_op"


def _pipelined(tmp_path: Path, parallelism: str, schedule: str = "1F1B") -> Path:
    """Llama 3 8B (32 layers) in torchtitan over 8 ranks: FSDP 4 x PP 2, local batch 8."""
    config = tmp_path / "t.toml"
    config.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\n'
                      'local_batch_size = 8\nseq_len = 8192\n[parallelism]\n'
                      'pipeline_parallel_degree = 2\n'
                      f'pipeline_parallel_schedule = "{schedule}"\n{parallelism}')
    return config


@pytest.mark.parametrize(("schedule", "parallelism", "written"), [
    # 32 + 1 + 1 = 34 effective layers over 2 stages: 17 each, less one at each end -> even
    ("1F1B", "", "pipeline(1f1b, microbatches = 8) over pp"),
    # a looped schedule: 2 stages per rank, 34 = 4 x 8 + 2 -> 9, 9, 8, 8 less the ends;
    # rank 0 holds virtual stages 0 and 2 (8 + 8), rank 1 stages 1 and 3 (9 + 7)
    ("Interleaved1F1B", "", "pipeline(interleaved, chunks = 2, microbatches = 8, "
                            "layers = [8, 9, 8, 7]) over pp"),
    # layers_per_stage 3: ceil(34 / 3) = 12 virtual stages, 6 per rank; 34 = 12 x 2 + 10 ->
    # ten stages of 3 then two of 2, less one at each end
    ("Interleaved1F1B", "pipeline_parallel_layers_per_stage = 3\n",
     "pipeline(interleaved, chunks = 6, microbatches = 8, "
     "layers = [2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 1]) over pp"),
    # layers_per_stage 1: 34 virtual stages, 17 per rank, 1 each less one at each end: the
    # first holds only the embedding, the last only the norm and the output (torchtitan
    # refuses only a weight above the layers per stage)
    ("Interleaved1F1B", "pipeline_parallel_layers_per_stage = 1\n",
     "pipeline(interleaved, chunks = 17, microbatches = 8, "
     "layers = [0, " + "1, " * 32 + "0]) over pp"),
    # no weight for the embedding, two layers' for the output: 34 over 2 -> 17 and 17 - 2
    ("1F1B", "pipeline_parallel_first_stage_less_layers = 0\n"
             "pipeline_parallel_last_stage_less_layers = 2\n",
     "pipeline(1f1b, microbatches = 8, layers = [17, 15]) over pp"),
    # written module lists: 10 layers on the first stage, 22 on the second
    ("1F1B", "module_fqns_per_model_part = ["
             "[\"tok_embeddings\", " + ", ".join(f'\"layers.{i}\"' for i in range(10)) + "], ["
             + ", ".join(f'\"layers.{i}\"' for i in range(10, 32)) + ", \"norm\", \"output\"]]\n",
     "pipeline(1f1b, microbatches = 8, layers = [10, 22]) over pp"),
])
def test_torchtitan_pipeline_split_as_torchtitan_builds_it(tmp_path: Path, schedule: str,
                                                          parallelism: str, written: str) -> None:
    # torchtitan/distributed/pipeline_parallel.py (9810191bb^): generate_llm_fqn_per_model_part
    strategy, imported = load(str(_pipelined(tmp_path, parallelism, schedule)), Options(world=8))
    assert f"place {written}" in imported.text
    check_strategy(strategy)  # the written split lowers and checks


@pytest.mark.parametrize(("parallelism", "schedule", "said"), [
    # ceil(34 / 4) = 9 virtual stages over 2 ranks
    ("pipeline_parallel_layers_per_stage = 4\n", "Interleaved1F1B", "not a multiple"),
    # ceil(34 / 3) = 12: 6 per rank, but 1F1B runs one stage per rank
    ("pipeline_parallel_layers_per_stage = 3\n", "1F1B", "needs exactly 1"),
    # ceil(34 / 17) = 2: 1 per rank, but a looped schedule needs 2
    ("pipeline_parallel_layers_per_stage = 17\n", "Interleaved1F1B", "at least 2"),
    # 32 + 40 + 1 = 73 effective over 2 stages: 36 each, fewer than the embedding's 40
    ("pipeline_parallel_first_stage_less_layers = 40\n", "1F1B", "fewer layers than"),
])
def test_torchtitan_refused_splits_at_the_key(tmp_path: Path, parallelism: str, schedule: str,
                                             said: str) -> None:
    with pytest.raises(PlaceError) as error:
        import_file(str(_pipelined(tmp_path, parallelism, schedule)), Options(world=8))
    d = error.value.diagnostics[0]
    assert said in d.message and d.span is not None and d.span.line == 10, d.message


def test_torchtitan_uneven_split_decides_the_fullest_stage(tmp_path: Path) -> None:
    # 34 effective layers over 4 stages (PP 4, 1F1B): 9, 9, 8, 8 less the ends -> 8, 9, 8, 7.
    # Stage 1 holds 9 layers and no embedding: its Θ is 9 layers' worth, not the 8 an even split
    # would give it.
    config = _pipelined(tmp_path, "", "1F1B").read_text().replace(
        "pipeline_parallel_degree = 2", "pipeline_parallel_degree = 4")
    (tmp_path / "t.toml").write_text(config)
    strategy, imported = load(str(tmp_path / "t.toml"), Options(world=8))
    assert "layers = [8, 9, 8, 7]" in imported.text
    # one Llama 3 8B layer: q, o 4096 x 4096; k, v 4096 x 1024; SwiGLU 3 x 4096 x 14336;
    # two RMSNorm weights of 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    costs = check_strategy(strategy).costs
    [second] = [rank for rank in costs.ranks if 1 in rank.kind.stages]
    # fp32 parameters sharded over dp 2: 9 layers x 4 B / 2
    assert costs.rank_bytes(second)["params"] == 9 * layer * 4 // 2


def test_torchtitan_always_reshard_under_a_pipeline_keeps_the_stage_gathered(
        tmp_path: Path) -> None:
    # torch.distributed.pipelining (stage.py, backward_maybe_with_nosync) runs every backward of
    # an FSDP stage with set_reshard_after_backward(False): from the first backward on the
    # stage's parameters stay gathered, so "always" peaks like reshard_after_forward = false;
    # written so, with a warning at the key (line 10) that the traffic differs
    config = _pipelined(tmp_path, 'fsdp_reshard_after_forward = "always"\n')
    strategy, imported = load(str(config), Options(world=8))
    assert "place fsdp(grad_op, reduce = step) over dp" in imported.text
    [w] = [w for w, _ in imported.warnings if "set_reshard_after_backward" in w.message]
    assert w.span is not None and w.span.line == 10
    assert not strategy.placement("dp").reshard_after_forward


def test_torchtitan_llama3_405b_published_preset() -> None:
    # llama3-405b-fsdp-tp.toml holds the values of torchtitan's llama3_405b.toml: local batch 2,
    # seq 8192, TP 8, data_parallel_shard_degree -1 -> 512 / 8 = 64, no PP -> reshard after
    # forward, full recomputation; float8 is warned as not modelled, at the key; async TP
    # (enable_async_tensor_parallel = true, line 34) overlaps the tensor-parallel collectives.
    strategy, imported = strategy_of("llama3-405b-fsdp-tp.toml", world=512)
    sizes, presets = summary(strategy)
    assert sizes == {"tp": 8, "dp": 64} and presets["dp"] == "fsdp"
    warned = {(w.message, w.span.line) for w, _ in imported.warnings if w.span is not None}
    assert ("not modelled: [model] converters", 16) in warned
    assert not any("enable_async_tensor_parallel" in message for message, _ in warned)
    assert "place megatron(sequence_parallel, overlap = true) over tp" in imported.text
    assert strategy.placement("tp").overlap
    same_costs(strategy, """
strategy "hand"
model llama3_405b { seq = 8192, micro_batch = 2 }
precision torchtitan_bf16
mesh { tp = 8, dp = 64, memory_profile = torch }
place megatron(sequence_parallel, overlap = true) over tp
place fsdp over dp
loss token_mean
clip max_norm = 1.0
recompute full
""")


@pytest.mark.parametrize(("option", "kind", "every"), [
    ('selective_ac_option = "3"\n', "full", 3),  # every 3rd block (parallelize.py)
    ("", "full", 2),  # job_config.py's default, "2"
    ('selective_ac_option = "1"\n', "full", 1),
    ('selective_ac_option = "op"\n', "selective_op", 1)])
def test_torchtitan_selective_layer_checkpointing(tmp_path: Path, option: str, kind: str,
                                                  every: int) -> None:
    config = tmp_path / "t.toml"
    config.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\n'
                      'seq_len = 8192\n[activation_checkpoint]\nmode = "selective"\n' + option)
    strategy, _ = load(str(config), Options(world=8))
    assert (strategy.recompute.kind.value, strategy.recompute.every) == (kind, every)


def test_torchtitan_unknown_selective_option_is_not_modelled(tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\n'
                      'mode = "selective"\nselective_ac_option = "half"\n')
    with pytest.raises(PlaceError) as error:
        import_file(str(config), Options(world=8))
    d = error.value.diagnostics[0]
    assert "selective_ac_option 'half'" in d.message and d.span is not None and d.span.line == 6


def test_lowering_errors_point_at_the_key(tmp_path: Path) -> None:
    # 16 tensor ranks do not divide Llama 3 405B's 8 key/value heads: the error is at the TOML
    # key (line 16), not the .place text
    config = tmp_path / "t.toml"
    config.write_text(Path(fixture("llama3-405b-hsdp-pp.toml")).read_text()
                      .replace("tensor_parallel_degree = 8", "tensor_parallel_degree = 16"))
    with pytest.raises(PlaceError) as error:
        load(str(config), Options(world=1792))
    d = error.value.diagnostics[0]
    assert "kv_heads (8)" in d.message and d.span is not None and d.span.line == 16
    assert error.value.source is not None and error.value.source.path == str(config)


def test_torchtitan_world_mismatch_at_the_key(tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text("[parallelism]\ndata_parallel_shard_degree = 3\ntensor_parallel_degree = 2\n")
    with pytest.raises(PlaceError) as error:
        import_file(str(config), Options(world=8))
    d = error.value.diagnostics[0]
    assert d.span is not None and (d.span.line, d.span.column) == (2, 1)


# ---- accelerate ------------------------------------------------------------------------------

def test_accelerate_fsdp2_hsdp_tp() -> None:
    # 2 x 2 x 2 x 1 = 8 = num_processes; mesh order dp_replicate, dp_shard, cp, tp (outermost first)
    strategy, imported = strategy_of_seq("llama3-8b-fsdp2-accelerate.yaml",
                                     model=fixture("llama3-8b-config.json"))
    sizes, _ = summary(strategy)
    assert sizes == {"tp": 2, "shard": 2, "replica": 2}
    assert "recompute full" in imported.text
    same_costs(strategy, """
strategy "hand"
model llama3_8b { seq = 8192, micro_batch = 1 }
precision accelerate_fsdp_bf16
mesh { tp = 2, shard = 2, replica = 2, memory_profile = torch }
place megatron(sequence_parallel) over tp
place hsdp over shard * replica
loss microbatch_mean
recompute full
""")


def test_accelerate_mixtral_moe_fsdp() -> None:
    # num_processes 16 (2 machines x 8): FULL_SHARD over all 16 (FSDP's ShardingStrategy), the
    # experts sharded like every other weight; bf16 compute over fp32 Θ/G/AdamW; activation
    # checkpointing of every MixtralDecoderLayer. The model is Mixtral 8x7B's config.json
    # (46.7B parameters: transformers' MixtralConfig), at --set model.seq=32768.
    strategy, imported = load_seq(fixture("mixtral-8x7b-fsdp-accelerate.yaml"),
                                  Options(model=fixture("mixtral-8x7b-config.json")),
                                  settings("model.seq=32768"))
    sizes, presets = summary(strategy)
    assert sizes == {"dp": 16} and presets == {"dp": "fsdp"}
    assert "experts = 8" in imported.text and "top_k = 2" in imported.text
    assert strategy.model.params == 46_702_792_704  # Mixtral's published count (tests/test_models.py)
    same_costs(strategy, """
strategy "hand"
model mixtral_8x7b { seq = 32768, micro_batch = 1 }
precision accelerate_fsdp_bf16
mesh { dp = 16, memory_profile = torch }
place fsdp over dp
loss microbatch_mean
recompute full
""")


def test_accelerate_yaml_reads_as_pyyaml_loads_it(tmp_path: Path) -> None:
    # accelerate loads its config with yaml.safe_load (commands/config/config_args.py): an
    # anchored value is the value (num_processes 8, the world), a merge key brings the anchored
    # mapping's keys in and the mapping's own keys override them (fsdp_sharding_strategy stays
    # SHARD_GRAD_OP), and a key written twice keeps its last value (mixed_precision bf16), with
    # a warning at the first (line 5).
    config = tmp_path / "a.yaml"
    config.write_text(
        "base: &fsdp\n"
        "  fsdp_sharding_strategy: FULL_SHARD\n"
        "  fsdp_version: 2\n"
        "distributed_type: FSDP\n"
        "mixed_precision: fp16\n"
        "mixed_precision: bf16\n"
        "num_processes: &n 8\n"
        "fsdp_config:\n"
        "  <<: *fsdp\n"
        "  fsdp_sharding_strategy: SHARD_GRAD_OP\n")
    strategy, imported = load_seq(str(config), Options(model=fixture("llama3-8b-config.json")))
    assert strategy.mesh.world == 8
    assert "place fsdp(grad_op) over dp" in imported.text
    assert "bf16" in (imported.text.split("precision", 1)[1].split("\n", 1)[0])
    [twice] = [d for d, _ in imported.warnings if "written twice" in d.message]
    assert twice.span is not None and twice.span.line == 5


# ---- Hugging Face config.json ------------------------------------------------------------------

def test_hf_config_gives_llama3_dimensions() -> None:
    imported = import_seq(fixture("llama3-8b-zero3.json"),
                           Options(world=8, model=fixture("llama3-70b-config.json")))
    for entry in ("layers = 80", "hidden = 8192", "heads = 64", "kv_heads = 8", "ffn = 28672",
                  "vocab = 128256", "embeddings = untied", "mlp = gated"):
        assert entry in imported.text


def test_hf_config_refuses_unmodelled_architectures(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "deepseek_v2", "q_lora_rank": 1536}\n')
    with pytest.raises(PlaceError) as error:
        import_file(fixture("llama3-8b-zero3.json"), Options(world=8, model=str(config)))
    assert error.value.source is not None and error.value.source.path == str(config)


def test_model_missing_says_what_to_give() -> None:
    with pytest.raises(PlaceError) as error:
        import_file(fixture("llama3-8b-zero3.json"), Options(world=8))
    assert any("--model" in d.message for d in error.value.diagnostics)


# ---- CLI -------------------------------------------------------------------------------------

def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "placeverify", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_cli_import_writes_atomically_and_check_accepts_the_file(tmp_path: Path) -> None:
    out = tmp_path / "gpt3.place"
    result = run("import", fixture("gpt3-175b-megatron.sh"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text().startswith("# Imported by placeverify")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    checked = run("check", "--no-verify", fixture("llama3-8b-zero3.json"), "--world", "8",
                  "--model", fixture("llama3-8b-config.json"), "--set", "model.seq=8192")
    assert checked.returncode == 0, checked.stderr
    failed = run("import", fixture("llama3-70b-offload-bad-batch.json"), "--world", "64",
                 "--model", fixture("llama3-70b-config.json"), "--set", "model.seq=8192", "-o",
                 str(tmp_path / "x.place"))
    assert failed.returncode == 2 and ":2:3: error:" in failed.stderr
    assert not (tmp_path / "x.place").exists()


# ---- keys read, ignored and not modelled (one helper in importers/common.py) --------------------


def _column(text: str, line: int, needle: str) -> int:
    return text.splitlines()[line - 1].index(needle) + 1


def _not_modelled(imported) -> list[tuple[str, int | None, int | None]]:  # type: ignore[no-untyped-def]
    return [(w.message, w.span.line if w.span else None, w.span.column if w.span else None)
            for w, _ in imported.warnings if w.message.startswith("not modelled")]


IGNORED = "# Read but without effect on placement, memory or communication: "


def test_deepspeed_leftover_keys(tmp_path: Path) -> None:
    """deepspeed/runtime/constants.py: steps_per_print is read by DeepSpeed but changes nothing
    here; 'foo' and 'zero_optimization.bar' are not DeepSpeed keys at all: warnings at the key.
    zero_optimization.overlap_comm true at stage 2 overlaps the reduce-scatters, not the
    all-gather of the updated parameters after the step: overlap = grads."""
    text = ('{\n  "train_micro_batch_size_per_gpu": 1,\n  "steps_per_print": 10,\n  "foo": 1,\n'
            '  "zero_optimization": {"stage": 2, "overlap_comm": true, "bar": 3}\n}\n')
    path = tmp_path / "ds.json"
    path.write_text(text)
    imported = import_seq(str(path), Options(fixture("llama3-8b-config.json"), 8))
    assert _not_modelled(imported) == [
        ("not modelled: DeepSpeed key 'foo'", 4, 3),
        ("not modelled: zero_optimization.bar", 5, _column(text, 5, '"bar"'))]
    assert IGNORED + "steps_per_print" in imported.text.splitlines()
    assert "place zero2(overlap = grads) over dp" in imported.text
    assert 'strategy "ds.json: DeepSpeed ZeRO-2, dp = 8"' in imported.text.splitlines()


def test_torchtitan_leftover_keys(tmp_path: Path) -> None:
    """torchtitan/config/job_config.py: [job] and [training] steps change nothing here;
    [parallelism] weird_key and the table [strange] are not torchtitan's."""
    text = ('[job]\ndump_folder = "x"\n[parallelism]\ntensor_parallel_degree = 1\nweird_key = 3\n'
            '[training]\nsteps = 10\n[strange]\na = 1\n')
    path = tmp_path / "tt.toml"
    path.write_text(text)
    imported = import_file(str(path), Options(fixture("llama3-8b-config.json"), 8))
    assert _not_modelled(imported) == [("not modelled: [parallelism] weird_key", 5, 1),
                                       ("not modelled: [strange]", 8, 1)]  # at its '['
    assert IGNORED + "[job] [training] steps" in imported.text.splitlines()
    assert 'strategy "tt.toml: torchtitan, dp = 8"' in imported.text.splitlines()


def test_accelerate_leftover_keys(tmp_path: Path) -> None:
    """accelerate's config_args.py: compute_environment and fsdp_state_dict_type change nothing
    here; fsdp_config.fsdp_wobble and 'surprise' are not accelerate keys."""
    text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 8\n"
            "mixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n"
            "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_wobble: true\nsurprise: 1\n")
    path = tmp_path / "acc.yaml"
    path.write_text(text)
    imported = import_seq(str(path), Options(fixture("llama3-8b-config.json")))
    assert _not_modelled(imported) == [("not modelled: fsdp_config.fsdp_wobble", 8, 3),
                                       ("not modelled: surprise", 9, 1)]
    assert (IGNORED + "compute_environment fsdp_config.fsdp_state_dict_type"
            in imported.text.splitlines())
    assert 'strategy "acc.yaml: accelerate FSDP, dp = 8"' in imported.text.splitlines()


def test_megatron_uneven_first_and_last_stages(tmp_path: Path) -> None:
    # transformer_block.py get_num_layers_to_build: first and last stages hold the given counts,
    # the 14 others (126 - 7 - 7) / 14 = 8 each (Llama 3 405B's 16-stage split)
    args = Path(fixture("llama3-405b-megatron.args")).read_text().replace(
        "--pipeline-model-parallel-size 14", "--pipeline-model-parallel-size 16\n"
        "--decoder-first-pipeline-num-layers 7\n--decoder-last-pipeline-num-layers 7")
    path = tmp_path / "uneven.args"
    path.write_text(args)
    strategy, imported = load(str(path), Options(world=2048))
    assert strategy.pipeline.layers == (7, *[8] * 14, 7)
    assert not _not_modelled(imported)
    same_costs(strategy, """
strategy "hand"
model llama3_405b { seq = 8192, micro_batch = 1 }
precision megatron
mesh { tp = 8, cp = 2, dp = 8, pp = 16 }
place megatron(sequence_parallel) over tp
place context(R, S, R, S) over cp
place zero1 over dp
place pipeline(1f1b, microbatches = 28, layers = [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]) over pp
loss microbatch_mean
clip max_norm = 1.0
recompute full
""")
    # only the first given: the other 15 stages share 119 layers (not a multiple of 15)
    path.write_text(args.replace("--decoder-last-pipeline-num-layers 7\n", ""))
    with pytest.raises(PlaceError) as error:
        load(str(path), Options(world=2048))
    [d] = [d for d in error.value.diagnostics if "leaves" in d.message]
    assert d.message.startswith("--num-layers 126 leaves 119 layers for the other 15 pipeline "
                                "stages, not a positive multiple of 15")
    assert d.span is not None and d.span.line == 3


# ---- consistency rules under --set overrides (judged on the final values) ----------------------

def settings(*texts: str):  # type: ignore[no-untyped-def]
    from placeverify.lower.overrides import parse_settings

    return parse_settings(list(texts))


def test_an_override_can_fix_a_batch_contradiction() -> None:
    # llama3-8b-zero3.json at world 16: 64 != 1 x 8 x 16 = 128 (DeepSpeed's _batch_assertion);
    # --set microbatches=4 gives 1 x 4 x 16 = 64, which DeepSpeed accepts.
    options = Options(fixture("llama3-8b-config.json"), 16)
    with pytest.raises(PlaceError) as error:
        load_seq(fixture("llama3-8b-zero3.json"), options)
    [d] = error.value.diagnostics
    assert "128" in d.message and d.span is not None and (d.span.line, d.span.column) == (2, 3)
    strategy, imported = load_seq(fixture("llama3-8b-zero3.json"), options, settings("microbatches=4"))
    assert strategy.microbatches == 4 and not [w for w, _ in imported.warnings
                                               if w.code.value == "conflict"]
    same_costs(strategy, """
strategy "hand"
model llama3_8b { seq = 8192, micro_batch = 1 }
precision bf16_adam
mesh { dp = 16, memory_profile = deepspeed }
place zero3 over dp
microbatches = 4
loss microbatch_mean
clip max_norm = 1.0
""")


def test_an_override_that_breaks_the_batch_rule_is_blamed() -> None:
    # world 8 is consistent (64 = 1 x 8 x 8); --set mesh.dp=16 makes it 128: the error is at the
    # override (--set:2:1, the second --set), with a note naming the key's position.
    options = Options(fixture("llama3-8b-config.json"), 8)
    with pytest.raises(PlaceError) as error:
        load_seq(fixture("llama3-8b-zero3.json"), options,
             settings("clip.max_norm=0.5", "mesh.dp=16"))
    [d] = error.value.diagnostics
    assert d.source is not None and d.source.path == "--set"
    assert d.span is not None and (d.span.line, d.span.column) == (2, 1)
    assert "128" in d.message and "4 micro-batches" in d.message
    assert d.notes == (f"train_batch_size is at {fixture('llama3-8b-zero3.json')}:2:3",)
    # an override that does not touch the batch leaves the error at the key
    with pytest.raises(PlaceError) as error:
        load_seq(fixture("llama3-8b-zero3.json"), Options(fixture("llama3-8b-config.json"), 16),
             settings("clip.max_norm=0.5"))
    [d] = error.value.diagnostics
    assert d.span is not None and (d.span.line, d.span.column) == (2, 3)
    assert d.notes == ("checked with --set clip.max_norm=0.5 --set model.seq=8192",)


def test_megatron_global_batch_is_judged_on_the_overridden_mesh() -> None:
    # gpt3-175b-megatron.sh: --global-batch-size 1024 (line 25, col 5) = 1 x 64 x 16.
    # mesh.dp=32 alone: 1 x 64 x 32 = 2048 (an error at the override); with the pipeline's
    # micro-batches set to 1024 / 32 = 32 as well, it holds again.
    with pytest.raises(PlaceError) as error:
        load(fixture("gpt3-175b-megatron.sh"), DEFAULT, settings("mesh.dp=32"))
    [d] = error.value.diagnostics
    assert "2048" in d.message and d.span is not None and d.span.line == 1
    assert d.notes[0].endswith("gpt3-175b-megatron.sh:25:5")
    strategy, _ = load(fixture("gpt3-175b-megatron.sh"), DEFAULT,
                       settings("mesh.dp=32", "place.pp=pipeline(1f1b, microbatches = 32)"))
    assert strategy.microbatches == 32 and strategy.mesh.size("dp") == 32


def test_megatron_global_batch_not_divisible_is_an_error_at_the_flag(tmp_path: Path) -> None:
    # 1000 is not a multiple of micro 1 x dp 16 (Megatron's calculator asserts it); setting
    # dp = 8 and 1000 / 8 = 125 micro-batches fixes it.
    script = tmp_path / "train.sh"
    script.write_text(Path(fixture("gpt3-175b-megatron.sh")).read_text()
                      .replace("--global-batch-size 1024", "--global-batch-size 1000"))
    with pytest.raises(PlaceError) as error:
        import_file(str(script))
    [d] = error.value.diagnostics
    assert "not a multiple" in d.message and "16" in d.message
    assert d.span is not None and (d.span.line, d.span.column) == (25, 5)
    strategy, _ = load(str(script), DEFAULT, settings(
        "mesh.dp=8", "place.pp=pipeline(1f1b, microbatches = 125)"))
    assert strategy.microbatches == 125


def test_sequence_parallel_ignored_is_judged_on_the_final_tensor_size(tmp_path: Path) -> None:
    # Megatron-LM's validate_args turns --sequence-parallel off when TP = 1, silently.
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py \\\n"
                      "    --tensor-model-parallel-size 2 --sequence-parallel \\\n"
                      "    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\\n"
                      "    --vocab-size 32000 --seq-length 4096 --global-batch-size 32 --bf16\n")
    _, imported = load(str(script))
    assert not [w for w, _ in imported.warnings if "--sequence-parallel" in w.message]
    _, imported = load(str(script), DEFAULT, settings("mesh.tp=1"))
    [(w, source)] = [(w, s) for w, s in imported.warnings if "--sequence-parallel" in w.message]
    assert w.severity is Severity.WARNING and source.path == "--set"
    assert w.span is not None and (w.span.line, w.span.column) == (1, 1)
    assert w.notes == (f"--sequence-parallel is at {script}:2:36",)
    # Mixtral's script has TP 1 and --sequence-parallel: warned at the flag; an override that
    # gives it two tensor-parallel ranks makes the flag effective, and the warning goes. (dp 4 ->
    # 2 keeps world 32; the global batch 256 = 1 x 16 x (ep 8 x dp 2) needs 16 micro-batches.)
    mixtral = Options(model=fixture("mixtral-8x7b-config.json"))
    _, imported = load(fixture("mixtral-8x7b-megatron.sh"), mixtral,
                       settings("mesh.dp=2", "mesh.tp=2", "place.tp=megatron(sequence_parallel)",
                                "microbatches=16"))
    assert not [w for w, _ in imported.warnings if "--sequence-parallel" in w.message]
    # without the micro-batches, the batch rule blames the resize, not the placement
    with pytest.raises(PlaceError) as error:
        load(fixture("mixtral-8x7b-megatron.sh"), mixtral,
             settings("mesh.dp=2", "mesh.tp=2", "place.tp=megatron(sequence_parallel)"))
    [d] = error.value.diagnostics
    assert "128" in d.message and d.span is not None and d.span.line == 1  # mesh.dp=2


def test_torchtitan_global_batch_rule_under_overrides() -> None:
    # llama3-405b-hsdp-pp.toml: global 2048 = 16 local x 8 accumulation x (2 x 8); pipeline
    # micro-batches of 1: 16 x 8 = 128. --set mesh.replica=4 (world 1792) breaks it: 4096.
    with pytest.raises(PlaceError) as error:
        load(fixture("llama3-405b-hsdp-pp.toml"), Options(world=896), settings("mesh.replica=4"))
    [d] = error.value.diagnostics
    assert "4096" in d.message and "64 micro-batches" in d.message
    assert d.notes[0].endswith("llama3-405b-hsdp-pp.toml:8:1")


def test_import_with_set_prints_the_judgement(tmp_path: Path) -> None:
    done = run("import", fixture("llama3-8b-zero3.json"), "--world", "16", "--model",
               fixture("llama3-8b-config.json"), "--set", "microbatches=4", "--set",
               "model.seq=8192")
    assert done.returncode == 0, done.stderr
    assert "microbatches = 4" in done.stdout and "# --set microbatches=4" in done.stdout
    done = run("import", fixture("llama3-8b-zero3.json"), "--world", "8", "--model",
               fixture("llama3-8b-config.json"), "--set", "mesh.dp=16", "--set", "model.seq=8192")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("--set:1:1: error: train_batch_size 64 != ")


def test_import_lowers_what_it_prints(tmp_path: Path) -> None:
    # 16 tensor ranks do not divide 8 key/value heads: `import` refuses it at the TOML key (line
    # 16, tensor_parallel_degree) rather than print a .place file that check would refuse
    config = tmp_path / "t.toml"
    config.write_text(Path(fixture("llama3-405b-hsdp-pp.toml")).read_text()
                      .replace("tensor_parallel_degree = 8", "tensor_parallel_degree = 16"))
    done = run("import", str(config), "--world", "1792")
    assert done.returncode == 2 and done.stdout == ""
    assert f"{config}:16:1: error:" in done.stderr and "kv_heads (8)" in done.stderr


def test_offload_param_is_judged_on_the_overridden_stage(tmp_path: Path) -> None:
    # deepspeed/runtime/zero/config.py: offload_param is honoured only at stage 3. The 70B
    # ZeRO-2 fixture with an offload_param section: at stage 2 the import leaves it out and
    # warns at the key (line 16, "device"); under --set place.dp=zero3 DeepSpeed would offload
    # the parameters, so the warning (still at the key, the override noted) says what to add;
    # with the offload set too, it goes.
    config = json.loads(Path(fixture("llama3-70b-zero2-offload.json")).read_text())
    config["zero_optimization"]["offload_param"] = {"device": "cpu"}
    path = tmp_path / "ds.json"
    text = json.dumps(config, indent=2)
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if '"offload_param"' in t) + 1
    options = Options(fixture("llama3-70b-config.json"), 64)

    def offload_warnings(*overrides: str) -> list[tuple[Diagnostic, Source]]:
        _, imported = load_seq(str(path), options, settings(*overrides) if overrides else None)
        return [(w, s) for w, s in imported.warnings if "offload_param" in w.message]

    [(w, source)] = offload_warnings()
    assert "DeepSpeed ignores it" in w.message and source.path == str(path)
    assert w.span is not None and w.span.line == line
    [(w, source)] = offload_warnings("place.dp=zero3")
    assert "--set offload=params,optimizer" in w.message
    assert source.path == str(path) and w.notes == ("checked with --set place.dp=zero3 --set model.seq=8192",)
    assert offload_warnings("place.dp=zero3", "offload=params,optimizer") == []


def test_deepspeed_trainer_auto_values_given_by_overrides(tmp_path: Path) -> None:
    # A DeepSpeed JSON written for transformers' Trainer: its "auto" values come from
    # TrainingArguments at launch. train_batch_size is world x micro x accumulation (derived);
    # the others are errors naming the override that gives them, and accepted under it.
    config = tmp_path / "ds.json"
    config.write_text('{\n  "train_batch_size": "auto",\n  "train_micro_batch_size_per_gpu": '
                      '"auto",\n  "gradient_accumulation_steps": "auto",\n  "bf16": {"enabled": '
                      '"auto"},\n  "gradient_clipping": "auto",\n  "zero_optimization": '
                      '{"stage": 2}\n}\n')
    options = Options(world=8, model=fixture("llama3-8b-config.json"))
    with pytest.raises(PlaceError) as error:
        import_seq(str(config), options)
    hints = {d.message.split("--set ")[-1] for d in error.value.diagnostics}
    assert hints == {"model.micro_batch=...", "microbatches=...", "precision=...",
                     "clip.max_norm=..."}
    assert not any("train_batch_size" in d.message for d in error.value.diagnostics)
    given = settings("model.micro_batch=4", "microbatches=2", "precision=bf16_adam",
                     "clip.max_norm=0.5")
    strategy, _ = load_seq(str(config), options, given)
    assert strategy.model.arch is not None and strategy.model.arch.micro_batch == 4
    assert strategy.precision.name == "bf16_adam" and strategy.mesh.world == 8
    assert {p.axis: p.preset for p in strategy.placements} == {"dp": "zero2"}
    # ZeRO-2 under bf16_adam, 8 ranks: Θ 2Ψ + (2 + 12)Ψ / 8 bytes per device (ZeRO, Table 1)
    psi = strategy.model.params
    from placeverify.cost import analyse

    device = analyse(strategy).device_bytes()
    assert device["params"] + device["optimizer"] + device["gradients"] == 2 * psi + Fraction(
        14 * psi, 8)


def test_a_pipeline_that_does_not_divide_the_layers_is_an_error_at_its_flag(tmp_path: Path) -> None:
    # 24 layers over 4 stages of 1f1b would hold 6 each; over 16 they do not divide. The error
    # belongs to --pipeline-model-parallel-size (line 3), not to the batch the micro-batch count
    # comes from (line 2).
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc_per_node 16 pretrain_gpt.py --num-layers 24 \\\n"
                      "  --global-batch-size 32 --hidden-size 64 --num-attention-heads 4 \\\n"
                      "  --pipeline-model-parallel-size 16 --seq-length 32 --vocab-size 100\n")
    with pytest.raises(PlaceError) as error:
        import_file(str(script))
    [d] = [d for d in error.value.diagnostics if "does not divide layers" in d.message]
    assert d.span is not None and (d.span.line, d.span.column) == (3, 3)


def test_words_only_the_launch_gives_are_a_warning_where_they_may_hide_flags(tmp_path: Path) -> None:
    # "$@" after a flag's value and $EXTRA_ARGS may expand to placement flags placeverify cannot
    # see: a warning at each (columns 152 and 156); $SAVE as --save's own value is not one.
    script = tmp_path / "train.sh"
    line = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
            "--num-attention-heads 4 --seq-length 32 --vocab-size 100 --log-interval 1 "
            '"$@" $EXTRA_ARGS --save $SAVE\n')
    script.write_text(line)
    imported = import_file(str(script))
    hidden = [(d.span.line, d.span.column) for d, _ in imported.warnings
              if "only known at launch" in d.message and d.span is not None]
    assert hidden == [(1, line.index('"$@"') + 2), (1, line.index("$EXTRA_ARGS") + 1)]


@pytest.mark.parametrize(("name", "flavor", "params"), [
    # dim 256, 6 layers, 16 heads (16 kv), SwiGLU 768, vocab 2048, untied: per layer 4 x 256^2 +
    # 3 x 256 x 768 + 2 x 256 = 852,480; x 6 + 2 x 2048 x 256 + 256 = 6,163,712
    ("llama3", "debugmodel", 6_163_712),
    # the same shape as Qwen3-8B's config.json (tests/test_head_dim.py): 8,190,735,360
    ("qwen3", "8B", 8_190_735_360),
    # 28 layers, hidden 1024, 16 heads (8 kv) of 128, SwiGLU 3072, tied: per layer q, o 2 x 1024
    # x 2048 + k, v 2 x 1024 x 1024 + 3 x 1024 x 3072 + 2 x 128 + 2 x 1024 = 15,730,944;
    # x 28 + 151936 x 1024 + 1024 = 596,049,920
    ("qwen3", "0.6B", 596_049_920),
])
def test_torchtitan_flavors_described_entry_by_entry(tmp_path: Path, name: str, flavor: str,
                                                     params: int) -> None:
    config = tmp_path / "train.toml"
    config.write_text(f'[model]\nname = "{name}"\nflavor = "{flavor}"\n\n[training]\n'
                      "local_batch_size = 1\nseq_len = 2048\n\n[parallelism]\n"
                      "data_parallel_shard_degree = -1\n")
    strategy, imported = load(str(config), Options(world=8))
    assert strategy.model.params == params
    assert f"{name} {flavor} (torchtitan/models/{name}/__init__.py)" in imported.text


# ---- the mesh order: the framework's innermost axis last -------------------------------------

@pytest.mark.parametrize("fixture,world", [("gpt3-175b-megatron.sh", None),
                                           ("bloom-176b-megatron-deepspeed.slurm", None),
                                           ("llama3-405b-hsdp-pp.toml", 896)])
def test_the_tensor_axis_of_an_import_stays_inside_a_node(fixture: str, world: int | None) -> None:
    # Megatron-LM (parallel_state: tensor groups are consecutive ranks) and torchtitan
    # (ParallelDims.build_mesh: tp innermost) put TP's 8 ranks in one 8-GPU node; a .place mesh
    # lays ranks out with its last axis varying fastest, so tp must be written last and get the
    # NVLink bandwidth of the device, the pipeline axis the network's
    profile = json.loads((ROOT / "placeverify" / "ir" / "devices.json").read_text())
    a100 = profile["a100_80gb_sxm"]
    strategy, _ = load(str(ROOT / "tests" / "importers" / fixture), Options(world=world),
                       settings("mesh.device=a100_80gb_sxm"))
    axes = {axis.name: axis for axis in strategy.mesh.axes}
    assert strategy.mesh.axes[-1].name == "tp"
    assert axes["tp"].bandwidth == Fraction(str(a100["intra_node_bandwidth"]))
    assert axes["pp"].bandwidth is not None
    assert axes["pp"].bandwidth < Fraction(str(a100["intra_node_bandwidth"]))
