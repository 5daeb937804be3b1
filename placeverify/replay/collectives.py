"""One rank's collectives on real tensors: gradient all-reduce, reduce-scatter and all-gather,
parameter gathers and broadcasts, and the overflow flag, each over its real process group.

The semantics is :mod:`placeverify.semantics.interpreter`'s (see :mod:`placeverify.replay.step`
for the statement-by-statement summary); the collectives themselves are
:mod:`placeverify.replay.comm`'s.
"""

from __future__ import annotations

import torch

from placeverify.ir.mesh import Group
from placeverify.ir.relations import Relation
from placeverify.ir.step import Collective, CollectiveKind, Order, ReduceOp, TargetKind
from placeverify.replay import comm
from placeverify.replay.buffers import Buffers, RankState, flat_slice
from placeverify.replay.distributed import Handle
from placeverify.replay.layout import Unsupported, optimizer_axes
from placeverify.roles.relations import relation
from placeverify.semantics.buffers import MODELLED_COLLECTIVES, NEUTRAL_COLLECTIVES
from placeverify.semantics.participation import skips


class RankCollectives(RankState):
    """The collectives of the step IR on this rank's buffers and parameters."""

    def collective(self, op: Collective, k: int | None = None) -> None:
        target = op.target.kind
        if (op.kind, target) not in MODELLED_COLLECTIVES:
            raise Unsupported(f"line {op.span.line}: '{op.label()}' is not replayed")
        if (op.kind, target) in NEUTRAL_COLLECTIVES:
            return  # token counts and activations travel inside the model's forward and backward
        if target is TargetKind.GRADS:
            for buf in self.targeted(op.target.applies_to):
                if skips(op, self.strategy.step.idle_in(buf.group), k):
                    continue  # 'only = used' and no rank used the group (semantics/participation)
                self.grads_collective(op, buf)
        elif target is TargetKind.PARAMS:
            for buf in self.targeted(op.target.applies_to):
                self._params_held_alike(op, buf)
                if op.kind is CollectiveKind.ALL_GATHER:
                    self.gather_params(buf, op.group, "owner")
                elif op.kind is CollectiveKind.BROADCAST:
                    self.gather_params(buf, op.group, op.source)
                else:
                    raise Unsupported(f"line {op.span.line}: '{op.label()}' on parameters is not "
                                      "replayed")
        elif target is TargetKind.OVERFLOW:
            self._flag(op)
        else:
            raise Unsupported(f"line {op.span.line}: '{op.label()}' is not replayed")

    def _flag(self, op: Collective) -> None:
        """The overflow flag (placeverify.semantics.skip): ``all_reduce(max)`` ORs the ranks' own
        checks; ``broadcast(from = k)`` gives every rank the view of the group's k-th rank (its
        flag where one was decided, ORed with its check unless it decides on the flag alone),
        on which a rank then decides alone unless a loss scaler checks again (dynamic)."""
        handle = self.handle(op.group)
        local = self._local_overflow(denoted=True)
        if op.kind is CollectiveKind.BROADCAST:
            view = self.overflow if self.flag_alone else (self.overflow or local)
            flag = torch.tensor([[1.0 if view else 0.0]], dtype=self.dtype, device=self.device)
            flags = comm.gather(flag, handle, 0)
            self.overflow = bool(flags[int(op.source)].item() > 0)
            self.flag_alone = not self.s.dynamic
            return
        flag = torch.tensor([1.0 if local else 0.0], dtype=self.dtype, device=self.device)
        comm.all_reduce(flag, handle, "max")
        self.overflow = bool(flag.item() > 0)
        self.flag_alone = False

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
        else:
            raise Unsupported(f"line {op.span.line}: '{op.label()}' on gradients is not replayed")

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
