"""Costs: per-device memory and per-step communication, as numbers and as closed forms.

``analyse(strategy)`` evaluates the formulas exactly (rationals); ``analyse(strategy,
symbolic=True)`` evaluates the same code with SymPy symbols for the closed forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from placeverify.cost.activations import ActivationCost
from placeverify.cost.communication import (
    CommItem,
    pipeline_bubble,
    placement_items,
    step_items,
    timed,
)
from placeverify.cost.domain import Domain, Exact, Num, Symbolic
from placeverify.cost.memory import MemoryItem, memory_items
from placeverify.ir.strategy import Strategy

CATEGORIES = ("params", "optimizer", "gradients", "activations", "buffers")


@dataclass(frozen=True, slots=True)
class Costs:
    strategy: Strategy
    domain: Domain
    memory: tuple[MemoryItem, ...]
    comm: tuple[CommItem, ...]
    bubble: Num | None
    activations: ActivationCost | None

    def device_bytes(self) -> dict[str, Num]:
        out: dict[str, Num] = {c: 0 for c in CATEGORIES}
        for item in self.memory:
            if not item.host:
                out[item.category] = out[item.category] + item.bytes
        total: Num = 0
        for c in CATEGORIES:
            total = total + out[c]
        out["total"] = total
        return out

    def host_bytes(self) -> Num:
        total: Num = 0
        for item in self.memory:
            if item.host:
                total = total + item.bytes
        return total

    def network_bytes(self) -> Num:
        total: Num = 0
        for item in self.comm:
            if not item.pcie:
                total = total + item.bytes
        return total

    def pcie_bytes(self) -> Num:
        total: Num = 0
        for item in self.comm:
            if item.pcie:
                total = total + item.bytes
        return total

    def state_bytes(self) -> Num:
        """Gradient and parameter traffic: what the ZeRO paper's 2Ψ / 3Ψ comparison counts."""
        total: Num = 0
        for item in self.comm:
            if item.state in ("gradients", "params") and not item.pcie:
                total = total + item.bytes
        return total


def analyse(strategy: Strategy, symbolic: bool = False) -> Costs:
    domain: Domain = Symbolic() if symbolic else Exact()
    memory, activations = memory_items(domain, strategy)
    comm = [*step_items(domain, strategy), *placement_items(domain, strategy, activations)]
    if not symbolic:
        comm = [timed(strategy, c, Fraction(c.bytes), Fraction(c.calls)) for c in comm]
    return Costs(strategy, domain, tuple(memory), tuple(comm), pipeline_bubble(domain, strategy),
                 activations)


def whole(value: Any) -> int:
    """Round an exact byte count to the nearest integer (halves up)."""
    fraction = Fraction(value)
    return int((fraction + Fraction(1, 2)) // 1)
