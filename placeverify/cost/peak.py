"""Peak memory over one step: what is alive at each moment, on every rank kind.

The placement's memory (:mod:`placeverify.cost.memory`) counts what a device holds: persistent
states (Θ, Ω, G as placed, and what the written step keeps besides), the activations in flight,
those outside the layers, and transient buffers (a gathered unit, the recompute working set). Not
all of it is alive at once, and implementations hold more than the states. The moments:

- **end of forward** of the last micro-batch in flight: Θ, Ω, the gradients where the
  implementation keeps them between steps or a previous micro-batch has made them, every
  activation in flight, those outside the layers (the logits and the loss's fp32 copy), the
  transient buffers, and the profile's extras (DDP buckets);
- **end of backward**: Θ, Ω, G, the transient buffers and the profile's extras (the activations
  have been freed layer by layer as the gradients were made);
- **optimizer step**: Θ, Ω, G, the profile's extras and the optimizer's temporaries.

The profile (``mesh { memory_profile = ... }``, :mod:`placeverify.ir.profiles`; default
``megatron``) says what the implementation adds; the peak is the largest moment of the fullest
rank kind, and "fits" compares it, plus the mesh's ``reserve``, with ``device_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.cost.implementations.params import ParamTensor, transformer_params
from placeverify.cost.memory import GATHERED_KEPT_LABEL, RankMemory, kept_parameter_axes
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, Schedule, State
from placeverify.ir.profiles import DEFAULT_MEMORY_PROFILE
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import gathered_axes, partitions


@dataclass(frozen=True, slots=True)
class Moment:
    """What is alive at one moment of the step on one rank kind, part by part (bytes)."""

    name: str  # end of forward | start of backward (FSDP2) | end of backward | optimizer step
    rank: str  # the rank kind (only | first | middle | last | every)
    parts: tuple[tuple[str, Fraction], ...]
    stage: int | None = None  # the stage whose figures these are, when the kind has several
    not_modelled: tuple[str, ...] = ()  # what this moment would hold but cannot be sized

    @property
    def total(self) -> Fraction:
        return sum((b for _, b in self.parts), Fraction(0))

    def describe(self) -> str:
        where = "" if self.rank in ("only", "every") else f", {self.rank} pipeline stage"
        if self.stage is not None:
            where += f" (stage {self.stage})"
        return f"{self.name}{where}"


@dataclass(frozen=True, slots=True)
class Peak:
    profile: str
    persistent: Fraction  # model states (and what the step keeps) of the fullest rank kind
    moments: tuple[Moment, ...]  # every moment of every rank kind
    peak: Moment  # the largest

    @property
    def bytes(self) -> Fraction:
        return self.peak.total


def _category(rank: RankMemory, category: str) -> Fraction:
    return sum((Fraction(i.bytes) for i in rank.items if not i.host and i.category == category),
               Fraction(0))


def _replicated_gradient_axes(strategy: Strategy) -> bool:
    """Whether some data axis (of size > 1) all-reduces replicated gradients (DDP's buckets)."""
    return any(p.role is Role.DATA and strategy.size(p.axis) > 1
               and not partitions(strategy, p.axis, State.GRADIENTS)
               for p in strategy.placements)


def _optimizer_elements(strategy: Strategy, optimizer_bytes: Fraction) -> Fraction:
    per = strategy.precision.optimizer
    return optimizer_bytes / per if per else Fraction(0)


def _largest_tensor(strategy: Strategy) -> Fraction:
    """Elements of the largest single parameter tensor on a device (tensor-parallel split)."""
    arch = strategy.model.arch
    assert arch is not None
    t = 1
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            t *= strategy.size(p.axis)
    ffn = arch.expert_ffn or arch.ffn
    largest = max(arch.hidden * arch.q_dim, arch.hidden * ffn,
                  arch.padded_vocab(t) * arch.hidden)
    return Fraction(largest, t)


def _sizes(strategy: Strategy, role: Role) -> int:
    size = 1
    for p in strategy.placements:
        if p.role is role:
            size *= strategy.size(p.axis)
    return size


def fsdp2_resharding(strategy: Strategy, profile: str) -> bool:
    """Whether the step runs FSDP2-style gathered units that reshard after forward under a torch
    profile: a gathered (S*) axis of size > 1 whose parameters are not kept gathered."""
    if profile not in ("torch", "torch_cpu") or strategy.model.arch is None:
        return False
    axes = [a for a in gathered_axes(strategy) if strategy.size(a) > 1]
    return bool(axes) and all(strategy.placement(a).reshard_after_forward for a in axes) \
        and not set(axes) <= set(kept_parameter_axes(strategy))


def _unit(strategy: Strategy) -> Fraction:
    """Parameters of one layer's FSDP2 unit on a device (÷ t, experts ÷ t·ep)."""
    arch = strategy.model.arch
    assert arch is not None
    t, ep = _sizes(strategy, Role.TENSOR), _sizes(strategy, Role.EXPERT)
    layer = arch.layer_params()
    return (Fraction(layer[ParamGroup.DENSE], t) + layer[ParamGroup.NORMS]
            + Fraction(layer[ParamGroup.EXPERTS], t * ep))


def fsdp2_backward_parts(strategy: Strategy, rank: RankMemory, profile: str
                         ) -> list[tuple[str, Fraction]]:
    """What FSDP2 adds at the start of the last layer's backward, its peak while every layer's
    activations are still alive (``torch.distributed.fsdp.fully_shard``, PyTorch docs, and the
    allocations of a real run, ``benchmarks/peak_memory.py``):

    - the root unit (the embedding, the final norm and the output layer, ``fully_shard`` on the
      model itself) stays gathered from forward to the end of backward: FSDP2 does not reshard
      the root after forward (it would be gathered again at once);
    - the root's unsharded gradients made so far (the output layer's and the final norm's; the
      embedding's comes last), alive until the root's reduce-scatter at the end of backward;
    - the gradient flowing back into the last layer, one hidden state (e·b·s·h);
    - the last layer's unit, gathered again for backward, and the one before it, prefetched
      (FSDP2 prefetches one unit in backward by default);
    - ``torch_cpu``: gloo's all-gather stages the gathered unit once more while it runs (the
      CPU trace shows the transient beside the output).

    The unit's own unsharded gradients come as its activations go (each reduce-scatter runs
    after the unit's parameters are resharded), so this moment is the backward's largest when a
    layer's activations outweigh its gradients; a unit's gradients beyond its activations are
    counted too."""
    arch = strategy.model.arch
    assert arch is not None
    t = _sizes(strategy, Role.TENSOR)
    pb, gb, eb = (Fraction(strategy.precision.params), Fraction(strategy.precision.grads),
                  Fraction(strategy.precision.activations))
    unit = _unit(strategy)
    word = Fraction(arch.padded_vocab(t) * arch.hidden, t)
    positions = Fraction(arch.position_rows * arch.hidden, t)
    output = Fraction(0) if arch.tied_embeddings else word
    root = word + positions + output + arch.norm_params()
    root_grads = (word if arch.tied_embeddings else output) + arch.norm_params()
    sp = any(p.sequence_parallel for p in strategy.placements if p.role is Role.TENSOR)
    hidden = eb * arch.micro_batch * arch.seq * arch.hidden / (t if sp else 1) \
        / _sizes(strategy, Role.CONTEXT)
    parts = [("root unit gathered (not resharded after forward)", root * pb),
             ("root unit's unsharded gradients (output layer, final norm)", root_grads * gb),
             ("activation gradient (one hidden state)", hidden),
             ("last layer's unit gathered for backward, and the next prefetched", 2 * unit * pb)]
    per_layer = _category(rank, "activations") / arch.layers if arch.layers else Fraction(0)
    if unit * gb > per_layer:
        parts.append(("a unit's unsharded gradients beyond its activations", unit * gb - per_layer))
    if profile == "torch_cpu":
        parts.append(("gloo all-gather staging (one unit)", unit * pb))
    return parts


# The start of backward in the order where gloo's worker thread lets go of the last layer's
# all-gather after FSDP2 does (``torch_cpu``): a moment of the same step, not another step.
GLOO_HELD_MOMENT = "start of backward, gloo still holding the last all-gather"
GLOO_HELD_LABEL = "last layer's all-gather output (its last reference on gloo's worker thread)"


def gloo_held_parts(strategy: Strategy) -> list[tuple[str, Fraction]]:
    """``torch_cpu``: the last layer's all-gather output alive beside the next unit's prefetch,
    in the order the implementation allows when gloo's worker thread drops its reference last.

    The gloo backend runs a collective on a worker thread that keeps its reference to the work
    (and through it to the output tensor) after the work is complete: torch's
    ``ProcessGroupGloo::runLoop`` (``torch/csrc/distributed/c10d/ProcessGroupGloo.cpp``) takes
    ``auto work = std::move(workQueue_.front())``, runs it (which completes the future that
    ``wait()`` returns on) and only then, under the lock, ``workInProgress_[workerIndex].reset()``;
    the local ``work`` goes at the end of that loop iteration. FSDP2's pre-backward
    (``_fsdp_param_group.py`` line 576, torch 2.13) copies the last layer's unit out of its
    all-gather output, drops that output (line 489, ``self._all_gather_result = None  # free
    unless saved in `all_gather_state```) and prefetches the next unit (line 585,
    ``self._backward_prefetch()``), whose all-gather output and gloo's staging are allocated at
    once. When the worker thread has not yet left its loop iteration (it has not been scheduled
    since the work completed), the output is freed by the worker, after those allocations: one
    unit more at this moment. Which order happens depends on thread scheduling (CPU runs of
    ``examples/measure/zero3.place`` show both); the peak is the larger. A worker thread
    starved for longer (each of gloo's threads holding a finished work) would hold more: not
    modelled."""
    return [(GLOO_HELD_LABEL, _unit(strategy) * Fraction(strategy.precision.params))]


def fsdp2_zero2_world(strategy: Strategy, profile: str) -> int:
    """W, the data-parallel size over which torch runs FSDP2's
    ``fully_shard(reshard_after_forward=False)`` under a torch profile: torch has no other
    ZeRO-2, and ``measure``'s plan runs ``zero2`` (R, S, S) and ``fsdp`` / ``zero3`` with
    ``reshard_after_forward = false`` (S*, S, S) so. Data axes of size > 1 that shard the
    gradients and keep the parameters whole or gathered from forward to backward. 1 where this
    does not apply or is not modelled (tensor, pipeline, expert or context axes of size > 1,
    experts, or a step that keeps the gathered parameters after the update as written)."""
    arch = strategy.model.arch
    if profile not in ("torch", "torch_cpu") or arch is None or arch.moe:
        return 1
    if any(p.role is not Role.DATA and strategy.size(p.axis) > 1 for p in strategy.placements):
        return 1
    world = 1
    for p in strategy.placements:
        if (p.role is Role.DATA and strategy.size(p.axis) > 1
                and partitions(strategy, p.axis, State.GRADIENTS)
                and not partitions(strategy, p.axis, State.PARAMS)):
            world *= strategy.size(p.axis)
        elif (p.role is Role.DATA and strategy.size(p.axis) > 1
                and p.axis in gathered_axes(strategy) and not p.reshard_after_forward):
            if p.axis in kept_parameter_axes(strategy):
                return 1
            world *= strategy.size(p.axis)
    return world


def _padded_rows(tensors: list[ParamTensor], world: int) -> int:
    """Elements of one rank's FSDP2 storage for ``tensors``: dim 0 padded to a multiple of
    ``world`` and cut in ``world`` (``_fsdp_param.py``: ``_sharded_param_data`` is the padded
    chunk; the first rank's real shard is all of it, ``torch.chunk``'s ⌈rows/W⌉)."""
    total = 0
    for t in tensors:
        rest = t.numel // t.shape[0]
        total += -(-t.shape[0] // world) * rest
    return total


def fsdp2_zero2_parts(strategy: Strategy, rank: RankMemory, world: int, profile: str
                      ) -> dict[str, list[tuple[str, Fraction]]]:
    """What FSDP2 with ``reshard_after_forward=False`` holds on its fullest rank (the first: every
    shard ⌈rows/W⌉), torch 2.13's ``_fully_shard`` (one unit per layer and the root, as
    ``placeverify measure`` wraps them):

    - ``states``: the parameters as padded shards (``_sharded_param_data``), the optimizer's state
      as ``zeros_like`` of the first rank's real shard (the same size), the sharded gradients as
      the reduce-scatter's padded output;
    - ``gathered``: every unit's unsharded parameters, kept from its forward to its post-backward
      (``FSDPParam.init_all_gather_outputs``: ``numel * world_size`` of the padded shard);
    - ``post_backward``: at the last layer's post-backward (its peak, every other layer's
      activations still alive) the unit has resharded first (``_fsdp_param_group.py``
      ``post_backward``: ``if self.reshard_after_backward: self.reshard()`` before
      ``foreach_reduce``), so every other unit is still gathered; ``foreach_reduce``
      (``_fsdp_collectives.py``) holds the unit's unsharded gradients (``unsharded_grads``,
      cleared only after the copy-in) beside the reduce-scatter input, a new flat buffer of the
      padded size (``reduce_scatter_comm.allocate((reduce_scatter_input_numel,))``), and on CPU
      ``_chunk_cat`` copies each gradient whose dim 0 W does not divide into a padded tensor
      before the cat (``torch/_decomp/decompositions.py`` ``_pad_chunk``:
      ``aten.constant_pad_nd`` when ``pad_along_dim != tensor_size[dim]``; CUDA has its own
      kernel, none counted); the root's unsharded gradients made so far (output layer, final
      norm) and the gradient flowing into the layer before (one hidden state)."""
    arch = strategy.model.arch
    assert arch is not None
    pb, gb = Fraction(strategy.precision.params), Fraction(strategy.precision.grads)
    ob = Fraction(strategy.precision.optimizer)
    tensors = transformer_params(arch)
    shard = _padded_rows(tensors, world)
    last = [t for t in tensors if t.unit == f"layers.{arch.layers - 1}"]
    unit_real = sum(t.numel for t in last)
    unit_padded = world * _padded_rows(last, world)
    copied = world * _padded_rows([t for t in last if t.shape[0] % world], world)
    output = Fraction(0) if arch.tied_embeddings else Fraction(arch.vocab * arch.hidden)
    root_grads = (Fraction(arch.vocab * arch.hidden) if arch.tied_embeddings else output) \
        + arch.norm_params()
    per_layer = _category(rank, "activations") / arch.layers if arch.layers else Fraction(0)
    return {
        "states": [(f"Θ params (FSDP2 shards, dim 0 padded to a multiple of {world})",
                    shard * pb),
                   ("Ω optimizer (the first rank's shard, ⌈rows/W⌉ of each tensor)",
                    shard * ob)],
        "grads": [("G gradients (padded reduce-scatter outputs)", shard * gb)],
        "gathered": [("Θ gathered units (kept from forward to backward)", world * shard * pb)],
        "gathered_but_last": [("Θ gathered units (all but the last layer's, resharded)",
                               (world * shard - unit_padded) * pb)],
        "post_backward": [
            ("A activations in flight (but the last layer's)",
             _category(rank, "activations") - per_layer),
            ("root unit's unsharded gradients (output layer, final norm)", root_grads * gb),
            ("activation gradient (one hidden state)", _hidden_bytes(strategy)),
            ("last layer's unsharded gradients", unit_real * gb),
            ("reduce-scatter input (padded flat copy)", unit_padded * gb),
            *([("_chunk_cat's padded copies (dim 0 not divisible by W)", copied * gb)]
              if profile == "torch_cpu" else [])],
    }


def _backward_before_peak(strategy: Strategy, rank: RankMemory) -> bool:
    """Whether some micro-batch's backward has made gradients on this rank kind (its first stage)
    by the time its activations in flight peak again: never with one micro-batch or under GPipe
    (every forward before any backward); under 1F1B when a steady step follows the first
    (m − W ≥ 2, W = min(p − i − 1, m) the stage's warm-up forwards, Megatron-LM's and
    torch.distributed.pipelining's schedule); interleaved likewise with W = min(2(p − i − 1) +
    (v − 1)p, m·v) virtual micro-batches."""
    m = strategy.microbatches
    pipe = strategy.pipeline
    if pipe is None or strategy.size(pipe.axis) == 1:
        return m > 1
    p, i = strategy.size(pipe.axis), (rank.kind.stages[0] if rank.kind.stages else 0)
    if pipe.schedule is Schedule.GPIPE:
        return False
    if pipe.schedule is Schedule.INTERLEAVED:
        v = pipe.chunks
        return m * v - min(2 * (p - i - 1) + (v - 1) * p, m * v) >= 2
    return m - min(p - i - 1, m) >= 2


def _hidden_bytes(strategy: Strategy) -> Fraction:
    """One micro-batch's hidden state on a device: e·b·s·h (÷ t under sequence parallelism,
    ÷ cp)."""
    arch = strategy.model.arch
    assert arch is not None
    sp = any(p.sequence_parallel for p in strategy.placements if p.role is Role.TENSOR)
    return (Fraction(strategy.precision.activations) * arch.micro_batch * arch.seq * arch.hidden
            / (_sizes(strategy, Role.TENSOR) if sp else 1) / _sizes(strategy, Role.CONTEXT))


def torch_pipelining_buffers(strategy: Strategy, rank: RankMemory) -> list[tuple[str, Fraction]]:
    """What ``torch.distributed.pipelining`` keeps on a stage for the whole step (torch 2.13,
    ``pipelining/stage.py``): a receive buffer per micro-batch for the activations
    (``_prepare_forward_infra``: ``args_recv_info[chunk] = self._create_act_recv_info()`` for
    each of the m micro-batches, a ``_make_tensor_from_meta`` buffer) on every stage but the
    first, and one for the gradients (``_prepare_backward_infra``, ``grad_recv_info[mb_index]``)
    on every stage but the last; and on the last stage each micro-batch's output, the logits
    (``if self.is_last and save_forward_output: self.output_chunks.append(output)``), kept for
    the merged output until the next step clears them (``clear_runtime_states``). One of those
    logits is the outside-the-layers "logits" item already (16-bit activations)."""
    pipe = strategy.pipeline
    arch = strategy.model.arch
    if pipe is None or strategy.size(pipe.axis) == 1 or arch is None:
        return []
    m = strategy.microbatches
    hidden = _hidden_bytes(strategy)
    parts: list[tuple[str, Fraction]] = []
    if not rank.kind.first:
        parts.append(("pipelining activation receive buffers (one per micro-batch)", m * hidden))
    if not rank.kind.last:
        parts.append(("pipelining gradient receive buffers (one per micro-batch)", m * hidden))
    if rank.kind.last:
        e = Fraction(strategy.precision.activations)
        t = _sizes(strategy, Role.TENSOR)
        logits = e * arch.micro_batch * arch.seq * arch.padded_vocab(t) / t \
            / _sizes(strategy, Role.CONTEXT)
        kept = m if e == 4 else m - 1  # with 16-bit activations one is counted outside the layers
        parts.append(("pipelining stage outputs kept for the merged output", kept * logits))
    return parts


def accumulation_temporaries(strategy: Strategy) -> list[tuple[str, Fraction]]:
    """A backward that adds into existing gradients (eager torch's ``AccumulateGrad``) makes each
    weight's gradient in a new tensor first: one weight of the layer's largest matrix (h × ffn,
    ÷ t) in the gradient dtype, beside the ffn-wide activation gradient being propagated
    (e·b·s·ffn, ÷ t, ÷ cp) at the MLP's backward."""
    arch = strategy.model.arch
    assert arch is not None
    t = _sizes(strategy, Role.TENSOR)
    ffn = arch.expert_ffn or arch.ffn
    weight = Fraction(max(arch.hidden * arch.q_dim, arch.hidden * ffn), t) \
        * strategy.precision.grads
    flowing = Fraction(strategy.precision.activations) * arch.micro_batch * arch.seq * ffn / t \
        / _sizes(strategy, Role.CONTEXT)
    return [("a weight's gradient before it is accumulated", weight),
            ("ffn-wide activation gradient", flowing)]


def rank_moments(strategy: Strategy, rank: RankMemory, profile: str) -> list[Moment]:
    """The three moments of one rank kind under ``profile``."""
    params, optimizer = _category(rank, "params"), _category(rank, "optimizer")
    grads = _category(rank, "gradients")
    activations, outside = _category(rank, "activations"), _category(rank, "outside_layers")
    buffers = _category(rank, "buffers")
    torch_like = profile in ("torch", "torch_cpu")
    elements = _optimizer_elements(strategy, optimizer)  # of the optimizer's partition
    world = fsdp2_zero2_world(strategy, profile)
    zero2 = fsdp2_zero2_parts(strategy, rank, world, profile) if world > 1 else None
    gathered: list[tuple[str, Fraction]] = []
    if zero2 is not None:  # FSDP2 holds padded shards, and gathered units from forward on
        grads, gathered = zero2["grads"][0][1], zero2["gathered"]
        # S* without resharding: the placement's whole-model buffer is these gathered units
        buffers -= sum((Fraction(i.bytes) for i in rank.items if not i.host
                        and i.label == GATHERED_KEPT_LABEL), Fraction(0))
    extras: list[tuple[str, Fraction]] = []
    if torch_like and _replicated_gradient_axes(strategy):
        extras.append(("DDP bucket buffers", grads))
    deepspeed = profile in ("deepspeed", "megatron_deepspeed")
    if deepspeed and strategy.precision.grads < 4 and _zero_1_or_2(strategy):
        extras.append(("fp32 gradient partition", 4 * elements))
    if profile == "megatron_deepspeed" and strategy.precision.grads >= 4 \
            and strategy.precision.params < 4 and _zero_1_or_2(strategy):
        # BF16_Optimizer: the 16-bit .grad of every parameter the rank holds, as Θ
        extras.append(("16-bit gradients beside the fp32 accumulation (BF16_Optimizer)", params))
    if torch_like:
        extras.extend(torch_pipelining_buffers(strategy, rank))
    # torch frees the gradients between steps: they exist in forward only while accumulating
    grads_forward = grads if (not torch_like or _backward_before_peak(strategy, rank)) \
        else Fraction(0)
    temporaries = Fraction(0)
    if profile == "torch":
        # foreach Adam, an fp32 sqrt of every exp_avg_sq at once (torch 2.13 torch/optim/adam.py
        # line 762, _multi_tensor_adam: ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``,
        # then divided and added into in place): sized by the whole list, known for a bare count
        temporaries = 4 * elements
    unsized: tuple[str, ...] = ()
    if profile == "torch_cpu" and elements and strategy.model.arch is None:
        # a bare count's tensors are unknown unless the user gives the largest one
        if strategy.model.largest_tensor is None:
            unsized = ("Adam's per-tensor temporaries (CPU): a bare parameter count has no "
                       "tensor sizes; give model { largest_tensor = N }",)
        else:
            temporaries = 2 * 4 * Fraction(strategy.model.largest_tensor,
                                           _sizes(strategy, Role.TENSOR))
    elif profile == "torch_cpu" and elements:
        # two temporaries of the largest parameter: torch 2.13 torch/optim/adam.py line 544,
        # _single_tensor_adam (CPU tensors are not foreach: optimizer.py
        # _default_to_fused_or_foreach), ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)``
        temporaries = 2 * 4 * _largest_tensor(strategy)
    states = (("Θ params", params), ("Ω optimizer", optimizer)) if zero2 is None \
        else tuple(zero2["states"])
    kind = rank.kind.name
    # a kind of several stages gives the figures of its first, the fullest (most in flight)
    stage = rank.kind.stages[0] if len(rank.kind.stages) > 1 and kind != "every" else None
    backward: list[Moment] = []
    if fsdp2_resharding(strategy, profile):
        backward.append(Moment("start of backward", kind, (
            *states, ("G gradients", grads_forward), ("A activations in flight", activations),
            *fsdp2_backward_parts(strategy, rank, profile), *extras), stage))
        if profile == "torch_cpu":
            backward.append(Moment(GLOO_HELD_MOMENT, kind, (
                *states, ("G gradients", grads_forward), ("A activations in flight", activations),
                *fsdp2_backward_parts(strategy, rank, profile), *gloo_held_parts(strategy),
                *extras), stage))
    if zero2 is not None:
        backward.append(Moment("post-backward of the last layer (FSDP2)", kind, (
            *states, ("G gradients", grads_forward), *zero2["gathered_but_last"],
            *zero2["post_backward"],
            *extras), stage))
    # GPipe: the second backward adds into the first's gradients with m - 1 micro-batches' of
    # activations left; 1F1B: a steady backward with the stage's peak in flight
    pipe = strategy.pipeline
    gpipe = pipe is not None and strategy.size(pipe.axis) > 1 and pipe.schedule is Schedule.GPIPE
    left = Fraction(strategy.microbatches - 1, strategy.microbatches) if gpipe else Fraction(1)
    if torch_like and strategy.model.arch is not None and (grads_forward or (gpipe and left)):
        backward.append(Moment("backward, gradients accumulating", kind, (
            *states, ("G gradients", grads), *gathered,
            ("A activations in flight", activations * left),
            ("A outside the layers", outside * left), ("buffers", buffers), *extras,
            *accumulation_temporaries(strategy)), stage))
    return [
        *backward,
        Moment("end of forward", kind, (*states, ("G gradients", grads_forward), *gathered,
                                        ("A activations in flight", activations),
                                        ("A outside the layers", outside),
                                        ("buffers", buffers), *extras), stage),
        Moment("end of backward", kind, (*states, ("G gradients", grads), ("buffers", buffers),
                                         *extras), stage),
        Moment("optimizer step", kind, (*states, ("G gradients", grads), *extras,
                                        ("optimizer temporaries", temporaries)), stage,
               unsized),
    ]


def _zero_1_or_2(strategy: Strategy) -> bool:
    """Whether some data axis shards the optimizer but not the parameters (ZeRO-1/2)."""
    return any(strategy.size(p.axis) > 1 and partitions(strategy, p.axis, State.OPTIMIZER)
               and not partitions(strategy, p.axis, State.PARAMS) for p in strategy.placements)


def peak(strategy: Strategy, ranks: tuple[RankMemory, ...]) -> Peak:
    """The peak of the step over every rank kind (exact numbers)."""
    profile = strategy.mesh.memory_profile or DEFAULT_MEMORY_PROFILE
    moments = [m for rank in ranks for m in rank_moments(strategy, rank, profile)]
    top = max(moments, key=lambda m: m.total)
    fullest = next(r for r in ranks if r.kind.name == top.rank)
    persistent = sum((_category(fullest, c) for c in ("params", "optimizer", "gradients")),
                     Fraction(0))
    return Peak(profile, persistent, tuple(moments), top)
