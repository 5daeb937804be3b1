"""From a strategy to the torch implementation that realises it (no torch import).

One placement on the mesh axes that have more than one rank picks the implementation:

========================================  =============================================
placement over its axis                   torch implementation
========================================  =============================================
``ddp`` / (R, R, R, R) over dp            ``DistributedDataParallel``
``zero1`` / (R, S, R, R)                  ``ZeroRedundancyOptimizer`` over DDP
``zero2``, ``fsdp(grad_op)`` / (R, S, S)  FSDP2 ``fully_shard(reshard_after_forward=False)``
``zero3``, ``fsdp`` / (S*, S, S)          FSDP2 ``fully_shard`` (reshard after forward)
``megatron`` / ``tp`` over tp             DTensor ``ColwiseParallel`` / ``RowwiseParallel``
``fsdp`` over dp + ``megatron`` over tp   FSDP2 over dp of the DTensor TP model (2D mesh)
``pipeline(gpipe | 1f1b)`` over pp        ``torch.distributed.pipelining``
========================================  =============================================

Everything else (sequence or context parallelism, experts, HSDP, offload, recomputation,
interleaved schedules, gradient accumulation outside a pipeline) has no torch implementation here
and is an input error that points at the line.
"""

from __future__ import annotations

from dataclasses import dataclass

from placeverify.cost.implementations.params import check_params
from placeverify.cost.implementations.spec import Implementation, Mlp, OptimizerKind, RunSpec
from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Span
from placeverify.ir.model import Transformer
from placeverify.ir.placement import AxisPlacement, Mode, Reduce, Role, Schedule, State
from placeverify.ir.presets import hybrid
from placeverify.ir.strategy import RecomputeKind, Strategy

MIN_WORLD, MAX_WORLD = 2, 8
MAX_PARAMS = 20_000_000  # what a CPU core trains in seconds
MAX_TOKENS = 16_384  # micro-batch x sequence
MAX_SCORES = 4_000_000  # heads x seq² x micro-batch elements of attention scores
MLP_DEPTH = 4  # layers of the MLP for a bare count without largest_tensor
MAX_MLP_DEPTH = 64  # with largest_tensor the count sets the layers
MLP_BATCH = 8

R, S, SS, O = Mode.R, Mode.S, Mode.S_STAR, Mode.O
_PARAMS, _OPTIMIZER, _GRADS = State.PARAMS, State.OPTIMIZER, State.GRADIENTS


@dataclass(frozen=True, slots=True)
class Plan:
    spec: RunSpec
    notes: tuple[str, ...]


def _error(strategy: Strategy, message: str, span: Span | None, *notes: str) -> PlaceError:
    diagnostic = Diagnostic(Severity.ERROR, message, Code.BAD_VALUE, span, tuple(notes))
    return PlaceError([diagnostic], strategy.source)


SUPPORTED = ("supported: ddp, zero1, zero2, zero3, fsdp, fsdp(grad_op) over one axis; megatron over "
             "tp; fsdp over dp with megatron over tp; pipeline(gpipe | 1f1b) over pp "
             "(see examples/measure)")


