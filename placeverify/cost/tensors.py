"""A per-tensor cost model of the real torch implementations that ``placeverify measure`` runs.

The placement-level model (:mod:`placeverify.cost.memory`, :mod:`placeverify.cost.communication`)
counts a state of s bytes as s/n per device on an axis of size n. Real implementations differ in
details that this module reproduces tensor by tensor, so that predicted / measured is exactly 1
for model states and communication:

- **DDP** (PyTorch docs, "DistributedDataParallel" and its design note): every gradient is
  all-reduced once per step, bucketed in reverse registration order; the first bucket closes at
  ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), the others at 25 MiB, a bucket
  closing once it reaches its cap. The reducer keeps its own flat bucket buffers beside the
  gradients (``gradient_as_bucket_view=False``).
- **ZeRO-1** (Rajbhandari et al., arXiv 1910.02054, stage 1; PyTorch's
  ``ZeroRedundancyOptimizer``): gradients are all-reduced by DDP; the optimizer state is
  partitioned by *whole parameters*: parameters sorted by size (largest first, stable), each
  given to the rank with the fewest elements so far (the first such rank); after the local step
  each rank broadcasts its parameters to all others, one broadcast per parameter.
- **FSDP2** (PyTorch docs, ``torch.distributed.fsdp.fully_shard``): each parameter is sharded on
  dim 0 like ``torch.chunk`` (chunk size ⌈d0/n⌉, the last ranks get less or nothing) and padded to
  the chunk size in its storage; one all-gather per unit (a ``fully_shard``-ed module: each
  transformer layer, then the root for the embedding, the final norm and the output layer) in
  forward and, when a non-root unit reshards after forward, again in backward; one reduce-scatter
  per unit in backward. The root is left at ``reshard_after_forward``'s default, so it does not
  reshard (FSDP2 skips the root's reshard: it would be gathered again at once for backward).
- **Tensor parallelism** (PyTorch docs, ``torch.distributed.tensor.parallel``; Shoeybi et al.,
  arXiv 1909.08053): ``ColwiseParallel`` shards a Linear's weight and bias on dim 0 and
  all-reduces the gradient of its replicated input in backward, once per module (q, k and v each
  do their own); ``RowwiseParallel`` shards the weight on dim 1, keeps the bias replicated and
  all-reduces its partial output in forward. The embedding is vocabulary-parallel
  (``RowwiseParallel`` on ``nn.Embedding``: rows sharded, output all-reduced) and the output layer
  ``ColwiseParallel`` with sharded logits under ``loss_parallel``.
- **FSDP2 × TP**: the FSDP2 rules applied over ``dp`` to each rank's tensor-parallel shard.
- **Pipelining** (PyTorch docs, ``torch.distributed.pipelining``; GPipe, Huang et al., arXiv
  1811.06965; 1F1B, Narayanan et al., arXiv 2104.04473): stage k holds its layers (the first stage
  also the embeddings, the last the final norm and the output layer); per micro-batch it sends its
  output forward and the gradient of its input backward.

Optimizer state follows ``torch.optim``: Adam keeps ``exp_avg`` and ``exp_avg_sq`` shaped like each
(local) parameter and a 4-byte ``step`` tensor per parameter; SGD with momentum one
``momentum_buffer``; plain SGD nothing.

Activation bytes saved for backward per transformer layer are
:func:`placeverify.cost.activations.saved_tensors` (Korthikanti et al., arXiv 2205.05198, Table 2,
generalised) plus what torch saves beyond that list: a LayerNorm's mean and reciprocal standard
deviation, RMSNorm's normalised input (torch composes it from primitives on CPU), the rotary
tables, K and V repeated to every head by written-out grouped-query attention, and dropout masks
of the activation dtype (CPU dropout multiplies by a float mask; Korthikanti count 1 byte). The tensors
saved outside the layers (position indices, the final norm, the output layer's input, the
log-probabilities) are enumerated from the autograd formulas of the ops involved.

Payload convention (REFERENCE §2.2): the bytes of the full tensor a collective is about: an
all-reduce's or broadcast's tensor, an all-gather's gathered output, a reduce-scatter's input;
a send or receive its tensor. gloo runs a reduce-scatter as an all-reduce of the full input, so
its wire cost per device is 2(n-1)/n of the payload rather than (n-1)/n.

This module does not import torch: the measure backend imports it, not the other way round.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from placeverify.cost.activations import layer_shape, per_layer_bytes, saved_tensors
from placeverify.cost.domain import Exact
from placeverify.ir.model import ParamGroup, Transformer

ELEMENT_BYTES = 4  # the measure backend runs in fp32
INDEX_BYTES = 8  # int64 token indices and targets
STEP_BYTES = 4  # torch.optim.Adam's per-parameter ``step`` (a float32 scalar tensor)
DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's default bucket_cap_mb


class Implementation(StrEnum):
    DDP = "ddp"
    ZERO1 = "zero1"
    FSDP2 = "fsdp2"
    TP = "tp"
    FSDP2_TP = "fsdp2_tp"
    PIPELINE = "pipeline"


IMPLEMENTATION_LABELS: dict[Implementation, str] = {
    Implementation.DDP: "DistributedDataParallel",
    Implementation.ZERO1: "ZeroRedundancyOptimizer over DistributedDataParallel",
    Implementation.FSDP2: "FSDP2 fully_shard",
    Implementation.TP: "DTensor tensor parallelism (ColwiseParallel / RowwiseParallel)",
    Implementation.FSDP2_TP: "FSDP2 fully_shard over dp x DTensor tensor parallelism over tp",
    Implementation.PIPELINE: "torch.distributed.pipelining",
}


class OptimizerKind(StrEnum):
    ADAM = "adam"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd_momentum"


class Schedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


@dataclass(frozen=True, slots=True)
class Mlp:
    """The plain model for a bare parameter count: ``depth`` Linear(width, width) + GELU layers."""

    width: int
    depth: int
    batch: int

    def params(self) -> int:
        return self.depth * (self.width * self.width + self.width)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What the measure backend runs: one implementation on a dp x tp (or pp) mesh, in fp32.

    Ranks are laid out like ``init_device_mesh("cpu", (dp, tp))``: rank = dp_rank * tp + tp_rank.
    A pipeline runs alone: rank = stage.
    """

    implementation: Implementation
    optimizer: OptimizerKind
    dp: int = 1
    tp: int = 1
    pp: int = 1
    reshard_after_forward: bool = True
    schedule: Schedule = Schedule.GPIPE
    microbatches: int = 1
    arch: Transformer | None = None
    mlp: Mlp | None = None

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def label(self) -> str:
        text = IMPLEMENTATION_LABELS[self.implementation]
        if self.implementation in (Implementation.FSDP2, Implementation.FSDP2_TP):
            text += f" (reshard_after_forward={self.reshard_after_forward})"
        if self.implementation is Implementation.PIPELINE:
            text += f" ({self.schedule.value}, {self.microbatches} micro-batches)"
        return text

    def coords(self, rank: int) -> dict[str, int]:
        if self.implementation is Implementation.PIPELINE:
            return {"pp": rank}
        return {"dp": rank // self.tp, "tp": rank % self.tp}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["implementation"] = self.implementation.value
        data["optimizer"] = self.optimizer.value
        data["schedule"] = self.schedule.value
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> RunSpec:
        arch = data.get("arch")
        mlp = data.get("mlp")
        return RunSpec(
            implementation=Implementation(data["implementation"]),
            optimizer=OptimizerKind(data["optimizer"]),
            dp=int(data["dp"]), tp=int(data["tp"]), pp=int(data["pp"]),
            reshard_after_forward=bool(data["reshard_after_forward"]),
            schedule=Schedule(data["schedule"]), microbatches=int(data["microbatches"]),
            arch=Transformer(**arch) if arch is not None else None,
            mlp=Mlp(**mlp) if mlp is not None else None)


# ---- the parameters, tensor by tensor ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParamTensor:
    """One parameter as the torch model registers it (same name, shape and order)."""

    name: str
    shape: tuple[int, ...]
    group: ParamGroup
    unit: str  # the FSDP2 unit: "layers.<i>", or "" for the root
    layer: int | None  # transformer layer (or MLP layer); None outside the layers
    tp_dim: int | None  # the dim tensor parallelism shards; None: replicated over tp
    first_stage: bool = False  # lives on the first pipeline stage (embeddings)
    last_stage: bool = False  # lives on the last pipeline stage (final norm, output layer)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _linear(prefix: str, out_f: int, in_f: int, bias: bool, style: str, layer: int,
            unit: str, group: ParamGroup = ParamGroup.DENSE) -> list[ParamTensor]:
    """nn.Linear's weight [out, in] then bias [out]; colwise shards dim 0, rowwise dim 1."""
    weight_dim = {"colwise": 0, "rowwise": 1}.get(style)
    out = [ParamTensor(f"{prefix}.weight", (out_f, in_f), group, unit, layer, weight_dim)]
    if bias:
        # A row-parallel bias is replicated over tp (Megatron's split, model.py's 'norms' group).
        bias_group = ParamGroup.NORMS if style == "rowwise" else group
        out.append(ParamTensor(f"{prefix}.bias", (out_f,), bias_group, unit, layer,
                               0 if style == "colwise" else None))
    return out


