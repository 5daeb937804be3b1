"""The layouts ``search`` enumerates, and the legality rules that prune them.

A :class:`Layout` fixes every choice a launch makes: the degrees of tensor (t), context (cp),
pipeline (p, with v model chunks per stage), expert (ep) and data (d) parallelism, whose product
is the number of devices; how the data axis shards the model states (DDP, ZeRO-1/2, ZeRO-3/FSDP,
HSDP with a shard group of some size); sequence parallelism; recomputation; optimizer offload;
the micro-batch size b and the micro-batch count m, with b · m · d · ep the global batch in
sequences.

Legality (the rules the frameworks enforce at start-up, cited where they are checked):

- t divides the attention heads, the KV heads and the MLP width (Megatron-LM
  ``megatron/training/arguments.py``: ``num_attention_heads % tensor_model_parallel_size``,
  ``num_query_groups % tensor_model_parallel_size``), and stays inside a node
  (``t <= gpus_per_node``: tensor-parallel collectives run on every layer);
- cp divides the sequence in 2 · cp chunks (Megatron-core's load-balanced causal context
  parallelism splits the sequence into 2 · cp pieces);
- ep divides the experts (MoE models only);
- p divides the layers into p · v equal chunks; otherwise, with ``uneven`` stages allowed, the
  first and last (virtual) stages take the remainder (as Llama 3 405B's 126 layers on 16
  interleaved stages);
  interleaving (v > 1) needs p > 2 and m a multiple of p (``arguments.py``:
  "number of microbatches must be divisible by pipeline-model-parallel size when using
  interleaved schedule");
- the global batch is a whole number of micro-batches per data-parallel replica.

GPipe is not enumerated: 1F1B runs the same work in the same time with fewer activations in
flight, so it is never on the frontier.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from placeverify.ir.model import Transformer
from placeverify.ir.placement import TensorOverlap


class Sharding(StrEnum):
    """How the data axis places the model states (the presets of ``place ... over dp``)."""

    NONE = "none"  # no data parallelism (d = 1)
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"  # FSDP FULL_SHARD
    HSDP = "hsdp"  # shard within groups of ``shard`` ranks, replicate across them


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Layout:
    tp: int
    cp: int
    pp: int
    v: int  # model chunks per pipeline stage (1: plain 1F1B)
    ep: int
    dp: int  # data-parallel ranks (the replica x shard product under HSDP)
    sharding: Sharding
    shard: int  # HSDP shard-group size (dp otherwise)
    sp: bool  # Megatron sequence parallelism on the tensor axis
    recompute: Recompute
    offload: bool  # optimizer states and gradients offloaded to the host (ZeRO-Offload)
    b: int  # micro-batch size (sequences)
    m: int  # micro-batches per step
    # layers per virtual pipeline stage (p · v of them, chunk-major as ``layers = [...]`` writes
    # them) when uneven, else None
    stages: tuple[int, ...] | None = None
    # sharded gradients reduced once a step, per model chunk (``reduce = step``), not every
    # micro-batch: ZeRO-2/3 and HSDP in a pipeline
    reduce_step: bool = False
    # which tensor-parallel collectives run beside the GEMMs (``megatron(overlap = backward)``,
    # ``megatron(sequence_parallel, overlap = true)``): a property of the framework
    # (Space.tp_overlap); ``all`` with sequence parallelism only
    tp_overlap: TensorOverlap = TensorOverlap.NONE
    # data-parallel collectives waited for (``overlap = none`` on the data axes): a property of
    # the framework (Space.data_overlap off), e.g. Megatron-LM without --overlap-grad-reduce
    dp_wait: bool = False

    @property
    def chunk_ordered(self) -> bool:
        """The backward runs chunk by chunk (interleaved, m ≤ p: one group of micro-batches,
        :func:`placeverify.roles.pipeline.chunk_ordered`)."""
        return self.pp > 1 and self.v > 1 and self.m <= self.pp

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.pp * self.ep * self.dp

    def physical_stages(self) -> tuple[int, ...] | None:
        """Layers per physical stage when uneven: stage i runs virtual stages i, i + p, ...,
        i + (v - 1) p."""
        return None if self.stages is None else _physical(self.stages, self.pp, self.v)

    def label(self) -> str:
        """A short name: ``t8 cp1 p16v4 d128 zero1 sp none b1 m16``."""
        parts = [f"t{self.tp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.pp > 1:
            parts.append(f"p{self.pp}" + (f"v{self.v}" if self.v > 1 else ""))
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        parts.append(f"d{self.dp}")
        if self.sharding is Sharding.HSDP:
            parts.append(f"hsdp{self.shard}")
        elif self.sharding is not Sharding.NONE:
            parts.append(self.sharding.value)
        if self.reduce_step:
            parts[-1] += "/step"
        if self.dp_wait:
            parts[-1] += "/no-overlap"
        if self.sp:
            parts.append("sp+overlap" if self.tp_overlap is TensorOverlap.ALL else "sp")
        parts.append(f"rc-{self.recompute.value}")
        if self.offload:
            parts.append("offload")
        parts.append(f"b{self.b}")
        parts.append(f"m{self.m}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Space:
    """What ``search`` may choose; the defaults are every option the language has."""

    max_tp: int | None = None  # default: the device's GPUs per node
    max_cp: int = 32
    max_pp: int = 128
    max_v: int = 8
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)  # micro-batch sizes tried
    shardings: tuple[Sharding, ...] = (Sharding.DDP, Sharding.ZERO1, Sharding.ZERO2,
                                       Sharding.ZERO3, Sharding.HSDP)
    recomputes: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    offload: bool = True  # also try ZeRO-Offload of the optimizer
    sequence_parallel: tuple[bool, ...] = (True, False)
    uneven: bool = True  # allow first/last stages with fewer layers
    # sharded gradients in a pipeline reduced once a step ('reduce = step', what the pipeline
    # runtimes do); off: every micro-batch
    reduce_once: bool = True
    # which tensor-parallel collectives the framework runs beside the GEMMs: ``backward``
    # (Megatron-LM's and Transformer Engine's column-parallel layers, by default) in every
    # layout with tensor parallelism; ``all`` (Megatron-LM --tp-comm-overlap, torchtitan's async
    # TP) in every sequence-parallel layout, ``backward`` in the others (Megatron-LM runs
    # --tp-comm-overlap with sequence parallelism only)
    tp_overlap: TensorOverlap = TensorOverlap.NONE
    # the framework overlaps data-parallel collectives with compute (off: every layout is written
    # 'overlap = none', Megatron-LM without --overlap-grad-reduce)
    data_overlap: bool = True


def powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


@lru_cache(maxsize=1024)
def _physical(stages: tuple[int, ...], pp: int, v: int) -> tuple[int, ...]:
    return tuple(sum(stages[c * pp + i] for c in range(v)) for i in range(pp))


def divisors(n: int) -> list[int]:
    small = [k for k in range(1, int(n ** 0.5) + 1) if n % k == 0]
    return sorted({*small, *(n // k for k in small)})


def stage_layers(layers: int, pp: int, v: int, uneven: bool) -> tuple[int, ...] | bool | None:
    """Layers per virtual stage (p · v of them; p for plain 1F1B): None when they split evenly,
    the list when the first and last take the remainder, False when neither works.

    Uneven stages follow Llama 3 405B (arXiv 2407.21783 §3.3.2: an interleaved pipeline with one
    layer fewer on the first and the last stage, so that "the first model chunk on the first
    stage has only the embedding, and the last model chunk on the last stage has only output
    projection and loss calculation"; 126 layers): every middle virtual stage holds
    ceil(L / (p v)) layers and the two end ones share what is left, as evenly as possible, down
    to none (Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and ``...-loss-...``
    build such a stage: ``get_num_layers_to_build`` asserts only ``>= 0``) — 7, 8 × 14, 7 on 16
    plain stages, 1, 2 × 62, 1 on 16 stages of 4 chunks, 0, 1 × 126, 0 on 16 stages of 8."""
    n = pp * v
    if layers % n == 0:
        return None
    if not uneven or n < 3:
        return False
    middle = -(-layers // n)
    rest = layers - middle * (n - 2)
    if rest < 0 or rest > 2 * middle:
        return False
    first = rest // 2
    return (first, *([middle] * (n - 2)), rest - first)


def layouts(arch: Transformer, devices: int, global_batch: int, gpus_per_node: int,
            space: Space) -> Iterator[Layout]:
    """Every legal layout of ``devices`` devices for a global batch of ``global_batch``
    sequences of ``arch.seq`` tokens (module docstring: the rules)."""
    tps = _tensor_degrees(arch, devices, gpus_per_node, space)
    cps = _context_degrees(arch, space)
    eps = _expert_degrees(arch)
    for t in tps:
        for c in cps:
            if devices % (t * c):
                continue
            for p in divisors(devices // (t * c)):
                if p > min(space.max_pp, arch.layers):
                    continue
                for e in eps:
                    rest = devices // (t * c)
                    if rest % (p * e):
                        continue
                    d = rest // (p * e)
                    yield from _with_data(arch, t, c, p, e, d, global_batch, space)


def _top_tp(gpus_per_node: int, space: Space) -> int:
    return min(space.max_tp or gpus_per_node, gpus_per_node)


def _tensor_degrees(arch: Transformer, devices: int, gpus_per_node: int, space: Space) -> list[int]:
    """The powers of two up to :func:`_top_tp` that divide the heads, the KV heads, the MLP
    width and the devices."""
    ffn = arch.expert_ffn or arch.ffn
    return [t for t in powers_of_two(_top_tp(gpus_per_node, space))
            if arch.heads % t == 0 and arch.kv_heads % t == 0 and ffn % t == 0
            and devices % t == 0]


def _context_degrees(arch: Transformer, space: Space) -> list[int]:
    """The powers of two up to ``max_cp`` for which 2 · cp divides the sequence."""
    return [c for c in powers_of_two(space.max_cp) if c == 1 or arch.seq % (2 * c) == 0]


def _expert_degrees(arch: Transformer) -> list[int]:
    return divisors(arch.experts) if arch.moe else [1]


def _with_data(arch: Transformer, t: int, c: int, p: int, e: int, d: int, global_batch: int,
               space: Space) -> Iterator[Layout]:
    replicas = d * e
    for b in space.micro_batches:
        if global_batch % (b * replicas):
            continue
        m = global_batch // (b * replicas)
        chunks = [1] + ([v for v in range(2, space.max_v + 1)
                         if p > 2 and m % p == 0 and (space.uneven or arch.layers % (p * v) == 0)]
                        if p > 1 else [])
        for v in chunks:
            stages = stage_layers(arch.layers, p, v, space.uneven) if p > 1 else None
            if stages is False:
                continue
            for sharding, shard in _shardings(d, space):
                for sp in (space.sequence_parallel if t > 1 else (False,)):
                    for rc in space.recomputes:
                        for off in (((True,) if d == 1 else (False, True))
                                    if space.offload and sharding in (
                                        Sharding.ZERO2, Sharding.ZERO3) else (False,)):
                            for once in _reductions(sharding, p, m, off, space):
                                yield Layout(t, c, p, v, e, d, sharding, shard, sp, rc, off, b,
                                             m, stages if isinstance(stages, tuple) else None,
                                             once, _tensor_overlap(space, t, sp),
                                             not space.data_overlap)


def _tensor_overlap(space: Space, t: int, sp: bool) -> TensorOverlap:
    """The tensor overlap of one layout under the framework's (``Space.tp_overlap``): none
    without tensor parallelism."""
    if t == 1:
        return TensorOverlap.NONE
    if space.tp_overlap is TensorOverlap.ALL and not sp:
        return TensorOverlap.BACKWARD
    return space.tp_overlap


def _reductions(sharding: Sharding, p: int, m: int, offload: bool,
                space: Space) -> tuple[bool, ...]:
    """Whether sharded gradients are reduced once a step, per model chunk (True, ``reduce =
    step``), or every micro-batch (False). In a pipeline of several micro-batches ZeRO-2/3 and
    HSDP reduce once a step, as the pipeline runtimes run them: ``torch.distributed.pipelining``
    defers an FSDP stage's reduce-scatter to its last backward (``backward_maybe_with_nosync``,
    then ``perform_reduce_grad``), DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3, and
    Megatron-LM's pipelines shard with its distributed optimizer (ZeRO-1); offloaded gradients
    are not modelled with it, so those are not tried. Elsewhere every micro-batch (once a step
    would hold the whole unsharded gradient: ZeRO-1's memory and traffic, and ZeRO-1 is
    searched). ``Space.reduce_once`` off: every micro-batch everywhere."""
    if (space.reduce_once and p > 1 and m > 1
            and sharding in (Sharding.ZERO2, Sharding.ZERO3, Sharding.HSDP)):
        return () if offload else (True,)
    return (False,)


def _shardings(d: int, space: Space) -> Iterator[tuple[Sharding, int]]:
    """The data axis's placements of ``d`` ranks. One rank: none, and ZeRO-2 over an axis of one
    for its optimizer offload (ZeRO-Offload on a single device, Ren et al. 2021; _with_data
    tries it offloaded only)."""
    if d == 1:
        yield Sharding.NONE, 1
        if space.offload and Sharding.ZERO2 in space.shardings:
            yield Sharding.ZERO2, 1
        return
    for sharding in space.shardings:
        if sharding is Sharding.HSDP:
            for shard in powers_of_two(d // 2):
                if shard > 1 and d % shard == 0:
                    yield sharding, shard
        else:
            yield sharding, d


def why_no_layout(arch: Transformer, devices: int, global_batch: int, gpus_per_node: int,
                  space: Space) -> list[str]:
    """Why :func:`layouts` has no layout for this problem, rule by rule with the degrees each
    leaves (the module docstring's rules); empty when some layout is legal."""
    if next(layouts(arch, devices, global_batch, gpus_per_node, space), None) is not None:
        return []
    tps = _tensor_degrees(arch, devices, gpus_per_node, space)
    cps = _context_degrees(arch, space)
    eps = _expert_degrees(arch)
    reasons = [f"tensor parallelism t in {_listed(tps)}: the powers of two up to "
               f"{_top_tp(gpus_per_node, space)} that divide the {arch.heads} heads, the "
               f"{arch.kv_heads} KV heads, the MLP width {arch.expert_ffn or arch.ffn:,} and the "
               f"{devices:,} devices",
               f"context parallelism cp in {_listed(cps)}: 2 · cp divides the sequence of "
               f"{arch.seq:,} tokens"]
    splits: set[tuple[int, int]] = set()  # (pipeline stages, data-parallel replicas d · ep)
    for t in tps:
        for c in cps:
            if devices % (t * c) == 0:
                rest = devices // (t * c)
                splits |= {(p, rest // p) for p in divisors(rest)
                           if p <= min(space.max_pp, arch.layers)
                           and any((rest // p) % e == 0 for e in eps)}
    shown = 6
    for p, r in sorted(splits)[:shown]:
        sizes = [b for b in space.micro_batches if global_batch % (b * r) == 0]
        if not sizes:
            reasons.append(f"pp {p}: d · ep = {r:,} data-parallel replicas, and b · {r:,} divides "
                           f"the global batch of {global_batch:,} sequences for no micro-batch "
                           f"size b in {_listed(list(space.micro_batches))}")
        else:
            reasons.append(f"pp {p} (d · ep = {r:,}): the {arch.layers} layers do not split into "
                           "pp · v chunks, evenly or with the first and last taking the remainder"
                           + ("" if space.uneven else " (uneven stages not allowed)"))
    if len(splits) > shown:
        reasons.append(f"and {len(splits) - shown} more pipeline degrees, each failing one of these")
    reasons.append("give a global batch or a number of devices that these rules allow")
    return reasons


def _listed(values: list[int]) -> str:
    return "{" + ", ".join(f"{v:,}" for v in values) + "}" if values else "{} (none)"
