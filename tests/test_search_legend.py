"""The search report explains every part of a layout's label under its tables."""

from __future__ import annotations

import itertools
import re

from placeverify.ir.placement import TensorOverlap
from placeverify.report.search_text import LEGEND
from placeverify.search.space import Layout, Recompute, Sharding


def labels() -> list[str]:
    out = []
    for sharding, sp, overlap, rc, offload, step, wait in itertools.product(
            Sharding, (False, True), TensorOverlap, Recompute, (False, True), (False, True),
            (False, True)):
        out.append(Layout(8, 2, 4, 2, 2, 16, sharding, 4, sp, rc, offload, 1, 8, None, step,
                          overlap, wait).label())
    return out


def test_every_part_of_every_label_is_in_the_legend() -> None:
    stems = {re.sub(r"(?<!zero)\d+", "N", part) for label in labels() for token in label.split()
             for part in re.split(r"(?=/)|(?=\+)", token) if part}
    assert {"tN", "cpN", "pNvN", "epN", "dN", "hsdpN", "zero3", "/step", "sp", "+overlap",
            "rc-full", "offload", "bN", "mN"} <= stems
    legend = LEGEND.replace(",", " ").replace(";", " ").replace(":", " ").replace("(", " ")
    words = set(legend.split())
    for stem in sorted(stems):
        # named as written, 'pNvN' as 'pN' and 'vN', 'rc-full' as 'rc-' and 'full'
        parts = ["pN", "vN"] if stem == "pNvN" else [stem]
        for part in parts:
            assert part in words or (part.startswith("rc-") and "rc-" in words
                                     and part[3:] in words), (stem, part)
