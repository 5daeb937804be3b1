"""IEEE float32 helpers for the reduction-order obligation (``fp-order``): a witness that float32
addition is not associative, and float32 values from a Z3 model as short decimals."""

from __future__ import annotations

import itertools
import struct
from fractions import Fraction
from typing import Any

import z3


def float32_text(value: float) -> str:
    """The shortest decimal that reads back as the same float32."""
    exact = struct.unpack("f", struct.pack("f", value))[0]
    for digits in range(1, 10):
        text = f"{exact:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == exact:
            return text
    return repr(exact)


def fp_value(model: Any, term: Any) -> float:
    value = model.eval(term, model_completion=True)
    return float(Fraction(str(z3.simplify(z3.fpToReal(value)))))


def float32_witness() -> tuple[float, float, float]:
    """Three gradients whose float32 sum depends on the order, from short decimals: the
    deterministic search placeverify does before Z3 confirms the witness."""
    def f32(x: float) -> float:
        return float(struct.unpack("f", struct.pack("f", x))[0])

    values = [f32(v) for v in (0.1, 0.2, 0.3, 0.7, 1.0, 3.0, 1e-3, 1e3, 1e6, 1e8)]
    for a, b, c in itertools.product(values, repeat=3):
        if f32(f32(a + b) + c) != f32(f32(b + c) + a):
            return a, b, c
    raise AssertionError("float32 addition is not associative; a witness exists")
