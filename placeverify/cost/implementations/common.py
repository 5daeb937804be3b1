"""What every implementation's predictor shares: element sizes, ``torch.chunk`` arithmetic, a
parameter's local piece, the prediction types, the gloo wire rule and optimizer-state bytes.

Optimizer state follows ``torch.optim``: Adam keeps ``exp_avg`` and ``exp_avg_sq`` shaped like each
(local) parameter and a 4-byte ``step`` tensor per parameter; SGD with momentum one
``momentum_buffer``; plain SGD nothing.

Payload convention (REFERENCE §2.2): the bytes of the full tensor a collective is about: an
all-reduce's or broadcast's tensor, an all-gather's gathered output, a reduce-scatter's input;
a send or receive its tensor. gloo runs a reduce-scatter as an all-reduce of the full input, so
its wire cost per device is 2(n-1)/n of the payload rather than (n-1)/n.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placeverify.cost.implementations.params import ParamTensor
from placeverify.cost.implementations.spec import OptimizerKind, RunSpec

ELEMENT_BYTES = 4  # the measure backend runs in fp32
INDEX_BYTES = 8  # int64 token indices and targets
STEP_BYTES = 4  # torch.optim.Adam's per-parameter ``step`` (a float32 scalar tensor)


def chunk(size: int, parts: int, index: int) -> int:
    """The length of piece ``index`` when ``torch.chunk`` splits ``size`` into ``parts``:
    pieces of ⌈size/parts⌉, the last ones shorter or empty (DTensor's ``Shard`` and FSDP2)."""
    step = -(-size // parts)
    return max(0, min(step, size - index * step))


@dataclass(frozen=True, slots=True)
class Shard:
    """One parameter's piece on one rank."""

    tensor: ParamTensor
    numel: int  # elements of the local tensor
    storage: int  # elements of its storage (FSDP2 pads dim 0 to the chunk size)
    grad: int  # elements of its gradient's local tensor


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


def collective(phase: str, op: str, axis: str, what: str, calls: int, payload: int,
          group_size: int) -> CommPrediction:
    return CommPrediction(phase, op, axis, what, calls, payload, group_size, gloo_wire_op(op))


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
