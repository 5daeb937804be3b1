"""Numeric formats: the dtype of each training state and of each thing a step does with it.

A mixed-precision policy is several dtypes, not one: the parameters are stored in one (Θ, often
the optimizer's fp32 copy), all-gathered and computed with in another (FSDP2's ``param_dtype``),
the matmuls run in a third (tf32 for fp32 operands), gradients are accumulated in one (G) and
reduced in another (FSDP2's ``reduce_dtype``, DeepSpeed's ``communication_data_type``), and the
optimizer keeps its own state (Ω). :class:`Precision` holds each; what is not written follows
the state it comes from (the gathered dtype the stored one, the reduction the gradient's, the
matmuls the gathered parameters'), so a file that writes only Θ, G, Ω and A means what it meant
before these were separate. Memory, traffic and step time read them through the properties
below and nowhere else.

Presets follow the papers and frameworks the figures come from: ``mixed_adam`` is the ZeRO
paper's fp16 mixed-precision Adam (Θ 2, G 2, Ω 12: fp32 master weights, momentum and variance),
``megatron`` Megatron-LM's bf16 parameters with an fp32 gradient buffer (2 / 4 / 12, 18 bytes per
parameter), ``torchtitan_bf16`` and ``accelerate_fsdp_bf16`` the FSDP2 ``MixedPrecisionPolicy``
those two set by default (fp32 sharded Θ and G, bf16 gather and compute; torchtitan reduces in
fp32, accelerate in bf16: REFERENCE §10).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
MATMUL_DTYPES = ("bf16", "fp16", "fp8", "tf32")  # the dtypes a matmul runs in on a device profile


class LossScale(StrEnum):
    """Loss scaling of mixed-precision training (the lowering stores the word as written)."""

    DYNAMIC = "dynamic"  # fp16: scaled, and a step is skipped when gradients overflow
    STATIC = "static"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Precision:
    name: str
    params: Fraction  # bytes per parameter element as stored (Θ)
    grads: Fraction  # bytes per gradient element as accumulated and kept (G)
    optimizer: Fraction  # optimizer-state bytes per parameter (Ω)
    activations: Fraction  # bytes per activation element (A)
    params_dtype: str
    grads_dtype: str
    loss_scale: str  # a LossScale value
    gather_dtype: str | None = None  # Θ as all-gathered and computed with; None: as stored
    reduce_dtype: str | None = None  # G as reduced (all-reduce, reduce-scatter); None: as kept
    compute: str | None = None  # the dtype matmuls run in; None: from the gathered dtype

    def with_overrides(self, **changes: object) -> Precision:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def gathered_dtype(self) -> str:
        return self.gather_dtype or self.params_dtype

    @property
    def gathered(self) -> Fraction:
        """Bytes per element of Θ as all-gathered (an FSDP unit, a ZeRO-3 gather) and as the
        compute copy kept gathered."""
        return self.params if self.gather_dtype is None else Fraction(DTYPE_BYTES[self.gather_dtype])

    @property
    def reduced_dtype(self) -> str:
        return self.reduce_dtype or self.grads_dtype

    @property
    def reduced(self) -> Fraction:
        """Bytes per element of G as it crosses the links (all-reduce, reduce-scatter)."""
        return self.grads if self.reduce_dtype is None else Fraction(DTYPE_BYTES[self.reduce_dtype])

    @property
    def matmul(self) -> str:
        """The dtype the matmuls run in: ``compute`` as written, else the gathered parameters'
        (fp32 operands run as tf32 on tensor cores; fp8 stays fp8)."""
        if self.compute is not None:
            return self.compute
        dtype = self.gathered_dtype
        return "tf32" if dtype == "fp32" else dtype if dtype in MATMUL_DTYPES else "bf16"


def _preset(name: str, params: str, grads: str, optimizer: int, activations: str,
            loss_scale: LossScale, gather: str | None = None, reduce: str | None = None,
            compute: str | None = None) -> Precision:
    return Precision(name, Fraction(DTYPE_BYTES[params]), Fraction(DTYPE_BYTES[grads]),
                     Fraction(optimizer), Fraction(DTYPE_BYTES[activations]), params, grads,
                     loss_scale, gather, reduce, compute)


PRECISIONS: dict[str, Precision] = {
    # ZeRO (arXiv 1910.02054) §3.1: fp16 parameters and gradients, fp32 master + Adam m, v.
    "mixed_adam": _preset("mixed_adam", "fp16", "fp16", 12, "fp16", LossScale.DYNAMIC),
    # Megatron-LM distributed optimizer docs: bf16 parameters, fp32 main grads, 18 bytes/param.
    "megatron": _preset("megatron", "bf16", "fp32", 12, "bf16", LossScale.NONE),
    "bf16_adam": _preset("bf16_adam", "bf16", "bf16", 12, "bf16", LossScale.NONE),
    "fp32_adam": _preset("fp32_adam", "fp32", "fp32", 8, "fp32", LossScale.NONE),
    "sgd": _preset("sgd", "fp32", "fp32", 0, "fp32", LossScale.NONE),
    "sgd_momentum": _preset("sgd_momentum", "fp32", "fp32", 4, "fp32", LossScale.NONE),
    # FSDP2 MixedPrecisionPolicy (torch distributed/fsdp/_fully_shard/_fsdp_api.py): sharded Θ and
    # G keep the parameters' fp32, the all-gather and compute use param_dtype, the
    # reduce-scatter reduce_dtype; AdamW's m and v are fp32 (8 B), the fp32 Θ is the master.
    # torchtitan's defaults: mixed_precision_param bfloat16, mixed_precision_reduce float32.
    "torchtitan_bf16": _preset("torchtitan_bf16", "fp32", "fp32", 8, "bf16", LossScale.NONE,
                               gather="bf16", reduce="fp32"),
    # accelerate's FSDP plugin with mixed_precision bf16 sets param_dtype and reduce_dtype both
    # to bf16 (accelerate utils/dataclasses.py, FullyShardedDataParallelPlugin).
    "accelerate_fsdp_bf16": _preset("accelerate_fsdp_bf16", "fp32", "fp32", 8, "bf16",
                                    LossScale.NONE, gather="bf16", reduce="bf16"),
    # DeepSpeed bf16.enabled / fp16.enabled: the model (Θ, G, the reduction's default
    # communication_data_type) in 16 bits, fp32 master weights and Adam states in Ω (12 B).
    "deepspeed_bf16": _preset("deepspeed_bf16", "bf16", "bf16", 12, "bf16", LossScale.NONE),
    "deepspeed_fp16": _preset("deepspeed_fp16", "fp16", "fp16", 12, "fp16", LossScale.DYNAMIC),
}
