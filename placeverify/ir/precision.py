"""Numeric formats: bytes per element of each training state.

Presets follow the papers the figures come from: ``mixed_adam`` is the ZeRO paper's fp16
mixed-precision Adam (Θ 2, G 2, Ω 12: fp32 master weights, momentum and variance), ``megatron``
Megatron-LM's bf16 parameters with an fp32 gradient buffer (2 / 4 / 12, 18 bytes per parameter).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class LossScale(StrEnum):
    """Loss scaling of mixed-precision training (the lowering stores the word as written)."""

    DYNAMIC = "dynamic"  # fp16: scaled, and a step is skipped when gradients overflow
    STATIC = "static"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Precision:
    name: str
    params: Fraction  # bytes per parameter element (Θ)
    grads: Fraction  # bytes per gradient element (G)
    optimizer: Fraction  # optimizer-state bytes per parameter (Ω)
    activations: Fraction  # bytes per activation element (A)
    params_dtype: str
    grads_dtype: str
    loss_scale: str  # a LossScale value

    def with_overrides(self, **changes: object) -> Precision:
        return replace(self, **changes)  # type: ignore[arg-type]


def _preset(name: str, params: str, grads: str, optimizer: int, activations: str,
            loss_scale: LossScale) -> Precision:
    return Precision(name, Fraction(DTYPE_BYTES[params]), Fraction(DTYPE_BYTES[grads]),
                     Fraction(optimizer), Fraction(DTYPE_BYTES[activations]), params, grads,
                     loss_scale)


PRECISIONS: dict[str, Precision] = {
    # ZeRO (arXiv 1910.02054) §3.1: fp16 parameters and gradients, fp32 master + Adam m, v.
    "mixed_adam": _preset("mixed_adam", "fp16", "fp16", 12, "fp16", LossScale.DYNAMIC),
    # Megatron-LM distributed optimizer docs: bf16 parameters, fp32 main grads, 18 bytes/param.
    "megatron": _preset("megatron", "bf16", "fp32", 12, "bf16", LossScale.NONE),
    "bf16_adam": _preset("bf16_adam", "bf16", "bf16", 12, "bf16", LossScale.NONE),
    "fp32_adam": _preset("fp32_adam", "fp32", "fp32", 8, "fp32", LossScale.NONE),
    "sgd": _preset("sgd", "fp32", "fp32", 0, "fp32", LossScale.NONE),
    "sgd_momentum": _preset("sgd_momentum", "fp32", "fp32", 4, "fp32", LossScale.NONE),
}
