"""Exposed communication in the step-time model (:mod:`placeverify.cost.time`, its
"Communication" bullet).

α-β per collective: ``bytes / (bandwidth · link efficiency) + latency · ring steps`` over the
slowest axis of the group (:func:`item_seconds`). Each collective runs beside a window of compute
or beside none (:class:`Window`, chosen by :func:`window`): tensor, context, expert and pipeline
traffic lengthens every micro-batch (so the bubble scales it too), except tensor-parallel
collectives placed ``overlap = true`` (beside the linear layers' GEMMs) or ``overlap = backward``
(the column-parallel layers' backward collectives beside their input- and weight-gradient
GEMMs); data-parallel gathers and reductions hide behind the forward or backward they overlap,
or, over a data axis that waits for them (:func:`waits`), lengthen every micro-batch inside the
loop and the step after it; gradients reduced once a step per model chunk queue behind the later
chunks' backward (:func:`reduced_by_chunk`); host transfers and scalars are exposed. What does
not fit in its window is exposed, or the share ``1 - overlap`` of it if more (:func:`outlasting`).

Parameters gathered before use (S*: ZeRO-3, FSDP, HSDP) move unit by unit (FSDP's wrapping
unit: a layer, and one unit for the parameters outside the layers; :func:`by_unit`): each of the
U units' gathers and gradient reductions is its own collective, with its own ring latency, and
the framework prefetches one unit ahead (FSDP2's default, FSDP1's ``BACKWARD_PRE``, DeepSpeed's
ZeRO-3 prefetch bucket): unit k + 1's gather runs beside unit k's forward, unit k - 1's gather
and unit k + 1's reduce-scatter beside unit k's backward. With U equal units the first unit's
gather of a forward has nothing to hide behind, nor the last unit's reduction of a backward;
the other U - 1 run beside a unit's compute each (:func:`by_units`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

from placeverify.cost.calibration import Calibration
from placeverify.cost.communication import CommItem
from placeverify.ir.placement import Overlap, Reduce, Role, TensorOverlap
from placeverify.ir.strategy import Strategy
from placeverify.roles.pipeline import chunk_ordered
from placeverify.roles.queries import gathered_axes


def outlasting(total: float, window: float, share: float) -> float:
    """The exposed part of ``total`` seconds of communication that runs beside ``window``
    seconds of compute and can hide at most the fraction ``share`` of itself: what outlasts the
    window, or ``1 - share`` of it if more (the overlap shares of :class:`Calibration`)."""
    return max(total * (1 - share), total - window)


def item_seconds(strategy: Strategy, item: CommItem, cal: Calibration) -> float | None:
    """α-β time of one collective item over a step (None when a link is not given)."""
    mesh = strategy.mesh
    total = float(Fraction(item.bytes))
    calls = float(Fraction(item.calls))
    if item.pcie:
        return None if mesh.pcie_bandwidth is None else total / float(mesh.pcie_bandwidth)
    links = [mesh.axis(a) for a in item.axes]
    if not links or total == 0:
        return 0.0
    if any(a.bandwidth is None for a in links):
        return None
    bandwidth = min(float(a.bandwidth) for a in links if a.bandwidth is not None)
    latency = max(float(a.latency or 0) for a in links)
    n = item.group_size
    steps = {"all_reduce": 2 * (n - 1), "send": 1}.get(item.op, n - 1)
    return total / (bandwidth * cal.link_efficiency) + latency * steps * calls


def by_unit(strategy: Strategy, item: CommItem) -> bool:
    """Does ``item`` move unit by unit: a parameter gather the placement implies for S*
    parameters, or a gradient reduction in a strategy whose parameters are gathered before use
    (ZeRO-3 and FSDP reduce-scatter each unit's gradients as its backward ends; HSDP all-reduces
    each unit's shard over the replicas then)?"""
    if not item.axes or item.pcie:
        return False
    if item.state == "params":
        return item.source == "placement"
    return item.state == "gradients" and bool(gathered_axes(strategy))


def unit_latency(strategy: Strategy, item: CommItem, units: int) -> float:
    """The ring latency the other ``units - 1`` per-unit collectives of ``item`` add to its
    α-β time (:func:`item_seconds` counts one collective per call)."""
    links = [strategy.mesh.axis(a) for a in item.axes]
    latency = max((float(a.latency or 0) for a in links), default=0.0)
    n = item.group_size
    steps = 2 * (n - 1) if item.op == "all_reduce" else n - 1
    return latency * steps * float(Fraction(item.calls)) * (units - 1)


def by_units(total: float, compute: float, share: float, units: int, first: float) -> float:
    """Exposed seconds of per-unit collectives of ``total`` seconds beside ``compute`` seconds
    of a pass over ``units`` equal units, prefetched one unit ahead: the first unit's ``first``
    seconds (the forward's first gather, the backward's last reduction) exposed whole, each of
    the other units' collectives beside one unit's compute (:func:`outlasting` of total / U
    beside compute / U, U - 1 times)."""
    if units <= 1:
        return outlasting(total, compute, share)
    return first + (units - 1) * outlasting(total / units, compute / units, share)


def unit_seconds(strategy: Strategy, item: CommItem, cal: Calibration, units: int) -> float | None:
    """:func:`item_seconds`, with the ring latency of every unit's collective when ``item``
    moves unit by unit over ``units`` units."""
    sec = item_seconds(strategy, item, cal)
    if sec and units > 1 and by_unit(strategy, item):
        sec += unit_latency(strategy, item, units)
    return sec


def pass_exposed(strategy: Strategy, items: list[tuple[CommItem, float]], compute: float,
                 share: float, units: int, first: str | None) -> float:
    """Exposed seconds of a window's collectives beside ``compute`` seconds: unit by unit
    (:func:`by_units`) when they move so and ``first`` names the state whose first (forward)
    or last (backward) unit is exposed whole; else what outlasts the window (:func:`outlasting`).
    A window that holds per-unit collectives holds nothing else (its gathers and reductions all
    follow the S* units)."""
    total = sum(sec for _, sec in items)
    if first is None or units <= 1 or not any(by_unit(strategy, i) for i, _ in items):
        return outlasting(total, compute, share)
    whole = sum(sec for item, sec in items if by_unit(strategy, item) and item.state == first)
    return by_units(total, compute, share, units, whole / units)


def queued(total: float, v: int, backward: float, share: float) -> float:
    """Exposed seconds of ``total`` seconds of gradient reductions made one chunk's share after
    each of ``v`` chunks' backward (``backward`` seconds over the stage's micro-batches), queued
    on the link: chunk k's starts once k + 1 of the v chunks' backward are done, so the last
    ends max(T / v, T - (v - 1) · backward / v) after the backward does, and at least the share
    1 - ``share`` of T is exposed (as every hidden data-parallel collective)."""
    return max(total / v, outlasting(total, (v - 1) * backward / v, share))


def unit_passes(gather: float, backward_comm: float, reduced: float, post: float,
                t_fwd: float, t_bwd: float, share: float, units: int, m: int) -> float:
    """The exposed seconds of a step's ZeRO-3 / FSDP traffic (the search's screen; the full
    model bins the same items, :func:`expose`): ``gather`` seconds of gathers per forward and
    ``backward_comm`` of gathers and reductions per backward (of which ``reduced`` are the
    reductions of the loop), M times; ``post`` seconds of reductions after the loop behind the
    last backward, or, with one micro-batch, beside that backward with its gathers."""
    if m == 1:
        backward_comm, reduced, post = backward_comm + post, reduced + post, 0.0
    return (m * by_units(gather, t_fwd, share, units, gather / units)
            + m * by_units(backward_comm, t_bwd, share, units, reduced / units)
            + by_units(post, t_bwd, share, units, post / units))


def label(item: CommItem) -> str:
    """The axis group a collective's exposed seconds are reported under."""
    return " * ".join(item.axes) if item.axes else "host"


def overlapped(strategy: Strategy, item: CommItem) -> bool:
    """Is ``item`` a tensor-parallel collective overlapped with the GEMMs: over tensor axes
    placed ``overlap = true`` only (Megatron-LM's --tp-comm-overlap splits each sequence-parallel
    all-gather and reduce-scatter into chunks pipelined with the GEMM that consumes or produces
    it; torchtitan's async tensor parallelism likewise)? (``overlap = backward`` overlaps only
    the items marked ``beside_gemm``.)"""
    return bool(item.axes) and all(strategy.placement(a).role is Role.TENSOR
                                   and strategy.placement(a).overlap is TensorOverlap.ALL
                                   for a in item.axes)


def waits(strategy: Strategy, item: CommItem) -> bool:
    """Does compute wait for ``item``, a collective over data axes, one of which is placed
    ``overlap = none`` (nothing overlapped: Megatron-LM without --overlap-grad-reduce reduces
    after the last backward), or, for a parameter gather, ``overlap = grads`` (Megatron-LM's
    distributed optimizer all-gathers the updated parameters after the step without
    --overlap-param-gather), for a gradient reduction ``overlap = params``?"""
    levels = [strategy.placement(a).data_overlap for a in item.axes
              if strategy.placement(a).role is Role.DATA]
    hidden = {"params": (Overlap.ALL, Overlap.PARAMS), "gradients": (Overlap.ALL, Overlap.GRADS)}
    return item.state in hidden and any(level not in hidden[item.state] for level in levels)


def reduced_by_chunk(strategy: Strategy, item: CommItem) -> bool:
    """Is ``item`` a gradient reduction after the loop that runs chunk by chunk: over data axes
    placed ``reduce = step`` (each model chunk reduced after its last micro-batch) in a pipeline
    whose backward finishes one chunk before the next (:func:`roles.pipeline.chunk_ordered`)?"""
    return (item.state == "gradients" and bool(item.axes) and chunk_ordered(strategy)
            and all(strategy.placement(a).role is Role.DATA
                    and strategy.placement(a).reduce is Reduce.STEP for a in item.axes))


class Window(Enum):
    """Where a collective's time goes in the step."""

    GEMMS = "beside the linear layers' GEMMs of its micro-batch (tensor axes, overlap = true)"
    COLUMN_GEMMS = ("beside the column-parallel layers' input- and weight-gradient GEMMs "
                    "(tensor axes, overlap = backward)")
    MICROBATCH = "lengthens every micro-batch: nothing hides it"
    STEP = "added to the step once: host transfers, scalars, the optimizer's"
    WAITED = "added to the step after the loop: a data axis waits for it"
    LOOP_FORWARD = "behind each micro-batch's forward"
    LOOP_BACKWARD = "behind each micro-batch's backward"
    NEXT_FORWARD = "behind the next forward: the parameter gather after a sharded update"
    LAST_BACKWARD = "behind the last micro-batch's backward: gradient reductions after the loop"


LOOP = (Window.LOOP_FORWARD, Window.LOOP_BACKWARD)  # timed per micro-batch


def window(strategy: Strategy, item: CommItem, m: int) -> Window:
    """The window ``item`` runs beside in a step of ``m`` micro-batches (the module docstring)."""
    in_loop = m > 1 and Fraction(item.calls) % m == 0
    if item.state == "activations" and not item.pcie and overlapped(strategy, item):
        return Window.GEMMS
    if item.state == "activations" and item.beside_gemm:
        return Window.COLUMN_GEMMS
    if not item.pcie and (item.state == "activations" or (
            waits(strategy, item) and (in_loop or item.source == "placement"))):
        # tensor, context, expert and pipeline traffic, and the data-parallel collectives of the
        # loop that nothing hides
        return Window.MICROBATCH
    if item.pcie or item.state in ("scalar", "optimizer"):
        return Window.STEP
    if waits(strategy, item):
        return Window.WAITED
    if item.source == "placement":
        return Window.LOOP_FORWARD if "forward" in item.what else Window.LOOP_BACKWARD
    if item.state == "params":
        return Window.NEXT_FORWARD
    return Window.LOOP_BACKWARD if in_loop else Window.LAST_BACKWARD


@dataclass(frozen=True, slots=True)
class Windows:
    """The compute of a step that its collectives can hide behind."""

    microbatches: int
    bubble: float  # the pipeline bubble in micro-batch times
    chunks: int  # model chunks per stage (v), whose backward the chunked reductions queue behind
    rate: float | None  # the achieved matmul FLOP rate (None: no device, no GEMM time to hide in)
    gemms: float  # FLOPs of the linear layers' GEMMs per micro-batch (forward, backward, recomputed)
    column_gemms: float  # FLOPs of the column-parallel layers' backward GEMMs per micro-batch
    forward: float | None  # seconds of a micro-batch's forward
    backward: float | None  # seconds of a micro-batch's backward
    units: int = 1  # FSDP units per pass over the stage (its layers, and one for the rest)


@dataclass(frozen=True, slots=True)
class Exposure:
    """A step's exposed communication."""

    by_group: dict[str, float]  # exposed seconds per axis group (:func:`label`)
    microbatch: float  # seconds that lengthen every micro-batch
    data: float  # data-parallel seconds added to the step (waited for, or outlasting a window)
    once: float  # host transfers, scalars and the optimizer's collectives, added once
    missing: bool  # some axes have no bandwidth: their collectives are not timed


def expose(strategy: Strategy, comm: Iterable[CommItem], cal: Calibration, w: Windows) -> Exposure:
    """Each collective's exposed seconds, its window's compute hiding what it can."""
    m = w.microbatches
    exposed: dict[str, float] = {}

    def add(item: CommItem, seconds: float) -> None:
        exposed[label(item)] = exposed.get(label(item), 0.0) + seconds

    timed = [(item, unit_seconds(strategy, item, cal, w.units)) for item in comm]
    bins: dict[Window, list[tuple[CommItem, float]]] = {where: [] for where in Window}
    microbatch = 0.0
    waited = 0.0  # data-parallel collectives after the loop that nothing hides (overlap = none)
    for item, sec in timed:
        if not sec:
            continue
        where = window(strategy, item, m)
        if where is Window.MICROBATCH:
            microbatch += sec / m
            add(item, sec * (1 + w.bubble / m))
        elif where is Window.STEP:
            add(item, sec)
        elif where is Window.WAITED:
            waited += sec
            add(item, sec)
        else:
            bins[where].append((item, sec / m if where in LOOP else sec))

    def beside(items: list[tuple[CommItem, float]], gemm_flops: float, share: float) -> float:
        """Collectives run beside GEMMs of ``gemm_flops`` per micro-batch: what outlasts the
        GEMMs, or the part ``1 - share`` of them if more, lengthens each micro-batch; no
        device, no GEMM time to hide in."""
        gemms = 0.0 if w.rate is None else gemm_flops / w.rate
        total = sum(sec for _, sec in items)
        left = outlasting(total / m, gemms, share)
        for item, sec in items:
            add(item, left * m * (1 + w.bubble / m) * sec / total)
        return left

    def hide(items: list[tuple[CommItem, float]], compute: float | None, times: int,
             first: str | None = None) -> float:
        """``first``: the state whose first (forward) or last (backward) unit is exposed whole
        when the items move unit by unit (:func:`by_units`)."""
        total = sum(sec for _, sec in items)
        if total == 0:
            return 0.0
        left = pass_exposed(strategy, items, compute or 0.0, cal.data_overlap, w.units, first)
        for item, sec in items:
            add(item, times * left * sec / total)
        return times * left

    if bins[Window.GEMMS]:
        # overlapped with the linear layers' GEMMs of the micro-batch (forward, backward and
        # recomputed)
        microbatch += beside(bins[Window.GEMMS], w.gemms, cal.tp_overlap)
    if bins[Window.COLUMN_GEMMS]:
        # the column-parallel layers' backward collectives beside their input- and
        # weight-gradient GEMMs (each as long as the layer's forward GEMM), the output layer's
        # too when this stage holds it
        microbatch += beside(bins[Window.COLUMN_GEMMS], w.column_gemms, cal.backward_overlap)
    # without a device there is no backward to queue behind: they stay after the loop
    by_chunk = [(item, sec) for item, sec in bins[Window.LAST_BACKWARD]
                if w.backward is not None and reduced_by_chunk(strategy, item)]
    after = [entry for entry in bins[Window.LAST_BACKWARD] if entry not in by_chunk]
    if m == 1 and any(by_unit(strategy, item) for item, _ in after):
        # one micro-batch: its reductions unit by unit beside the backward of its gathers
        bins[Window.LOOP_BACKWARD] = bins[Window.LOOP_BACKWARD] + after
        after = []
    data = (hide(bins[Window.LOOP_FORWARD], w.forward, m, "params")
            + hide(bins[Window.LOOP_BACKWARD], w.backward, m, "gradients")
            + hide(after, w.backward, 1, "gradients") + hide(bins[Window.NEXT_FORWARD], w.forward, 1)
            + waited)
    if by_chunk and w.backward is not None:  # (known whenever by_chunk is not empty)
        total = sum(sec for _, sec in by_chunk)
        left = queued(total, w.chunks, m * w.backward, cal.data_overlap)
        for item, sec in by_chunk:
            add(item, left * sec / total)
        data += left
    once = sum(sec for item, sec in timed
               if sec and (item.pcie or item.state in ("scalar", "optimizer")))
    return Exposure(exposed, microbatch, data, once, any(sec is None for _, sec in timed))
