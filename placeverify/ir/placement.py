"""Placement semantics: the four training states, the five modes and the roles of mesh axes.

A placement gives each state a mode per mesh axis (like DTensor's per-dim placements). Each axis
also has a *role* that says what it splits: the batch (data), layers' weights (tensor), the layer
stack (pipeline), the sequence (context) or the experts (expert). The paper's tuple
``(Θ, Ω, G, A)`` is one column of the state x axis matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placeverify.diagnostics import Span


class State(StrEnum):
    PARAMS = "params"
    OPTIMIZER = "optimizer"
    GRADIENTS = "gradients"
    ACTIVATIONS = "activations"

    @property
    def symbol(self) -> str:
        return {"params": "Θ", "optimizer": "Ω", "gradients": "G", "activations": "A"}[self.value]


STATES: tuple[State, ...] = (State.PARAMS, State.OPTIMIZER, State.GRADIENTS, State.ACTIVATIONS)

STATE_NAMES: dict[str, State] = {
    "params": State.PARAMS, "parameters": State.PARAMS, "Θ": State.PARAMS,
    "optimizer": State.OPTIMIZER, "optimizer_state": State.OPTIMIZER, "Ω": State.OPTIMIZER,
    "grads": State.GRADIENTS, "gradients": State.GRADIENTS, "G": State.GRADIENTS,
    "activations": State.ACTIVATIONS, "A": State.ACTIVATIONS,
}


class Mode(StrEnum):
    R = "R"  # replicated
    S = "S"  # sharded
    S_STAR = "S*"  # sharded, gathered before each use
    M = "M"  # materialized on demand (recomputed)
    O = "O"  # offloaded to host memory

    @property
    def sharded(self) -> bool:
        """Does the device hold only 1/n of the state along this axis?"""
        return self in (Mode.S, Mode.S_STAR, Mode.O)


class Role(StrEnum):
    DATA = "data"
    TENSOR = "tensor"
    PIPELINE = "pipeline"
    CONTEXT = "context"
    EXPERT = "expert"


class Schedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Reduce(StrEnum):
    """When a data axis that shards the gradients reduces them over several micro-batches."""

    # every micro-batch into the shard, the full buffer freed (DeepSpeed ZeRO-2/3, FSDP's default)
    MICROBATCH = "microbatch"
    # once a step: the unsharded gradient accumulates over the micro-batches and is
    # reduce-scattered after the last one, per model chunk of an interleaved pipeline (FSDP2's
    # set_requires_gradient_sync(False) before the last micro-batch, as torch.distributed.pipelining
    # does for its stages; Llama 3's FP32 accumulation over micro-batches, arXiv 2407.21783 §3.3.2)
    STEP = "step"


class Overlap(StrEnum):
    """Which collectives of a data axis overlap with compute (the others wait for them)."""

    # the gradient reductions with the backward, the parameter all-gathers with the forward:
    # PyTorch DDP's and FSDP's buckets and prefetching, Megatron-LM --overlap-grad-reduce with
    # --overlap-param-gather
    ALL = "all"
    # the gradient reductions only (Megatron-LM --overlap-grad-reduce alone: the distributed
    # optimizer's parameter all-gather runs after the update)
    GRADS = "grads"
    # the parameter gathers only (DeepSpeed ZeRO-3 with overlap_comm false: prefetched gathers,
    # gradient reductions on the compute stream)
    PARAMS = "params"
    # none: Megatron-LM without --overlap-grad-reduce (the reduction after the last backward),
    # DeepSpeed ZeRO-1/2 with overlap_comm false
    NONE = "none"


class TensorOverlap(StrEnum):
    """Which collectives of a tensor axis run beside the GEMMs (what outlasts a GEMM waits).

    Written ``overlap = none | backward | all`` on ``megatron`` and ``sp`` (``false`` and ``true``
    are ``none`` and ``all``)."""

    # every collective waited for: torch DTensor tensor parallelism run eagerly (torchtitan
    # without async TP), Megatron-DeepSpeed's copy of Megatron-LM of 2021
    NONE = "none"
    # the column-parallel linear layers' backward collectives: the input all-gathered again
    # beside the input-gradient GEMM, the input gradient reduce-scattered (all-reduced without
    # sequence parallelism) beside the weight-gradient GEMM; Megatron-LM's
    # LinearWithGradAccumulationAndAsyncCommunication (megatron/core/tensor_parallel/layers.py;
    # since 2021-09 without sequence parallelism, 2022-03 with it) and Transformer Engine's
    # Linear ("Overlap dgrad-RS/AR with wgrad"), by default
    BACKWARD = "backward"
    # every collective chunked beside the GEMM that consumes or produces it: Megatron-LM
    # --tp-comm-overlap (Transformer Engine's userbuffers), torchtitan's async tensor
    # parallelism; needs sequence parallelism
    ALL = "all"

    @property
    def json(self) -> bool | str:
        """As JSON shows it: ``true`` and ``false`` for all and none (as ``overlap = true`` and
        ``false`` are written), else the word (``"backward"``)."""
        return {"all": True, "none": False}.get(self.value, self.value)


@dataclass(frozen=True, slots=True)
class AxisPlacement:
    """How every state is placed along one mesh axis, and what the axis splits."""

    axis: str
    role: Role
    modes: tuple[Mode, Mode, Mode, Mode]  # Θ, Ω, G, A
    preset: str
    span: Span
    sequence_parallel: bool = False  # tensor axes: Megatron sequence parallelism
    # tensor axes: which collectives run beside the GEMMs (TensorOverlap); ``all`` needs
    # sequence parallelism
    overlap: TensorOverlap = TensorOverlap.NONE
    reshard_after_forward: bool = True  # data axes with Θ = S*: FSDP FULL_SHARD vs SHARD_GRAD_OP
    reduce: Reduce = Reduce.MICROBATCH  # data axes with G = S: when gradients are reduced
    data_overlap: Overlap = Overlap.ALL  # data axes: which collectives overlap with compute
    schedule: Schedule | None = None  # pipeline axes
    chunks: int = 1  # interleaved pipeline: model chunks per stage
    microbatches: int | None = None  # pipeline axes
    # pipeline axes: layers per virtual stage when written (``layers = [7, 8, ..., 7]``), virtual
    # stage k = chunk * stages + stage; None splits the layers evenly
    layers: tuple[int, ...] | None = None
    layers_span: Span | None = None  # where the list is written
    # pipeline axes: Megatron-LM's scatter/gather of the stage boundary (Narayanan et al. 2021
    # §4.1): each tensor rank sends 1/t of it, the receivers all-gather it over the tensor axes
    scatter_gather: bool = False
    # tensor axes: the experts are split whole along it (``place expert over tp * ep``): its ranks
    # belong to the experts' expert-parallel group, not to their tensor-parallel group, as
    # Megatron-core regroups the ranks for the experts when --expert-tensor-parallel-size is
    # below --tensor-model-parallel-size (``docs/language/place.md``, "The experts' own mesh")
    experts_split: bool = False
    # data axes: parameter groups placed over this axis by their own preset (``place ddp over dp
    # for norms``, ``docs/language/place.md``): (group name, its modes); the others follow ``modes``
    group_modes: tuple[tuple[str, tuple[Mode, Mode, Mode, Mode]], ...] = ()

    def mode(self, state: State) -> Mode:
        return self.modes[STATES.index(state)]

    def mode_of(self, state: State, group: str | None) -> Mode:
        """The mode of one parameter group's state along this axis (the axis's own without a
        group, or for a group it does not place by itself)."""
        for name, modes in self.group_modes:
            if name == group and state is not State.ACTIVATIONS:
                return modes[STATES.index(state)]
        return self.mode(state)

    def tuple_text(self) -> str:
        text = "(" + ", ".join(m.value for m in self.modes) + ")"
        for name, modes in self.group_modes:  # per-group meshes
            text += f"; {name} (" + ", ".join(m.value for m in modes[:3]) + f", {self.modes[3].value})"
        return text
