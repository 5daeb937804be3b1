"""Collectives with autograd, for the split model (Megatron-LM's mappings, written out).

Megatron-LM (``megatron/core/tensor_parallel/mappings.py``) names four conjugate pairs, each a
forward collective whose backward is the other one of the pair:

- ``copy_to_tensor_model_parallel_region`` (*f*): identity forward, all-reduce backward — before a
  column-parallel layer whose input is replicated;
- ``reduce_from_tensor_model_parallel_region`` (*g*): all-reduce forward, identity backward — after
  a row-parallel layer;
- ``gather_from_sequence_parallel_region``: all-gather along the sequence forward, reduce-scatter
  backward — before a column-parallel layer under sequence parallelism, and for K/V under context
  parallelism (every rank's queries read every key, so the key gradients are partial);
- ``reduce_scatter_to_sequence_parallel_region``: reduce-scatter forward, all-gather backward —
  after a row-parallel layer under sequence parallelism;

plus ``gather_from_tensor_model_parallel_region`` (all-gather forward, keep own slice backward) for
the vocabulary-parallel logits, and an all-to-all whose backward is the reverse all-to-all for
expert routing (GShard / Megatron-LM's token dispatcher). A handle of one rank makes each of them
the identity.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from placeverify.replay.distributed import Handle


def all_reduce(t: torch.Tensor, handle: Handle | None, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (sum or max); returns ``t``."""
    if handle is None or handle.size == 1:
        return t
    reduce_op = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM
    dist.all_reduce(t, op=reduce_op, group=handle.pg)
    return t


def gather(t: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
    """Concatenate every member's ``t`` along ``dim`` (in group order)."""
    if handle is None or handle.size == 1:
        return t
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(handle.size)]
    dist.all_gather(parts, t, group=handle.pg)
    return torch.cat(parts, dim)


def reduce_scatter(t: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
    """Sum over the group, keep this member's chunk along ``dim``."""
    if handle is None or handle.size == 1:
        return t
    chunks = [c.contiguous() for c in t.chunk(handle.size, dim)]
    out = torch.empty_like(chunks[handle.index])
    dist.reduce_scatter(out, chunks, group=handle.pg)
    return out


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: Handle | None) -> torch.Tensor:
        ctx.handle = handle
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduce(grad.clone(), ctx.handle), None


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: Handle | None) -> torch.Tensor:
        return all_reduce(x.clone(), handle)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
        ctx.handle, ctx.dim = handle, dim
        return gather(x, handle, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return reduce_scatter(grad, ctx.handle, ctx.dim), None, None


class _ReduceScatterGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
        ctx.handle, ctx.dim = handle, dim
        return reduce_scatter(x, handle, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return gather(grad, ctx.handle, ctx.dim), None, None


class _GatherSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
        ctx.handle, ctx.dim = handle, dim
        return gather(x, handle, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        handle = ctx.handle
        if handle is None or handle.size == 1:
            return grad, None, None
        return grad.chunk(handle.size, ctx.dim)[handle.index].contiguous(), None, None


def _all_to_all(x: torch.Tensor, handle: Handle, send: list[int], receive: list[int]) -> torch.Tensor:
    out = x.new_empty((sum(receive), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), receive, send, group=handle.pg)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, handle: Handle | None, send: list[int],
                receive: list[int]) -> torch.Tensor:
        ctx.handle, ctx.send, ctx.receive = handle, send, receive
        if handle is None or handle.size == 1:
            return x.clone()
        return _all_to_all(x, handle, send, receive)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        if ctx.handle is None or ctx.handle.size == 1:
            return grad, None, None, None
        return _all_to_all(grad, ctx.handle, ctx.receive, ctx.send), None, None, None


def copy_to_region(x: torch.Tensor, handle: Handle | None) -> torch.Tensor:
    return x if handle is None or handle.size == 1 else _CopyToRegion.apply(x, handle)


def reduce_from_region(x: torch.Tensor, handle: Handle | None) -> torch.Tensor:
    return x if handle is None or handle.size == 1 else _ReduceFromRegion.apply(x, handle)


def gather_along(x: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
    """All-gather forward, reduce-scatter backward (sequence and context parallelism)."""
    return x if handle is None or handle.size == 1 else _GatherReduceScatter.apply(x, handle, dim)


def scatter_along(x: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
    """Reduce-scatter forward, all-gather backward (after a row-parallel layer under SP)."""
    return x if handle is None or handle.size == 1 else _ReduceScatterGather.apply(x, handle, dim)


def gather_split(x: torch.Tensor, handle: Handle | None, dim: int) -> torch.Tensor:
    """All-gather forward, own slice backward (vocabulary-parallel logits)."""
    return x if handle is None or handle.size == 1 else _GatherSplit.apply(x, handle, dim)


def all_to_all(x: torch.Tensor, handle: Handle | None, send: list[int],
               receive: list[int]) -> torch.Tensor:
    """Rows ``send[i]`` go to member i; ``receive[i]`` rows come from member i."""
    return _AllToAll.apply(x, handle, send, receive)


def exchange_counts(send: list[int], handle: Handle | None, device: torch.device) -> list[int]:
    """How many rows each member will send this one (an all-to-all of the counts)."""
    if handle is None or handle.size == 1:
        return list(send)
    out = torch.zeros(handle.size, dtype=torch.int64, device=device)
    dist.all_to_all_single(out, torch.tensor(send, dtype=torch.int64, device=device),
                           group=handle.pg)
    return [int(v) for v in out.tolist()]


def all_to_all_ids(ids: torch.Tensor, handle: Handle | None, send: list[int],
                   receive: list[int]) -> torch.Tensor:
    """An all-to-all of integer rows, without gradients (the expert id of each routed token)."""
    if handle is None or handle.size == 1:
        return ids
    out = ids.new_empty(sum(receive))
    dist.all_to_all_single(out, ids.contiguous(), receive, send, group=handle.pg)
    return out
