"""Numbers for tables read by people: byte counts in the unit asked for, with three significant
digits (four in the check report) and never fewer digits than the integer part has.

``auto`` (the default of ``compare --units``) picks a decimal prefix per value (B, KB, MB, GB,
TB, PB: GB = 10⁹ bytes, as the ZeRO paper, the check report and ``device_memory = 80 GB`` count);
``GB``/``MB`` fix a decimal unit and ``GiB``/``MiB`` a binary one (2³⁰, 2²⁰ bytes: what
``torch.cuda.memory_allocated() / 2**30``, ``torch.cuda.memory_summary`` and DeepSpeed's
``see_memory_usage`` print, the latter labelled "GB").
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

UNITS: dict[str, int] = {"GB": 10**9, "MB": 10**6, "GiB": 2**30, "MiB": 2**20}
AUTO = "auto"
CHOICES = (AUTO, *UNITS)
DECIMAL = (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
BINARY = (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def significant(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits (trailing zeros kept, so a column reads at one
    precision), all of its integer digits (thousands separated) when it has more, and in
    scientific form below 0.001."""
    if x == 0:
        return "0"
    rounded = float(f"{x:.{digits}g}")
    magnitude = math.floor(math.log10(abs(rounded)))
    if magnitude >= digits - 1:
        return f"{rounded if abs(x) < 10 ** digits else x:,.0f}"
    if magnitude < -3:
        return f"{x:.{digits - 1}e}"
    return f"{rounded:.{digits - 1 - magnitude}f}"


def size(value: Any, units: str = AUTO, digits: int = 3) -> str:
    """A byte count in ``units``: ``auto`` with its unit (``1.41 GB``, ``234 MB``, ``0 B``), a
    fixed unit as a bare number (the column header names the unit)."""
    n = float(Fraction(value))
    if units != AUTO:
        return significant(n / UNITS[units], digits)
    return _prefixed(n, DECIMAL, digits)


def binary(value: Any, digits: int = 4) -> str:
    """A byte count with a binary prefix (``38.52 GiB``), as torch.cuda and nvidia-smi count."""
    return _prefixed(float(Fraction(value)), BINARY, digits)


def _prefixed(n: float, prefixes: tuple[tuple[str, int], ...], digits: int) -> str:
    for unit, scale in prefixes:
        if abs(n) >= scale:
            text = significant(n / scale, digits)
            if unit != prefixes[0][0] and abs(float(text.replace(",", ""))) >= 1000:
                bigger = prefixes[prefixes.index((unit, scale)) - 1]  # 999.96 MB -> 1.00 GB
                return f"{significant(n / bigger[1], digits)} {bigger[0]}"
            return f"{text} {unit}"
    return f"{n:,.0f} B"


def ratio(value: float | None) -> str:
    """A ratio to the baseline: ``1x``, ``0.262x``, ``1.5x`` (three significant digits)."""
    return "-" if value is None else f"{value:.3g}x"


def share(value: float | None) -> str:
    """A share of the step: ``9.9%``."""
    return "-" if value is None else f"{value:.1%}"