def plan(strategy: Strategy) -> Plan:
    """The run spec for ``strategy``, or a :class:`PlaceError` pointing at what cannot run."""
    notes: list[str] = []
    world = strategy.mesh.world
    if not MIN_WORLD <= world <= MAX_WORLD:
        raise _error(strategy, f"measure runs one process per device; this mesh has {world} "
                     f"devices and measure runs {MIN_WORLD} to {MAX_WORLD}", strategy.mesh.span,
                     "write a small mesh, e.g. 'mesh { dp = 2 }' (see examples/measure)")
    active = [p for p in strategy.placements if strategy.size(p.axis) > 1]
    for p in active:
        _check_placement(strategy, p)
    data = [p for p in active if p.role is Role.DATA]
    tensor = [p for p in active if p.role is Role.TENSOR]
    pipeline = [p for p in active if p.role is Role.PIPELINE]
    if strategy.recompute.kind is not RecomputeKind.NONE:
        raise _error(strategy, "activation recomputation has no torch implementation in measure "
                     "yet", strategy.recompute.span, "remove the 'recompute' line to measure the "
                     "placement without it")
    if strategy.microbatches > 1 and not pipeline:
        raise _error(strategy, f"measure runs one micro-batch per step outside a pipeline "
                     f"(this file has {strategy.microbatches})", strategy.placements[0].span)
    if not strategy.step.canonical:
        notes.append("the file's step block is not run: measure runs torch's own implementation "
                     "of the placement (its canonical step)")

    optimizer = _optimizer(strategy, notes)
    arch, mlp = _model(strategy, notes)
    if len(pipeline) == 1 and not data and not tensor:
        p = pipeline[0]
        if arch is not None and arch.tied_embeddings:
            raise _error(strategy, "tied embeddings across pipeline stages have no torch "
                         "implementation in measure", strategy.model_span)
        if p.layers is not None:
            raise _error(strategy, "uneven pipeline stages (a list of layers per stage) have no "
                         "torch implementation in measure", p.layers_span or p.span)
        layers = arch.layers if arch is not None else (mlp.depth if mlp is not None else 0)
        pp = strategy.size(p.axis)
        if layers < pp:
            raise _error(strategy, f"{layers} layers cannot fill {pp} pipeline stages",
                         strategy.model_span)
        m = p.microbatches or strategy.microbatches
        schedule = Schedule.GPIPE if p.schedule is Schedule.GPIPE else Schedule.ONE_F_ONE_B
        spec = RunSpec(Implementation.PIPELINE, optimizer, pp=pp, schedule=schedule,
                       microbatches=m, arch=arch, mlp=mlp)
        return Plan(spec, tuple(notes))
    if len(tensor) > 1 or len(data) > 1 or pipeline or (not data and not tensor):
        span = (pipeline or data or tensor or strategy.placements)[0].span
        raise _error(strategy, "this combination of placements has no torch implementation in "
                     "measure", span, SUPPORTED)
    if tensor:
        tp = strategy.size(tensor[0].axis)
        _check_tensor_parallel(strategy, tensor[0], tp, arch, mlp)
        if not data:
            return Plan(RunSpec(Implementation.TP, optimizer, tp=tp, arch=arch, mlp=mlp),
                        tuple(notes))
        d = data[0]
        if d.mode(_PARAMS) is not SS:
            raise _error(strategy, f"'{d.preset}' with tensor parallelism has no torch "
                         "implementation in measure; use 'fsdp' over the data axis", d.span,
                         SUPPORTED)
        order = [p.axis for p in strategy.placements]
        if order.index(d.axis) > order.index(tensor[0].axis):
            notes.append("ranks are laid out as (dp, tp): tp is the inner mesh dimension")
        spec = RunSpec(Implementation.FSDP2_TP, optimizer, dp=strategy.size(d.axis), tp=tp,
                       reshard_after_forward=d.reshard_after_forward, arch=arch, mlp=mlp)
        return Plan(spec, tuple(notes))
    d = data[0]
    implementation, reshard = _data_implementation(strategy, d)
    spec = RunSpec(implementation, optimizer, dp=strategy.size(d.axis),
                   reshard_after_forward=reshard, arch=arch, mlp=mlp)
    return Plan(spec, tuple(notes))


def _check_placement(strategy: Strategy, p: AxisPlacement) -> None:
    if any(p.mode(s) is O for s in State):
        raise _error(strategy, "offloading has no torch implementation in measure", p.span,
                     SUPPORTED)
    if p.role in (Role.CONTEXT, Role.EXPERT):
        raise _error(strategy, f"{p.role.value} parallelism has no torch implementation in "
                     "measure", p.span, SUPPORTED)
    if p.role is Role.TENSOR and p.sequence_parallel:
        raise _error(strategy, "sequence parallelism has no torch implementation in measure",
                     p.span, "use 'megatron' without sequence_parallel")
    if p.role is Role.PIPELINE and p.schedule not in (Schedule.GPIPE,
                                                      Schedule.ONE_F_ONE_B):
        raise _error(strategy, "the interleaved schedule has no torch implementation in measure",
                     p.span, "use pipeline(gpipe) or pipeline(1f1b)")
    if hybrid(p.preset):
        raise _error(strategy, "HSDP has no torch implementation in measure", p.span, SUPPORTED)
    if p.reduce is Reduce.STEP and strategy.microbatches > 1:
        raise _error(strategy, "'reduce = step' (gradients reduced once a step) has no torch "
                     "implementation in measure", p.span,
                     "measure the default, gradients reduced every micro-batch")


def _data_implementation(strategy: Strategy, p: AxisPlacement) -> tuple[Implementation, bool]:
    params, optimizer, grads = p.mode(_PARAMS), p.mode(_OPTIMIZER), p.mode(_GRADS)
    if (params, optimizer, grads) == (R, R, R):
        return Implementation.DDP, True
    if (params, optimizer, grads) == (R, S, R):
        return Implementation.ZERO1, True
    if (params, optimizer, grads) == (R, S, S):
        return Implementation.FSDP2, False
    if (params, optimizer, grads) == (SS, S, S):
        return Implementation.FSDP2, p.reshard_after_forward
    raise _error(strategy, f"the placement {p.tuple_text()} over {p.axis} has no torch "
                 "implementation in measure", p.span, SUPPORTED)


def _optimizer(strategy: Strategy, notes: list[str]) -> OptimizerKind:
    p = strategy.precision
    if p.optimizer == 0:
        kind = OptimizerKind.SGD
    elif p.optimizer == 4:
        kind = OptimizerKind.SGD_MOMENTUM
    else:
        kind = OptimizerKind.ADAM
    if not (p.params == p.grads == 4 and p.optimizer in (0, 4, 8)):
        name = {OptimizerKind.ADAM: "Adam", OptimizerKind.SGD: "SGD",
                OptimizerKind.SGD_MOMENTUM: "SGD with momentum"}[kind]
        notes.append(f"measured in fp32 with torch.optim.{name.split()[0]}: the file's precision "
                     f"'{p.name}' (Θ {p.params}, G {p.grads}, Ω {p.optimizer} bytes per parameter) "
                     "is not what the CPU run holds; predictions are for the fp32 run")
    return kind


