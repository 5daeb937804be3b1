"""One rank's parameters, gradient buffers and optimizer slices, as real tensors.

:class:`Buffers` is one parameter group's gradient on this rank (the full flat buffer of this
rank's local parameters in spec order, and the shard a reduce-scatter leaves);
:class:`RankState` builds the rank's local parameters and stage model from the replay set-up,
keeps a :class:`Buffers` per group with this rank's optimizer slice (ZeRO, Rajbhandari et al.
2020), and names every state the rank holds for the comparison with the reference. The step
itself runs in :mod:`placeverify.replay.step` (semantics: :mod:`placeverify.semantics.interpreter`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Count
from placeverify.replay.batch import Setup
from placeverify.replay.distributed import Handle, ProcessGroups, RankGrid
from placeverify.replay.layout import ParamSpec, holds, local_key, optimizer_axes
from placeverify.replay.model import StageModel, init_params, local_value


def flat_slice(numel: int, count: int, index: int) -> tuple[int, int]:
    """Member ``index`` of ``count``'s slice of a flat buffer padded to a multiple of ``count``."""
    chunk = -(-numel // count) if numel else 0
    start = min(index * chunk, numel)
    return start, min(start + chunk, numel)


@dataclass
class Buffers:
    """One parameter group's gradient on this rank."""

    group: ParamGroup
    specs: list[ParamSpec]
    numel: int
    full: torch.Tensor
    opt: tuple[int, int]  # this rank's optimizer slice
    momentum: torch.Tensor
    shard: torch.Tensor | None = None
    shard_at: tuple[tuple[int, ...], int, int] | None = None  # (members, start, stop)
    sharded: bool = False
    scattered: set[str] = field(default_factory=set)

    def denoted(self) -> torch.Tensor:
        if self.sharded:
            assert self.shard is not None
            return self.shard
        return self.full

    def set_denoted(self, value: torch.Tensor) -> None:
        if self.sharded:
            self.shard = value
        else:
            self.full = value

    def consumed(self) -> torch.Tensor:
        """The gradient the optimizer reads: the full buffer, overwritten by the shard."""
        out = self.full.clone()
        if self.sharded and self.shard is not None and self.shard_at is not None:
            _, start, stop = self.shard_at
            out[start:stop] = self.shard
        return out


class RankState:
    """A rank's tensors: parameters, stage model, gradient buffers and optimizer state."""

    def __init__(self, setup: Setup, grid: RankGrid, groups: ProcessGroups, alpha: float,
                 device: torch.device, progress: Callable[[str], None]) -> None:
        self.s = setup
        self.strategy = setup.strategy
        self.grid = grid
        self.groups = groups
        self.coords = grid.coords
        self.alpha = alpha
        self.device = device
        self.progress = progress
        self.dtype = setup.dtype
        layout = setup.layout
        self.layout = layout
        full = _initial(setup)
        self.local = [s for s in setup.specs if holds(s, setup.config, layout, self.coords)]
        self.params = {s.name: local_value(full[s.name], s, layout, self.coords).clone()
                       .to(device).requires_grad_(True) for s in self.local}
        tp = groups.axes(layout.tp) if layout.tp else None
        cp = groups.axes(layout.cp) if layout.cp else None
        ep = groups.axes(layout.ep) if layout.ep else None
        self.model = StageModel(setup.config, layout, self.coords, self.params, tp, cp, ep,
                                setup.dropout)
        self.buffers = {g: self._buffers(g) for g in self.strategy.model.groups_present()}
        self.counts: dict[tuple[Count, int], int] = {}
        # counts across steps (semantics/counters.py): over the run, the total of the steps
        # replayed so far; over the batch, the steps replayed are one batch of this many
        self.run_totals: dict[Count, int] = {}
        self.total_steps = 1
        self.overflow = False
        self.flag_alone = False  # a flag broadcast decided last: the rank skips on it alone
        self.skipped: list[int] = []
        self.step_index = 0

    # ---- set-up --------------------------------------------------------------------------------

    def _specs_of(self, group: ParamGroup, coords: dict[str, int]) -> list[ParamSpec]:
        return [s for s in self.s.specs if s.group is group
                and holds(s, self.s.config, self.layout, coords)]

    def numel_of(self, group: ParamGroup, rank: int) -> int:
        coords = self.grid.coords_of(rank)
        total = 0
        for s in self._specs_of(group, coords):
            total += math.prod(s.shape) // (self.layout.tp_size if s.tp_dim is not None
                                            and self.layout.tp else 1)
        return total

    def opt_slice(self, group: ParamGroup, rank: int) -> tuple[int, int]:
        axes = optimizer_axes(self.strategy, group)
        numel = self.numel_of(group, rank)
        if not axes:
            return 0, numel
        members = self.grid.members(Group(tuple(a for a in self.grid.names if a in axes)), rank)
        assert members is not None
        return flat_slice(numel, len(members), members.index(rank))

    def _buffers(self, group: ParamGroup) -> Buffers:
        specs = [s for s in self.local if s.group is group]
        numel = sum(self.params[s.name].numel() for s in specs)
        start, stop = self.opt_slice(group, self.grid.rank)
        return Buffers(group, specs, numel, self._zeros(numel), (start, stop),
                       self._zeros(stop - start))

    def _zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=self.dtype, device=self.device)

    def flat_params(self, buf: Buffers) -> torch.Tensor:
        if not buf.specs:
            return self._zeros(0)
        return torch.cat([self.params[s.name].detach().reshape(-1) for s in buf.specs])

    def write_params(self, buf: Buffers, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for s in buf.specs:
                p = self.params[s.name]
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def handle(self, group: Group) -> Handle | None:
        return self.groups.handle(group)

    def targeted(self, applies: Callable[[ParamGroup], bool]) -> list[Buffers]:
        return [b for g, b in self.buffers.items() if applies(g)]

    def _local_overflow(self, denoted: bool) -> bool:
        for buf in self.buffers.values():
            if not buf.numel:
                continue
            value = buf.denoted() if denoted else buf.consumed()[buf.opt[0]:buf.opt[1]]
            if not bool(torch.isfinite(value).all()):
                return True
        return False

    # ---- results ---------------------------------------------------------------------------------

    def states(self) -> dict[str, tuple[str, torch.Tensor]]:
        """Every state this rank holds, keyed so that ranks holding copies share the key."""
        out: dict[str, tuple[str, torch.Tensor]] = {}
        for spec in self.local:
            key = "params/" + local_key(spec, self.layout, self.coords)
            out[key] = ("params", self.params[spec.name].detach())
        for buf in self.buffers.values():
            if not buf.numel:
                continue
            out[self.optimizer_key(buf)] = ("optimizer", buf.momentum)
        return out

    def reference_slices(self, params: dict[str, torch.Tensor],
                         momentum: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reference's value of every state :meth:`states` returns."""
        out: dict[str, torch.Tensor] = {}
        for spec in self.local:
            key = "params/" + local_key(spec, self.layout, self.coords)
            out[key] = local_value(params[spec.name], spec, self.layout, self.coords)
        for buf in self.buffers.values():
            if not buf.numel:
                continue
            start, stop = buf.opt
            flat = torch.cat([local_value(momentum[s.name], s, self.layout, self.coords)
                              .reshape(-1) for s in buf.specs])
            out[self.optimizer_key(buf)] = flat[start:stop]
        return out

    def optimizer_key(self, buf: Buffers) -> str:
        """A buffer's optimizer slice, named by its tensors (hashed) and its range."""
        names = ",".join(local_key(s, self.layout, self.coords) for s in buf.specs)
        digest = hashlib.sha1(names.encode()).hexdigest()[:10]
        start, stop = buf.opt
        return f"optimizer/{buf.group.value}/{digest}[{start}:{stop}]"


def _initial(setup: Setup) -> dict[str, torch.Tensor]:
    return init_params(setup.specs, setup.seed, setup.dtype)
