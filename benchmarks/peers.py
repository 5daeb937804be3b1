"""Peer step-time models run on ``benchmarks/step_time.py``'s rows (issue 32, item 8).

- **llm-analysis** (cli99/llm-analysis, PyPI ``llm-analysis``, pinned in the ``peers`` extra of
  pyproject.toml): ``LLMAnalysis.training`` with the row's model, GPU, layout, ZeRO stage and
  recomputation; its ``latency_per_iter`` is the step time. Its matmul efficiency is set by hand
  (``flops_efficiency``): placeverify's fitted η_max for the row's device (the same number
  placeverify runs with), its HBM and link efficiencies are its defaults. Installed apart from
  the project (it pins an old ``transformers``): ``pip install llm-analysis==0.2.2`` in a venv
  of its own, with placeverify's dependencies, then run the benchmark with that interpreter.
- **Calculon** (calculon-ai/calculon, Isaev et al. 2023): not on PyPI. The PyPI name
  ``calculon`` (1.1.1) is an unrelated producer-consumer library (jango/calculon), so no pinned
  package a CI with PyPI alone can install exists; the benchmark says so.

A row a peer cannot express (fp8 matmuls, context or expert parallelism, interleaved or uneven
pipelines, per-axis bandwidths, torchtitan's op-level checkpointing, HSDP) is left out for that
peer and counted: ``express`` returns the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placeverify.ir.placement import Mode, Role, Schedule, State
from placeverify.ir.strategy import Strategy

LLM_ANALYSIS_VERSION = "0.2.2"
CALCULON_STATUS = ("Calculon: not on PyPI (the PyPI name 'calculon' 1.1.1 is jango/calculon, a "
                   "producer-consumer library; calculon-ai/calculon publishes no package): not run")

# placeverify's device profiles to llm-analysis's bundled gpu_configs
GPUS = {"a100_80gb_sxm": "a100-sxm-80gb", "a100_40gb_sxm": "a100-sxm-40gb",
        "h100_sxm": "h100-sxm-80gb"}


@dataclass(frozen=True)
class Peer:
    name: str
    available: bool
    status: str  # what the benchmark prints about it


def installed() -> str:
    """llm-analysis's installed version, read from its metadata, or "not installed"."""
    import importlib.metadata

    try:
        return importlib.metadata.version("llm-analysis")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def llm_analysis() -> tuple[Peer, Any]:
    """The llm-analysis peer and its module, or why it is not run."""
    try:
        from llm_analysis import analysis  # type: ignore[import-not-found]
    except ImportError:
        return Peer("llm-analysis", False, "llm-analysis: not installed (pip install "
                    f"llm-analysis=={LLM_ANALYSIS_VERSION}): not run"), None
    return Peer("llm-analysis", True, f"llm-analysis {LLM_ANALYSIS_VERSION}: run"), analysis


def express(strategy: Strategy, profile_links: bool = True) -> tuple[dict[str, Any] | None, str]:
    """llm-analysis's arguments for a row, or None and why it cannot say it (``profile_links``:
    the row's links are its device profile's, none written per axis)."""
    arch, mesh = strategy.model.arch, strategy.mesh
    if arch is None or mesh.device is None:
        return None, "no architecture or device"
    if mesh.device.key not in GPUS:
        return None, f"no llm-analysis GPU for {mesh.device.key}"
    if (mesh.matmul or strategy.precision.matmul) not in ("bf16", "fp16"):
        return None, "fp8 matmuls"
    if arch.experts:
        return None, "mixture of experts"
    if not profile_links:
        return None, "per-axis bandwidths"
    tp = pp = dp = 1
    zero = 0
    for p in strategy.placements:
        size = strategy.size(p.axis)
        if p.role is Role.TENSOR:
            tp *= size
        elif p.role is Role.PIPELINE:
            pp *= size
        elif p.role is Role.DATA:
            dp *= size
            if p.mode(State.PARAMS) is Mode.S_STAR:
                zero = 3
            elif p.mode(State.GRADIENTS) is Mode.S:
                zero = max(zero, 2)
            elif p.mode(State.OPTIMIZER) is Mode.S:
                zero = max(zero, 1)
        elif size > 1:
            return None, f"{p.role.value} parallelism"
    if sum(1 for p in strategy.placements if p.role is Role.DATA) > 1:
        return None, "HSDP"
    pipeline = strategy.pipeline
    if pipeline is not None and strategy.size(pipeline.axis) > 1 and (
            pipeline.schedule is Schedule.INTERLEAVED or pipeline.layers is not None):
        return None, "interleaved or uneven pipeline"
    recompute = strategy.recompute.kind.value
    levels = {"none": 0, "selective": 1, "full": 2}
    if recompute not in levels or (recompute == "full" and strategy.recompute.every != 1):
        return None, f"recompute {recompute}" + (" every n" if recompute == "full" else "")
    return {
        "model": dict(name="row", num_layers=arch.layers, n_head=arch.heads,
                      hidden_dim=arch.hidden, vocab_size=arch.vocab, max_seq_len=arch.seq,
                      num_key_value_heads=arch.kv_heads, ffn_embed_dim=arch.ffn,
                      expansion_ratio=arch.ffn / arch.hidden),
        "gpu": GPUS[mesh.device.key],
        "parallel": dict(tp_size=tp, pp_size=pp, dp_size=dp, sp_size=tp if any(
            p.role is Role.TENSOR and p.sequence_parallel for p in strategy.placements) else 1),
        "training": dict(batch_size_per_gpu=arch.micro_batch,
                         gradient_accumulation_steps=strategy.microbatches, seq_len=arch.seq,
                         activation_recomputation=levels[recompute], ds_zero=zero,
                         flash_attn=arch.attention == "flash",
                         mlp_gated_linear_units=arch.gated),
    }, ""


def run_llm_analysis(module: Any, args: dict[str, Any], efficiency: float) -> float:
    """llm-analysis's step time (seconds) for expressed arguments at ``efficiency``."""
    import logging

    module.logger.setLevel(logging.ERROR)
    model = module.ModelConfig(**args["model"])
    gpu = module.get_gpu_config_by_name(args["gpu"])
    dtype = module.get_dtype_config_by_name("w16a16e16")
    parallel = module.ParallelismConfig(**args["parallel"])
    analysis = module.LLMAnalysis(model, gpu, dtype, parallel, flops_efficiency=efficiency,
                                  hbm_memory_efficiency=module.HBM_MEMORY_EFFICIENCY)
    t = dict(args["training"])
    summary = analysis.training(
        batch_size_per_gpu=t["batch_size_per_gpu"],
        gradient_accumulation_steps=t["gradient_accumulation_steps"], seq_len=t["seq_len"],
        activation_recomputation=module.ActivationRecomputation(t["activation_recomputation"]),
        ds_zero=module.DSZeRO(t["ds_zero"]), flash_attn=t["flash_attn"],
        mlp_gated_linear_units=t["mlp_gated_linear_units"])
    return float(summary["latency_per_iter"])
