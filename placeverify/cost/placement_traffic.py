"""Communication the placement implies inside forward and backward, per device per step
(:mod:`placeverify.cost.communication` has the step's own collectives and the item type).

S* parameter gathers (forward and, unless kept, backward, per micro-batch), Megatron tensor
parallelism (4 all-reduces of b·s·h per layer per micro-batch; under sequence parallelism 6
all-gathers and 4 reduce-scatters, the column-parallel inputs gathered again in backward),
pipeline point-to-point (b·s·h per micro-batch per boundary per direction), context parallelism
(all-gather of K and V forward and backward, reduce-scatter of their gradients), expert
all-to-all (dispatch and combine, forward and backward), and host <-> device transfers for
offloaded states. Bytes as in :mod:`placeverify.cost.communication` (REFERENCE §2.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.cost import fine_tune
from placeverify.cost.activations import (
    ActivationCost,
    parallel_sizes,
    recomputed_layers,
    stage_share,
)
from placeverify.cost.communication import CommItem, comm_item
from placeverify.cost.domain import Domain, Num
from placeverify.cost.memory import bytes_per_element, gathered_bytes, local_params
from placeverify.diagnostics import Span
from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup, Transformer
from placeverify.ir.placement import Role, State, TensorOverlap
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import gathered_axes, gathers_copies, replicates_model


def placement_items(d: Domain, strategy: Strategy,
                    activations: ActivationCost | None) -> list[CommItem]:
    items: list[CommItem] = []
    mesh = strategy.mesh
    m = d.sym("m", strategy.microbatches)
    param_bytes = gathered_bytes(d, strategy)  # FSDP's param_dtype: what the gathers move
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
        # per-group meshes: only the groups this axis gathers; a quantised base moves packed
        applies = {g for g in local if not p.group_modes or p.axis in gathered_axes(strategy, g)}
        payload = fine_tune.gathered_payload(d, strategy, local, applies, False, param_bytes)
        items.append(comm_item(d, strategy, "all_gather", group, "params (gather for forward)",
                               payload, m, "params", "placement", p.span))
        if p.reshard_after_forward:
            items.append(comm_item(d, strategy, "all_gather", group, "params (gather for backward)",
                                   payload, m, "params", "placement", p.span))

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
    * dp``, ``docs/language/place.md``) the dense parameters are gathered over dp x ep and the
    experts over dp (torchtitan's ``apply_fsdp``: the dense parameters over dp_shard, which
    includes the ep ranks, the routed experts over dp_shard_mod_ep)."""
    by_axes: dict[tuple[str, ...], list[ParamGroup]] = {}
    for g in local:
        axes = _sharded_over(strategy, g)
        if axes:
            by_axes.setdefault(axes, []).append(g)
    items: list[CommItem] = []
    for axes, groups in by_axes.items():
        payload = fine_tune.gathered_payload(d, strategy, local, set(groups), False, param_bytes)
        first = strategy.placement(axes[0])
        label = "params" if len(groups) == len(local) else \
            f"params[{', '.join(sorted(g.value for g in groups))}]"
        reshard = any(strategy.placement(a).reshard_after_forward for a in axes)
        for when in ("forward", "backward") if reshard else ("forward",):
            items.append(comm_item(d, strategy, "all_gather", strategy.mesh.group(*axes),
                                   f"{label} (gather for {when})", payload, m,
                                   "params", "placement", first.span))
    return items


@dataclass(frozen=True, slots=True)
class _Layers:
    """The sizes the model-parallel traffic of one micro-batch is counted in (symbols of ``d``)."""

    arch: Transformer
    m: Num  # micro-batches
    e: Num  # activation bytes per element
    s: Num
    b: Num
    h: Num
    t: Num  # tensor-parallel size
    sp: bool  # sequence parallel
    c: Num  # context-parallel size
    layers: Num  # the stage with the most layers: the most traffic
    bsh: Num  # one micro-batch's hidden states on this device (cp splits s)
    # Full recomputation runs each layer's forward again in backward, collectives included
    # (Megatron-LM's recompute granularity "full"); selective recomputation only redoes the
    # attention core, which has none; ``every = n`` re-runs ⌊layers / n⌋ of a stage's layers.
    # Not modelled: the all-gathers that ``selective_op`` recomputation re-runs
    # (``docs/models/step-time.md``).
    refwd: Fraction | int


