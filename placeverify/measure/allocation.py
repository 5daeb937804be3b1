"""The bytes torch's allocator holds on a measure rank, phase by phase of the measured step.

:class:`AllocationMeter` reads CUDA's allocator statistics, or on CPU the profiler's memory
events with c10's running total kept on every thread (:func:`track_all_threads`); each phase's
start, peak and the op that allocated at the peak is a :class:`PhasePeak`. The model's
parameters, gradients and optimizer state are counted by :mod:`placeverify.measure.probes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PhasePeak:
    """The allocator's live bytes in one phase of the measured step: at its start, its highest,
    and the op that allocated at the highest moment (CPU only; None on CUDA)."""

    start: int
    peak: int
    op: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "peak": self.peak, "op": self.op}


MARKER_BYTES = 977  # an odd size no model tensor of this backend has (they are fp32 or int64)


def track_all_threads() -> bool:
    """Set c10's ``FLAGS_caffe2_report_cpu_memory_usage`` (a global of ``libc10``), so that the CPU
    allocator's running total is kept on every thread; False when this torch does not export it."""
    import ctypes
    import os

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    try:
        flag = ctypes.c_bool.in_dll(ctypes.CDLL(path), "FLAGS_caffe2_report_cpu_memory_usage")
    except (OSError, ValueError):
        return False
    flag.value = True
    return True


class AllocationMeter:
    """Live bytes held by torch's allocator on this rank, phase by phase.

    - CUDA: ``torch.cuda.memory_allocated`` and ``max_memory_allocated`` after
      ``reset_peak_memory_stats`` at each phase's start (PyTorch docs, "torch.cuda.memory").
    - CPU: the profiler's memory events (``profile_memory=True``): every allocation event carries
      the CPU allocator's running total (c10 ``ProfiledCPUMemoryReporter``, ``allocated_``). That
      total is kept only on threads where memory profiling is on, so a tensor gloo frees on one
      of its worker threads (FSDP2's all-gather and reduce-scatter buffers, held by the gloo
      work object) would stay counted. The meter therefore sets c10's
      ``FLAGS_caffe2_report_cpu_memory_usage`` (``c10/core/CPUAllocator.cpp``: with it,
      ``ProfiledCPUMemoryReporter::New`` / ``Delete`` keep the total on every thread) when it is
      made, before the model exists, and starts the profiler there: the total then counts every
      CPU tensor alive on the rank, on every thread, less what was alive when the meter was made
      (read from a marker allocation). Events are reported only from the profiled thread, so a
      peak reached and left inside one gloo call is not seen; what gloo holds across the main
      thread's allocations is. Without the flag (a torch that does not export it) the meter
      falls back to counting from ``start()`` on top of the caller's ``baseline``. Each phase is
      a ``record_function`` range; its peak is the highest running total among the allocations
      inside it.
    """

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.device = device
        self.enabled = enabled
        self.cuda = device.type == "cuda"
        self.phases: dict[str, PhasePeak] = {}
        self.baseline = 0  # bytes alive before start() that the meter cannot see (CPU)
        self.runtime = self.runtime_bytes()
        self._profiler: Any = None
        self.all_threads = False  # CPU: c10 keeps the running total on every thread
        if self.enabled and not self.cuda and track_all_threads():
            self.all_threads = True
            self._start_profiler()
            # an allocation whose event reads the total alive before the model exists (freed at
            # once: it is not part of the run)
            del_marker = torch.empty(MARKER_BYTES, dtype=torch.uint8)
            del del_marker

    def start(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return
        if not self.all_threads:
            self._start_profiler()

    def runtime_bytes(self) -> int:
        """CUDA: what the runtime itself takes through the caching allocator before any model
        state exists: cuBLAS's workspace, allocated at the first matrix product of each thread
        (the forward's, and the autograd engine's device thread that runs backward), for cuBLAS and
        cuBLASLt; 0 on CPU."""
        if not (self.enabled and self.cuda):
            return 0
        a = torch.ones(8, 8, device=self.device, requires_grad=True)
        bias = torch.ones(8, device=self.device, requires_grad=True)
        # a product with bias takes cuBLASLt's path (its own workspace), one without plain cuBLAS
        (torch.nn.functional.linear(a, a, bias) @ a).sum().backward()
        del a, bias
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_allocated(self.device)

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            start = torch.cuda.memory_allocated(self.device)
            try:
                yield
            finally:
                torch.cuda.synchronize(self.device)
                self.phases[name] = PhasePeak(start, torch.cuda.max_memory_allocated(self.device))
            return
        with torch.profiler.record_function(f"placeverify.phase.{name}"):
            yield

    def stop(self) -> None:
        """Stop profiling (CPU) and read each phase's peak from the memory events."""
        if not self.enabled or self.cuda or self._profiler is None:
            return
        self._profiler.__exit__(None, None, None)
        from torch._C._profiler import _EventType

        allocations: list[tuple[int, int, str]] = []  # (time, running total, op)
        ranges: dict[str, tuple[int, int]] = {}
        stack = [(node, "") for node in self._profiler.profiler.kineto_results.experimental_event_tree()]
        zero: tuple[int, int] | None = None  # (time, total alive before the meter) of the marker
        while stack:
            node, parent = stack.pop()
            if node.tag == _EventType.Allocation:
                fields = node.extra_fields
                allocations.append((node.start_time_ns, fields.total_allocated, parent))
                if (self.all_threads and fields.alloc_size == MARKER_BYTES
                        and (zero is None or node.start_time_ns < zero[0])):
                    zero = (node.start_time_ns, fields.total_allocated - MARKER_BYTES)
            elif node.name.startswith("placeverify.phase."):
                ranges[node.name.removeprefix("placeverify.phase.")] = (node.start_time_ns,
                                                                        node.end_time_ns)
            stack.extend((child, node.name) for child in node.children)
        allocations.sort()
        base = self.baseline
        if self.all_threads:
            if zero is None:
                raise RuntimeError("the allocation meter found no marker allocation")
            # the total counts everything alive since the flag was set: no caller's baseline, and
            # what was alive before the meter (earlier runs in this process) taken off
            base = -zero[1]
        for name, (begin, end) in sorted(ranges.items(), key=lambda item: item[1]):
            before = [a for a in allocations if a[0] < begin]
            inside = [a for a in allocations if begin <= a[0] <= end]
            start = before[-1][1] if before else 0
            top = max(inside, key=lambda a: a[1], default=(0, start, None))
            self.phases[name] = PhasePeak(base + start, base + max(start, top[1]),
                                          top[2] if top[1] > start else None)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device.type, "runtime": self.runtime,
                "phases": {name: p.to_json() for name, p in self.phases.items()}}
