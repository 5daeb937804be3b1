"""The device mesh: named axes with sizes, groups of axes, capacities and links."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from placeverify.diagnostics import Span

if TYPE_CHECKING:
    from placeverify.ir.devices import Device  # loaded only for a mesh that names one


@dataclass(frozen=True, slots=True)
class Axis:
    name: str
    size: int
    span: Span
    bandwidth: Fraction | None = None  # bytes per second per device on this axis's links
    latency: Fraction | None = None  # seconds per collective step


@dataclass(frozen=True, slots=True)
class Group:
    """A set of mesh axes a collective runs over. ``ends`` axes contribute only their first and
    last coordinate (``ends(pp)``: the first and last pipeline stage, Megatron's embedding group)."""

    axes: tuple[str, ...]
    ends: frozenset[str] = frozenset()
    span: Span | None = field(default=None, compare=False)

    def size(self, mesh: Mesh) -> int:
        return int(self.size_of({a: mesh.size(a) for a in self.axes}))

    def size_of(self, sizes: Mapping[str, Any]) -> Any:
        """The group's size given axis sizes (ints, or solver terms for unbounded sizes)."""
        total: Any = 1
        for a in self.axes:
            n = sizes[a]
            if a in self.ends:
                n = 2 if (n > 1 if isinstance(n, int) else True) else 1
            total = total * n
        return total

    def covers(self, axis: str) -> bool:
        return axis in self.axes and axis not in self.ends

    def label(self) -> str:
        if not self.axes:
            return "(none)"
        return " * ".join(f"ends({a})" if a in self.ends else a for a in self.axes)


@dataclass(frozen=True, slots=True)
class Mesh:
    axes: tuple[Axis, ...]
    span: Span
    groups: tuple[tuple[str, Group], ...] = ()
    device_memory: int | None = None  # bytes
    host_memory: int | None = None  # bytes per device's share of host memory
    pcie_bandwidth: Fraction | None = None  # bytes per second host <-> device
    device: Device | None = None  # a bundled profile (``device = h100_sxm``)
    matmul: str | None = None  # the dtype matmuls run in (``matmul = fp8``); None: the params'
    reserve: int | None = None  # bytes kept free on a device (allocator, runtime), ``reserve = 4 GiB``
    memory_profile: str | None = None  # the implementation whose peak is modelled (cost/peak.py)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def world(self) -> int:
        return math.prod(a.size for a in self.axes)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def size(self, name: str) -> int:
        return self.axis(name).size

    def group(self, *axes: str) -> Group:
        order = {n: i for i, n in enumerate(self.names)}
        return Group(tuple(sorted(set(axes), key=order.__getitem__)))

    def with_sizes(self, sizes: dict[str, int]) -> Mesh:
        """The same mesh with some axes resized (counterexamples shrink the mesh)."""
        axes = tuple(Axis(a.name, sizes.get(a.name, a.size), a.span, a.bandwidth, a.latency)
                     for a in self.axes)
        return Mesh(axes, self.span, self.groups, self.device_memory, self.host_memory,
                    self.pcie_bandwidth, self.device, self.matmul, self.reserve,
                    self.memory_profile)
