"""The rank grid and its process groups.

Ranks are laid out in mesh order, ``arange(world).view(*sizes)`` (picotron's one-line grid): the
last mesh axis varies fastest. A :class:`placeverify.ir.mesh.Group` names the axes a collective
runs over; its process group on one rank is the set of ranks that differ from it only along those
axes. ``ends(pp)`` keeps only the first and the last coordinate of ``pp`` (Megatron-LM's embedding
group): ranks on middle stages belong to no such group.

Every rank must create every process group in the same order (torch.distributed's ``new_group``
is collective over the default group), so the groups a run needs are collected up front and
created once, sorted.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from placeverify.ir.mesh import Group


@dataclass(frozen=True, slots=True)
class RankGrid:
    names: tuple[str, ...]
    sizes: tuple[int, ...]
    rank: int

    @property
    def world(self) -> int:
        return math.prod(self.sizes)

    def size(self, axis: str) -> int:
        return self.sizes[self.names.index(axis)]

    def table(self) -> torch.Tensor:
        """``arange(world).view(*sizes)``: the rank at each mesh coordinate."""
        return torch.arange(self.world).view(*self.sizes) if self.sizes else torch.arange(1)

    def coords_of(self, rank: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, size in reversed(list(zip(self.names, self.sizes, strict=True))):
            rank, out[name] = divmod(rank, size)
        return {name: out[name] for name in self.names}

    @property
    def coords(self) -> dict[str, int]:
        return self.coords_of(self.rank)

    def rank_of(self, coords: dict[str, int]) -> int:
        index = 0
        for name, size in zip(self.names, self.sizes, strict=True):
            index = index * size + coords[name]
        return index

    def members(self, group: Group, rank: int | None = None) -> list[int] | None:
        """The ranks of ``rank``'s group (sorted by group index), or None when it is not in one."""
        coords = self.coords_of(self.rank if rank is None else rank)
        choices: list[list[int]] = []
        for axis in group.axes:
            n = self.size(axis)
            if axis in group.ends:
                ends = sorted({0, n - 1})
                if coords[axis] not in ends:
                    return None
                choices.append(ends)
            else:
                choices.append(list(range(n)))
        out = []
        for combo in itertools.product(*choices):
            c = dict(coords)
            c.update(zip(group.axes, combo, strict=True))
            out.append(self.rank_of(c))
        return sorted(out)  # torch numbers a group's ranks in ascending global order

    def partition(self, group: Group) -> tuple[tuple[int, ...], ...]:
        """Every group of this kind across the world (ranks on middle stages in none)."""
        seen: set[tuple[int, ...]] = set()
        for r in range(self.world):
            members = self.members(group, r)
            if members is not None:
                seen.add(tuple(members))
        return tuple(sorted(seen))


@dataclass
class Handle:
    """One rank's view of a process group: its members, its index, the torch group."""

    members: tuple[int, ...]
    index: int
    pg: Any  # torch ProcessGroup; None for a group of one rank

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass
class ProcessGroups:
    grid: RankGrid
    handles: dict[tuple[tuple[int, ...], ...], dict[tuple[int, ...], Any]] = field(default_factory=dict)

    def create(self, groups: list[Group]) -> None:
        """Create every process group the run needs, in one order shared by all ranks."""
        partitions = sorted({self.grid.partition(g) for g in groups})
        world = tuple(range(self.grid.world))
        for partition in partitions:
            if partition in self.handles:
                continue
            made: dict[tuple[int, ...], Any] = {}
            for members in partition:
                if len(members) == 1:
                    made[members] = None
                elif members == world:
                    made[members] = dist.group.WORLD
                else:
                    made[members] = dist.new_group(list(members))
            self.handles[partition] = made

    def handle(self, group: Group) -> Handle | None:
        members = self.grid.members(group)
        if members is None:
            return None
        partition = self.grid.partition(group)
        if partition not in self.handles:
            raise RuntimeError(f"process group over {group.label()} was not created")
        key = tuple(members)
        return Handle(key, key.index(self.grid.rank), self.handles[partition][key])

    def axes(self, *axes: str) -> Handle:
        handle = self.handle(Group(tuple(a for a in self.grid.names if a in axes)))
        assert handle is not None
        return handle
