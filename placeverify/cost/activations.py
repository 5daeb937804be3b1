"""Activation memory: the tensors a transformer layer saves for backward.

The list below reproduces Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (arXiv 2205.05198), §4 and Table 2, tensor by tensor, so that the published
per-layer formulas fall out exactly for a GPT layer with 16-bit activations and dropout:

    no parallelism        sbh(34 + 5as/h)
    tensor parallel       sbh(10 + 24/t + 5as/(ht))
    + sequence parallel   sbh(34/t + 5as/(ht))
    + selective recompute sbh(10 + 24/t)          (and 34sbh/t with sequence parallelism)
    full recompute        2sbh                     (the layer input)

It generalises in the natural way: e bytes per element (masks stay 1 byte), grouped-query
attention (K and V of kv_heads/heads the size of Q), gated MLPs (gate, up, activation and product
of width ffn), no dropout (no masks, no dropout outputs), flash attention (no s^2 scores; the
fp32 log-sum-exp per head and token), mixture of experts (MLP tensors times top_k), and context
parallelism (every tensor divided by cp). Embedding, output-layer and loss activations are not
counted (Korthikanti's Table 2 is per transformer layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placeverify.cost.domain import Domain, Num
from placeverify.ir.model import Transformer
from placeverify.ir.placement import Role, Schedule
from placeverify.ir.strategy import RecomputeKind, Strategy


class Split(StrEnum):
    REPLICATED = "replicated"  # replicated over tp; split by tp under sequence parallelism
    TENSOR = "tensor"  # split by tp (heads or ffn columns)


@dataclass(frozen=True, slots=True)
class Saved:
    """One tensor saved for backward, in bytes per layer per micro-batch without parallelism."""

    name: str
    bytes: Num
    split: Split
    core: bool = False  # part of the attention core that selective recomputation drops


@dataclass(frozen=True, slots=True)
class LayerShape:
    """The symbols of a layer's activation formulas, in one domain."""

    s: Num
    b: Num
    h: Num
    a: Num
    kv: Num
    f: Num
    e: Num
    k: Num  # MoE top-k (1 for a dense MLP)


def layer_shape(d: Domain, arch: Transformer, activation_bytes: Num) -> LayerShape:
    ffn = arch.expert_ffn or arch.ffn
    return LayerShape(
        s=d.sym("s", arch.seq), b=d.sym("b", arch.micro_batch), h=d.sym("h", arch.hidden),
        a=d.sym("a", arch.heads), kv=d.sym("a_kv", arch.kv_heads), f=d.sym("f", ffn),
        e=activation_bytes, k=d.sym("k", arch.top_k) if arch.moe else d.const(1))


def saved_tensors(arch: Transformer, x: LayerShape) -> list[Saved]:
    """Korthikanti et al. §4.1, generalised (see the module docstring)."""
    sbh = x.s * x.b * x.h
    kv_ratio = x.kv / x.a
    rep, tp = Split.REPLICATED, Split.TENSOR
    out = [
        Saved("attention norm input", x.e * sbh, rep),
        Saved("QKV projection input", x.e * sbh, rep),
        Saved("Q", x.e * sbh, tp),
        Saved("K", x.e * sbh * kv_ratio, tp),
        Saved("V", x.e * sbh * kv_ratio, tp),
        Saved("output projection input", x.e * sbh, tp),
        Saved("MLP norm input", x.e * sbh, rep),
        Saved("MLP input", x.e * sbh, rep),
    ]
    scores = x.a * x.s * x.s * x.b
    if arch.attention == "flash":
        out.append(Saved("softmax log-sum-exp (fp32)", 4 * x.a * x.s * x.b, tp))
    else:
        out.append(Saved("softmax output", x.e * scores, tp, core=True))
        if arch.dropout:
            out.append(Saved("attention dropout mask", scores, tp, core=True))
            out.append(Saved("attention dropout output", x.e * scores, tp, core=True))
    sbf = x.s * x.b * x.f * x.k
    if arch.gated:
        out.extend([Saved("MLP gate output", x.e * sbf, tp), Saved("MLP up output", x.e * sbf, tp),
                    Saved("MLP activation output", x.e * sbf, tp),
                    Saved("MLP down-projection input", x.e * sbf, tp)])
    else:
        out.extend([Saved("MLP activation input", x.e * sbf, tp),
                    Saved("MLP second linear input", x.e * sbf, tp)])
    if arch.dropout:
        out.append(Saved("attention output dropout mask", sbh, rep))
        out.append(Saved("MLP output dropout mask", sbh, rep))
    return out


