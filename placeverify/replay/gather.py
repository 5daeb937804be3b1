"""The torch replay of a collective inside the loss (``all_gather(differentiable | detached)
embeddings over G``, ``all_reduce(sum, ...)``): the collective runs for real, so the gradient each
rank receives is what torch's autograd makes of it, not the factor
:mod:`placeverify.semantics.gather` derives.

Each rank's quantity is its micro-batch's weighted loss (one number per rank: its samples'
share of the group's loss). The group's loss on every rank is the sum of the gathered (or
all-reduced) quantities, the same value everywhere:

- ``all_gather(differentiable)``: an all-gather whose backward sums every rank's gradient for a
  slice into its owner — a reduce-scatter of the gathered gradients, as
  ``torch.distributed.nn.functional.all_gather`` does, written here as an all-reduce of the
  stacked gradients keeping the rank's own slice (torch 2.13's gloo path of that function
  scatters from group-local indices taken as global ranks, and fails on a group that is not
  ranks 0..n-1);
- ``all_gather(detached)``: ``torch.distributed.all_gather`` of the detached quantity with the
  rank's own slot put back live, as contrastive losses that gather without gradient do;
- ``all_reduce(sum, differentiable)``: ``torch.distributed.nn.functional.all_reduce`` (backward:
  an all-reduce of the gradients);
- ``all_reduce(sum, detached)``: ``torch.distributed.all_reduce`` on a copy, the forward value
  the group's sum and the gradient the local quantity's alone (what an in-place all-reduce that
  autograd does not see gives, lightly-ai/lightly#1977).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from placeverify.ir.step import CollectiveKind, LossGather
from placeverify.replay.distributed import Handle


class _GatherWithGrad(torch.autograd.Function):
    """All-gather forward (the members' tensors stacked in group order); backward: every
    member's gradient for each slice summed, this member keeping its own (a reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: Handle) -> torch.Tensor:
        ctx.handle = handle
        parts = [torch.empty_like(x) for _ in range(handle.size)]
        dist.all_gather(parts, x.contiguous(), group=handle.pg)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.handle.pg)
        return summed[ctx.handle.index], None


def group_loss(part: torch.Tensor, gather: LossGather, handle: Handle | None) -> torch.Tensor:
    """The group's loss on this rank from this rank's ``part`` (a scalar), through the
    collective as written."""
    if handle is None or handle.size == 1:
        return part
    local = part.reshape(1)
    if gather.kind is CollectiveKind.ALL_GATHER:
        if gather.differentiable:
            parts = list(_GatherWithGrad.apply(local, handle).unbind(0))
        else:
            parts = [torch.empty_like(local) for _ in range(handle.size)]
            dist.all_gather(parts, local.detach().contiguous(), group=handle.pg)
            parts[handle.index] = local
        return torch.cat(parts).sum()
    if gather.differentiable:
        from torch.distributed.nn.functional import all_reduce

        with warnings.catch_warnings():  # torch 2.x marks it deprecated; its backward is what counts
            warnings.simplefilter("ignore", FutureWarning)
            return all_reduce(local, group=handle.pg).sum()
    summed = local.detach().clone()
    dist.all_reduce(summed, group=handle.pg)
    return (local + (summed - local.detach())).sum()