def _model_parallel_items(d: Domain, strategy: Strategy, m: Num) -> list[CommItem]:
    arch = strategy.model.arch
    assert arch is not None
    e = bytes_per_element(d, strategy, State.ACTIVATIONS)
    s, b, h = d.sym("s", arch.seq), d.sym("b", arch.micro_batch), d.sym("h", arch.hidden)
    t, sp, c = parallel_sizes(d, strategy)
    layers = stage_share(d, strategy, arch)
    refwd: Fraction | int = 0
    if strategy.recompute.kind.value == "full":
        kept, held = recomputed_layers(strategy)
        refwd = 1 if kept == held else Fraction(kept, held)
    shapes = _Layers(arch, m, e, s, b, h, t, sp, c, layers, b * s * h * e / c, refwd)
    return [*_tensor_items(d, strategy, shapes), *_pipeline_items(d, strategy, shapes),
            *_context_and_expert_items(d, strategy, shapes), *_expert_tensor_items(d, strategy, shapes)]


def _tensor_items(d: Domain, strategy: Strategy, x: _Layers) -> list[CommItem]:
    """Megatron tensor parallelism's collectives, per layer and around the embedding, the output
    layer and the loss."""
    mesh = strategy.mesh
    arch, m, sp, layers, bsh, refwd = x.arch, x.m, x.sp, x.layers, x.bsh, x.refwd
    items: list[CommItem] = []
    tensor_axes = strategy.axes(Role.TENSOR)
    if not (tensor_axes and strategy.mesh.group(*tensor_axes).size(mesh) > 1):
        return items
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
        # reduce-scatter beside the weight-gradient GEMM (async_op=True there). With the
        # experts split whole over a tensor axis (lower/expert_mesh.py) the MoE layer's MLP has
        # none of these (the dispatcher's, over the expert tensor axes: _expert_tensor_items):
        # the attention's QKV and output projection give 3 + 2 (a recomputed forward 1 + 1).
        whole = arch.moe and any(p.experts_split for p in strategy.placements)
        for kind, count, what in (
                ("all_gather", (3 + refwd) if whole else 6 + 2 * refwd,
                 "column-parallel inputs gathered again in backward, beside the "
                 "input-gradient GEMMs"),
                ("reduce_scatter", (2 + refwd) if whole else 4 + 2 * refwd,
                 "column-parallel input gradients, beside the weight-gradient GEMMs")):
            waited = count - pairs if beside else count
            items.append(comm_item(d, strategy, kind, group,
                                   f"activations (sequence parallel, {waited} per layer per "
                                   "micro-batch)", bsh, waited * layers * m,
                                   "activations", "placement", span))
            if beside:
                items.append(comm_item(d, strategy, kind, group,
                                       f"{what} (sequence parallel, {pairs} per layer per "
                                       "micro-batch)", bsh, pairs * layers * m, "activations",
                                       "placement", span, beside_gemm=True))
        items.append(comm_item(d, strategy, "reduce_scatter", group,
                               "embedding output (vocab-parallel, forward)", bsh, m,
                               "activations", "placement", span))
        items.append(comm_item(d, strategy, "all_gather", group,
                               "embedding output gradient (sequence parallel, backward)", bsh, m,
                               "activations", "placement", span))
    else:
        # the column-parallel layers' input gradients are all-reduced in backward, beside
        # the weight-gradient GEMM (allreduce_dgrad, async_op=True)
        waited = 4 + 2 * refwd - (pairs if beside else 0)
        items.append(comm_item(d, strategy, "all_reduce", group,
                               f"activations (tensor parallel, {waited} per layer per "
                               "micro-batch)", bsh, waited * layers * m, "activations",
                               "placement", span))
        if beside:
            items.append(comm_item(d, strategy, "all_reduce", group,
                                   "column-parallel input gradients, beside the weight-gradient "
                                   f"GEMMs (tensor parallel, {pairs} per layer per micro-batch)",
                                   bsh, pairs * layers * m, "activations", "placement", span,
                                   beside_gemm=True))
        items.append(comm_item(d, strategy, "all_reduce", group,
                               "embedding output (vocab-parallel, forward)", bsh, m,
                               "activations", "placement", span))
    pipeline = strategy.pipeline
    if pipeline is None or strategy.size(pipeline.axis) == 1:
        # the output layer and the loss live on this device too
        items.extend(_output_layer_items(d, strategy, x, group, span, beside))
    return items


