"""Megatron-LM scripts that Slurm launches with one srun task per GPU (no torchrun): the world
is srun's task count, from srun's own options or the allocation's ``#SBATCH`` lines; the
tokenizer pretrain_gpt.py defaults to; the softmax of a Megatron-LM that predates FlashAttention;
and flags a ``<...>`` placeholder hands to a redirection.

Expected values are derived by hand: Slurm starts ``--ntasks`` tasks, else nodes x
``--ntasks-per-node`` (srun(1)); Megatron-LM's pretrain_gpt.py sets ``args_defaults=
{'tokenizer_type': 'GPT2BPETokenizer'}``, whose vocabulary holds 50,257 tokens (50,000 merges,
256 byte tokens and <|endoftext|>).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.api import check_strategy, load_text
from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import import_file, load
from tests.test_shell_import import write

HERE = Path(__file__).parent / "importers"
ARGS = ("--tensor-model-parallel-size 2 --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
        "--vocab-size 100 --seq-length 32 --micro-batch-size 1 --global-batch-size 16")


def _messages(error: pytest.ExceptionInfo[PlaceError]) -> list[str]:
    return [d.message for d in error.value.diagnostics]


def test_the_2021_gpt3_launchwrite() -> None:
    """128 nodes x 8 tasks = 1,024 processes; tp 8 x pp 16 -> dp 1024 / 128 = 8; 1,536 / (1 x 8)
    = 192 micro-batches; --fp16 without --accumulate-allreduce-grads-in-fp32: fp16 gradients."""
    strategy, imported = load(str(HERE / "gpt3-175b-megatron-2021-srun.sh"), Options())
    assert {a.name: a.size for a in strategy.mesh.axes} == {"pp": 16, "dp": 8, "tp": 8}
    assert strategy.mesh.world == 1024
    assert "#SBATCH --ntasks-per-node=8 (line 7) x #SBATCH --nodes=128 (line 7)" in imported.text
    assert strategy.microbatches == 192
    arch = strategy.model.arch
    assert arch is not None and arch.vocab == 50257 and arch.attention == "standard"
    assert strategy.precision.grads_dtype == "fp16"
    assert "recompute full" in imported.text
    assert not imported.warnings
    hand = load_text("""
strategy "hand"
model gpt3_175b { seq = 2048, micro_batch = 1 }
precision { params = fp16, grads = fp16, optimizer = 12, activations = fp16, loss_scale = dynamic }
mesh { pp = 16, dp = 8, tp = 8, world = 1024 }
place megatron(overlap = backward) over tp
place ddp(overlap = none) over dp
place pipeline(1f1b, microbatches = 192) over pp
loss microbatch_mean
clip max_norm = 1.0
recompute full
""")
    a, b = check_strategy(strategy), check_strategy(hand)
    assert a.costs.device_bytes() == b.costs.device_bytes()
    assert a.costs.network_bytes() == b.costs.network_bytes()
    assert strategy.model.params == hand.model.params


@pytest.mark.parametrize(("launch", "world"), [
    ("#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=8\nsrun python pretrain_gpt.py", 32),
    ("#SBATCH -N 4 --ntasks-per-node 8 --gres=gpu:8\nsrun python pretrain_gpt.py", 32),
    # srun's own options replace the allocation's
    ("#SBATCH --nodes=4 --ntasks-per-node=8\nsrun -N 2 python pretrain_gpt.py", 16),
    ("#SBATCH --nodes=4 --ntasks-per-node=8\nsrun --ntasks=8 python pretrain_gpt.py", 8),
    ("srun --nodes 2 --ntasks-per-node=4 python pretrain_gpt.py", 8),
    ("#SBATCH --ntasks=16\nsrun python pretrain_gpt.py", 16),
    ('#SBATCH --nodes=2 --ntasks-per-node=4 # eight GPUs\nsrun bash -c "python pretrain_gpt.py', 8),
])
def test_srun_tasks_are_the_world(tmp_path: Path, launch: str, world: int) -> None:
    closing = '"' if 'bash -c "' in launch else ""
    text = import_file(write(tmp_path, f"{launch} {ARGS}{closing}\n")).text
    assert f"world = {world} " in text and "srun tasks" in text
    assert f"dp = {world // 2} " in text


def test_srun_without_a_task_count_says_so(tmp_path: Path) -> None:
    """Slurm's default of one task per node is not assumed; --world gives the count."""
    path = write(tmp_path, f"#SBATCH --nodes=4\nsrun python pretrain_gpt.py {ARGS}\n")
    with pytest.raises(PlaceError) as error:
        import_file(path)
    assert any("--ntasks-per-node" in m and "--world" in m for m in _messages(error))
    assert "world = 8 " in import_file(path, Options(world=8)).text


