"""Per-device communication per training step.

Bytes are what one device sends (equal to what it receives) under bandwidth-optimal ring
algorithms: an all-reduce of S bytes over n devices moves 2(n-1)/n·S, a reduce-scatter,
all-gather, broadcast or all-to-all (n-1)/n·S, a point-to-point send S (REFERENCE §2.2).

Two sources of traffic:

- the step's own collectives (the file's step, or the canonical step of the placement): gradient
  reductions, parameter gathers after a sharded update, token counts, the overflow flag, the
  clipping norm; a collective inside the micro-batch loop runs once per micro-batch;
- traffic the placement implies inside forward and backward: S* parameter gathers (forward and,
  unless kept, backward, per micro-batch), Megatron tensor parallelism (4 all-reduces of b·s·h per
  layer per micro-batch; under sequence parallelism 6 all-gathers and 4 reduce-scatters, the
  column-parallel inputs gathered again in backward),
  pipeline point-to-point (b·s·h per micro-batch per boundary per direction), context
  parallelism (all-gather of K and V forward and backward, reduce-scatter of their gradients),
  expert all-to-all (dispatch and combine, forward and backward), and host <-> device transfers
  for offloaded states (:mod:`placeverify.cost.placement_traffic`).

This module holds the item type (:class:`CommItem`), the ring factors, the step's collectives
(:func:`step_items`), their α-β time (:func:`timed`) and the pipeline bubble.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from placeverify.cost import fine_tune
from placeverify.cost.domain import Domain, Num
from placeverify.cost.memory import gathered_bytes, local_params, model_split, reduced_bytes
from placeverify.diagnostics import Span
from placeverify.ir.collectives import COLLECTIVES
from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, Schedule, State
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Op,
    TargetKind,
    TermKind,
)
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import partitions

COUNT_BYTES = 8  # an int64 token or sample count
FLAG_BYTES = 4  # an fp32 overflow flag or squared norm


@dataclass(frozen=True, slots=True)
class CommItem:
    op: str  # all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send, h2d, d2h
    axes: tuple[str, ...]  # () for host <-> device transfers
    what: str
    payload: Num  # bytes per call
    calls: Num  # calls per step
    group_size: int
    factor: Num  # ring factor: bytes moved per payload byte
    state: str  # gradients | params | activations | optimizer | scalar
    source: str  # "step" (the step's statements) or "placement" (implied by a placement)
    span: Span | None = None
    seconds: Fraction | None = None
    # a tensor-parallel collective of a column-parallel layer's backward that the framework runs
    # beside that layer's input- or weight-gradient GEMM (a tensor axis placed ``overlap =
    # backward``, ir.placement.TensorOverlap)
    beside_gemm: bool = False

    @property
    def bytes(self) -> Num:
        return self.payload * self.factor * self.calls

    @property
    def pcie(self) -> bool:
        return self.op in ("h2d", "d2h")


KINDS = frozenset(k.value for k in CollectiveKind)


def ring_factor(d: Domain, kind: str, n: Num) -> Num:
    """Bytes per payload byte a device sends: the collective's ring cost (ir.collectives), or
    the payload itself for point-to-point and host transfers."""
    spec = COLLECTIVES.get(CollectiveKind(kind)) if kind in KINDS else None
    if spec is None or spec.ring_steps is None:
        return d.const(1)
    steps = spec.ring_steps
    return (n - 1) / n if steps == 1 else steps.numerator * (n - 1) / n


def group_size(d: Domain, strategy: Strategy, group: Group) -> tuple[Num, int]:
    size: Num = d.const(1)
    for axis in group.axes:
        if axis in group.ends:
            size = size * d.const(min(2, strategy.size(axis)))
        else:
            size = size * d.sym(axis, strategy.size(axis))
    return size, group.size(strategy.mesh)


def comm_item(d: Domain, strategy: Strategy, kind: str, group: Group, what: str, payload: Num,
              calls: Num, state: str, source: str, span: Span | None,
              beside_gemm: bool = False) -> CommItem:
    n, n_value = group_size(d, strategy, group)
    return CommItem(kind, group.axes, what, payload, calls, n_value, ring_factor(d, kind, n),
                    state, source, span, beside_gemm=beside_gemm)


# ---- the step's collectives ------------------------------------------------------------------


def step_items(d: Domain, strategy: Strategy) -> list[CommItem]:
    step = strategy.step
    m = d.sym("m", step.microbatches)
    grads = fine_tune.counted(strategy, State.GRADIENTS, local_params(d, strategy, State.GRADIENTS))
    params = local_params(d, strategy, State.PARAMS)
    grad_bytes = reduced_bytes(d, strategy)  # G crosses the links in its reduction dtype
    param_bytes = gathered_bytes(d, strategy)  # Θ in the dtype it is gathered in
    fraction: dict[ParamGroup, Num] = {g: d.const(1) for g in grads}
    items: list[CommItem] = []

    def visit(op: Op, calls: Num) -> None:
        if isinstance(op, Backward):
            for term, _ in op.loss.factors:
                if term.kind is TermKind.COUNT and term.count is not None and term.count.axes:
                    per_step = term.count.scope.value in ("step", "run", "batch")  # once a step
                    group = strategy.mesh.group(*term.count.axes)
                    items.append(comm_item(d, strategy, "all_reduce", group, term.count.label(),
                                           d.const(COUNT_BYTES), d.const(1) if per_step else m,
                                           "scalar", "step", op.span))
        elif isinstance(op, Clip) and op.group.axes:
            items.append(comm_item(d, strategy, "all_reduce", op.group, "squared gradient norm",
                                   d.const(FLAG_BYTES), calls, "scalar", "step", op.span))
        elif isinstance(op, Collective):
            items.extend(_collective(d, strategy, op, calls, grads, params, fraction, grad_bytes,
                                     param_bytes))

    for op in step.pre:
        visit(op, d.const(1))
    for lo in step.loop:
        visit(lo.op, m if lo.microbatch is None else d.const(1))
    for op in step.post:
        visit(op, d.const(1))
    return items


def _collective(d: Domain, strategy: Strategy, op: Collective, calls: Num,
                grads: dict[ParamGroup, Num], params: dict[ParamGroup, Num],
                fraction: dict[ParamGroup, Num], grad_bytes: Num, param_bytes: Num) -> list[CommItem]:
    kind = op.kind.value
    target = op.target
    if target.kind in (TargetKind.TOKENS, TargetKind.OVERFLOW):
        size = COUNT_BYTES if target.kind is TargetKind.TOKENS else FLAG_BYTES
        return [comm_item(d, strategy, kind, op.group, target.label(), d.const(size), calls, "scalar",
                          "step", op.span)]
    if target.kind is TargetKind.ACTIVATIONS:
        return []  # pipeline point-to-point traffic is counted from the pipeline placement
    if target.kind is TargetKind.GRADS:
        payload: Num = 0
        for group, n in grads.items():
            if target.applies_to(group):
                if op.group.ends and group is ParamGroup.EMBEDDING:
                    # the end stages sum the whole (vocab-parallel) word table they each hold,
                    # not the 1/p share the even-split memory model assigns a stage (a learned
                    # position table, on the first stage only, is not tied)
                    n = _tied_word(d, strategy, n)
                payload = payload + n * fraction[group]
                if op.kind is CollectiveKind.REDUCE_SCATTER:
                    fraction[group] = fraction[group] / group_size(d, strategy, op.group)[0]
                elif op.kind is CollectiveKind.ALL_GATHER:
                    fraction[group] = d.const(1)
        return [comm_item(d, strategy, kind, op.group, target.label(), payload * grad_bytes, calls,
                          "gradients", "step", op.span)]
    if op.kind is not CollectiveKind.ALL_GATHER:  # a broadcast or sum of Θ moves it as stored
        param_bytes = d.const(strategy.precision.params)
    applies = {g for g in params if target.applies_to(g)}
    # after the update over axes where Θ is whole (ZeRO-1/2 sharing the updated shards) only the
    # trained groups changed; a sharded Θ (ZeRO-3, FSDP) gathers the frozen shards too
    updated = any(op is o for o in strategy.step.post) and not any(
        partitions(strategy, a, State.PARAMS) for a in op.group.axes)
    payload = fine_tune.gathered_payload(d, strategy, params, applies, updated, param_bytes)
    return [comm_item(d, strategy, kind, op.group, target.label(), payload, calls,
                      "params", "step", op.span)]


def _tied_word(d: Domain, strategy: Strategy, local: Num) -> Num:
    """The tied word table one end stage holds, from the embedding group's even 1/p share."""
    arch = strategy.model.arch
    if arch is None or not arch.position_rows:
        return local * _pipeline_split(d, strategy)
    word = d.sym("Ψ_word", arch.vocab * arch.hidden)
    return word / model_split(d, strategy, ParamGroup.EMBEDDING, State.GRADIENTS, pipeline=False)


