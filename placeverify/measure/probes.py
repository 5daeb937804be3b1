"""What the measure backend observes inside a real torch run.

- :class:`CommRecorder`, a ``TorchDispatchMode`` (PyTorch docs, "torch.utils._python_dispatch")
  that records every ``c10d`` and ``_c10d_functional`` op with its payload and group. The
  dispatcher routes DDP's C++ reducer, FSDP2, DTensor redistributions, ``ZeroRedundancyOptimizer``
  and ``torch.distributed.pipelining``'s point-to-point ops through these ops, so one mode sees
  them all. The profiler and ``CommDebugMode`` miss some of them on CPU (REFERENCE §5). For
  DTensor operands the mode gives way (returns ``NotImplemented``) so that DTensor's own
  dispatch runs with the mode still active and the collectives of its sharding rules (e.g.
  ``loss_parallel``'s) are seen on plain tensors, once.
- :class:`SavedTensorProbe`, ``torch.autograd.graph.saved_tensors_hooks`` that count the bytes
  autograd keeps for backward: deduplicated by storage, parameters (model state) and the input
  batch excluded, DTensors and async collective tensors unwrapped to the tensor that holds
  memory, split into the transformer layers and the rest, with the peak held at once.
- :func:`local_bytes`, the bytes of a tensor's local piece (a DTensor's ``_local_tensor``) and of
  its storage (FSDP2 pads dim 0 of each shard).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

# Tensor subclasses whose own dispatch issues collectives (DTensor's sharding rules, e.g.
# loss_parallel's cross-entropy) or waits on them.
_DEFERRED = (DTensor, AsyncCollectiveTensor)

# Ops that carry no payload of their own (completion and autograd plumbing).
IGNORED_OPS = {"wait_tensor", "_wrap_tensor_autograd", "check_for_nan"}

# op name -> (recorded kind, where the payload is): the full tensor the collective is about
# (REFERENCE §2.2): an all-gather's output, a reduce-scatter's input.
OPS: dict[str, tuple[str, str]] = {
    # c10d (the ProcessGroup API; DDP's reducer, FSDP2, ZeroRedundancyOptimizer, send/recv)
    "allreduce_": ("all_reduce", "arg0"),
    "allreduce_coalesced_": ("all_reduce", "arg0"),
    "broadcast_": ("broadcast", "arg0"),
    "_allgather_base_": ("all_gather", "arg0"),
    "allgather_": ("all_gather", "arg0"),
    "allgather_into_tensor_coalesced_": ("all_gather", "arg0"),
    "allgather_coalesced_": ("all_gather", "arg0"),
    "_reduce_scatter_base_": ("reduce_scatter", "arg1"),
    "reduce_scatter_": ("reduce_scatter", "arg1"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "arg1"),
    "reduce_": ("reduce", "arg0"),
    "alltoall_": ("all_to_all", "arg1"),
    "alltoall_base_": ("all_to_all", "arg1"),
    "gather_": ("gather", "arg0"),
    "scatter_": ("scatter", "arg1"),
    "send": ("send", "arg0"),
    "recv_": ("recv", "arg0"),
    "recv_any_source_": ("recv", "arg0"),
    "barrier": ("barrier", "none"),
    "monitored_barrier_": ("barrier", "none"),
    # _c10d_functional (DTensor redistributions, loss_parallel, funcol users)
    "all_reduce": ("all_reduce", "arg0"),
    "all_reduce_": ("all_reduce", "arg0"),
    "all_reduce_coalesced": ("all_reduce", "arg0"),
    "all_reduce_coalesced_": ("all_reduce", "arg0"),
    "all_gather_into_tensor": ("all_gather", "gathered"),
    "all_gather_into_tensor_out": ("all_gather", "gathered"),
    "all_gather_into_tensor_coalesced": ("all_gather", "gathered"),
    "reduce_scatter_tensor": ("reduce_scatter", "arg0"),
    "reduce_scatter_tensor_out": ("reduce_scatter", "arg0"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "arg0"),
    "all_to_all_single": ("all_to_all", "arg0"),
    "broadcast": ("broadcast", "arg0"),
    "isend": ("send", "arg0"),
    "irecv": ("recv", "arg0"),
}


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a (nested) list of tensors."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


@dataclass
class Record:
    """One collective call on this rank."""

    phase: str
    namespace: str
    op: str  # the raw op name
    kind: str  # all_reduce, all_gather, ...
    payload: int  # bytes of the full tensor (REFERENCE §2.2)
    group_size: int
    group_ranks: list[int]
    peer: int | None = None  # send / recv: the global rank at the other end
    storages: list[int] = field(default_factory=list)  # data pointers of the tensors it touched

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "namespace": self.namespace, "op": self.op,
                "kind": self.kind, "payload": self.payload, "group_size": self.group_size,
                "group_ranks": self.group_ranks, "peer": self.peer}


def _group(namespace: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dist.ProcessGroup | None:
    """The process group a c10d or functional op runs on."""
    if namespace == "c10d":
        for value in args:
            if isinstance(value, torch.ScriptObject):
                try:
                    return dist.ProcessGroup.unbox(value)
                except (RuntimeError, TypeError):
                    continue
        return None
    name = kwargs.get("group_name")
    if name is None:
        strings = [a for a in args if isinstance(a, str)]
        name = strings[-1] if strings else None
    if name is None:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _ints(args: tuple[Any, ...]) -> list[int]:
    return [a for a in args if isinstance(a, int) and not isinstance(a, bool)]


def _storage_ptrs(value: Any) -> list[int]:
    if isinstance(value, torch.Tensor):
        return [value.untyped_storage().data_ptr()]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _storage_ptrs(v)]
    return []


class CommRecorder(TorchDispatchMode):
    """Records each c10d / _c10d_functional op; ``phase`` is set by the training loop."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Record] = []
        self.phase = "forward"
        self.unknown: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if any(issubclass(t, _DEFERRED) for t in types):
            # A tensor subclass (DTensor, an async collective tensor) runs its own dispatch; giving
            # way keeps this mode on the stack for the ops it issues on plain tensors (the
            # collectives of a sharding rule, e.g. loss_parallel's), which are then recorded once.
            return NotImplemented
        namespace = func.namespace
        if namespace in ("c10d", "_c10d_functional"):
            self._record(namespace, func._opname, args, kwargs)
        return func(*args, **kwargs)

    def _record(self, namespace: str, op: str, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> None:
        if op in IGNORED_OPS:
            return
        entry = OPS.get(op)
        if entry is None:
            self.unknown.add(f"{namespace}.{op}")
            return
        kind, where = entry
        pg = _group(namespace, args, kwargs)
        size = pg.size() if pg is not None else 0
        ranks = dist.get_process_group_ranks(pg) if pg is not None else []
        if where == "arg0":
            payload = tensor_bytes(args[0])
        elif where == "arg1":
            payload = tensor_bytes(args[1])
        elif where == "gathered":
            payload = tensor_bytes(args[0]) * size
        else:
            payload = 0
        peer = None
        if kind in ("send", "recv"):
            ints = _ints(args[1:])
            if ints and pg is not None:
                local = ints[0]
                # c10d.send / recv_ take the peer's rank in the group; functional ops the global one.
                peer = dist.get_global_rank(pg, local) if namespace == "c10d" else local
        self.records.append(Record(self.phase, namespace, op, kind, payload, size, ranks, peer,
                                   _storage_ptrs(args[0])))


# ---- bytes held by tensors ----------------------------------------------------------------------


def unwrap(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor that holds a DTensor's or an async collective tensor's memory."""
    for _ in range(4):
        inner = getattr(t, "_local_tensor", None)
        if inner is None:
            inner = getattr(t, "elem", None)
        if not isinstance(inner, torch.Tensor):
            return t
        t = inner
    return t


def local_bytes(t: torch.Tensor) -> int:
    local = unwrap(t)
    return local.numel() * local.element_size()


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    storage = unwrap(t).untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages under ``tensors`` (a shared storage counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        ptr, nbytes = storage_key(t)
        if nbytes:
            seen[ptr] = max(seen.get(ptr, 0), nbytes)
    return sum(seen.values())


def optimizer_tensors(state: dict[Any, dict[str, Any]]) -> Iterator[torch.Tensor]:
    for per_param in state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor):
                yield value


# ---- activations saved for backward -------------------------------------------------------------


class _Held:
    """What the pack hook returns: the tensor, and a release of its storage count when autograd
    drops it (after the backward of the node that saved it)."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


@dataclass
class SavedTensorProbe:
    """Counts the bytes saved for backward, once per live storage. Tensors sharing a storage with
    ``excluded()`` (the parameters, which are model state, and the step's input batch, which
    the caller holds anyway) are not counted."""

    excluded: Callable[[], Iterable[torch.Tensor]]
    region: str = "other"
    by_region: dict[str, int] = field(default_factory=dict)
    live: dict[int, list[int]] = field(default_factory=dict)  # storage -> [bytes, holders]
    live_bytes: int = 0
    peak: int = 0
    log: list[list[Any]] | None = None  # (shape, dtype, bytes, region, new?) when debugging

    def _excluded_storages(self) -> set[int]:
        return {storage_key(p)[0] for p in self.excluded()}

    def pack(self, tensor: torch.Tensor) -> Any:
        ptr, nbytes = storage_key(tensor)
        if nbytes == 0 or ptr in self._excluded_storages():
            return tensor
        entry = self.live.get(ptr)
        if self.log is not None:
            local = unwrap(tensor)
            self.log.append([list(local.shape), str(local.dtype), nbytes, self.region,
                             entry is None])
        if entry is None:
            # A storage not alive yet: new bytes kept for backward.
            self.by_region[self.region] = self.by_region.get(self.region, 0) + nbytes
            self.live[ptr] = [nbytes, 1]
            self.live_bytes += nbytes
            self.peak = max(self.peak, self.live_bytes)
        else:
            entry[1] += 1
        held = _Held(tensor)
        weakref.finalize(held, self._release, ptr)
        return held

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live_bytes -= entry[0]
            del self.live[ptr]

    @staticmethod
    def unpack(value: Any) -> Any:
        return value.tensor if isinstance(value, _Held) else value

    @contextmanager
    def active(self) -> Iterator[SavedTensorProbe]:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield self

    def tag_layers(self, modules: Iterable[nn.Module]) -> list[Any]:
        """Count what is saved inside these modules' forward as 'layers'."""
        handles = []

        def enter(module: nn.Module, args: Any) -> None:
            self.region = "layers"

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            self.region = "other"

        for module in modules:
            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave))
        return handles