def _model(strategy: Strategy, notes: list[str]) -> tuple[Transformer | None, Mlp | None]:
    model = strategy.model
    span = strategy.model_span
    arch = model.arch
    if arch is None:
        if model.params > MAX_PARAMS:
            raise _error(strategy, f"a model of {model.params:,} parameters is too large to run at "
                         "small scale on CPU", span, f"measure runs up to {MAX_PARAMS:,} "
                         "parameters; give a tiny model (see examples/measure)")
        if model.largest_tensor is None:
            width = _mlp_width(model.params)
            mlp = Mlp(width, MLP_DEPTH, MLP_BATCH)
            notes.append(f"a bare parameter count: measured on an MLP of {MLP_DEPTH} Linear("
                         f"{width}, {width}) layers ({mlp.params():,} parameters; the file says "
                         f"{model.params:,})")
            return None, mlp
        # the largest tensor sizes CPU Adam's temporaries: the MLP's weight (width²) is made
        # the closest to it, and as many layers as come closest to the count
        largest = model.largest_tensor
        width = min(range(8, 4097, 8), key=lambda w: (abs(w * w - largest), w))
        depth = max(1, round(model.params / (width * width + width)))
        if depth > MAX_MLP_DEPTH:
            raise _error(strategy, f"largest_tensor = {model.largest_tensor:,} with params = "
                         f"{model.params:,} needs {depth:,} layers of Linear({width}, {width})",
                         span, f"measure runs an MLP of up to {MAX_MLP_DEPTH} layers; give a "
                         "larger largest_tensor or a smaller count")
        mlp = Mlp(width, depth, MLP_BATCH)
        notes.append(f"a bare parameter count with largest_tensor = {model.largest_tensor:,}: "
                     f"measured on an MLP of {depth} Linear({width}, {width}) layers "
                     f"({mlp.params():,} parameters, largest tensor {width * width:,}; the file "
                     f"says {model.params:,} and {model.largest_tensor:,})")
        return None, mlp
    if arch.moe:
        raise _error(strategy, "mixture-of-experts models have no torch implementation in measure",
                     span)
    if arch.latent is not None:
        raise _error(strategy, "multi-head latent attention has no torch implementation in "
                     "measure", span)
    if arch.params() > MAX_PARAMS:
        raise _error(strategy, f"a model of {arch.params():,} parameters is too large to run at small "
                     "scale on CPU", span, f"measure runs up to {MAX_PARAMS:,} parameters; write "
                     "a tiny 'model transformer { ... }' (see examples/measure)")
    tokens = arch.seq * arch.micro_batch
    if tokens > MAX_TOKENS or arch.heads * arch.seq * tokens > MAX_SCORES:
        raise _error(strategy, f"seq = {arch.seq} with micro_batch = {arch.micro_batch} is too "
                     "large to run at small scale on CPU", span,
                     f"measure runs up to {MAX_TOKENS:,} tokens per micro-batch")
    if arch.head_dim % 2 and arch.position == "rotary":
        raise _error(strategy, f"rotary positions need an even head dimension (head_dim = "
                     f"{arch.head_dim})", span)
    check_params(arch)
    return arch, None


def _mlp_width(params: int) -> int:
    """The width whose MLP_DEPTH layers of w² + w parameters come closest to ``params`` (at
    least 8, a multiple of 8 so that tensor parallelism divides it)."""
    best = 8
    for width in range(8, 4097, 8):
        if abs(MLP_DEPTH * (width * width + width) - params) < abs(
                MLP_DEPTH * (best * best + best) - params):
            best = width
    return best


def _check_tensor_parallel(strategy: Strategy, p: AxisPlacement, tp: int,
                           arch: Transformer | None, mlp: Mlp | None) -> None:
    if mlp is not None:
        if mlp.width % tp:
            raise _error(strategy, f"the MLP width ({mlp.width}) must be divisible by {p.axis} "
                         f"({tp})", p.span)
        return
    assert arch is not None
    if arch.tied_embeddings:
        raise _error(strategy, "tied embeddings with tensor parallelism have no torch "
                     "implementation in measure", strategy.model_span, "use 'embeddings = untied'")
    sizes = {"heads": arch.heads, "kv_heads": arch.kv_heads, "ffn": arch.ffn, "vocab": arch.vocab,
             "hidden": arch.hidden}
    for name, value in sizes.items():
        if value % tp:
            raise _error(strategy, f"{name} ({value}) must be divisible by {p.axis} ({tp}): each "
                         "rank computes whole heads and equal column blocks", p.span)
