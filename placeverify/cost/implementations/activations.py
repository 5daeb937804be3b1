"""Activation bytes the torch implementations save for backward, per micro-batch and rank.

Per transformer layer: :func:`placeverify.cost.activations.saved_tensors` (Korthikanti et al.,
arXiv 2205.05198, Table 2, generalised) plus what torch saves beyond that list: a LayerNorm's mean
and reciprocal standard deviation, RMSNorm's normalised input (torch composes it from primitives
on CPU), the rotary tables, K and V repeated to every head by written-out grouped-query
attention, and dropout masks of the activation dtype (CPU dropout multiplies by a float mask;
Korthikanti count 1 byte). The tensors saved outside the layers (position indices, the final
norm, the output layer's input, the log-probabilities) are enumerated from the autograd formulas
of the ops involved.
"""

from __future__ import annotations

from fractions import Fraction

from placeverify.cost.activations import per_layer_bytes, saved_tensors
from placeverify.cost.domain import Exact
from placeverify.cost.implementations.common import ELEMENT_BYTES, INDEX_BYTES, chunk
from placeverify.cost.implementations.pipeline import stage_layers
from placeverify.cost.implementations.spec import Implementation, Mlp, RunSpec
from placeverify.cost.saved import layer_shape
from placeverify.ir.model import Transformer
from placeverify.ir.placement import Schedule
from placeverify.ir.profiles import GENERALISED


def korthikanti_layer_bytes(arch: Transformer, tp: int = 1) -> int:
    """Bytes one transformer layer saves for backward per micro-batch in fp32, by
    :mod:`placeverify.cost.activations` (Korthikanti et al., Table 2, generalised)."""
    d = Exact()
    saved = saved_tensors(arch, layer_shape(d, arch, d.const(ELEMENT_BYTES)), GENERALISED)
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
    """Per layer, what torch saves beyond Korthikanti's list: the norms' extras (the two layer
    norms', four with ``sandwich_norm``, and with ``qk_norm`` Q's and K's over their heads' rows); with
    grouped-query attention written out (``attention = standard``) K and V repeated to every
    head (Korthikanti's generalisation counts them at kv_heads / heads); and dropout masks of
    the activation dtype where Korthikanti counts 1 byte (CPU dropout is ``input * mask``)."""
    b, s, h = arch.micro_batch, arch.seq, arch.hidden
    extra = (4 if arch.sandwich_norm else 2) * norm_extra_bytes(arch)
    if arch.qk_norm:  # Q's and K's per-head norms, heads split over tp: the same extras per row
        for heads in (arch.heads, arch.kv_heads):
            rows = b * s * heads // tp
            extra += (2 * rows * ELEMENT_BYTES if arch.norm == "layernorm" else
                      rows * ELEMENT_BYTES + rows * arch.head_dim * ELEMENT_BYTES)
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