def _pipeline_split(d: Domain, strategy: Strategy) -> Num:
    split: Num = d.const(1)
    for p in strategy.placements:
        if p.role is Role.PIPELINE:
            split = split * d.sym(p.axis, strategy.size(p.axis))
    return split


def timed(strategy: Strategy, item: CommItem, exact_bytes: Fraction, exact_calls: Fraction) -> CommItem:
    """Add an alpha-beta time estimate when the mesh gives bandwidths (no overlap assumed)."""
    mesh = strategy.mesh
    if item.pcie:
        if mesh.pcie_bandwidth is None:
            return item
        return replace(item, seconds=exact_bytes / mesh.pcie_bandwidth)
    links = [mesh.axis(a) for a in item.axes]
    if not links or any(a.bandwidth is None for a in links):
        return item
    bandwidth = min(a.bandwidth for a in links if a.bandwidth is not None)
    latency = max((a.latency or Fraction(0)) for a in links)
    n = item.group_size
    steps = {"all_reduce": 2 * (n - 1), "send": 1}.get(item.op, n - 1)
    return replace(item, seconds=exact_bytes / bandwidth + latency * steps * exact_calls)


def pipeline_bubble(d: Domain, strategy: Strategy) -> Num | None:
    """The bubble-to-compute ratio of a pipeline step: (p-1)/m, or (p-1)/(v·m) interleaved
    (Narayanan et al. 2021, §2.2: bubble time over ideal compute time). The idle share of the step
    is ratio / (1 + ratio), ``Costs.idle``."""
    pipeline = strategy.pipeline
    if pipeline is None or strategy.size(pipeline.axis) == 1:
        return None
    p = d.sym(pipeline.axis, strategy.size(pipeline.axis))
    m = d.sym("m", strategy.microbatches)
    if pipeline.schedule is Schedule.INTERLEAVED:
        return (p - 1) / (d.sym("v", pipeline.chunks) * m)
    return (p - 1) / m