def test_a_node_range_is_not_a_node_count(tmp_path: Path) -> None:
    path = write(tmp_path, "#SBATCH --nodes=2-4 --ntasks-per-node=8\n"
                             f"srun python pretrain_gpt.py {ARGS}\n")
    with pytest.raises(PlaceError) as error:
        import_file(path)
    assert any("--nodes" in m for m in _messages(error))


def test_world_contradicting_srun_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "#SBATCH --nodes=2 --ntasks-per-node=8\n"
                             f"srun python pretrain_gpt.py {ARGS}\n")
    with pytest.raises(PlaceError) as error:
        import_file(path, Options(world=32))
    assert any("contradicts srun's 16 tasks" in m for m in _messages(error))


def test_srun_running_torchrun_keeps_torchrun_s_count(tmp_path: Path) -> None:
    """srun starts one torchrun per node; torchrun starts --nproc-per-node processes each."""
    text = import_file(write(tmp_path, "#SBATCH --nodes=4 --ntasks-per-node=1\n"
                                         "srun torchrun --nnodes $SLURM_NNODES --nproc-per-node 8 "
                                         f"pretrain_gpt.py {ARGS}\n")).text
    assert "world = 32 " in text and "srun tasks" not in text


def test_pretrain_gpt_defaults_to_the_gpt2_tokenizer(tmp_path: Path) -> None:
    args = ARGS.replace("--vocab-size 100 ", "")
    text = import_file(write(tmp_path, f"torchrun --nproc-per-node 2 pretrain_gpt.py {args}\n")).text
    assert "vocab = 50257 " in text and "default of pretrain_gpt.py" in text
    with pytest.raises(PlaceError) as error:  # another program: the vocabulary is not known
        import_file(write(tmp_path, f"torchrun --nproc-per-node 2 pretrain_mamba.py {args}\n"))
    assert any("vocabulary size" in m for m in _messages(error))


def test_the_old_recompute_flag_means_the_fused_softmax(tmp_path: Path) -> None:
    """--checkpoint-activations (renamed in 2022-05) predates --use-flash-attn (2022-12)."""
    launch = "torchrun --nproc-per-node 2 pretrain_gpt.py " + ARGS
    old = import_file(write(tmp_path, launch + " --checkpoint-activations\n")).text
    assert "attention = standard" in old and "recompute full" in old
    flash = import_file(write(tmp_path, launch + " --checkpoint-activations --use-flash-attn\n"))
    assert "attention = flash" in flash.text
    new = import_file(write(tmp_path, launch + " --recompute-activations\n")).text
    assert "attention = flash" in new


def test_a_placeholder_swallowing_a_flag_is_reported(tmp_path: Path) -> None:
    """``--save <PATH TO CHECKPOINTS> --fp16``: the shell reads '>' then takes --fp16 as the
    file to write; the import warns at --fp16 instead of losing it silently."""
    path = write(tmp_path, "#SBATCH --nodes=1 --ntasks-per-node=2\n"
                             f'options="{ARGS} --save <PATH TO CHECKPOINTS> --fp16"\n'
                             'srun sh -c "python pretrain_gpt.py ${options}"\n')
    imported = import_file(path)
    warnings = [d for d, _ in imported.warnings if "--fp16" in d.message]
    assert warnings and "redirection" in warnings[0].message
    assert warnings[0].span is not None and warnings[0].span.line == 2
    assert "precision fp32_adam" in imported.text  # as the shell runs it: --fp16 is not given
