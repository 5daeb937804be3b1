"""Peak memory over one step: what is alive at each moment, on every rank kind.

The placement's memory (:mod:`placeverify.cost.memory`) counts what a device holds: persistent
states (Θ, Ω, G as placed, and what the written step keeps besides), the activations in flight,
those outside the layers, and transient buffers (a gathered unit, the recompute working set). Not
all of it is alive at once, and implementations hold more than the states. The moments:

- **end of forward** of the last micro-batch in flight: Θ, Ω, the gradients where the
  implementation keeps them between steps or a previous micro-batch has made them, every
  activation in flight, those outside the layers (the logits and the loss's fp32 copy), the
  transient buffers but the recompute working set, and the profile's extras (DDP buckets);
- **backward of the last layer** (under recomputation, or ZeRO-3 / FSDP full shard): every
  activation still held, the working set (the layer rebuilt), and under ZeRO-3 that layer
  gathered with its unsharded gradient; **backward of the output layer** (ZeRO-3, last stage):
  the output layer gathered with its unsharded gradient (:func:`_layer_backward`);
- **end of backward**: Θ, Ω, G, the transient buffers and the profile's extras (the activations
  have been freed layer by layer as the gradients were made);
- **optimizer step**: Θ, Ω, G, the profile's extras and the optimizer's temporaries.

The profile (``mesh { memory_profile = ... }``, :mod:`placeverify.ir.profiles`; default
``megatron``) says what the implementation adds; the peak is the largest moment of the fullest
rank kind, and "fits" compares it, plus the mesh's ``reserve``, with ``device_memory``.

The parts that torch's implementations add (FSDP2, gloo, ``torch.distributed.pipelining``, eager
accumulation, Adam's temporaries) are :mod:`placeverify.cost.torch_moments`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.cost.memory import (
    GATHER_BUFFER_LABEL,
    GATHERED_KEPT_LABEL,
    WORKING_SET_LABEL,
    RankMemory,
    unsharded_gradient_axes,
)
from placeverify.cost.torch_moments import (
    GLOO_HELD_MOMENT,
    LOSS_BACKWARD_MOMENT,
    accumulation_temporaries,
    adam_temporaries,
    category_bytes,
    fsdp2_backward_parts,
    fsdp2_resharding,
    fsdp2_zero2_parts,
    fsdp2_zero2_world,
    gloo_held_parts,
    layer_unit,
    loss_backward_parts,
    replicated_gradient_axes,
    torch_pipelining_buffers,
)
from placeverify.ir.placement import Role, Schedule, State
from placeverify.ir.profiles import DEFAULT_MEMORY_PROFILE
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import gathered_axes, partitions

# GLOO_HELD_MOMENT was defined here: benchmarks/peak_memory.py imports it from this module.
__all__ = ["GLOO_HELD_MOMENT", "Moment", "Peak", "peak", "rank_moments"]



@dataclass(frozen=True, slots=True)
class Moment:
    """What is alive at one moment of the step on one rank kind, part by part (bytes)."""

    name: str  # end of forward | backward of the loss | start of backward (FSDP2) | ... | optimizer step
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


def _optimizer_elements(strategy: Strategy, optimizer_bytes: Fraction) -> Fraction:
    per = strategy.precision.optimizer
    return optimizer_bytes / per if per else Fraction(0)


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


@dataclass(frozen=True, slots=True)
class _Held:
    """What a rank kind holds, part by part, for its moments."""

    kind: str
    stage: int | None
    states: tuple[tuple[str, Fraction], ...]  # Θ and Ω (FSDP2's padded shards under ZeRO-2)
    grads: Fraction
    grads_forward: Fraction  # the gradients alive in forward
    gathered: tuple[tuple[str, Fraction], ...]  # FSDP2's units kept gathered from forward on
    activations: Fraction
    outside: Fraction
    buffers: Fraction  # without the recompute working set
    extras: tuple[tuple[str, Fraction], ...]  # the profile's, at every moment
    working: Fraction = Fraction(0)  # the recompute working set: one layer rebuilt in backward


def _extras(strategy: Strategy, rank: RankMemory, profile: str, grads: Fraction,
            params: Fraction, elements: Fraction) -> list[tuple[str, Fraction]]:
    """What the profile's implementation holds beside the states at every moment."""
    torch_like = profile in ("torch", "torch_cpu")
    extras: list[tuple[str, Fraction]] = []
    if torch_like and replicated_gradient_axes(strategy):
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
    return extras