def _output_layer_items(d: Domain, strategy: Strategy, x: _Layers, group: Group, span: Span | None,
                        beside: bool) -> list[CommItem]:
    """The tensor-parallel collectives of the output layer and the vocab-parallel loss."""
    m, b, s, c, sp, bsh = x.m, x.b, x.s, x.c, x.sp, x.bsh
    items: list[CommItem] = []
    # the output layer is column-parallel: its backward collectives run beside its
    # GEMMs as the layers' do
    near = ", beside the weight-gradient GEMM" if beside else ""
    out_kind = "reduce_scatter" if sp else "all_reduce"
    items.append(comm_item(d, strategy, out_kind, group,
                           f"output layer input gradient (backward{near})", bsh, m,
                           "activations", "placement", span, beside_gemm=beside))
    if sp:
        items.append(comm_item(d, strategy, "all_gather", group,
                               "final hidden states (sequence parallel, forward)", bsh, m,
                               "activations", "placement", span))
        near = ", beside the input-gradient GEMM" if beside else ""
        items.append(comm_item(d, strategy, "all_gather", group,
                               "final hidden states (sequence parallel, re-gathered in "
                               f"backward{near})", bsh, m, "activations", "placement", span,
                               beside_gemm=beside))
    items.append(comm_item(d, strategy, "all_reduce", group,
                           "vocab-parallel cross-entropy (max, sum-exp, target logit)",
                           4 * b * s / c, 3 * m, "activations", "placement", span))
    return items


def _pipeline_items(d: Domain, strategy: Strategy, x: _Layers) -> list[CommItem]:
    """Pipeline point-to-point traffic between stages (and the scatter/gather's all-gather)."""
    mesh = strategy.mesh
    m, t, sp, bsh = x.m, x.t, x.sp, x.bsh
    tensor_axes = strategy.axes(Role.TENSOR)
    pipeline = strategy.pipeline
    items: list[CommItem] = []
    if pipeline is None or strategy.size(pipeline.axis) <= 1:
        return items
    chunks = d.sym("v", pipeline.chunks) if pipeline.chunks > 1 else d.const(1)
    split = sp or pipeline.scatter_gather  # scatter/gather: 1/t sent, then gathered
    boundary = bsh / (t if split else 1)
    items.append(comm_item(d, strategy, "send", mesh.group(pipeline.axis),
                           "activations forward, gradients backward (middle stage)", boundary,
                           2 * m * chunks, "activations", "placement", pipeline.span))
    if pipeline.scatter_gather and not sp and tensor_axes \
            and mesh.group(*tensor_axes).size(mesh) > 1:
        items.append(comm_item(d, strategy, "all_gather", mesh.group(*tensor_axes),
                               "stage boundary (pipeline scatter/gather, received)", bsh,
                               2 * m * chunks, "activations", "placement", pipeline.span))
    return items


def _context_and_expert_items(d: Domain, strategy: Strategy, x: _Layers) -> list[CommItem]:
    """Context parallelism's K and V gathers and expert parallelism's token all-to-all."""
    mesh = strategy.mesh
    arch, m, e, s, b, h, t, sp, c = x.arch, x.m, x.e, x.s, x.b, x.h, x.t, x.sp, x.c
    layers, refwd = x.layers, x.refwd
    items: list[CommItem] = []
    for p in strategy.placements:
        if p.role is Role.CONTEXT and strategy.size(p.axis) > 1:
            kv = (2 * b * s * h * (d.sym("a_kv", arch.kv_heads) / d.sym("a", arch.heads)) * e / t
                  if not arch.head_size else  # K and V: kv_heads heads of head_dim
                  2 * b * s * d.sym("a_kv", arch.kv_heads) * d.sym("d_head", arch.head_dim) * e / t)
            group = mesh.group(p.axis)
            items.append(comm_item(d, strategy, "all_gather", group,
                                   "K and V (context parallel, forward" + (", recompute" if refwd else "")
                                   + " and backward, per layer)", kv, (2 + refwd) * layers * m,
                                   "activations", "placement", p.span))
            items.append(comm_item(d, strategy, "reduce_scatter", group,
                                   "K and V gradients (context parallel, per layer)", kv, layers * m,
                                   "activations", "placement", p.span))
        # the experts split whole over tensor axes too (place expert over tp * ep,
        # lower/expert_mesh.py): the tokens are dispatched over the whole expert group
        split = tuple(q.axis for q in strategy.placements if q.experts_split)
        group = mesh.group(*split, p.axis)
        if p.role is Role.EXPERT and group.size(mesh) > 1 and arch.moe:
            k = d.sym("k", arch.top_k)
            tokens = b * s * k * h * e / (c * (t if sp else 1))
            items.append(comm_item(d, strategy, "all_to_all", group,
                                   "tokens to experts and back (dispatch, combine; fwd"
                                   + (", recompute" if refwd else "") + " and bwd)",
                                   tokens, (4 + 2 * refwd) * moe_layers(d, arch, layers) * m,
                                   "activations", "placement", p.span))
    return items