def _norm(prefix: str, arch: Transformer, layer: int | None, unit: str,
          last: bool = False) -> list[ParamTensor]:
    h = arch.hidden
    out = [ParamTensor(f"{prefix}.weight", (h,), ParamGroup.NORMS, unit, layer, None,
                       last_stage=last)]
    if arch.norm == "layernorm":
        out.append(ParamTensor(f"{prefix}.bias", (h,), ParamGroup.NORMS, unit, layer, None,
                               last_stage=last))
    return out


def transformer_params(arch: Transformer) -> list[ParamTensor]:
    """The parameters of :class:`placeverify.measure.models.TinyTransformer`, in its order."""
    h, kv, f = arch.hidden, arch.kv_dim, arch.ffn
    out = [ParamTensor("embed.weight", (arch.vocab, h), ParamGroup.EMBEDDING, "", None, 0,
                       first_stage=True)]
    if arch.position == "learned":
        out.append(ParamTensor("pos.weight", (arch.position_rows, h), ParamGroup.EMBEDDING, "",
                               None, None, first_stage=True))
    for i in range(arch.layers):
        unit = f"layers.{i}"
        out += _norm(f"{unit}.attn_norm", arch, i, unit)
        out += _linear(f"{unit}.attn.q", h, h, arch.bias, "colwise", i, unit)
        out += _linear(f"{unit}.attn.k", kv, h, arch.bias, "colwise", i, unit)
        out += _linear(f"{unit}.attn.v", kv, h, arch.bias, "colwise", i, unit)
        out += _linear(f"{unit}.attn.o", h, h, arch.bias, "rowwise", i, unit)
        out += _norm(f"{unit}.mlp_norm", arch, i, unit)
        if arch.gated:
            out += _linear(f"{unit}.mlp.gate", f, h, arch.bias, "colwise", i, unit)
        out += _linear(f"{unit}.mlp.up", f, h, arch.bias, "colwise", i, unit)
        out += _linear(f"{unit}.mlp.down", h, f, arch.bias, "rowwise", i, unit)
    out += _norm("norm", arch, None, "", last=True)
    if not arch.tied_embeddings:
        out.append(ParamTensor("output.weight", (arch.vocab, h), ParamGroup.DENSE, "", None, 0,
                               last_stage=True))
    return out


