"""The step-time model's fitted constants (:mod:`placeverify.cost.time`).

The matmul efficiency ``η_max`` per device and dtype kind, the memory-bound passes beside the
matmuls, the fused attention kernels' rate, the links' and HBM's achieved fractions, and the
shares of an overlapped collective that can hide behind compute. ``CALIBRATION`` holds the values
``benchmarks/step_time.py`` fits on its calibration rows (``docs/models/step-time.md``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Calibration:
    """The model's fitted constants (see the module docstring)."""

    efficiency: tuple[tuple[str, float], ...]  # ("device:kind", "kind" or "default", η_max)
    score_passes: float  # memory-bound passes over the s×s attention scores (unfused softmax,
    # mask, dropout), in activation-sized elements per score per layer forward
    hidden_passes: float  # memory-bound passes over the b·s·h hidden states of the replicated
    # region (norms, residuals, dropout: ÷ t under sequence parallelism only) per layer forward
    attention_efficiency: float  # fused (flash) attention kernels' rate relative to GEMMs
    link_efficiency: float  # achieved fraction of a link's bandwidth (NCCL bus bandwidth)
    fp8_cast_bytes: float  # HBM bytes per element of a GEMM input cast to fp8 per layer
    # forward (read, amax, write, transposed copy), twice in backward; matmul = fp8 only
    memory_efficiency: float  # achieved fraction of HBM bandwidth in the optimizer step
    # the share of an overlapped tensor-parallel collective's time that can hide behind the
    # GEMMs (``overlap = true``; the rest is exposed, as is what outlasts the GEMMs)
    tp_overlap: float = 1.0
    # the share of a column-parallel layer's backward collective that can hide behind its
    # input- or weight-gradient GEMM (``overlap = backward``: NCCL's kernels share the GPU with
    # the GEMM they run beside)
    backward_overlap: float = 1.0
    # memory-bound passes over the MLP's b·s·f intermediate (bias, activation; ``top_k`` experts'
    # under MoE), the tensor-parallel region (÷ t with or without sequence parallelism), per
    # layer forward
    ffn_passes: float = 0.0
    # the share of an overlapped data-parallel collective's time (a parameter gather, a gradient
    # reduction) that can hide behind the compute of its window; the rest is exposed, as is
    # what outlasts the window (NCCL's kernels share the GPU with the compute they run beside)
    data_overlap: float = 1.0

    def eta_max(self, device: str, dtype: str) -> float:
        """η_max for a device's matmuls in ``dtype`` (kind ``16bit`` for bf16 and fp16)."""
        kind = "16bit" if dtype in ("bf16", "fp16") else dtype
        table = dict(self.efficiency)
        return table.get(f"{device}:{kind}", table.get(kind, table["default"]))


# Fitted by benchmarks/step_time.py on its calibration rows (printed there; held-out rows judge).
CALIBRATION = Calibration(
    efficiency=(("default", 0.5), ("a100_80gb_sxm:16bit", 0.687), ("h100_sxm:16bit", 0.609),
                ("h100_sxm:fp8", 0.597)),
    score_passes=8.0,
    hidden_passes=8.0,
    attention_efficiency=0.3,
    link_efficiency=1.0,
    fp8_cast_bytes=8.0,
    memory_efficiency=0.7,
    tp_overlap=1.0,
    backward_overlap=1.0,
    ffn_passes=8.0,
    data_overlap=0.9,
)
