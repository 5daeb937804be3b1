"""One rank executing the step IR, statement by statement, on real tensors.

The semantics is that of :mod:`placeverify.semantics.interpreter` (its docstring is the
specification); here each parameter group's gradient is a real flat buffer of this rank's local
parameters (their concatenation in spec order), not one rational:

- ``backward L``: forward and backward of one micro-batch through this rank's pipeline stage
  (activations and their gradients travel by send/recv), with the loss ``factor(L) * sum``; the
  parameters' gradients are added (``+=``) to the full buffers, and ``grads`` denotes the full
  buffers again. Counts in ``L`` are all-reduced over their axes' process groups, for real;
- ``all_reduce(op) grads[g] over G``: a real all-reduce of the denoted buffer over G's process
  group (``order = fixed``: ``torch.distributed.all_reduce``; ``rank_dependent``: an all-gather,
  then each rank sums starting from its own index); ``mean`` divides the sum by |G|;
- ``reduce_scatter(op[, accumulate]) grads[g] over G``: reduce the full buffer (zero-padded to a
  multiple of |G|) and keep this rank's 1/|G| slice as the shard (assigned, or added to the
  previous shard); ``grads`` denotes the shard until the next backward;
- ``all_gather grads``: the shards of the group, concatenated, become the full buffer;
- ``scale``, ``free``, ``clip`` (squared norms summed over the group's process group, elements
  that ranks hold as copies counted once or on every rank), ``all_reduce(max) overflow``;
- ``update params``: SGD with momentum (:mod:`placeverify.replay.reference` for the constants)
  on this rank's optimizer slice — all of the group, or its 1/n along the data axes where the
  optimizer state is sharded (ZeRO, Rajbhandari et al. 2020) — reading the denoted gradient there
  (the shard where the gradient was reduce-scattered, the full buffer elsewhere); under dynamic
  loss scaling the step is skipped when the overflow flag (or the rank's own check) is set;
- ``all_gather params`` / ``broadcast params``: each element from the rank of the group that owns
  it in the optimizer layout (or all from one rank); parameters sharded and gathered before use
  (S*, offloaded) are gathered from their owners at the end of every step.

Token all-reduces, token all-to-alls and activation send/recv are already part of the model's
forward and backward; as statements they do nothing more.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import torch
import torch.distributed as dist

from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role
from placeverify.ir.relations import Relation, relation
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Count,
    CountKind,
    Free,
    Monomial,
    Op,
    Order,
    ReduceOp,
    Scale,
    Scope,
    TargetKind,
    TermKind,
    Update,
)
from placeverify.ir.strategy import Strategy
from placeverify.replay import comm
from placeverify.replay.data import loss_weights, make_atom
from placeverify.replay.distributed import Handle, ProcessGroups, RankGrid
from placeverify.replay.layout import (
    ParamSpec,
    Unsupported,
    gathered_axes,
    holds,
    local_key,
    optimizer_axes,
)
from placeverify.replay.model import StageModel, local_value
from placeverify.replay.reference import LEARNING_RATE, MOMENTUM, NORM_EPS, Setup
from placeverify.semantics.buffers import MODELLED_COLLECTIVES, NEUTRAL_COLLECTIVES
from placeverify.semantics.interpreter import LOSS_SCALE
from placeverify.semantics.schedule import events


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


class RankRun:
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
        self.overflow = False
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

    # ---- training ------------------------------------------------------------------------------

    def train(self, steps: int) -> None:
        for t in range(steps):
            self.step_index = t
            self.progress(f"step {t + 1}/{steps}")
            self.run_step(t)

    def run_step(self, t: int) -> None:
        for buf in self.buffers.values():
            buf.full = self._zeros(buf.numel)
            buf.shard, buf.shard_at, buf.sharded, buf.scattered = None, None, False, set()
        self.overflow = False
        self.counts = self._counts()
        for event in events(self.strategy.step, self.s.microbatches):
            assert isinstance(event.k, int)
            self.apply(event.op, t, event.k)
        gathered = gathered_axes(self.strategy)
        if gathered:
            for buf in self.buffers.values():
                self.gather_params(buf, Group(tuple(a for a in self.grid.names if a in gathered)),
                                   "owner")

    def apply(self, op: Op, t: int, k: int) -> None:
        if isinstance(op, Backward):
            self.backward(op, t, k)
        elif isinstance(op, Collective):
            self.collective(op)
        elif isinstance(op, Scale):
            factor = float(self.factor(op.factor, k))
            for buf in self.targeted(op.target.applies_to):
                buf.set_denoted(buf.denoted() * factor)
        elif isinstance(op, Free):
            for buf in self.targeted(op.target.applies_to):
                buf.full = self._zeros(buf.numel)
        elif isinstance(op, Clip):
            self.clip(op)
        elif isinstance(op, Update):
            self.update()
        else:
            raise Unsupported(f"statement {type(op).__name__} is not replayed")

    def targeted(self, applies: Callable[[ParamGroup], bool]) -> list[Buffers]:
        return [b for g, b in self.buffers.items() if applies(g)]

    # ---- counts and loss factors ----------------------------------------------------------------

    def _counts(self) -> dict[tuple[Count, int], int]:
        """Every count the step's expressions name, all-reduced over its axes, per micro-batch."""
        wanted: list[Count] = []
        for op in self.strategy.step.ops():
            monomial = op.loss if isinstance(op, Backward) else op.factor if isinstance(op, Scale) \
                else None
            if monomial is None:
                continue
            for term, _ in monomial.factors:
                if term.kind is TermKind.COUNT and term.count is not None and term.count not in wanted:
                    wanted.append(term.count)
        m = self.s.microbatches
        b = tuple(self.coords[a] for a in self.layout.batch)
        out: dict[tuple[Count, int], int] = {}
        for count in wanted:
            table = self.s.tokens if count.kind is CountKind.TOKENS else self.s.samples
            local = [table[(b, k)] for k in range(m)]
            if count.scope is Scope.STEP:
                local = [sum(local)] * m
            values = torch.tensor(local, dtype=torch.int64, device=self.device)
            handle = self.handle(Group(tuple(a for a in self.grid.names if a in count.axes)))
            comm.all_reduce(values, handle)
            for k, v in enumerate(values.tolist()):
                out[(count, k)] = int(v)
        return out

    def factor(self, monomial: Monomial, k: int) -> Fraction:
        value: Fraction = monomial.evaluate(
            one=Fraction(1), number=Fraction, microbatches=Fraction(self.s.microbatches),
            size=lambda group: Fraction(group.size_of({a: self.grid.size(a) for a in group.axes})),
            count=lambda c: Fraction(self.counts[(c, k)]), loss_scale=LOSS_SCALE)
        return value

    # ---- backward: one micro-batch through the pipeline ----------------------------------------

    def backward(self, op: Backward, t: int, k: int) -> None:
        s, model, layout = self.s, self.model, self.layout
        b = tuple(self.coords[a] for a in layout.batch)
        atom = make_atom(s.config, s.seed, t, b, k, s.samples[(b, k)], s.tokens[(b, k)], s.dtype)
        stage = model.stage
        shape = (atom.samples, model.local_positions, s.config.hidden)
        prev = self._neighbour(stage - 1) if not model.first else None
        nxt = self._neighbour(stage + 1) if not model.last else None
        if model.first:
            x = model.embed(atom)
        else:
            x = torch.empty(shape, dtype=self.dtype, device=self.device)
            dist.recv(x, src=prev)
            x.requires_grad_(True)

        def seed_layer(i: int) -> None:
            from placeverify.replay.data import layer_seed

            torch.manual_seed(layer_seed(s.seed, t, k, model.dropout.stream_layer(i, self.coords)))

        h = model.layers(x, seed_layer)
        if model.last:
            losses = model.head(h, atom.labels)
            weights = loss_weights(self.strategy, atom, s.config).to(self.device)
            total = (losses * weights).sum() * (float(self.factor(op.loss, k)) * self.alpha)
            total.backward()
        else:
            dist.send(h.detach().contiguous(), dst=nxt)
            grad = torch.empty_like(h)
            dist.recv(grad, src=nxt)
            h.backward(grad)
        if not model.first:
            assert x.grad is not None
            dist.send(x.grad.contiguous(), dst=prev)
        for buf in self.buffers.values():
            if buf.specs:
                buf.full = buf.full + torch.cat([_grad(self.params[sp.name]) for sp in buf.specs])
            for sp in buf.specs:
                self.params[sp.name].grad = None
            buf.sharded = False
        if s.dynamic and t == 0 and k == 0 and self.grid.rank == 0:
            self._inject_overflow()

    def _neighbour(self, stage: int) -> int:
        coords = dict(self.coords)
        assert self.layout.pp is not None
        coords[self.layout.pp] = stage
        return self.grid.rank_of(coords)

    def _inject_overflow(self) -> None:
        """Dynamic loss scaling only matters when a gradient overflows: make one do so on rank 0
        in the first step (the reference skips that step)."""
        for buf in self.buffers.values():
            if buf.numel:
                buf.full = buf.full.clone()
                buf.full[0] = float("inf")
                return

    # ---- collectives ---------------------------------------------------------------------------

    def collective(self, op: Collective) -> None:
        target = op.target.kind
        if (op.kind, target) not in MODELLED_COLLECTIVES:
            raise Unsupported(f"line {op.span.line}: '{op.label()}' is not replayed")
        if (op.kind, target) in NEUTRAL_COLLECTIVES:
            return  # token counts and activations travel inside the model's forward and backward
        if target is TargetKind.GRADS:
            for buf in self.targeted(op.target.applies_to):
                self.grads_collective(op, buf)
        elif target is TargetKind.PARAMS:
            for buf in self.targeted(op.target.applies_to):
                self._params_held_alike(op, buf)
                if op.kind is CollectiveKind.ALL_GATHER:
                    self.gather_params(buf, op.group, "owner")
                elif op.kind is CollectiveKind.BROADCAST:
                    self.gather_params(buf, op.group, op.source)
        elif target is TargetKind.OVERFLOW:
            handle = self.handle(op.group)
            flag = torch.tensor([1.0 if self._local_overflow(denoted=True) else 0.0],
                                dtype=self.dtype, device=self.device)
            comm.all_reduce(flag, handle, "max")
            self.overflow = bool(flag.item() > 0)

    def _params_held_alike(self, op: Collective, buf: Buffers) -> None:
        """A parameter gather or broadcast takes each element from the rank that owns it; along
        an axis where ranks hold different parameters (tensor shards, other stages or experts)
        there is no such rank, and a flat gather would mix them: refused, never run."""
        for axis in op.group.axes:
            if self.grid.size(axis) > 1 and \
                    relation(self.strategy, buf.group, axis) is Relation.OWNED:
                raise Unsupported(f"line {op.span.line}: '{op.label()}' gathers "
                                  f"{buf.group.value} parameters over {axis}, where ranks hold "
                                  "different parameters; it cannot run")

    def _same_shapes(self, op: Collective, buf: Buffers, handle: Handle) -> None:
        sizes = {self.numel_of(buf.group, r) for r in handle.members}
        if len(sizes) > 1:
            raise Unsupported(f"line {op.span.line}: '{op.label()}' reduces {buf.group.value} "
                              "gradients over ranks that hold differently shaped "
                              f"{buf.group.value} parameters; it cannot run")

    def grads_collective(self, op: Collective, buf: Buffers) -> None:
        handle = self.handle(op.group)
        if handle is None:
            return  # a middle pipeline stage is in no ends(pp) group
        self._same_shapes(op, buf, handle)
        if buf.numel == 0:
            return
        kind = op.kind
        if kind is CollectiveKind.ALL_REDUCE:
            buf.set_denoted(self.reduce(buf.denoted(), op, handle))
        elif kind is CollectiveKind.REDUCE_SCATTER:
            start, stop = flat_slice(buf.numel, handle.size, handle.index)
            chunk = -(-buf.numel // handle.size)
            padded = torch.zeros(chunk * handle.size, dtype=self.dtype, device=self.device)
            padded[:buf.numel] = buf.full
            if op.order is Order.RANK_DEPENDENT:
                reduced = self.reduce(padded, op, handle)[handle.index * chunk:
                                                          (handle.index + 1) * chunk]
            else:
                reduced = comm.reduce_scatter(padded, handle, 0) if op.op is not ReduceOp.MAX \
                    else comm.all_reduce(padded.clone(), handle, "max")[
                        handle.index * chunk:(handle.index + 1) * chunk]
                if op.op is ReduceOp.MEAN:
                    reduced = reduced / handle.size
            reduced = reduced[:stop - start]
            where = (handle.members, start, stop)
            if op.accumulate and buf.shard is not None:
                if buf.shard_at != where:
                    raise Unsupported(f"line {op.span.line}: '{op.label()}' accumulates into a "
                                      "shard laid out over another group")
                reduced = buf.shard + reduced
            buf.shard, buf.shard_at, buf.sharded = reduced, where, True
            buf.scattered |= {a for a in op.group.axes if self.grid.size(a) > 1}
        elif kind is CollectiveKind.ALL_GATHER:
            if not buf.sharded or buf.shard is None or buf.shard_at is None:
                return
            if buf.shard_at[0] != handle.members:
                raise Unsupported(f"line {op.span.line}: '{op.label()}' gathers over another "
                                  "group than the shard was scattered over")
            chunk = -(-buf.numel // handle.size)
            padded = torch.zeros(chunk, dtype=self.dtype, device=self.device)
            padded[:buf.shard.numel()] = buf.shard
            buf.full = comm.gather(padded, handle, 0)[:buf.numel]
            buf.sharded = False
            buf.scattered = set()

    def reduce(self, value: torch.Tensor, op: Collective, handle: Handle) -> torch.Tensor:
        if handle.size == 1:
            return value.clone()
        if op.order is Order.RANK_DEPENDENT:
            rows = comm.gather(value.unsqueeze(0), handle, 0)
            acc = rows[handle.index].clone()
            for j in range(1, handle.size):
                row = rows[(handle.index + j) % handle.size]
                acc = torch.maximum(acc, row) if op.op is ReduceOp.MAX else acc + row
        else:
            acc = comm.all_reduce(value.clone(), handle, "max" if op.op is ReduceOp.MAX else "sum")
        if op.op is ReduceOp.MEAN:
            acc = acc / handle.size
        return acc

    def gather_params(self, buf: Buffers, group: Group, source: str) -> None:
        """Each element from the member that owns it in the optimizer layout (``owner``), or
        every element from member ``source``."""
        handle = self.handle(group)
        if handle is None or handle.size == 1 or buf.numel == 0:
            return
        flat = self.flat_params(buf)
        rows = comm.gather(flat.unsqueeze(0), handle, 0)
        if source != "owner":
            index = int(source)
            if not 0 <= index < handle.size:
                raise Unsupported(f"broadcast from rank {index} of a group of {handle.size}")
            self.write_params(buf, rows[index])
            return
        if not optimizer_axes(self.strategy, buf.group):
            return  # every rank updated every element: there is nothing to gather
        out = flat.clone()
        for j, member in enumerate(handle.members):
            start, stop = self.opt_slice(buf.group, member)
            out[start:stop] = rows[j][start:stop]
        self.write_params(buf, out)

    # ---- clipping, overflow, update --------------------------------------------------------------

    def _replica(self, buf: Buffers, axis: str) -> bool:
        """Do the ranks along ``axis`` hold copies of the same elements of this group?"""
        if buf.sharded and axis in buf.scattered:
            return False
        return relation(self.strategy, buf.group, axis) is not Relation.OWNED

    def clip(self, op: Clip) -> None:
        handle = self.handle(op.group)
        total = torch.zeros(1, dtype=self.dtype, device=self.device)
        clipped = self.targeted(op.target.applies_to)
        for buf in clipped:
            counted = op.replicated_once is False or all(
                self.coords[a] == 0 for a in op.group.axes
                if self.grid.size(a) > 1 and self._replica(buf, a))
            if counted and buf.numel:
                value = buf.denoted()
                total = total + (value * value).sum()
        comm.all_reduce(total, handle)
        norm = float(torch.sqrt(total).item())
        coef = min(1.0, float(op.max_norm) / (norm + NORM_EPS))
        for buf in clipped:
            buf.set_denoted(buf.denoted() * coef)

    def _local_overflow(self, denoted: bool) -> bool:
        for buf in self.buffers.values():
            if not buf.numel:
                continue
            value = buf.denoted() if denoted else buf.consumed()[buf.opt[0]:buf.opt[1]]
            if not bool(torch.isfinite(value).all()):
                return True
        return False

    def update(self) -> None:
        if self.s.dynamic and (self.overflow or self._local_overflow(denoted=False)):
            self.skipped.append(self.step_index)
            return
        for buf in self.buffers.values():
            if not buf.numel:
                continue
            start, stop = buf.opt
            grad = buf.consumed()[start:stop]
            buf.momentum = buf.momentum * MOMENTUM + grad
            flat = self.flat_params(buf).clone()
            flat[start:stop] = flat[start:stop] - LEARNING_RATE * buf.momentum
            self.write_params(buf, flat)

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
            names = ",".join(local_key(s, self.layout, self.coords) for s in buf.specs)
            digest = hashlib.sha1(names.encode()).hexdigest()[:10]
            start, stop = buf.opt
            out[f"optimizer/{buf.group.value}/{digest}[{start}:{stop}]"] = ("optimizer",
                                                                            buf.momentum)
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
            names = ",".join(local_key(s, self.layout, self.coords) for s in buf.specs)
            digest = hashlib.sha1(names.encode()).hexdigest()[:10]
            start, stop = buf.opt
            flat = torch.cat([local_value(momentum[s.name], s, self.layout, self.coords)
                              .reshape(-1) for s in buf.specs])
            out[f"optimizer/{buf.group.value}/{digest}[{start}:{stop}]"] = flat[start:stop]
        return out


def groups_needed(strategy: Strategy) -> list[Group]:
    """Every group a run communicates over: the step's statements and counts, the model's
    tensor, context and expert axes, and the gather of parameters sharded before use."""
    names = strategy.mesh.names

    def ordered(axes: tuple[str, ...]) -> Group:
        return Group(tuple(a for a in names if a in axes))

    out: list[Group] = []
    for op in strategy.step.ops():
        if isinstance(op, Collective | Clip):
            out.append(op.group)
        monomial = op.loss if isinstance(op, Backward) else op.factor if isinstance(op, Scale) \
            else None
        if monomial is not None:
            out += [ordered(t.count.axes) for t, _ in monomial.factors if t.count is not None]
    for p in strategy.placements:
        if p.role is not Role.DATA and strategy.size(p.axis) > 1:
            out.append(ordered((p.axis,)))
    gathered = gathered_axes(strategy)
    if gathered:
        out.append(ordered(gathered))
    return out


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype,
                                                                     device=p.device)


def _initial(setup: Setup) -> dict[str, torch.Tensor]:
    from placeverify.replay.model import init_params

    return init_params(setup.specs, setup.seed, setup.dtype)
