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
  for offloaded states.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from placeverify.cost.activations import (
    ActivationCost,
    parallel_sizes,
    recomputed_layers,
    stage_share,
)
from placeverify.cost.domain import Domain, Num
from placeverify.cost.memory import bytes_per_element, local_params
from placeverify.diagnostics import Span
from placeverify.ir.collectives import COLLECTIVES
from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, Schedule, State, TensorOverlap
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
from placeverify.roles.queries import gathered_axes, gathers_copies, replicates_model

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


def _item(d: Domain, strategy: Strategy, kind: str, group: Group, what: str, payload: Num,
          calls: Num, state: str, source: str, span: Span | None,
          beside_gemm: bool = False) -> CommItem:
    n, n_value = group_size(d, strategy, group)
    return CommItem(kind, group.axes, what, payload, calls, n_value, ring_factor(d, kind, n),
                    state, source, span, beside_gemm=beside_gemm)


# ---- the step's collectives ------------------------------------------------------------------


def step_items(d: Domain, strategy: Strategy) -> list[CommItem]:
    step = strategy.step
    m = d.sym("m", step.microbatches)
    grads = local_params(d, strategy, State.GRADIENTS)
    params = local_params(d, strategy, State.PARAMS)
    grad_bytes = bytes_per_element(d, strategy, State.GRADIENTS)
    param_bytes = bytes_per_element(d, strategy, State.PARAMS)
    fraction: dict[ParamGroup, Num] = {g: d.const(1) for g in grads}
    items: list[CommItem] = []

    def visit(op: Op, calls: Num) -> None:
        if isinstance(op, Backward):
            for term, _ in op.loss.factors:
                if term.kind is TermKind.COUNT and term.count is not None and term.count.axes:
                    per_step = term.count.scope.value in ("step", "run", "batch")  # once a step
                    group = strategy.mesh.group(*term.count.axes)
                    items.append(_item(d, strategy, "all_reduce", group, term.count.label(),
                                       d.const(COUNT_BYTES), d.const(1) if per_step else m,
                                       "scalar", "step", op.span))
        elif isinstance(op, Clip) and op.group.axes:
            items.append(_item(d, strategy, "all_reduce", op.group, "squared gradient norm",
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
        return [_item(d, strategy, kind, op.group, target.label(), d.const(size), calls, "scalar",
                      "step", op.span)]
    if target.kind is TargetKind.ACTIVATIONS:
        return []  # pipeline point-to-point traffic is counted from the pipeline placement
    if target.kind is TargetKind.GRADS:
        payload: Num = 0
        for group, n in grads.items():
            if target.applies_to(group):
                if op.group.ends and group is ParamGroup.EMBEDDING:
                    # the end stages sum the whole (vocab-parallel) embedding they each hold,
                    # not the 1/p share the even-split memory model assigns a stage
                    n = n * _pipeline_split(d, strategy)
                payload = payload + n * fraction[group]
                if op.kind is CollectiveKind.REDUCE_SCATTER:
                    fraction[group] = fraction[group] / group_size(d, strategy, op.group)[0]
                elif op.kind is CollectiveKind.ALL_GATHER:
                    fraction[group] = d.const(1)
        return [_item(d, strategy, kind, op.group, target.label(), payload * grad_bytes, calls,
                      "gradients", "step", op.span)]
    payload = 0
    for group, n in params.items():
        if target.applies_to(group):
            payload = payload + n
    return [_item(d, strategy, kind, op.group, target.label(), payload * param_bytes, calls,
                  "params", "step", op.span)]


def _pipeline_split(d: Domain, strategy: Strategy) -> Num:
    split: Num = d.const(1)
    for p in strategy.placements:
        if p.role is Role.PIPELINE:
            split = split * d.sym(p.axis, strategy.size(p.axis))
    return split


# ---- traffic implied by the placement ----------------------------------------------------------


def placement_items(d: Domain, strategy: Strategy,
                    activations: ActivationCost | None) -> list[CommItem]:
    items: list[CommItem] = []
    mesh = strategy.mesh
    m = d.sym("m", strategy.microbatches)
    param_bytes = bytes_per_element(d, strategy, State.PARAMS)
    local = local_params(d, strategy)
    local_total: Num = 0
    for n in local.values():
        local_total = local_total + n

    gathered = set(gathered_axes(strategy)).union(*(gathered_axes(strategy, g) for g in local))
    if any(gathers_copies(p, g) for p in strategy.placements for g in local) or \
            any(len(_sharded_over(strategy, g)) > 1 for g in local):
        items.extend(_gathers_by_group(d, strategy, local, m, param_bytes))
        gathered = set()
    for p in strategy.placements:
        if p.axis not in gathered:
            continue
        group = mesh.group(p.axis)
        payload = local_total
        if p.group_modes:  # per-group meshes: only the groups this axis gathers
            payload = 0
            for g, n in local.items():
                if p.axis in gathered_axes(strategy, g):
                    payload = payload + n
        items.append(_item(d, strategy, "all_gather", group, "params (gather for forward)",
                           payload * param_bytes, m, "params", "placement", p.span))
        if p.reshard_after_forward:
            items.append(_item(d, strategy, "all_gather", group, "params (gather for backward)",
                               payload * param_bytes, m, "params", "placement", p.span))

    arch = strategy.model.arch
    if arch is not None:
        items.extend(_model_parallel_items(d, strategy, m))
    items.extend(_offload_items(d, strategy, m, local_total, activations))
    return items


def _sharded_over(strategy: Strategy, group: ParamGroup) -> tuple[str, ...]:
    """The axes of more than one rank a group's parameters are gathered over."""
    return tuple(a for a in gathered_axes(strategy, group) if strategy.size(a) > 1)


def _gathers_by_group(d: Domain, strategy: Strategy, local: dict[ParamGroup, Num], m: Num,
                      param_bytes: Num) -> list[CommItem]:
    """The parameter gathers of parameters sharded over several axes: each set of groups gathered
    over the same axes in one all-gather over their product, as FSDP2 gathers a unit over the
    (flattened) mesh it was given. A preset over a product (``place fsdp over dp * dq``) or over
    each axis moves (n - 1)/n of the payload per rank over the n = |dp x dq| ranks, not
    (|dp| - 1)/|dp| + (|dq| - 1)/|dq| of it, as one gather per axis would (a hierarchical gather,
    first over dq then over dp, also moves (n - 1)/n). With an expert axis (``place fsdp over ep
    * dp``, README "Per-group meshes") the dense parameters are gathered over dp x ep and the
    experts over dp (torchtitan's ``apply_fsdp``: the dense parameters over dp_shard, which
    includes the ep ranks, the routed experts over dp_shard_mod_ep)."""
    by_axes: dict[tuple[str, ...], list[ParamGroup]] = {}
    for g in local:
        axes = _sharded_over(strategy, g)
        if axes:
            by_axes.setdefault(axes, []).append(g)
    items: list[CommItem] = []
    for axes, groups in by_axes.items():
        payload: Num = 0
        for g in groups:
            payload = payload + local[g]
        first = strategy.placement(axes[0])
        label = "params" if len(groups) == len(local) else \
            f"params[{', '.join(sorted(g.value for g in groups))}]"
        reshard = any(strategy.placement(a).reshard_after_forward for a in axes)
        for when in ("forward", "backward") if reshard else ("forward",):
            items.append(_item(d, strategy, "all_gather", strategy.mesh.group(*axes),
                               f"{label} (gather for {when})", payload * param_bytes, m,
                               "params", "placement", first.span))
    return items


def _model_parallel_items(d: Domain, strategy: Strategy, m: Num) -> list[CommItem]:
    arch = strategy.model.arch
    assert arch is not None
    mesh = strategy.mesh
    items: list[CommItem] = []
    e = bytes_per_element(d, strategy, State.ACTIVATIONS)
    s, b, h = d.sym("s", arch.seq), d.sym("b", arch.micro_batch), d.sym("h", arch.hidden)
    t, sp, c = parallel_sizes(d, strategy)
    pipeline = strategy.pipeline
    p_size = strategy.size(pipeline.axis) if pipeline else 1
    layers = stage_share(d, strategy, arch)  # the stage with the most layers: the most traffic
    bsh = b * s * h * e / c  # one micro-batch's hidden states on this device (cp splits s)
    # Full recomputation runs each layer's forward again in backward, collectives included
    # (Megatron-LM's recompute granularity "full"); selective recomputation only redoes the
    # attention core, which has none; ``every = n`` re-runs ⌊layers / n⌋ of a stage's layers.
    # Not modelled: the all-gathers that ``selective_op`` recomputation re-runs (README).
    refwd: Fraction | int = 0
    if strategy.recompute.kind.value == "full":
        kept, held = recomputed_layers(strategy)
        refwd = 1 if kept == held else Fraction(kept, held)

    tensor_axes = strategy.axes(Role.TENSOR)
    if tensor_axes and strategy.mesh.group(*tensor_axes).size(mesh) > 1:
        group = mesh.group(*tensor_axes)
        span = strategy.placement(tensor_axes[0]).span
        # overlap = backward: the column-parallel layers' backward collectives (two per layer,
        # of each kind the backward issues there) are listed apart, beside their GEMMs
        beside = any(strategy.placement(a).overlap is TensorOverlap.BACKWARD
                     for a in tensor_axes)
        # the QKV projection and the MLP's first matmul; an MoE layer's experts are reached
        # through the token dispatcher's collectives instead (Megatron-core's expert linears
        # take explicit_expert_comm: no gather or input-gradient reduction of their own)
        pairs = 1 if arch.moe else 2
        if sp:
            # Megatron-core (megatron/core/tensor_parallel/layers.py,
            # LinearWithGradAccumulationAndAsyncCommunication): a column-parallel linear saves
            # its input's sequence shard and all-gathers it in forward and again in backward for
            # the weight gradient, then reduce-scatters the input gradient; a row-parallel
            # linear reduce-scatters its output, whose backward (mappings.py,
            # _ReduceScatterToSequenceParallelRegion) all-gathers the gradient. Two of each per
            # layer: 6 all-gathers + 4 reduce-scatters; a recomputed forward adds 2 + 2 (14).
            # The backward's re-gather runs beside the input-gradient GEMM and its
            # reduce-scatter beside the weight-gradient GEMM (async_op=True there).
            for kind, count, what in (
                    ("all_gather", 6 + 2 * refwd,
                     "column-parallel inputs gathered again in backward, beside the "
                     "input-gradient GEMMs"),
                    ("reduce_scatter", 4 + 2 * refwd,
                     "column-parallel input gradients, beside the weight-gradient GEMMs")):
                waited = count - pairs if beside else count
                items.append(_item(d, strategy, kind, group,
                                   f"activations (sequence parallel, {waited} per layer per "
                                   "micro-batch)", bsh, waited * layers * m,
                                   "activations", "placement", span))
                if beside:
                    items.append(_item(d, strategy, kind, group,
                                       f"{what} (sequence parallel, {pairs} per layer per "
                                       "micro-batch)", bsh, pairs * layers * m, "activations",
                                       "placement", span, beside_gemm=True))
            items.append(_item(d, strategy, "reduce_scatter", group,
                               "embedding output (vocab-parallel, forward)", bsh, m,
                               "activations", "placement", span))
            items.append(_item(d, strategy, "all_gather", group,
                               "embedding output gradient (sequence parallel, backward)", bsh, m,
                               "activations", "placement", span))
        else:
            # the column-parallel layers' input gradients are all-reduced in backward, beside
            # the weight-gradient GEMM (allreduce_dgrad, async_op=True)
            waited = 4 + 2 * refwd - (pairs if beside else 0)
            items.append(_item(d, strategy, "all_reduce", group,
                               f"activations (tensor parallel, {waited} per layer per "
                               "micro-batch)", bsh, waited * layers * m, "activations",
                               "placement", span))
            if beside:
                items.append(_item(d, strategy, "all_reduce", group,
                                   "column-parallel input gradients, beside the weight-gradient "
                                   f"GEMMs (tensor parallel, {pairs} per layer per micro-batch)",
                                   bsh, pairs * layers * m, "activations", "placement", span,
                                   beside_gemm=True))
            items.append(_item(d, strategy, "all_reduce", group,
                               "embedding output (vocab-parallel, forward)", bsh, m,
                               "activations", "placement", span))
        if p_size == 1:  # the output layer and the loss live on this device too
            # the output layer is column-parallel: its backward collectives run beside its
            # GEMMs as the layers' do
            near = ", beside the weight-gradient GEMM" if beside else ""
            out_kind = "reduce_scatter" if sp else "all_reduce"
            items.append(_item(d, strategy, out_kind, group,
                               f"output layer input gradient (backward{near})", bsh, m,
                               "activations", "placement", span, beside_gemm=beside))
            if sp:
                items.append(_item(d, strategy, "all_gather", group,
                                   "final hidden states (sequence parallel, forward)", bsh, m,
                                   "activations", "placement", span))
                near = ", beside the input-gradient GEMM" if beside else ""
                items.append(_item(d, strategy, "all_gather", group,
                                   "final hidden states (sequence parallel, re-gathered in "
                                   f"backward{near})", bsh, m, "activations", "placement", span,
                                   beside_gemm=beside))
            items.append(_item(d, strategy, "all_reduce", group,
                               "vocab-parallel cross-entropy (max, sum-exp, target logit)",
                               4 * b * s / c, 3 * m, "activations", "placement", span))

    if pipeline is not None and p_size > 1:
        chunks = d.sym("v", pipeline.chunks) if pipeline.chunks > 1 else d.const(1)
        split = sp or pipeline.scatter_gather  # scatter/gather: 1/t sent, then gathered
        boundary = bsh / (t if split else 1)
        items.append(_item(d, strategy, "send", mesh.group(pipeline.axis),
                           "activations forward, gradients backward (middle stage)", boundary,
                           2 * m * chunks, "activations", "placement", pipeline.span))
        if pipeline.scatter_gather and not sp and tensor_axes \
                and mesh.group(*tensor_axes).size(mesh) > 1:
            items.append(_item(d, strategy, "all_gather", mesh.group(*tensor_axes),
                               "stage boundary (pipeline scatter/gather, received)", bsh,
                               2 * m * chunks, "activations", "placement", pipeline.span))

    for p in strategy.placements:
        if p.role is Role.CONTEXT and strategy.size(p.axis) > 1:
            kv = (2 * b * s * h * (d.sym("a_kv", arch.kv_heads) / d.sym("a", arch.heads)) * e / t
                  if not arch.head_size else  # K and V: kv_heads heads of head_dim
                  2 * b * s * d.sym("a_kv", arch.kv_heads) * d.sym("d_head", arch.head_dim) * e / t)
            group = mesh.group(p.axis)
            items.append(_item(d, strategy, "all_gather", group,
                               "K and V (context parallel, forward" + (", recompute" if refwd else "")
                               + " and backward, per layer)", kv, (2 + refwd) * layers * m,
                               "activations", "placement", p.span))
            items.append(_item(d, strategy, "reduce_scatter", group,
                               "K and V gradients (context parallel, per layer)", kv, layers * m,
                               "activations", "placement", p.span))
        if p.role is Role.EXPERT and strategy.size(p.axis) > 1 and arch.moe:
            k = d.sym("k", arch.top_k)
            tokens = b * s * k * h * e / (c * (t if sp else 1))
            items.append(_item(d, strategy, "all_to_all", mesh.group(p.axis),
                               "tokens to experts and back (dispatch, combine; fwd"
                               + (", recompute" if refwd else "") + " and bwd)",
                               tokens, (4 + 2 * refwd) * layers * m, "activations", "placement",
                               p.span))
    return items


def _offload_items(d: Domain, strategy: Strategy, m: Num, local_total: Num,
                   activations: ActivationCost | None) -> list[CommItem]:
    items: list[CommItem] = []
    off = strategy.offloaded
    if not off:
        return items
    none = Group(())
    shard_g: Num = local_total
    shard_p: Num = local_total
    for p in strategy.placements:
        if replicates_model(p):
            if p.mode(State.GRADIENTS).sharded or p.mode(State.OPTIMIZER).sharded:
                shard_g = shard_g / d.sym(p.axis, strategy.size(p.axis))
            if p.mode(State.PARAMS).sharded or p.mode(State.OPTIMIZER).sharded:
                shard_p = shard_p / d.sym(p.axis, strategy.size(p.axis))
    g_bytes = bytes_per_element(d, strategy, State.GRADIENTS)
    p_bytes = bytes_per_element(d, strategy, State.PARAMS)
    span = strategy.placements[0].span
    if State.OPTIMIZER in off or State.GRADIENTS in off:
        # a gradient partition kept on the host receives each micro-batch's reduced shard
        calls = m if State.GRADIENTS in off else d.const(1)
        items.append(_item(d, strategy, "d2h", none, "gradient shard to the host optimizer",
                           shard_g * g_bytes, calls, "gradients", "placement", span))
    if State.OPTIMIZER in off:
        items.append(_item(d, strategy, "h2d", none, "updated parameter shard from the host",
                           shard_p * p_bytes, d.const(1), "params", "placement", span))
    if State.PARAMS in off:
        items.append(_item(d, strategy, "h2d", none,
                           "parameter shard streamed in for forward and backward", shard_p * p_bytes,
                           2 * m, "params", "placement", span))
    if State.ACTIVATIONS in off and activations is not None:
        for kind, what in (("d2h", "activations out after forward"),
                           ("h2d", "activations back for backward")):
            items.append(_item(d, strategy, kind, none, what, activations.kept, d.const(1),
                               "activations", "placement", span))
    return items


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