def _backward_moments(strategy: Strategy, rank: RankMemory, profile: str, held: _Held,
                      zero2: dict[str, list[tuple[str, Fraction]]] | None) -> list[Moment]:
    """The moments inside the backward that an implementation makes larger than its end."""
    kind, stage, states, extras = held.kind, held.stage, held.states, held.extras
    backward: list[Moment] = []
    # a layer's backward under recomputation rebuilds its activations first (the last layer's
    # at the start of backward, and every steady backward's)
    recompute = [("recompute working set (one layer)", held.working)] if held.working else []
    if fsdp2_resharding(strategy, profile):
        backward.append(Moment("start of backward", kind, (
            *states, ("G gradients", held.grads_forward),
            ("A activations in flight", held.activations),
            *fsdp2_backward_parts(strategy, rank, profile), *recompute, *extras), stage))
        if profile == "torch_cpu":
            backward.append(Moment(GLOO_HELD_MOMENT, kind, (
                *states, ("G gradients", held.grads_forward),
                ("A activations in flight", held.activations),
                *fsdp2_backward_parts(strategy, rank, profile), *gloo_held_parts(strategy),
                *recompute, *extras), stage))
    if zero2 is not None:
        backward.append(Moment("post-backward of the last layer (FSDP2)", kind, (
            *states, ("G gradients", held.grads_forward), *zero2["gathered_but_last"],
            *zero2["post_backward"],
            *extras), stage))
    # GPipe: the second backward adds into the first's gradients with m - 1 micro-batches' of
    # activations left; 1F1B: a steady backward with the stage's peak in flight
    torch_like = profile in ("torch", "torch_cpu")
    pipe = strategy.pipeline
    gpipe = pipe is not None and strategy.size(pipe.axis) > 1 and pipe.schedule is Schedule.GPIPE
    left = Fraction(strategy.microbatches - 1, strategy.microbatches) if gpipe else Fraction(1)
    if torch_like and strategy.model.arch is not None and (held.grads_forward or (gpipe and left)):
        backward.append(Moment("backward, gradients accumulating", kind, (
            *states, ("G gradients", held.grads), *held.gathered,
            ("A activations in flight", held.activations * left),
            ("A outside the layers", held.outside * left), ("buffers", held.buffers), *recompute,
            *extras, *accumulation_temporaries(strategy)), stage))
    elif not fsdp2_resharding(strategy, profile):
        backward.extend(_layer_backward(strategy, rank, profile, held))
    return backward


def _zero3(strategy: Strategy, profile: str) -> bool:
    """Whether the layers' backward runs on gathered parameters whose gradients are
    reduce-scattered unit by unit (ZeRO-3, FSDP full shard) outside torch's FSDP2 moments: an S*
    axis of size > 1 that shards G, with G not already held unsharded by the step as written."""
    if profile in ("torch", "torch_cpu") or strategy.model.arch is None \
            or unsharded_gradient_axes(strategy):
        return False
    return any(strategy.size(a) > 1 and partitions(strategy, a, State.GRADIENTS)
               for a in gathered_axes(strategy))


def _outside_held(strategy: Strategy, rank: RankMemory, output: bool) -> Fraction:
    """The activations outside the layers still alive in backward: at the output layer's backward
    (``output``) all but the logits (freed when the model's forward returns); at the last
    transformer layer's, the micro-batch in backward has freed its loss copy and the final norm's
    and output layer's inputs too (GPipe keeps the other m − 1 micro-batches'), while the first
    stage's embedding dropout mask waits for the embedding's backward."""
    pipe = strategy.pipeline
    m = strategy.microbatches
    gpipe = pipe is not None and strategy.size(pipe.axis) > 1 and pipe.schedule is Schedule.GPIPE
    left = Fraction(m - 1, m) if gpipe else Fraction(0)
    total = Fraction(0)
    for item in rank.items:
        if item.host or item.category != "outside_layers" or item.label == "logits":
            continue
        keep = output or item.label == "embedding dropout mask"
        total += Fraction(item.bytes) * (1 if keep else left)
    return total