@dataclass(frozen=True, slots=True)
class ActivationCost:
    per_layer: Num  # bytes per layer per micro-batch, kept for backward
    layers: Num  # layers on the device
    in_flight: Num  # micro-batches whose activations are alive at once
    kept: Num  # per_layer * layers * in_flight
    working_set: Num  # transient: one layer of one micro-batch rebuilt by full recompute
    in_flight_rule: str


def parallel_sizes(d: Domain, strategy: Strategy) -> tuple[Num, bool, Num]:
    """(tensor-parallel size t, sequence parallel?, context-parallel size c)."""
    t = d.const(1)
    sp = False
    c = d.const(1)
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            t = t * d.sym(p.axis, strategy.size(p.axis))
            sp = sp or p.sequence_parallel
        elif p.role is Role.CONTEXT:
            c = c * d.sym(p.axis, strategy.size(p.axis))
    return t, sp, c


def per_layer_bytes(saved: list[Saved], t: Num, sp: bool, c: Num, drop_core: bool) -> Num:
    total: Num = 0
    for item in saved:
        if drop_core and item.core:
            continue
        divisor = t if (item.split is Split.TENSOR or sp) else 1
        total = total + item.bytes / divisor
    return total / c


def activation_cost(d: Domain, strategy: Strategy, activation_bytes: Num) -> ActivationCost | None:
    arch = strategy.model.arch
    if arch is None:
        return None
    x = layer_shape(d, arch, activation_bytes)
    saved = saved_tensors(arch, x)
    t, sp, c = parallel_sizes(d, strategy)
    recompute = strategy.recompute.kind
    full_layer = per_layer_bytes(saved, t, sp, c, drop_core=False)
    if recompute is RecomputeKind.FULL:
        per_layer = x.e * x.s * x.b * x.h / ((t if sp else 1) * c)
        working_set = full_layer
    else:
        per_layer = per_layer_bytes(saved, t, sp, c, drop_core=recompute is RecomputeKind.SELECTIVE)
        working_set = d.const(0)
    layers, in_flight, rule = _pipeline_factors(d, strategy, arch)
    return ActivationCost(per_layer, layers, in_flight, per_layer * layers * in_flight, working_set,
                          rule)


def _pipeline_factors(d: Domain, strategy: Strategy, arch: Transformer) -> tuple[Num, Num, str]:
    """Layers held and micro-batches in flight on the first pipeline stage (the fullest)."""
    L = d.sym("L", arch.layers)
    pipeline = strategy.pipeline
    if pipeline is None or strategy.size(pipeline.axis) == 1:
        return L, d.const(1), "one micro-batch at a time"
    p_value = strategy.size(pipeline.axis)
    p = d.sym(pipeline.axis, p_value)
    m_value = strategy.microbatches
    m = d.sym("m", m_value)
    if pipeline.schedule is Schedule.GPIPE:
        return L / p, m, "GPipe: all m micro-batches in flight"
    if pipeline.schedule is Schedule.INTERLEAVED:
        v = d.sym("v", pipeline.chunks)
        return L / p, p * (1 + (p - 1) / (p * v)), "interleaved 1F1B: p(1 + (p-1)/(pv)) in flight"
    if m_value < p_value:
        return L / p, m, "1F1B with m < p: m micro-batches in flight"
    return L / p, p, "1F1B: p micro-batches in flight on the first stage"