def mlp_params(mlp: Mlp) -> list[ParamTensor]:
    """The parameters of :class:`placeverify.measure.models.TinyMlp`: even layers colwise under
    tensor parallelism, odd layers rowwise (Megatron's MLP pairing)."""
    out: list[ParamTensor] = []
    for i in range(mlp.depth):
        style = "colwise" if i % 2 == 0 else "rowwise"
        out += _linear(f"layers.{i}", mlp.width, mlp.width, True, style, i, f"layers.{i}")
    return out


def model_params(spec: RunSpec) -> list[ParamTensor]:
    if spec.arch is not None:
        return transformer_params(spec.arch)
    assert spec.mlp is not None
    return mlp_params(spec.mlp)


def check_params(arch: Transformer) -> None:
    """The tensors above must add up to the IR's exact parameter count (model.py)."""
    total = sum(t.numel for t in transformer_params(arch))
    if total != arch.params():
        raise AssertionError(f"tensor list has {total} parameters, the IR {arch.params()}")


# ---- sharding arithmetic ------------------------------------------------------------------------


def chunk(size: int, parts: int, index: int) -> int:
    """The length of piece ``index`` when ``torch.chunk`` splits ``size`` into ``parts``:
    pieces of ⌈size/parts⌉, the last ones shorter or empty (DTensor's ``Shard`` and FSDP2)."""
    step = -(-size // parts)
    return max(0, min(step, size - index * step))


def tp_shape(t: ParamTensor, tp: int, tp_rank: int) -> tuple[int, ...]:
    if t.tp_dim is None or tp == 1:
        return t.shape
    shape = list(t.shape)
    shape[t.tp_dim] = chunk(shape[t.tp_dim], tp, tp_rank)
    return tuple(shape)


@dataclass(frozen=True, slots=True)
class Shard:
    """One parameter's piece on one rank."""

    tensor: ParamTensor
    numel: int  # elements of the local tensor
    storage: int  # elements of its storage (FSDP2 pads dim 0 to the chunk size)
    grad: int  # elements of its gradient's local tensor


def fsdp_shard(shape: tuple[int, ...], dp: int, dp_rank: int) -> tuple[int, int]:
    """(local elements, padded storage elements) of FSDP2's dim-0 shard."""
    rest = math.prod(shape[1:])
    return chunk(shape[0], dp, dp_rank) * rest, -(-shape[0] // dp) * rest


def local_shards(spec: RunSpec, rank: int) -> list[Shard]:
    """The parameters this rank holds at rest, with their local and storage sizes."""
    coords = spec.coords(rank)
    out: list[Shard] = []
    for t in model_params(spec):
        if spec.implementation is Implementation.PIPELINE:
            if on_stage(spec, t, coords["pp"]):
                out.append(Shard(t, t.numel, t.numel, t.numel))
            continue
        shape = tp_shape(t, spec.tp, coords["tp"])
        if spec.implementation in (Implementation.FSDP2, Implementation.FSDP2_TP):
            numel, storage = fsdp_shard(shape, spec.dp, coords["dp"])
            out.append(Shard(t, numel, storage, numel))
        else:
            numel = math.prod(shape)
            # DTensor's embedding backward (RowwiseParallel on nn.Embedding) yields a replicated
            # gradient of the whole table: each rank holds vocab x hidden, not its rows.
            vocab_rows = t.group is ParamGroup.EMBEDDING and t.tp_dim == 0 and spec.tp > 1
            out.append(Shard(t, numel, numel, t.numel if vocab_rows else numel))
    return out


def stage_layers(spec: RunSpec, stage: int) -> range:
    """Layers of a pipeline stage: contiguous, as even as possible, earlier stages first."""
    layers = spec.arch.layers if spec.arch is not None else (spec.mlp.depth if spec.mlp else 0)
    return range(chunk_start(layers, spec.pp, stage), chunk_start(layers, spec.pp, stage + 1))


def chunk_start(size: int, parts: int, index: int) -> int:
    base, extra = divmod(size, parts)
    return index * base + min(index, extra)


def on_stage(spec: RunSpec, t: ParamTensor, stage: int) -> bool:
    if t.first_stage:
        return stage == 0
    if t.last_stage:
        return stage == spec.pp - 1
    return t.layer in stage_layers(spec, stage)


# ---- predictions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommPrediction:
    """Collectives of one kind in one phase of a step, on one rank."""

    phase: str  # forward | backward | optimizer
    op: str  # all_reduce | all_gather | reduce_scatter | broadcast | send | recv
    axis: str  # the mesh axis it runs over (dp, tp, pp)
    what: str
    calls: int
    payload: int  # bytes, summed over the calls
    group_size: int
    wire_op: str  # the collective gloo actually runs

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.phase, self.op, self.axis)


@dataclass(frozen=True, slots=True)
class RankPrediction:
    rank: int
    coords: dict[str, int]
    states: dict[str, int]  # bytes: params, params_storage, grads, grads_storage, optimizer, ...
    comm: tuple[CommPrediction, ...]
    activations: dict[str, int] = field(default_factory=dict)  # bytes saved for backward


def gloo_wire_op(op: str) -> str:
    """ProcessGroupGloo implements reduce-scatter as an all-reduce of the full input."""
    return "all_reduce" if op == "reduce_scatter" else op


def _comm(phase: str, op: str, axis: str, what: str, calls: int, payload: int,
          group_size: int) -> CommPrediction:
    return CommPrediction(phase, op, axis, what, calls, payload, group_size, gloo_wire_op(op))


def ddp_buckets(sizes_in_backward_order: list[int]) -> list[int]:
    """Bytes of each DDP bucket: filled in the order gradients become ready, the first closing at
    1 MiB and the others at 25 MiB, each closing as soon as it reaches its cap."""
    buckets: list[int] = []
    current = 0
    for size in sizes_in_backward_order:
        current += size
        cap = DDP_FIRST_BUCKET_BYTES if not buckets else DDP_BUCKET_BYTES
        if current >= cap:
            buckets.append(current)
            current = 0
    if current:
        buckets.append(current)
    return buckets


def zero_partition(sizes: list[int], world: int) -> list[int]:
    """ZeroRedundancyOptimizer's owner of each parameter (given in registration order): sorted by
    size, largest first (a stable sort), each to the first rank holding the fewest elements."""
    owner = [0] * len(sizes)
    load = [0] * world
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


def optimizer_bytes(kind: OptimizerKind, numels: list[int]) -> int:
    if kind is OptimizerKind.ADAM:
        return sum(2 * n * ELEMENT_BYTES + STEP_BYTES for n in numels)
    if kind is OptimizerKind.SGD_MOMENTUM:
        return sum(n * ELEMENT_BYTES for n in numels)
    return 0


def tokens(spec: RunSpec) -> tuple[int, int]:
    """(samples, sequence length) of one micro-batch on one rank."""
    if spec.arch is not None:
        return spec.arch.micro_batch, spec.arch.seq
    assert spec.mlp is not None
    return spec.mlp.batch, 1


def hidden_bytes(spec: RunSpec) -> int:
    """One micro-batch's hidden states: b·s·h elements (b·width for the MLP)."""
    b, s = tokens(spec)
    width = spec.arch.hidden if spec.arch is not None else (spec.mlp.width if spec.mlp else 0)
    return b * s * width * ELEMENT_BYTES


def predict(spec: RunSpec) -> list[RankPrediction]:
    """Per-rank model-state bytes, collectives per step and activation bytes of ``spec``."""
    return [predict_rank(spec, rank) for rank in range(spec.world)]


def predict_rank(spec: RunSpec, rank: int) -> RankPrediction:
    shards = local_shards(spec, rank)
    impl = spec.implementation
    numels = [s.numel for s in shards]
    # A gradient is as large as its parameter's local piece, and lives in storage as large as the
    # parameter's (FSDP2 reduce-scatters into padded shards), except where ``grad`` says otherwise.
    states: dict[str, int] = {
        "params": sum(numels) * ELEMENT_BYTES,
        "params_storage": sum(s.storage for s in shards) * ELEMENT_BYTES,
        "grads": sum(s.grad for s in shards) * ELEMENT_BYTES,
        "grads_storage": sum(s.storage + s.grad - s.numel for s in shards) * ELEMENT_BYTES,
        "optimizer": optimizer_bytes(spec.optimizer, numels),
    }
    comm: list[CommPrediction] = []
    if impl in (Implementation.DDP, Implementation.ZERO1):
        comm += _ddp_comm(spec, shards, states)
    if impl is Implementation.ZERO1:
        owners = zero_partition(numels, spec.dp)
        mine = [n for n, owner in zip(numels, owners, strict=True) if owner == rank]
        states["optimizer"] = optimizer_bytes(spec.optimizer, mine)
        comm.append(_comm("optimizer", "broadcast", "dp",
                          "updated parameters from their owner (one per parameter)", len(numels),
                          sum(numels) * ELEMENT_BYTES, spec.dp))
    if impl in (Implementation.FSDP2, Implementation.FSDP2_TP):
        comm += _fsdp_comm(spec, shards, states)
    if impl in (Implementation.TP, Implementation.FSDP2_TP) and spec.tp > 1:
        comm += _tp_comm(spec)
    if impl is Implementation.PIPELINE:
        comm += _pipeline_comm(spec, spec.coords(rank)["pp"])
    activations = predict_activations(spec, rank)
    return RankPrediction(rank, spec.coords(rank), states, tuple(c for c in comm if c.calls),
                          activations)


def _ddp_comm(spec: RunSpec, shards: list[Shard], states: dict[str, int]) -> list[CommPrediction]:
    sizes = [s.numel * ELEMENT_BYTES for s in reversed(shards)]
    buckets = ddp_buckets(sizes)
    states["ddp_buckets"] = sum(buckets)
    return [_comm("backward", "all_reduce", "dp", "gradients (DDP buckets)", len(buckets),
                  sum(buckets), spec.dp)]


def _fsdp_units(shards: list[Shard]) -> dict[str, list[Shard]]:
    units: dict[str, list[Shard]] = {}
    for s in shards:
        units.setdefault(s.tensor.unit, []).append(s)
    return units


def _fsdp_comm(spec: RunSpec, shards: list[Shard], states: dict[str, int]) -> list[CommPrediction]:
    n = spec.dp
    units = _fsdp_units(shards)
    gathered = {u: n * sum(s.storage for s in group) * ELEMENT_BYTES for u, group in units.items()}
    reshards = [u for u in units if u and spec.reshard_after_forward]
    # Parameters held once forward is done: gathered units (padded) plus resharded units' shards.
    states["params_after_forward"] = sum(
        sum(s.storage for s in units[u]) * ELEMENT_BYTES if u in reshards else gathered[u]
        for u in units)
    return [
        _comm("forward", "all_gather", "dp", "parameters, one per FSDP unit", len(units),
              sum(gathered.values()), n),
        _comm("backward", "all_gather", "dp", "parameters of resharded units", len(reshards),
              sum(gathered[u] for u in reshards), n),
        _comm("backward", "reduce_scatter", "dp", "gradients, one per FSDP unit", len(units),
              sum(gathered.values()), n),
    ]


def _tp_comm(spec: RunSpec) -> list[CommPrediction]:
    hidden = hidden_bytes(spec)
    t = spec.tp
    if spec.arch is None:
        assert spec.mlp is not None
        rowwise = sum(1 for i in range(spec.mlp.depth) if i % 2 == 1)
        colwise_inner = sum(1 for i in range(1, spec.mlp.depth) if i % 2 == 0)
        return [
            _comm("forward", "all_reduce", "tp", "row-parallel outputs", rowwise,
                  rowwise * hidden, t),
            _comm("backward", "all_reduce", "tp", "column-parallel input gradients",
                  colwise_inner, colwise_inner * hidden, t),
        ]
    arch = spec.arch
    b, s = tokens(spec)
    layers = arch.layers
    colwise_per_layer = 3 + (2 if arch.gated else 1)  # q, k, v; gate and up, or up
    # loss_parallel's cross-entropy: the max and the sum of exponentials of each token's logits
    # (log-softmax), then the target logit (nll_loss), each an all-reduce of b·s fp32 values.
    loss_calls = 3
    return [
        _comm("forward", "all_reduce", "tp",
              "embedding output, and 2 row-parallel outputs per layer (o, down)", 1 + 2 * layers,
              (1 + 2 * layers) * hidden, t),
        _comm("forward", "all_reduce", "tp", "vocab-parallel cross-entropy", loss_calls,
              loss_calls * b * s * ELEMENT_BYTES, t),
        _comm("backward", "all_reduce", "tp",
              f"input gradients of column-parallel modules ({colwise_per_layer} per layer and the "
              "output layer)", colwise_per_layer * layers + 1,
              (colwise_per_layer * layers + 1) * hidden, t),
    ]


def _pipeline_comm(spec: RunSpec, stage: int) -> list[CommPrediction]:
    hidden = hidden_bytes(spec)
    m = spec.microbatches
    p = spec.pp
    out: list[CommPrediction] = []
    if stage < p - 1:
        out.append(_comm("forward", "send", "pp", "activations to the next stage", m, m * hidden, 2))
        out.append(_comm("backward", "recv", "pp", "gradients from the next stage", m, m * hidden,
                         2))
    if stage > 0:
        out.append(_comm("forward", "recv", "pp", "activations from the previous stage", m,
                         m * hidden, 2))
        out.append(_comm("backward", "send", "pp", "input gradients to the previous stage", m,
                         m * hidden, 2))
    return out


# ---- activations --------------------------------------------------------------------------------


def korthikanti_layer_bytes(arch: Transformer, tp: int = 1) -> int:
    """Bytes one transformer layer saves for backward per micro-batch in fp32, by
    :mod:`placeverify.cost.activations` (Korthikanti et al., Table 2, generalised)."""
    d = Exact()
    saved = saved_tensors(arch, layer_shape(d, arch, d.const(ELEMENT_BYTES)))
    value = Fraction(per_layer_bytes(saved, d.const(tp), False, d.const(1), drop_core=False))
    assert value.denominator == 1, value
    return int(value)


def norm_extra_bytes(arch: Transformer) -> int:
    """What one normalisation saves beyond its input, which Korthikanti et al. count:
    ``layer_norm`` its mean and reciprocal standard deviation (b·s fp32 values each); torch's
    ``RMSNorm``, composite on CPU, its reciprocal RMS and its normalised input (b·s·h)."""
    b, s, h = arch.micro_batch, arch.seq, arch.hidden
    if arch.norm == "layernorm":
        return 2 * b * s * ELEMENT_BYTES
    return b * s * ELEMENT_BYTES + b * s * h * ELEMENT_BYTES


def layer_extra_bytes(arch: Transformer, tp: int = 1) -> int:
    """Per layer, what torch saves beyond Korthikanti's list: the two norms' extras; with
    grouped-query attention written out (``attention = standard``) K and V repeated to every
    head (Korthikanti's generalisation counts them at kv_heads / heads); and dropout masks of
    the activation dtype where Korthikanti counts 1 byte (CPU dropout is ``input * mask``)."""
    b, s, h = arch.micro_batch, arch.seq, arch.hidden
    extra = 2 * norm_extra_bytes(arch)
    if arch.attention != "flash" and arch.kv_heads != arch.heads:
        repeated = b * s * (h - arch.kv_dim) // tp
        extra += 2 * repeated * ELEMENT_BYTES
    if arch.dropout:
        # CPU dropout multiplies by a mask of the activation dtype, not a 1-byte mask.
        masks = 2 * b * s * h  # the two residual dropouts (replicated over tp)
        if arch.attention != "flash":
            masks += arch.heads * s * s * b // tp  # attention-probability dropout
        extra += (ELEMENT_BYTES - 1) * masks
    return extra


def rope_table_bytes(arch: Transformer) -> int:
    """The rotary cos and sin tables (seq x head_dim each), built once per forward."""
    return 2 * arch.seq * arch.head_dim * ELEMENT_BYTES if arch.position == "rotary" else 0


def outside_layers_bytes(spec: RunSpec, first: bool, last: bool) -> int:
    """Bytes saved for backward outside the transformer layers, per micro-batch, from the autograd
    formulas. The input batch (token indices, targets) is not counted: the caller holds it. The
    first stage saves the learned-position indices (and an embedding dropout mask); the last the
    final norm's input and extras, the output layer's input, the log-probabilities of
    ``log_softmax`` (vocab-sharded under ``loss_parallel``) and ``nll_loss``'s total weight."""
    if spec.arch is None:
        return 0
    arch = spec.arch
    b, s, h = arch.micro_batch, arch.seq, arch.hidden
    tp = spec.tp
    total = 0
    if first:
        if arch.position == "learned":
            total += s * INDEX_BYTES
        if arch.dropout:
            total += b * s * h * ELEMENT_BYTES  # the embedding dropout's mask (activation dtype)
    if last:
        total += b * s * h * ELEMENT_BYTES + norm_extra_bytes(arch)  # final norm
        total += b * s * h * ELEMENT_BYTES  # output layer input
        total += b * s * chunk(arch.vocab, tp, 0) * ELEMENT_BYTES  # log-probabilities
        total += ELEMENT_BYTES  # nll_loss's total weight (a scalar)
    return total


def mlp_activation_bytes(mlp: Mlp, layers: range, first: bool, tp: int) -> int:
    """The MLP's layers, per micro-batch: each Linear saves its input (the model's input on the
    first stage is the caller's batch: not counted) and each GELU its input. Under tensor
    parallelism an even (column-parallel) layer's output is sharded, an odd (row-parallel) one's
    replicated after its all-reduce."""
    row = mlp.batch * mlp.width * ELEMENT_BYTES
    total = 0
    for i in layers:
        if not (first and i == 0):
            total += row // tp if i % 2 == 1 else row  # this layer's input
        total += row // tp if i % 2 == 0 else row  # GELU's input
    return total


def predict_activations(spec: RunSpec, rank: int) -> dict[str, int]:
    """Per micro-batch: the transformer layers (Korthikanti's count plus what torch saves beyond
    it) and the rest; the peak held at once given the micro-batches in flight (GPipe: m; 1F1B:
    min(m, p - stage)); and Korthikanti's count alone, for reference. For the MLP: its layers,
    and the loss's saved output."""
    tp = spec.tp if spec.implementation in (Implementation.TP, Implementation.FSDP2_TP) else 1
    if spec.implementation is Implementation.PIPELINE:
        stage = spec.coords(rank)["pp"]
        span = stage_layers(spec, stage)
        first, last = stage == 0, stage == spec.pp - 1
        m = spec.microbatches
        in_flight = m if spec.schedule is Schedule.GPIPE else min(m, spec.pp - stage)
    else:
        count = spec.arch.layers if spec.arch is not None else (spec.mlp.depth if spec.mlp else 0)
        span, first, last, in_flight = range(count), True, True, 1
    if spec.arch is None:
        assert spec.mlp is not None
        layer_bytes = mlp_activation_bytes(spec.mlp, span, first, tp)
        # mse_loss saves its input (the model's output, replicated: the depth is even).
        other = spec.mlp.batch * spec.mlp.width * ELEMENT_BYTES if last else 0
        return {"layers": layer_bytes, "other": other, "peak": in_flight * (layer_bytes + other)}
    arch = spec.arch
    layers = len(span)
    korthikanti = korthikanti_layer_bytes(arch, tp) * layers
    layer_bytes = korthikanti + layer_extra_bytes(arch, tp) * layers
    if layers:
        layer_bytes += rope_table_bytes(arch)
    other = outside_layers_bytes(spec, first, last)
    return {"layers": layer_bytes, "other": other, "peak": in_flight * (layer_bytes + other),
            "layers_korthikanti": korthikanti}