def _layer_backward(strategy: Strategy, rank: RankMemory, profile: str, held: _Held
                    ) -> list[Moment]:
    """The backward of the last transformer layer (every layer's activations, or checkpoints, still
    alive; under recomputation its working set rebuilt) and, under ZeRO-3 / FSDP full shard, of
    the output layer: what ZeRO-3 holds there is the unit in use gathered (in place of the gather
    buffer) and its unsharded gradient before its reduce-scatter, DeepSpeed's
    ``estimate_zero3_model_states_mem_needs`` ``largest_layer_memory = 4 * largest_layer_params``
    (``runtime/zero/stage3.py``, 16-bit parameters and gradients of one layer). The megatron and
    deepspeed profiles prefetch nothing beyond that unit, as the gather buffer assumes (one
    unit); torch's FSDP2 prefetch is its own moment (:mod:`placeverify.cost.torch_moments`)."""
    arch = strategy.model.arch
    zero3 = _zero3(strategy, profile)
    if arch is None or not (zero3 or held.working):
        return []
    kind, stage, states, extras = held.kind, held.stage, held.states, held.extras
    common = (*states, ("G gradients", held.grads_forward), *held.gathered,
              ("A activations in flight", held.activations))
    buffer = sum((Fraction(i.bytes) for i in rank.items if not i.host
                  and i.label == GATHER_BUFFER_LABEL), Fraction(0))
    t = 1
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            t *= strategy.size(p.axis)
    units = [("the last layer", layer_unit(strategy))]
    if rank.kind.last:
        units.append(("the output layer", Fraction(arch.padded_vocab(t) * arch.hidden, t)))
    moments = []
    for name, unit in units if zero3 else units[:1]:
        output = name == "the output layer"
        parts = [*common, ("A outside the layers (held in backward)",
                           _outside_held(strategy, rank, output)),
                 ("buffers", held.buffers - (buffer if zero3 else 0))]
        if zero3:
            if buffer:
                parts.append((f"Θ {name}'s parameters gathered", unit * strategy.precision.gathered))
            parts.append((f"G {name}'s unsharded gradient (before its reduce-scatter)",
                          unit * strategy.precision.grads))
        if not output and held.working:
            parts.append(("recompute working set (one layer)", held.working))
        moments.append(Moment(f"backward of {name}", kind, (*parts, *extras), stage))
    return moments


def rank_moments(strategy: Strategy, rank: RankMemory, profile: str) -> list[Moment]:
    """The three moments of one rank kind under ``profile``."""
    params, optimizer = category_bytes(rank, "params"), category_bytes(rank, "optimizer")
    grads = category_bytes(rank, "gradients")
    activations, outside = category_bytes(rank, "activations"), category_bytes(rank, "outside_layers")
    working = sum((Fraction(i.bytes) for i in rank.items if not i.host
                   and i.label == WORKING_SET_LABEL), Fraction(0))
    buffers = category_bytes(rank, "buffers") - working  # the working set: only in backward
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
    extras = _extras(strategy, rank, profile, grads, params, elements)
    # torch frees the gradients between steps: they exist in forward only while accumulating
    grads_forward = grads if (not torch_like or _backward_before_peak(strategy, rank)) \
        else Fraction(0)
    temporaries, unsized = adam_temporaries(strategy, profile, elements)
    states = (("Θ params", params), ("Ω optimizer", optimizer)) if zero2 is None \
        else tuple(zero2["states"])
    kind = rank.kind.name
    # a kind of several stages gives the figures of its first, the fullest (most in flight)
    stage = rank.kind.stages[0] if len(rank.kind.stages) > 1 and kind != "every" else None
    held = _Held(kind, stage, states, grads, grads_forward, tuple(gathered), activations, outside,
                 buffers, tuple(extras), working)
    loss: list[Moment] = []
    if torch_like and strategy.model.arch is not None and rank.kind.last:
        # the model's forward has returned: its 16-bit logits are gone, the loss's fp32
        # log-probabilities saved ("fp32 logits for the loss") and its backward's gradients made
        logits = sum((Fraction(i.bytes) for i in rank.items if not i.host
                      and i.category == "outside_layers" and i.label == "logits"), Fraction(0))
        loss.append(Moment(LOSS_BACKWARD_MOMENT, kind, (
            *states, ("G gradients", grads_forward), *gathered,
            ("A activations in flight", activations),
            ("A outside the layers (but the model's logits)", outside - logits),
            ("buffers", buffers), *extras, *loss_backward_parts(strategy)), stage))
    return [
        *_backward_moments(strategy, rank, profile, held, zero2),
        *loss,
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
    persistent = sum((category_bytes(fullest, c) for c in ("params", "optimizer", "gradients")),
                     Fraction(0))
    return Peak(profile, persistent, tuple(moments), top)
