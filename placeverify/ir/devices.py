"""Bundled accelerator profiles (``mesh { device = h100_sxm }``), read from ``devices.json``.

The data file is the only place the figures live; each one names its source (a vendor data
sheet) beside it. Peaks are dense tensor-core FLOP/s; bandwidths are bytes per second per GPU
and per direction; latencies are modelling assumptions (the α of the α-β model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

DATA_FILE = "devices.json"


@dataclass(frozen=True, slots=True)
class Device:
    key: str  # the name a mesh block uses: h100_sxm
    name: str
    flops: tuple[tuple[str, Fraction], ...]  # (matmul dtype, dense peak FLOP/s)
    memory_bytes: int
    memory_bandwidth: Fraction  # HBM bytes per second
    intra_node_bandwidth: Fraction  # NVLink / xGMI bytes per second per direction
    network_bandwidth: Fraction  # scale-out bytes per second per GPU per direction
    gpus_per_node: int
    intra_node_latency: Fraction  # seconds per ring step (assumption)
    network_latency: Fraction
    sources: tuple[tuple[str, str], ...]
    # the profile whose matmul efficiency (the step-time model's fitted η_max) this one shares:
    # the same chip with other memory (``compute_as`` in the data file; itself when absent)
    compute_as: str = ""

    @property
    def compute_key(self) -> str:
        """The key the step-time model's matmul efficiency is fitted and looked up under."""
        return self.compute_as or self.key

    def peak(self, dtype: str) -> Fraction | None:
        """Dense peak FLOP/s for matmuls in ``dtype``, or None when the device has none."""
        return dict(self.flops).get(dtype)


def _fraction(value: Any, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{DATA_FILE}: {what} must be a number, not {value!r}")
    return Fraction(str(value))


def _device(key: str, raw: dict[str, Any]) -> Device:
    flops = tuple((k, _fraction(v, f"{key}.flops.{k}")) for k, v in raw["flops"].items())
    return Device(
        key, str(raw["name"]), flops,
        int(_fraction(raw["memory_bytes"], f"{key}.memory_bytes")),
        _fraction(raw["memory_bandwidth"], f"{key}.memory_bandwidth"),
        _fraction(raw["intra_node_bandwidth"], f"{key}.intra_node_bandwidth"),
        _fraction(raw["network_bandwidth"], f"{key}.network_bandwidth"),
        int(raw["gpus_per_node"]),
        _fraction(raw["intra_node_latency"], f"{key}.intra_node_latency"),
        _fraction(raw["network_latency"], f"{key}.network_latency"),
        tuple((k, str(v)) for k, v in raw["sources"].items()),
        str(raw.get("compute_as", "")))


@cache
def devices() -> dict[str, Device]:
    """Every bundled profile by key (the data file is read once)."""
    text = (Path(__file__).parent / DATA_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    return {k: _device(k, v) for k, v in data.items() if not k.startswith("_")}


def device(key: str) -> Device | None:
    return devices().get(key)


def intra_node(sizes: tuple[int, ...], index: int, gpus_per_node: int) -> bool:
    """Whether axis ``index`` of a mesh with these sizes stays inside one node.

    Ranks are laid out in mesh order with the last axis varying fastest
    (``arange(world).view(*sizes)``, as the replay and torch's DeviceMesh do), so an axis's
    groups are blocks of ``size(axis) * product(later sizes)`` consecutive ranks; they stay in a
    node exactly when that block divides the GPUs per node.
    """
    block = 1
    for n in sizes[index:]:
        block *= n
    return gpus_per_node % block == 0


def ranks_per_node(sizes: tuple[int, ...], index: int, gpus_per_node: int) -> int:
    """How many ranks of one group of axis ``index`` share a node (1 when the later axes fill
    a node or do not divide it). A ring across nodes runs one channel per NIC (NCCL), so an
    axis crossing nodes gets the network bandwidth of that many GPUs."""
    inner = 1
    for n in sizes[index + 1:]:
        inner *= n
    if inner >= gpus_per_node or gpus_per_node % inner:
        return 1
    return min(sizes[index], gpus_per_node // inner)


DTYPE_PEAKS = ("bf16", "fp16", "fp8", "tf32")  # the matmul dtypes a profile may list
