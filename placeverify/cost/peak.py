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

from placeverify.cost.memory import RankMemory
from placeverify.ir.placement import Role, State
from placeverify.ir.profiles import DEFAULT_MEMORY_PROFILE
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import partitions


@dataclass(frozen=True, slots=True)
class Moment:
    """What is alive at one moment of the step on one rank kind, part by part (bytes)."""

    name: str  # end of forward | end of backward | optimizer step
    rank: str  # the rank kind (only | first | middle | last | every)
    parts: tuple[tuple[str, Fraction], ...]
    stage: int | None = None  # the stage whose figures these are, when the kind has several

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
    largest = max(arch.hidden * arch.hidden, arch.hidden * ffn,
                  arch.padded_vocab(t) * arch.hidden)
    return Fraction(largest, t)


def rank_moments(strategy: Strategy, rank: RankMemory, profile: str) -> list[Moment]:
    """The three moments of one rank kind under ``profile``."""
    params, optimizer = _category(rank, "params"), _category(rank, "optimizer")
    grads = _category(rank, "gradients")
    activations, outside = _category(rank, "activations"), _category(rank, "outside_layers")
    buffers = _category(rank, "buffers")
    torch_like = profile in ("torch", "torch_cpu")
    elements = _optimizer_elements(strategy, optimizer)  # of the optimizer's partition
    extras: list[tuple[str, Fraction]] = []
    if torch_like and _replicated_gradient_axes(strategy):
        extras.append(("DDP bucket buffers", grads))
    if profile == "deepspeed" and strategy.precision.grads < 4 and _zero_1_or_2(strategy):
        extras.append(("fp32 gradient partition", 4 * elements))
    # torch frees the gradients between steps: they exist in forward only while accumulating
    grads_forward = grads if (not torch_like or strategy.microbatches > 1) else Fraction(0)
    temporaries = Fraction(0)
    if profile == "torch":
        temporaries = 4 * elements  # foreach Adam: an fp32 sqrt of every exp_avg_sq
    elif profile == "torch_cpu" and elements and strategy.model.arch is not None:
        # two temporaries of the largest parameter (a bare parameter count has no tensors: none)
        temporaries = 2 * 4 * _largest_tensor(strategy)
    states = (("Θ params", params), ("Ω optimizer", optimizer))
    kind = rank.kind.name
    # a kind of several stages gives the figures of its first, the fullest (most in flight)
    stage = rank.kind.stages[0] if len(rank.kind.stages) > 1 and kind != "every" else None
    return [
        Moment("end of forward", kind, (*states, ("G gradients", grads_forward),
                                        ("A activations in flight", activations),
                                        ("A outside the layers", outside),
                                        ("buffers", buffers), *extras), stage),
        Moment("end of backward", kind, (*states, ("G gradients", grads), ("buffers", buffers),
                                         *extras), stage),
        Moment("optimizer step", kind, (*states, ("G gradients", grads), *extras,
                                        ("optimizer temporaries", temporaries)), stage),
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
