"""Costs: per-device memory and per-step communication, as numbers and as closed forms.

``analyse(strategy)`` evaluates the formulas exactly (rationals); ``analyse(strategy,
symbolic=True)`` evaluates the same code with SymPy symbols for the closed forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from placeverify.cost.activations import ActivationCost
from placeverify.cost.communication import CommItem, pipeline_bubble, step_items, timed
from placeverify.cost.domain import Domain, Exact, Num, Symbolic
from placeverify.cost.memory import MemoryItem, RankMemory, fullest, memory_by_rank
from placeverify.cost.peak import Peak, peak
from placeverify.cost.placement_traffic import placement_items
from placeverify.ir.strategy import Strategy

CATEGORIES = ("params", "optimizer", "gradients", "activations", "outside_layers", "buffers")


@dataclass(frozen=True, slots=True)
class Costs:
    strategy: Strategy
    domain: Domain
    memory: tuple[MemoryItem, ...]
    comm: tuple[CommItem, ...]
    bubble: Num | None
    activations: ActivationCost | None
    ranks: tuple[RankMemory, ...] = ()  # every distinct rank kind; ``memory`` is the fullest's
    peak: Peak | None = None  # the step's peak over every rank kind (exact analyses only)

    def rank_bytes(self, rank: RankMemory) -> dict[str, Num]:
        """Device bytes of one rank kind by category, and their total."""
        out: dict[str, Num] = {c: _total(i.bytes for i in rank.items
                                         if not i.host and i.category == c) for c in CATEGORIES}
        out["total"] = _total(out[c] for c in CATEGORIES)
        return out

    def device_bytes(self) -> dict[str, Num]:
        out: dict[str, Num] = {c: _total(i.bytes for i in self.memory
                                         if not i.host and i.category == c) for c in CATEGORIES}
        out["total"] = _total(out[c] for c in CATEGORIES)
        return out

    def needed_bytes(self) -> int:
        """What a device must have for the step: the peak of the fullest rank kind plus the
        mesh's ``reserve`` (the device total when no peak was computed)."""
        top = self.peak.bytes if self.peak is not None else self.device_bytes()["total"]
        return whole(top) + (self.strategy.mesh.reserve or 0)

    def fits(self) -> bool | None:
        """Whether the step fits ``device_memory`` (None when the mesh gives none): the one rule
        that the report, compare, the CI outputs and ``--require-fit`` use."""
        capacity = self.strategy.mesh.device_memory
        return None if capacity is None else self.needed_bytes() <= capacity

    def idle(self) -> Num | None:
        """Share of the step a pipeline stage is idle: bubble / (compute + bubble), i.e.
        (p − 1)/(m + p − 1), or (p − 1)/(v·m + p − 1) interleaved. ``bubble`` itself is the
        bubble-to-compute ratio (p − 1)/m of Narayanan et al. 2021, §2.2."""
        if self.bubble is None:
            return None
        return self.bubble / (1 + self.bubble)

    def host_bytes(self) -> Num:
        return _total(item.bytes for item in self.memory if item.host)

    def traffic(self, *states: str, pcie: bool = False) -> Num:
        """Bytes per step of the collectives moving these states (all when none is named),
        over the network or, with ``pcie``, between host and device."""
        return _total(c.bytes for c in self.comm
                      if c.pcie == pcie and (not states or c.state in states))

    def network_bytes(self) -> Num:
        return self.traffic()

    def pcie_bytes(self) -> Num:
        return self.traffic(pcie=True)

    def state_bytes(self) -> Num:
        """Gradient and parameter traffic: what the ZeRO paper's 2Ψ / 3Ψ comparison counts."""
        return self.traffic("gradients", "params")


def _total(values: Any) -> Num:
    total: Num = 0
    for value in values:
        total = total + value
    return total


def analyse(strategy: Strategy, symbolic: bool = False) -> Costs:
    domain: Domain = Symbolic() if symbolic else Exact()
    ranks, activations = memory_by_rank(domain, strategy)
    memory = ranks[fullest(strategy, ranks)].items
    comm = [*step_items(domain, strategy), *placement_items(domain, strategy, activations)]
    if not symbolic:
        comm = [timed(strategy, c, Fraction(c.bytes), Fraction(c.calls)) for c in comm]
    return Costs(strategy, domain, tuple(memory), tuple(comm), pipeline_bubble(domain, strategy),
                 activations, ranks, None if symbolic else peak(strategy, ranks))


def timed_mesh(strategy: Strategy) -> bool:
    """Whether ``check`` reports step time (:mod:`placeverify.cost.time`, loaded only then): the
    mesh names a device or gives link bandwidths."""
    mesh = strategy.mesh
    return mesh.device is not None or any(a.bandwidth is not None for a in mesh.axes)


def whole(value: Any) -> int:
    """Round an exact byte count to the nearest integer (halves up)."""
    fraction = Fraction(value)
    return int((fraction + Fraction(1, 2)) // 1)