def moe_layers(d: Domain, arch: Transformer, layers: Num) -> Num:
    """The MoE layers among ``layers`` (all of them unless dense and MoE layers mix; then the
    model's share, L_moe / L: a pipeline over such a model is refused, lower/shapes.py)."""
    if not arch.mixed_layers:
        return layers
    return layers * d.sym("L_moe", arch.moe_layers) / d.sym("L", arch.layers)


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
        items.append(comm_item(d, strategy, "d2h", none, "gradient shard to the host optimizer",
                               shard_g * g_bytes, calls, "gradients", "placement", span))
    if State.OPTIMIZER in off:
        items.append(comm_item(d, strategy, "h2d", none, "updated parameter shard from the host",
                               shard_p * p_bytes, d.const(1), "params", "placement", span))
    if State.PARAMS in off:
        items.append(comm_item(d, strategy, "h2d", none,
                               "parameter shard streamed in for forward and backward", shard_p * p_bytes,
                               2 * m, "params", "placement", span))
    if State.ACTIVATIONS in off and activations is not None:
        for kind, what in (("d2h", "activations out after forward"),
                           ("h2d", "activations back for backward")):
            items.append(comm_item(d, strategy, kind, none, what, activations.kept, d.const(1),
                                   "activations", "placement", span))
    return items


def _expert_tensor_items(d: Domain, strategy: Strategy, x: _Layers) -> list[CommItem]:
    """With the experts split whole over some tensor axes (``place expert over tp * ep``,
    lower/expert_mesh.py), the token dispatcher's collectives over the others, the expert
    tensor-parallel group: Megatron-core's MoEAlltoAllTokenDispatcher
    (``megatron/core/transformer/moe/token_dispatcher.py:741-751, 824-834`` at d98e8a64dd; its
    tp_group is the expert tensor-parallel group, line 86) all-gathers the tokens the
    all-to-all brought over the expert tensor-parallel group (gather_from_sequence_parallel_region)
    and reduce-scatters the experts' outputs before the combining all-to-all
    (reduce_scatter_to_sequence_parallel_region); the backward runs each as the other. Each
    rank's routed tokens (b·s·k / t, balanced) are gathered from |etp| ranks: the payload is
    b·s·k·h / |tp| bytes of activations, tp the tensor axes the experts split whole over. Not
    counted: the routing probabilities gathered beside (one number per routed token), and the
    combine's reduce-scatter running in the probabilities' dtype."""
    arch, mesh = x.arch, strategy.mesh
    split = [p for p in strategy.placements if p.experts_split]
    rest = [p.axis for p in strategy.placements if p.role is Role.TENSOR and not p.experts_split]
    if not (arch.moe and split and rest and mesh.group(*rest).size(mesh) > 1):
        return []
    whole: Num = d.const(1)
    for p in split:
        whole = whole * d.sym(p.axis, strategy.size(p.axis))
    gathered = x.b * x.s * d.sym("k", arch.top_k) * x.h * x.e / (x.c * whole)
    calls = (2 + x.refwd) * moe_layers(d, arch, x.layers) * x.m
    group, span = mesh.group(*rest), split[0].span
    return [comm_item(d, strategy, "all_gather", group, "routed tokens over the expert tensor-"
                      "parallel group (dispatch forward, combine backward)", gathered, calls,
                      "activations", "placement", span),
            comm_item(d, strategy, "reduce_scatter", group, "expert outputs over the expert "
                      "tensor-parallel group (combine forward, dispatch backward)", gathered,
                      calls, "activations", "placement", span)]
