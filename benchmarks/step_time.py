"""The step-time model (placeverify/cost/time.py) against published training runs.

Every row is a published configuration with its measured throughput, written as a ``.place``
text with its exact layout, and the measured step time derived from the published figure by the
source's own convention (below). The script fits the model's constants on the calibration rows
(``calibrate = True``, about half of each source), then prints predicted / measured per row and the
median and worst relative error on the calibration rows and, separately, on the held-out rows
(the figure that counts).

    .venv/bin/python benchmarks/step_time.py            # fit, then print every row and the summary
    .venv/bin/python benchmarks/step_time.py --shipped  # use the constants in cost/time.py, no fit
    .venv/bin/python benchmarks/step_time.py --write benchmarks/step_time  # also write the .place files

Sources (measured step time from the published figure):

- NARAYANAN: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", arXiv 2104.04473, Table 1 (A100 80GB, Selene). Step time =
  F / (TFLOP/s per GPU · GPUs) with the paper's hardware FLOPs (§5.1, full recomputation)
  F = 96·B·s·l·h²(1 + s/(6h) + V/(16·l·h)). Layouts and DDP as the paper's scripts ran them
  (``examples/sc21/run_table_1.sh``): the pipelined rows' Megatron-LM all-reduced the gradients
  after the whole forward-backward (``ddp(overlap = none)``), the others ran PyTorch's DDP,
  which overlaps it with the last backward (:func:`narayanan_rows`).
- MEGATRON_LM_2021: NVIDIA/Megatron-LM's README at 152aab304d (2021-01-11): GPT-3 175B on
  1,024 A100 with the launch script it ships, "each iteration takes around 32 seconds
  resulting in 138 teraFLOPs per GPU"; step time from the 138 TFLOP/s with Narayanan et al.'s
  count. Held out only (:func:`megatron_gpt3_row`).
- KORTHIKANTI: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", arXiv 2205.05198, Table 5: seconds per iteration, full recomputation and sequence
  parallelism + selective recomputation (A100 80GB, t = 8).
- LLAMA3: Llama Team 2024, "The Llama 3 Herd of Models", arXiv 2407.21783, Table 4 (H100 80GB,
  bf16): step time = tokens per step · (6N + 12·L·h·s) / (TFLOP/s per GPU · GPUs).
- NEMO: NVIDIA NeMo docs/source/performance/performance_summary.md (NeMo 24.07, DGX-H100,
  FP8), commit 070a0bb168d405d653b9734c0017cf5078e77c0d, "Pretraining" table: step time =
  GBS · sequence length / (tokens/s/GPU · GPUs).
- TORCHTITAN: pytorch/torchtitan docs/performance.md, commit
  041336434916bdc0f88c1f89fda176fd3c2092e4 (FSDP2 on 64 A100 80GB, bf16): step time = local
  batch · sequence length / WPS (tokens per second per GPU).
- MEGATRON_BRIDGE: NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, commit
  97ad8cc6f ("Added 25.11 starter pack"), 25.11 NeMo container, DGX-H100 table: step time =
  GBS · sequence length / (tokens/s/GPU · GPUs). Held out only: it checks the layout family
  ``placeverify search`` prefers for Llama 3 405B at sequence 8,192 (context parallelism 2
  with Megatron's distributed optimizer, docs/search.md) on the model itself.
- MEGATRON_LM: NVIDIA/Megatron-LM README.md, "Performance Benchmarking", and its model table
  (images/model_table.png, added in f2e5db402c, July 2024; unchanged at d98e8a64dd): GPT models
  from 1.7B to 462B on H100 with Megatron-Core r0.8.0, vocabulary 131,072, sequence 4,096,
  "--overlap-grad-reduce, --overlap-param-gather" (the distributed optimizer: ``zero1``) and
  "--tp-comm-overlap" (``overlap = true``). Step time = F / (TFLOP/s per GPU · GPUs) with
  Megatron-LM's own count of that time (``num_floating_point_operations`` in
  megatron/training/training.py at cf1d4d12a7, July 2024: 12·B·s·L·h²·((1 + g/a + s/h) +
  f/h + V/(2·L·h)), with g = a and f = 4h: 72·B·s·L·h²(1 + s/(6h) + V/(12·L·h))). The table
  does not give the micro-batch size or the interleaving: one sequence and no interleaving are
  assumed (batch / d = 4p micro-batches per replica), bf16 with fp32 gradients (``precision
  megatron``), sequence parallelism wherever t > 1 (--tp-comm-overlap requires it), no
  recomputation, fused attention.
- BLOOM: BigScience's BLOOM 176B run (bigscience-workshop/bigscience at 9e64ede,
  train/tr11-176B-ml: the launch script's layout and the step time its training log printed,
  105.22 s at the full global batch; :func:`bloom_rows`). Held out only: a Megatron-DeepSpeed
  run on a cluster whose network (Omni-Path, 6.25 GB/s per GPU) is none of the profiles'.
- LLM_FOUNDRY: mosaicml/llm-foundry scripts/train/benchmarking/README.md at 061f2c7ce6, "A100
  40GB with 1600 Gbps node-node interconnect (RoCE)": MPT-7B to 70B under FSDP full shard on 8
  to 128 GPUs at sequence 2,048 (:func:`llm_foundry_rows`). Step time = GlobalBatchSize (T) /
  Throughput (T/s). Held out only: ZeRO-3 / FSDP at several data-parallel degrees.
- TORCHTITAN_H100: pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md at
  31a17bfdb7, Tables 1 and 3 (FSDP2, Llama 3.1 8B, 8 and 128 H100 96GB at 500 W, no
  torch.compile): step = local batch · sequence / TPS per GPU (:func:`torchtitan_h100_rows`).

Peers (benchmarks/peers.py): llm-analysis (pinned, ``pip install .[peers]`` in a venv of its own)
on the rows it can express, its matmul efficiency set to placeverify's fitted η_max, its
errors printed beside placeverify's on the same rows; Calculon is not on PyPI (the benchmark
says so). Without llm-analysis importable the benchmark says "not installed" and runs on.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)
import peers  # noqa: E402  (benchmarks/peers.py: llm-analysis and Calculon on the same rows)

from placeverify.api import costs, load_text  # noqa: E402
from placeverify.cost import Costs  # noqa: E402
from placeverify.cost.time import CALIBRATION, Calibration, step_time  # noqa: E402
from placeverify.ir.strategy import Strategy  # noqa: E402


@dataclass(frozen=True)
class Row:
    source: str
    label: str
    text: str  # the .place file
    measured: float  # seconds per step
    calibrate: bool  # used to fit the constants (False: held out)


# ---- Narayanan et al. 2021, Table 1 ----------------------------------------------------------

# (params B, heads, h, layers, t, p, GPUs, global batch, micro-batch, TFLOP/s per GPU,
#  layers per virtual stage or None for 1F1B)
NARAYANAN = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 16, 137, None),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 16, 138, None),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 16, 142, None),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 8, 135, None),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 4, 138, None),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 2, 140, 5),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 2, 148, 5),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 1, 155, 3),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 1, 163, 1),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 1, 163, None),
]


def gpt_model(layers: int, h: int, heads: int, seq: int, mb: int, vocab: int = 51200) -> str:
    return (f"model transformer {{ layers = {layers}, hidden = {h}, heads = {heads}, "
            f"ffn = {4 * h}, mlp = plain, vocab = {vocab}, seq = {seq}, micro_batch = {mb}, "
            "position = learned, norm = layernorm, bias = true, attention = standard }")


def mesh(device: str, axes: list[tuple[str, int]], extra: str = "") -> str:
    """Axes innermost last: tensor parallelism inside a node, as the runs placed it."""
    lines = [f"    {n} = {k}" for n, k in axes if k > 1 or n == "dp"]
    return "mesh {\n" + "\n".join(lines) + f"\n    device = {device}\n{extra}}}"


def pipeline_line(p: int, m: int, chunks: int, scatter_gather: bool = False) -> str:
    """``scatter_gather``: Megatron-LM's default of 2021-2022 (``--no-scatter-gather-tensors-in-
    pipeline`` turns it off; Narayanan et al. 2021 §4.1), used by the runs of both papers."""
    if p == 1:
        return ""
    sg = ", scatter_gather = true" if scatter_gather else ""
    if chunks > 1:
        return f"place pipeline(interleaved, microbatches = {m}, chunks = {chunks}{sg}) over pp\n"
    return f"place pipeline(1f1b, microbatches = {m}{sg}) over pp\n"


def narayanan_rows() -> list[Row]:
    """The layouts and DDP of the paper's own scripts (NVIDIA/Megatron-LM
    ``examples/sc21/run_table_1.sh``, "scripts for sc21", de7dc40f88, 2021-08-10; now
    ``examples/academic_paper_scripts/sc21``): the pipelined rows run ``--DDP-impl local``, whose
    gradients Megatron-LM all-reduces after the whole forward-backward (``train_step`` calls
    ``allreduce_gradients`` once ``forward_backward_func`` returns, the hooks only accumulating
    into the main gradient): ``ddp(overlap = none)``. The rows without a pipeline (1.7B to 18B)
    run ``DDP=torch``: PyTorch's DistributedDataParallel, which Megatron-LM's
    ``forward_backward_no_pipelining`` keeps in ``no_sync`` for all but the last micro-batch,
    whose backward then all-reduces the gradients bucket by bucket: ``ddp``, the reduction
    hidden behind the last backward."""
    rows = []
    for i, (b, a, h, l, t, p, n, B, mb, tflops, per_virtual) in enumerate(NARAYANAN):
        d = n // (t * p)
        m = B // (d * mb)
        v = l // (p * per_virtual) if per_virtual else 1
        s, V = 2048, 51200
        flops = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
        measured = flops / (tflops * 1e12 * n)
        text = (f'strategy "Narayanan 2021 Table 1: {b}B"\n{gpt_model(l, h, a, s, mb)}\n'
                "precision mixed_adam\n"
                + mesh("a100_80gb_sxm", [("dp", d), ("pp", p), ("tp", t)]) + "\n"
                + ("place ddp(overlap = none) over dp\n" if p > 1 else "place ddp over dp\n")
                + ("place megatron over tp\n" if t > 1 else "")
                + pipeline_line(p, m, v, scatter_gather=True)
                + ("" if p > 1 else f"microbatches = {m}\n") + "recompute full\n")
        rows.append(Row("narayanan", f"{b}B t{t} p{p} d{d} m{m}" + (f" v{v}" if v > 1 else ""),
                        text, measured, i % 2 == 0))
    return rows


def megatron_gpt3_row() -> Row:
    """GPT-3 175B on 1,024 A100 at its full batch of 1,536 (held out), the run Megatron-LM's
    README published with its launch script (NVIDIA/Megatron-LM at 152aab304d, 2021-01-11):
    ``examples/pretrain_gpt3_175B.sh`` runs 128 nodes x 8 tasks (``#SBATCH --nodes=128
    --ntasks-per-node=8``, one srun task per GPU) with ``--tensor-model-parallel-size 8
    --pipeline-model-parallel-size 16`` (so d = 8), micro-batch 1 (192 micro-batches),
    ``--fp16`` (gradients all-reduced in fp16: no ``--accumulate-allreduce-grads-in-fp32``) and
    ``--checkpoint-activations``; its README: "With full global batch size of 1536 on 1024 A100
    GPUs, each iteration takes around 32 seconds resulting in 138 teraFLOPs per GPU". The step
    time is taken from the 138 TFLOP/s with Narayanan et al.'s count (the same team's
    convention; 31.9 s, "around 32"). That Megatron-LM had no interleaved schedule in the
    script, no scatter-gather of the pipeline's tensors (27fc468964, 2021-01-20) and no async
    tensor-parallel all-reduce (2021-08): plain 1F1B, every collective waited for; its
    DDP all-reduced after the whole forward-backward (:func:`narayanan_rows`)."""
    l, h, a, s, V, B, n = 96, 12288, 96, 2048, 51200, 1536, 1024
    flops = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    text = ('strategy "Megatron-LM README (2021-01): GPT-3 175B on 1,024 A100"\n'
            f"{gpt_model(l, h, a, s, 1)}\nprecision mixed_adam\n"
            + mesh("a100_80gb_sxm", [("dp", 8), ("pp", 16), ("tp", 8)]) + "\n"
            "place ddp(overlap = none) over dp\nplace megatron over tp\n"
            + pipeline_line(16, 192, 1) + "recompute full\n")
    return Row("megatron-lm-2021", "GPT-3 175B t8 p16 d8 m192", text,
               flops / (138e12 * n), False)


# ---- Korthikanti et al. 2022, Table 5 --------------------------------------------------------

# (name, h, heads, layers, p, GPUs, batch, chunks, s/iter full recompute, s/iter SP + selective)
KORTHIKANTI = [
    ("22B", 6144, 64, 48, 1, 8, 4, 1, 1.42, 1.10),
    ("175B", 12288, 96, 96, 8, 64, 64, 3, 18.13, 13.75),
    ("530B", 20480, 128, 105, 35, 280, 280, 3, 49.05, 37.83),
    ("1T", 25600, 160, 128, 64, 512, 512, 1, 94.42, 71.49),
]


def korthikanti_rows() -> list[Row]:
    """Megatron-LM of the paper (its sequence-parallel branch of 2022-03 to 2022-05, whose
    ``LinearWithGradAccumulationAndAsyncCommunication`` Megatron-LM keeps) runs the column-parallel layers'
    backward collectives beside their GEMMs: the input all-gathered again beside the
    input-gradient GEMM and the input gradient reduce-scattered beside the weight-gradient GEMM
    (``async_op=True``), or, without sequence parallelism, the input gradient all-reduced beside
    the weight-gradient GEMM (``--async-tensor-model-parallel-allreduce``, on by default since
    2021-09): ``overlap = backward``."""
    rows = []
    for i, (name, h, a, l, p, _n, B, v, full, selective) in enumerate(KORTHIKANTI):
        mb = 4 if name == "22B" else 1
        m = B // mb
        for j, (kind, measured) in enumerate((("full", full), ("selective", selective))):
            # Megatron-LM of the paper (2022) overlaps the column-parallel layers' backward
            # collectives with their GEMMs: ``overlap = backward`` (korthikanti_rows)
            tp = ("megatron(sequence_parallel, overlap = backward)" if kind == "selective"
                  else "megatron(overlap = backward)")
            text = (f'strategy "Korthikanti 2022 Table 5: {name}, {kind}"\n'
                    f"{gpt_model(l, h, a, 2048, mb)}\nprecision megatron\n"
                    + mesh("a100_80gb_sxm", [("pp", p), ("tp", 8)]) + "\n"
                    + f"place {tp} over tp\n" + pipeline_line(p, m, v, scatter_gather=True)
                    + ("" if p > 1 else f"microbatches = {m}\n") + f"recompute {kind}\n")
            rows.append(Row("korthikanti", f"{name} p{p} {kind}", text, measured,
                            (i + j) % 2 == 0))
    return rows


# ---- Llama 3, Table 4 -------------------------------------------------------------------------

# (GPUs, t, cp, p, d, seq, sequences per DP group per step, TFLOP/s per GPU)
LLAMA3 = [
    (8192, 8, 1, 16, 64, 8192, 32, 430),
    (16384, 8, 1, 16, 128, 8192, 16, 400),
    (16384, 8, 16, 16, 8, 131072, 16, 380),
]
LLAMA3_405B_PARAMS = 405_853_388_800  # docs: placeverify's exact count of llama3_405b


def llama3_rows() -> list[Row]:
    rows = []
    for i, (n, t, cp, p, d, s, per_dp, tflops) in enumerate(LLAMA3):
        tokens = d * per_dp * s
        flops = tokens * (6 * LLAMA3_405B_PARAMS + 12 * 126 * 16384 * s)
        measured = flops / (tflops * 1e12 * n)
        # 126 layers, "one Transformer layer each from the first and the last stages" less,
        # so that "the first model chunk on the first stage has only the embedding, and the
        # last model chunk on the last stage has only output projection and loss calculation"
        # (§3.3.2): a chunk held one layer of 126 + 2, so 128 chunks over p = 16 stages is
        # v = 8, and the virtual stages hold 0, 1 x 126, 0.
        cp_axis = [("cp", cp)] if cp > 1 else []
        v = (126 + 2) // p
        layers = ", ".join(["0", *["1"] * (v * p - 2), "0"])
        text = (f'strategy "Llama 3 Table 4: 405B on {n} GPUs, seq {s}"\n'
                f"model llama3_405b {{ seq = {s}, micro_batch = 1 }}\n"
                "precision megatron\n"
                + mesh("h100_sxm", [("dp", d), ("pp", p), *cp_axis, ("tp", t)]) + "\n"
                # FSDP without resharding after forward gathers the parameters once a step
                # and keeps them: ZeRO-2's (R, S, S, R); "FP32 gradient accumulation during
                # backward computation over multiple micro-batches" (§3.3.2), then one
                # reduce-scatter per model chunk: reduce = step
                "place zero2(reduce = step) over dp\n"
                "place megatron(sequence_parallel) over tp\n"
                + ("place context over cp\n" if cp > 1 else "")
                + f"place pipeline(interleaved, microbatches = {per_dp}, chunks = {v}, "
                f"layers = [{layers}]) over pp\n"
                "recompute none\n")
        rows.append(Row("llama3", f"405B {n} GPUs cp{cp} seq {s}", text, measured, i == 0))
    return rows


# ---- NeMo 24.07 performance summary (FP8, DGX-H100) ----------------------------------------

def llama2(layers: int, h: int, heads: int, kv: int, ffn: int, seq: int) -> str:
    return (f"model transformer {{ layers = {layers}, hidden = {h}, heads = {heads}, "
            f"kv_heads = {kv}, ffn = {ffn}, mlp = gated, vocab = 32000, seq = {seq}, "
            "micro_batch = 1, position = rotary, norm = rmsnorm, attention = flash }")


MODELS = {
    # NeMo's GPT-3 configs (examples/nlp/language_modeling/conf/megatron_gpt_config*): GELU MLP,
    # LayerNorm, learned positions, 50,257-token GPT-2 vocabulary padded by Megatron.
    "GPT3-5B": "model transformer { layers = 24, hidden = 4096, heads = 32, ffn = 16384, "
               "mlp = plain, vocab = 50257, vocab_divisible_by = 128, seq = 2048, "
               "micro_batch = 4, position = learned, norm = layernorm, bias = true, "
               "attention = flash }",
    "GPT3-20B": "model transformer { layers = 44, hidden = 6144, heads = 48, ffn = 24576, "
                "mlp = plain, vocab = 50257, vocab_divisible_by = 128, seq = 2048, "
                "micro_batch = 2, position = learned, norm = layernorm, bias = true, "
                "attention = flash }",
    "GPT3-175B": "model gpt3_175b { seq = 2048, micro_batch = 1, attention = flash }",
    # Llama 2 (Touvron et al. 2023, arXiv 2307.09288, and its released configs).
    "LLAMA2-7B": llama2(32, 4096, 32, 32, 11008, 4096),
    "LLAMA2-13B": llama2(40, 5120, 40, 40, 13824, 4096),
    "LLAMA2-70B": llama2(80, 8192, 64, 8, 28672, 4096),
    "LLAMA3-8B": "model llama3_8b { seq = 8192, micro_batch = 1 }",
    "LLAMA3-70B": "model llama3_70b { seq = 8192, micro_batch = 1 }",
}

# (model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s/GPU)
NEMO = [
    ("GPT3-5B", 64, 2048, 4, 2048, 1, 1, 1, 1, 22521),
    ("GPT3-20B", 64, 256, 2, 2048, 2, 1, 1, 1, 5851),
    ("GPT3-175B", 128, 256, 1, 2048, 4, 8, 1, 6, 726),
    ("GPT3-175B", 512, 2048, 2, 2048, 4, 8, 1, 6, 782),
    ("LLAMA2-7B", 8, 128, 1, 4096, 1, 1, 1, 1, 16847),
    ("LLAMA2-13B", 16, 128, 1, 4096, 1, 4, 1, 10, 8646),
    ("LLAMA2-70B", 64, 128, 1, 4096, 4, 4, 1, 20, 1707),
    ("LLAMA3-8B", 8, 128, 1, 8192, 1, 1, 2, 1, 12036),
    ("LLAMA3-70B", 64, 128, 1, 8192, 4, 4, 2, 5, 1533),
]


# The layouts whose NeMo-Framework-Launcher configurations set ``ub_tp_comm_overlap: true``
# (launcher_scripts/conf/training/): llama/llama3_70b.yaml (TP 4, PP 4, VP 5, CP 2, sequence
# 8,192: this row's layout) and gpt3/175b_fp8_performance.yaml ("the best 175B training
# performance with the NeMo SW stack": TP 4, PP 8, FP8). llama/llama2_70b.yaml sets it false
# and no launcher configuration of GPT-3 20B at TP 2 was found: those run Megatron-core's
# default, the column-parallel layers' backward collectives beside their GEMMs (Transformer
# Engine's Linear: "Overlap dgrad-RS/AR with wgrad"): ``overlap = backward``.
NEMO_TP_OVERLAP = ("GPT3-175B", "LLAMA3-70B")


def nemo_rows() -> list[Row]:
    rows = []
    for i, (name, n, B, mb, s, t, p, cp, vp, tps) in enumerate(NEMO):
        d = n // (t * p * cp)
        m = B // (mb * d)
        model = MODELS[name].replace("micro_batch = 4", f"micro_batch = {mb}").replace(
            "micro_batch = 2", f"micro_batch = {mb}").replace("micro_batch = 1",
                                                              f"micro_batch = {mb}")
        axes = [("dp", d), ("pp", p), ("cp", cp), ("tp", t)]
        text = (f'strategy "NeMo 24.07 FP8: {name} on {n} GPUs"\n{model}\nprecision megatron\n'
                + mesh("h100_sxm", axes, "    matmul = fp8\n") + "\n"
                "place zero1 over dp\n"
                + (("place megatron(sequence_parallel, overlap = true) over tp\n"
                    if name in NEMO_TP_OVERLAP else
                    "place megatron(sequence_parallel, overlap = backward) over tp\n")
                   if t > 1 else "")
                + ("place context over cp\n" if cp > 1 else "")
                + pipeline_line(p, m, vp) + ("" if p > 1 else f"microbatches = {m}\n")
                + "recompute none\n")
        rows.append(Row("nemo", f"{name} {n} GPUs t{t} p{p} cp{cp} v{vp}", text, B * s / (tps * n),
                        i % 2 == 0))
    return rows


# ---- torchtitan docs/performance.md (FSDP2, 64 A100) -----------------------------------------

# (model, local batch, activation checkpointing, WPS per GPU)
TORCHTITAN = [
    ("LLAMA3-8B", 1, "selective layer", 2904),
    ("LLAMA3-8B", 1, "selective op", 2973),
    ("LLAMA3-70B", 1, "full", 331),
    ("LLAMA2-13B", 2, "no", 2162),
    ("LLAMA2-13B", 2, "selective layer", 1914),
    ("LLAMA2-13B", 2, "selective op", 1904),
    ("LLAMA2-70B", 1, "selective op", 355),
    ("LLAMA2-70B", 2, "full", 353),
]


def torchtitan_rows() -> list[Row]:
    rows = []
    for i, (name, mb, ac, wps) in enumerate(TORCHTITAN):
        s = 8192 if name.startswith("LLAMA3") else 4096
        model = MODELS[name].replace("micro_batch = 1", f"micro_batch = {mb}")
        # torchtitan's activation_checkpoint.mode = "selective" (parallelize_llama.py at the
        # commit of the table, 0413364): selective_ac_option "op" is `selective_op` (every other
        # matmul's output saved); a digit n wraps every n-th block in full checkpointing. The
        # table does not say which n; config_manager.py's default, "2", is assumed.
        recompute = {"no": "none", "full": "full", "selective layer": "full(every = 2)",
                     "selective op": "selective_op"}[ac]
        text = (f'strategy "torchtitan FSDP2: {name}, local batch {mb}, AC {ac}"\n{model}\n'
                "precision megatron\n" + mesh("a100_80gb_sxm", [("dp", 64)]) + "\n"
                "place fsdp over dp\n" + f"recompute {recompute}\n")
        rows.append(Row("torchtitan", f"{name} b{mb} AC {ac}", text, mb * s / wps, i % 2 == 1))
    return rows


# ---- Megatron-Bridge 25.11 performance summary (DGX-H100) -------------------------------------

# (GPUs, GBS, t, p, cp, v, tokens/s/GPU): LLAMA3.1_405B, FP8-CS, MBS 1, sequence 8192, FSDP 0.
MEGATRON_BRIDGE = [(1024, 512, 8, 8, 2, 8, 292)]


def megatron_bridge_rows() -> list[Row]:
    """The recipe at the same commit (scripts/performance/configs/llama/): the layout above,
    ``grad_reduce_in_fp32 = False`` (bf16 gradients: ``precision bf16_adam``), Megatron's
    distributed optimizer (``zero1``), ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split`` (126 layers + 2 over p · v = 64 virtual stages:
    1, 2 x 62, 1), and TP communication overlap (userbuffers: ``overlap = true``)."""
    rows = []
    for n, gbs, t, p, cp, v, tps in MEGATRON_BRIDGE:
        d = n // (t * p * cp)
        m = gbs // d
        layers = ", ".join(["1", *["2"] * (v * p - 2), "1"])
        text = (f'strategy "Megatron-Bridge 25.11 FP8-CS: Llama 3.1 405B on {n} H100"\n'
                "model llama3_405b { seq = 8192, micro_batch = 1 }\nprecision bf16_adam\n"
                + mesh("h100_sxm", [("dp", d), ("pp", p), ("cp", cp), ("tp", t)],
                       "    matmul = fp8\n") + "\n"
                "place zero1 over dp\nplace megatron(sequence_parallel, overlap = true) over tp\n"
                "place context over cp\n"
                f"place pipeline(interleaved, microbatches = {m}, chunks = {v}, "
                f"layers = [{layers}]) over pp\n"
                "recompute none\n")
        rows.append(Row("megatron-bridge", f"LLAMA3.1-405B {n} GPUs t{t} p{p} cp{cp} v{v}",
                        text, gbs * 8192 / (tps * n), False))
    return rows


# ---- Megatron-LM README model table (Megatron-Core r0.8.0, H100) --------------------------------

# (label, heads, h, layers, t, p, d, GPUs, global batch, TFLOP/s per GPU)
MEGATRON_LM = [
    ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9),
]


def megatron_lm_rows() -> list[Row]:
    rows = []
    vocab, s = 131072, 4096
    for i, (label, a, h, layers, t, p, d, n, batch, tflops) in enumerate(MEGATRON_LM):
        flops = 72 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * h * layers))
        m = batch // d
        model = (f"model transformer {{ layers = {layers}, hidden = {h}, heads = {a}, "
                 f"ffn = {4 * h}, mlp = plain, vocab = {vocab}, embeddings = untied, seq = {s}, "
                 "micro_batch = 1, position = learned, norm = layernorm, bias = true, "
                 "attention = flash }")
        text = (f'strategy "Megatron-Core r0.8.0 on H100: GPT {label}, t {t}, p {p}, d {d}"\n'
                f"{model}\nprecision megatron\n"
                + mesh("h100_sxm", [("dp", d), ("pp", p), ("tp", t)]) + "\n"
                "place zero1 over dp\n"
                + ("place megatron(sequence_parallel, overlap = true) over tp\n" if t > 1 else "")
                + (pipeline_line(p, m, 1) if p > 1 else f"microbatches = {m}\n")
                + "recompute none\n")
        rows.append(Row("megatron-lm", f"GPT {label} t{t} p{p} d{d}", text,
                        flops / (tflops * 1e12 * n), i % 2 == 0))
    return rows


# ---- BLOOM 176B (BigScience, Megatron-DeepSpeed) ---------------------------------------------

def bloom_rows() -> list[Row]:
    """bigscience-workshop/bigscience at 9e64ede: train/tr11-176B-ml/tr11-176B-ml.slurm (TP 4,
    PP 12 on 48 nodes of 8 A100 80GB, so DP 8; micro-batch 2, global batch 2,048 of 2,048
    tokens: 128 micro-batches; 70 layers, hidden 14,336, 112 heads, ALiBi (no position table:
    ``position = none``), vocabulary padded to 250,880, tied embeddings, ``--bf16``,
    ``--checkpoint-activations``; ``ZERO_STAGE=0``, "bf16 must use z0! it implements its own
    zero stage 1 equivalent": ``zero1``; ``--pp-partition-method 'type:transformer|embedding'``
    counts the two tied embeddings as layers: 72 over 12 stages, 5, 6 x 10, 5 transformer
    layers), and the measured step in train/tr11-176B-ml/chronicles.md (2022-03-18, at full
    batch): "elapsed time per iteration (s): 105.22" (149 TFLOP/s per GPU).

    Written as the run ran and held out: DeepSpeed's pipeline engine reduces the gradients
    after the whole schedule (``overlap = none``) and runs 1F1B; no sequence parallelism, no
    fused attention (2022). The network is the README's "4 OmniPath links" of 100 Gbps per
    node: 50 GB/s shared by 8 GPUs, 6.25 GB/s per GPU; a data-parallel group holds 2 ranks of
    a node (tp 4 innermost, then dp), so 12.5 GB/s, a pipeline group 1. Not modelled: the
    BF16 optimizer all-reduces its gradients where ``zero1`` reduce-scatters them (about 0.5 s
    of the step), and the embedding LayerNorm."""
    model = ("model transformer { layers = 70, hidden = 14336, heads = 112, ffn = 57344, "
             "mlp = plain, vocab = 250880, embeddings = tied, seq = 2048, micro_batch = 2, "
             "position = none, norm = layernorm, bias = true, attention = standard }")
    layers = ", ".join(["5", *["6"] * 10, "5"])
    text = ('strategy "BLOOM 176B: tr11-176B-ml on 384 A100"\n'
            f"{model}\nprecision megatron\n"
            "mesh {\n    pp = 12 { bandwidth = 6.25 GB/s }\n    dp = 8 { bandwidth = 12.5 GB/s }\n"
            "    tp = 4\n    device = a100_80gb_sxm\n}\n"
            "place zero1(overlap = none) over dp\nplace megatron over tp\n"
            f"place pipeline(1f1b, microbatches = 128, layers = [{layers}]) over pp\n"
            "recompute full\n")
    return [Row("bloom", "176B t4 p12 d8 m128", text, 105.22, False)]


# ---- llm-foundry's MPT benchmarks (FSDP full shard, A100 40GB) --------------------------------

# mosaicml/llm-foundry scripts/train/benchmarking/README.md at 061f2c7ce64e655100286584a7629e2a09f827ba,
# "A100 40GB with 1600 Gbps node-node interconnect (RoCE)", sequence 2,048, bf16 PURE, FULL_SHARD,
# activation checkpointing True: (model, GPUs, micro-batch, grad accum, global batch (T),
# throughput (T/s))
LLM_FOUNDRY = [
    ("70b", 128, 4, 1, 1048576, 48194),
    ("70b", 64, 2, 1, 262144, 17672),
    ("30b", 128, 6, 1, 1572864, 110803),
    ("30b", 32, 4, 1, 262144, 27431),
    ("13b", 128, 16, 1, 4194304, 252444),
    ("13b", 64, 16, 1, 2097152, 126479),
    ("13b", 32, 14, 1, 917504, 63946),
    ("13b", 16, 10, 1, 327680, 31900),
    ("13b", 8, 4, 16, 1048576, 13347),
    ("7b", 128, 18, 1, 4718592, 463749),
    ("7b", 64, 18, 1, 2359296, 234614),
    ("7b", 32, 18, 1, 1179648, 119202),
    ("7b", 16, 16, 1, 524288, 58322),
    ("7b", 8, 12, 4, 786432, 29436),
]
# (layers, d_model, heads): the pretrain yamls (scripts/train/yamls/pretrain/mpt-*.yaml)
MPT = {"7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 64), "70b": (80, 8192, 64)}


def llm_foundry_rows() -> list[Row]:
    """MPT on A100 40GB under Composer's FSDP (torch FSDP1), held out: a ZeRO-3 family at 8 to
    128 GPUs with a fixed micro-batch per GPU, so the gathered and reduced bytes per GPU stay
    while the compute per GPU varies with the micro-batch. MPT (llm-foundry's MPTConfig
    defaults with the pretrain yamls' sizes): GELU MLP of 4 · d_model, LayerNorm with biases,
    biases on every linear layer, learned positions of max_seq_len rows (the tables'
    NumParams grow by 2,048 · d_model from sequence 1,024 to 2,048: 6,658,859,008 for 7b, which
    placeverify's count of this model matches), the word table tied to the output layer,
    vocabulary 50,368, ``attn_impl: triton`` (fused: ``flash``). ``mixed_precision: PURE``
    (llm-foundry's FSDP config: param, reduce and buffer dtype bf16, the sharded flat
    parameters fp32), ``decoupled_adamw`` (fp32 m and v), activation checkpointing of every
    block (``recompute full``). Measured step = GlobalBatchSize (T) / Throughput (T/s)."""
    rows = []
    for name, n, mb, accum, tokens, tps in LLM_FOUNDRY:
        layers, h, heads = MPT[name]
        model = (f"model transformer {{ layers = {layers}, hidden = {h}, heads = {heads}, "
                 f"ffn = {4 * h}, mlp = plain, vocab = 50368, embeddings = tied, seq = 2048, "
                 f"micro_batch = {mb}, position = learned, norm = layernorm, bias = true, "
                 "attention = flash }")
        text = (f'strategy "llm-foundry MPT-{name} on {n} A100 40GB, FSDP full shard"\n{model}\n'
                "precision { params = fp32, gather = bf16, grads = fp32, reduce = bf16, "
                "optimizer = 8, activations = bf16, loss_scale = none }\n"
                + mesh("a100_40gb_sxm", [("dp", n)]) + "\nplace fsdp over dp\n"
                + f"microbatches = {accum}\nrecompute full\n")
        rows.append(Row("llm-foundry", f"MPT-{name} {n} GPUs b{mb} x{accum}", text,
                        tokens / tps, False))
    return rows


# ---- torchtitan's H100 benchmarks (FSDP2, Llama 3.1 8B, 96GB H100 at 500 W) ---------------------

# pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md at 31a17bfdb7, Tables 1 and 3:
# "FSDP" without torch.compile or Float8, local batch 2, selective activation checkpointing:
# (GPUs, TPS/GPU)
TORCHTITAN_H100 = [(8, 5762), (128, 5605)]


def torchtitan_h100_rows() -> list[Row]:
    """Held out: FSDP2 at 8 and 128 GPUs on the Grand Teton H100 (96GB HBM2e, 2.4 TB/s, 400 Gb/s
    per GPU, a 500 W power limit: the ``h100_96gb_500w`` profile, whose peak is the SXM's, an
    upper bound the page itself uses). torchtitan at the page's commit (9dec370, 2024-12):
    ``train_configs/llama3_8b.toml`` sets ``selective_ac_option = 'op'`` (``recompute
    selective_op``) and the FSDP2 mixed precision of bf16 parameters and fp32 reductions
    (``torchtitan_bf16``); sequence 8,192. Step = local batch · 8,192 / TPS. The rows with
    torch.compile and Float8 are left out: placeverify has no term for what compile fuses."""
    rows = []
    for n, tps in TORCHTITAN_H100:
        text = (f'strategy "torchtitan FSDP2 on {n} H100 96GB (500 W): Llama 3.1 8B"\n'
                "model llama3_8b { seq = 8192, micro_batch = 2 }\nprecision torchtitan_bf16\n"
                + mesh("h100_96gb_500w", [("dp", n)]) + "\nplace fsdp over dp\n"
                "recompute selective_op\n")
        rows.append(Row("torchtitan-h100", f"LLAMA3.1-8B {n} GPUs b2 AC op", text,
                        2 * 8192 / tps, False))
    return rows


def all_rows() -> list[Row]:
    return [*narayanan_rows(), megatron_gpt3_row(), *korthikanti_rows(), *llama3_rows(), *nemo_rows(),
            *torchtitan_rows(), *megatron_bridge_rows(), *megatron_lm_rows(), *bloom_rows(),
            *llm_foundry_rows(), *torchtitan_h100_rows()]


# ---- fitting ------------------------------------------------------------------------------------

Loaded = tuple[Row, Strategy, Costs]


def load(rows: list[Row]) -> list[Loaded]:
    """Each row with its strategy and costs."""
    out: list[Loaded] = []
    for row in rows:
        strategy = load_text(row.text, f"<{row.label}>")
        out.append((row, strategy, costs(strategy)))
    return out


def predict(loaded: Loaded, cal: Calibration) -> float:
    _, strategy, cost = loaded
    result = step_time(strategy, cost, cal)
    assert result is not None and result.step_seconds is not None
    return result.step_seconds


def error(loaded: Loaded, cal: Calibration) -> float:
    return predict(loaded, cal) / loaded[0].measured - 1


def score(rows: list[Loaded], cal: Calibration) -> float:
    errors = sorted(abs(error(r, cal)) for r in rows)
    return statistics.median(errors) + 0.5 * errors[-1]


# The grid the fit searches: (score_passes, hidden_passes, ffn_passes, link_efficiency,
# attention_efficiency, fp8_cast_bytes, tp_overlap, backward_overlap, data_overlap)
GRID = (
    [0.0, 4.0, 8.0, 16.0],  # score_passes
    [0.0, 4.0, 8.0, 16.0, 32.0],  # hidden_passes
    [0.0, 2.0, 4.0, 8.0],  # ffn_passes
    [0.8, 1.0],  # link_efficiency
    [0.2, 0.3, 0.4, 0.6],  # attention_efficiency
    [0.0, 4.0, 8.0],  # fp8_cast_bytes
    [0.7, 0.85, 1.0],  # tp_overlap
    [0.0, 0.5, 1.0],  # backward_overlap
    [0.8, 0.9, 1.0],  # data_overlap
)

_ROWS: list[Loaded] = []  # a fitting process's calibration rows (_load_rows)


def _load_rows(labels: list[str]) -> None:
    _ROWS[:] = [r for r in load(all_rows()) if r[0].label in labels]


def _fit_point(point: tuple[float, ...]) -> tuple[float, Calibration]:
    """The constants of one grid point, η_max of every (device, dtype) class by fixed-point
    iteration (η ← η · median predicted/measured over its rows), and their score."""
    rows = _ROWS
    classes = sorted({_class(r) for r in rows})
    scores, hidden, ffn, link, attention, casts, overlap, backward, data = point
    eff = {c: 0.6 for c in classes}
    cal = replace(CALIBRATION, score_passes=scores, hidden_passes=hidden, ffn_passes=ffn,
                  link_efficiency=link, attention_efficiency=attention, fp8_cast_bytes=casts,
                  tp_overlap=overlap, backward_overlap=backward, data_overlap=data)
    for _ in range(4):
        cal = replace(cal, efficiency=(("default", 0.5), *sorted(eff.items())))
        for c in classes:
            ratios = [predict(r, cal) / r[0].measured for r in rows if _class(r) == c]
            eff[c] = min(0.95, eff[c] * statistics.median(ratios))
    cal = replace(cal, efficiency=(("default", 0.5),
                                   *sorted((k, round(v, 3)) for k, v in eff.items())))
    return score(rows, cal), cal


def fit(rows: list[Loaded]) -> Calibration:
    """Every point of GRID (the memory-bound passes, the link and attention efficiencies, the
    fp8 casts, the two tensor-parallel overlap shares and the data-parallel one), each with its
    η_max (_fit_point), in as many processes as there are cores; keep the point with the least
    median + worst/2 of |error| over the calibration rows (ties: the first in GRID's order)."""
    labels = [r[0].label for r in rows]
    points = list(itertools.product(*GRID))
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, initializer=_load_rows,
                             initargs=(labels,)) as pool:
        results = list(pool.map(_fit_point, points, chunksize=256))
    return min(enumerate(results), key=lambda r: (r[1][0], r[0]))[1][1]


def _class(loaded: Loaded) -> str:
    mesh = loaded[1].mesh
    assert mesh.device is not None
    dtype = mesh.matmul or "bf16"
    return f"{mesh.device.compute_key}:{'16bit' if dtype in ('bf16', 'fp16') else dtype}"


def summary(rows: list[Loaded], cal: Calibration) -> tuple[float, float]:
    errors = [abs(error(r, cal)) for r in rows]
    return statistics.median(errors), max(errors)


def source_medians(rows: list[Loaded], cal: Calibration) -> dict[str, tuple[str, str]]:
    """Each source's median |error| on its calibration and held-out rows ("-": none)."""
    out = {}
    for src in dict.fromkeys(r[0].source for r in rows):
        cells = []
        for held in (False, True):
            errors = [abs(error(r, cal)) for r in rows
                      if r[0].source == src and r[0].calibrate is not held]
            cells.append(f"{statistics.median(errors):.1%}" if errors else "-")
        out[src] = (cells[0], cells[1])
    return out


def compare_peers(rows: list[Loaded], cal: Calibration) -> list[str]:
    """llm-analysis (when importable) on the rows it can express, its median |error| beside
    placeverify's on the same rows, per set; Calculon's status (benchmarks/peers.py).
    llm-analysis's ``flops_efficiency`` is set per device class as placeverify's η_max is: the
    value whose predictions' median ratio to the measured is 1 on that class's calibration rows
    (fixed-point iteration from 0.5, as :func:`_fit_point`), the held-out rows judging both."""
    lines = [peers.CALCULON_STATUS]
    peer, module = peers.llm_analysis()
    lines.append(peer.status)
    if module is None:
        return lines
    expressed: list[tuple[Loaded, dict]] = []
    left_out: dict[str, int] = {}
    for r in rows:
        args, why = peers.express(r[1], profile_links="bandwidth =" not in r[0].text)
        if args is None:
            left_out[why] = left_out.get(why, 0) + 1
        else:
            expressed.append((r, args))
    eff = {c: 0.5 for c in {_class(r) for r, _ in expressed}}
    for _ in range(4):
        for c in eff:
            ratios = [peers.run_llm_analysis(module, a, eff[c]) / r[0].measured
                      for r, a in expressed if _class(r) == c and r[0].calibrate]
            if ratios:  # llm-analysis's time scales as 1 / efficiency in its compute
                eff[c] = min(1.0, eff[c] * statistics.median(ratios))
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r, a in expressed:
        theirs = peers.run_llm_analysis(module, a, eff[_class(r)]) / r[0].measured - 1
        ours = error(r, cal)
        print(f"  llm-analysis {r[0].source:<15} {r[0].label:<38} "
              f"{'cal' if r[0].calibrate else 'held':<5} {theirs:+7.1%}  placeverify {ours:+7.1%}")
        results[not r[0].calibrate].append((abs(theirs), abs(ours)))
    lines.append("llm-analysis flops_efficiency fitted on the calibration rows: " + ", ".join(
        f"{c} {v:.3f}" for c, v in sorted(eff.items())))
    for held, name in ((False, "calibration"), (True, "held-out")):
        pairs = results[held]
        if pairs:
            lines.append(
                f"llm-analysis on the {len(pairs)} {name} rows it expresses: median |error| "
                f"{statistics.median(p[0] for p in pairs):.1%}, worst {max(p[0] for p in pairs):.1%};"
                f" placeverify on the same rows {statistics.median(p[1] for p in pairs):.1%}, "
                f"worst {max(p[1] for p in pairs):.1%}")
    lines.append("llm-analysis left out: " + (", ".join(
        f"{why} ({n})" for why, n in sorted(left_out.items())) or "none"))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shipped", action="store_true",
                        help="use the constants in placeverify/cost/time.py (no fitting)")
    parser.add_argument("--write", metavar="DIR", help="write every row's .place file there")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    loaded = load(all_rows())
    if args.write:
        out = Path(args.write)
        out.mkdir(parents=True, exist_ok=True)
        for row, _, _ in loaded:
            name = f"{row.source}-" + "".join(ch if ch.isalnum() else "-" for ch in row.label)
            (out / f"{name.strip('-')}.place").write_text(row.text, encoding="utf-8")
    calibration = [r for r in loaded if r[0].calibrate]
    held = [r for r in loaded if not r[0].calibrate]
    cal = CALIBRATION if args.shipped else fit(calibration)
    print(f"{'source':<15} {'row':<38} {'set':<5} {'measured s':>11} {'predicted s':>12} "
          f"{'error':>7}")
    table = ["| source | row | set | measured s | predicted s | error |", "|---|---|---|---:|---:|---:|"]
    for r in loaded:
        p = predict(r, cal)
        print(f"{r[0].source:<15} {r[0].label:<38} {'cal' if r[0].calibrate else 'held':<5} "
              f"{r[0].measured:>11.3f} {p:>12.3f} {p / r[0].measured - 1:>+7.1%}")
        table.append(f"| {r[0].source} | {r[0].label} | {'cal' if r[0].calibrate else 'held'} | "
                     f"{r[0].measured:.3f} | {p:.3f} | {p / r[0].measured - 1:+.1%} |")
    print()
    print(f"constants: efficiency {dict(cal.efficiency)}, score_passes {cal.score_passes}, "
          f"hidden_passes {cal.hidden_passes}, attention_efficiency {cal.attention_efficiency}, "
          f"link_efficiency {cal.link_efficiency}, fp8_cast_bytes {cal.fp8_cast_bytes}, "
          f"memory_efficiency {cal.memory_efficiency}, tp_overlap {cal.tp_overlap}, "
          f"backward_overlap {cal.backward_overlap}, ffn_passes {cal.ffn_passes}, "
          f"data_overlap {cal.data_overlap}")
    sources = sorted({r[0].source for r in loaded})
    print(f"{len(loaded)} rows from {len(sources)} sources ({', '.join(sources)}); "
          f"{len(calibration)} calibration, {len(held)} held out")
    found: list[figures.Figure] = [
        ("published runs", f"{len(loaded)} rows from {len(sources)} sources ({', '.join(sources)}); "
                           f"{len(calibration)} calibration, {len(held)} held out"),
        ("constants", "the shipped ones (`placeverify/cost/time.py`)" if args.shipped
         else "fitted to the calibration rows by this run")]
    for name, subset in (("calibration", calibration), ("held-out", held)):
        median, worst = summary(subset, cal)
        print(f"{name:<12} median |error| {median:6.1%}   worst {worst:6.1%}")
        found.append((f"{name} rows: step time, predicted against published",
                      f"median error {median:.1%}, worst {worst:.1%}"))
    by_source = source_medians(loaded, cal)
    print("per source, median |error| (cal / held): " + ", ".join(
        f"{src} {c} / {h}" for src, (c, h) in by_source.items()))
    found.append(("per source: median error (calibration / held-out)", ", ".join(
        f"{src} {c} / {h}" for src, (c, h) in by_source.items())))
    peer_lines = compare_peers(loaded, cal)
    for line in peer_lines:
        print(line)
    found.extend(("peers", line) for line in peer_lines)
    if args.docs:
        figures.write_section("step_time", "Step time against published runs", found,
                              name=args.docs_name, tables=["\n".join(table)],
                              facts={**figures.machine(), "llm-analysis": peers.installed()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
