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
attention (K and V of kv_heads/heads the size of Q under flash attention; unfused attention saves
the copies repeated over each group's heads, the size of Q), gated MLPs as the memory profile's
implementation saves them (:data:`placeverify.ir.profiles.LAYER_KERNELS`: Megatron-core's fused
SwiGLU, the default, keeps the fc1 output, gate and up, and the down projection's input, 3
tensors of width ffn; eager torch the gate, up, activation and product outputs, 4), eager
RMSNorms' fp32 copies (the eager profiles), no dropout (no masks, no dropout outputs), flash
attention (no s^2 scores; the fp32 log-sum-exp per head and token), mixture of experts (MLP
tensors times top_k, and the shared experts' widths), multi-head latent attention
(:func:`placeverify.cost.saved.latent_saved`), dense and MoE layers summed kind by kind (the
mean layer, :func:`placeverify.cost.saved.layer_shape`), and context parallelism (every tensor
divided by cp).

Activations outside the layers (Korthikanti et al. §4.3, "input embeddings" and "output layer and
cross entropy", and Megatron-core's vocab-parallel output layer and loss) are a separate list,
:func:`outside_layers`, held by the stages that run them.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.cost.domain import Domain, Exact, Num
from placeverify.cost.saved import (
    LayerShape as LayerShape,  # re-exported for search/screen.py
)
from placeverify.cost.saved import (
    Saved,
    Split,
    latent_saved,
    layer_shape,
    norm_saved,
)
from placeverify.ir.model import Transformer
from placeverify.ir.placement import Role, Schedule
from placeverify.ir.profiles import LayerKernels, layer_kernels
from placeverify.ir.strategy import RecomputeKind, Strategy
from placeverify.roles.pipeline import stage_layers


def _qk_norms(arch: Transformer, x: LayerShape, kernels: LayerKernels) -> list[Saved]:
    """Q's and K's per-head norms (``qk_norm``): each saves what a norm saves, over the heads'
    rows, split over tp with the heads. The normalised Q and K that attention then saves are the
    "Q" and "K" above."""
    sb = x.s * x.b
    if x.head is None:
        q, k = sb * x.h, sb * x.h * (x.kv / x.a)
    else:
        q, k = sb * x.a * x.head, sb * x.kv * x.head
    return [*norm_saved(arch, x, "Q", kernels, q, sb * x.a, Split.TENSOR),
            *norm_saved(arch, x, "K", kernels, k, sb * x.kv, Split.TENSOR)]


def saved_tensors(arch: Transformer, x: LayerShape, kernels: LayerKernels) -> list[Saved]:
    """Korthikanti et al. §4.1, generalised (see the module docstring), with the gated MLP and
    the norms as ``kernels`` (the memory profile's, :func:`placeverify.ir.profiles.layer_kernels`)
    save them."""
    sbh = x.s * x.b * x.h
    if x.head is None:  # Q and the attention output hidden wide, K and V kv / heads of that
        q, kv = x.e * sbh, x.e * sbh * (x.kv / x.a)
    else:
        q, kv = x.e * x.s * x.b * x.a * x.head, x.e * x.s * x.b * x.kv * x.head
    if arch.attention == "standard":
        # unfused attention repeats each group's K and V over its heads before the matmuls,
        # which save the copies (Megatron-core ``DotProductAttention``: ``key.repeat_interleave``
        # when heads per partition exceed query groups; transformers' ``repeat_kv``; the measure
        # model's ``repeat_interleave``); the un-repeated K and V are saved by nothing
        kv = q
    rep, tp = Split.REPLICATED, Split.TENSOR
    mask = x.e if kernels.float_masks else 1  # bytes per element of a dropout mask
    attention = latent_saved(arch, x, kernels) if arch.latent is not None else [
        Saved("QKV projection input", x.e * sbh, rep),
        Saved("Q", q, tp),
        Saved("K", kv, tp),
        Saved("V", kv, tp),
        Saved("output projection input", q, tp)]
    out = [
        *norm_saved(arch, x, "attention", kernels),
        *attention,
        *(_qk_norms(arch, x, kernels) if arch.qk_norm else []),
        *(norm_saved(arch, x, "post-attention", kernels) if arch.sandwich_norm else []),
        *norm_saved(arch, x, "MLP", kernels),
        Saved("MLP input", x.e * sbh, rep),
        *(norm_saved(arch, x, "post-MLP", kernels) if arch.sandwich_norm else []),
    ]
    scores = x.a * x.s * x.s * x.b
    if arch.attention == "flash":
        # what selective recomputation does not keep: the checkpointed core saves its inputs
        # (Q, K, V, kept anyway), its output is the output projection's input
        out.append(Saved("softmax log-sum-exp (fp32)", 4 * x.a * x.s * x.b, tp, core=True))
    else:
        out.append(Saved("softmax output", x.e * scores, tp, core=True))
        if arch.dropout:
            out.append(Saved("attention dropout mask", mask * scores, tp, core=True))
            out.append(Saved("attention dropout output", x.e * scores, tp, core=True))
    sbf = x.s * x.b * x.f * x.k
    if arch.gated and kernels.fused_swiglu:
        out.extend([Saved("MLP fc1 output (gate and up, the fused SwiGLU's input)", 2 * x.e * sbf,
                          tp),
                    Saved("MLP down-projection input", x.e * sbf, tp)])
    elif arch.gated:
        out.extend([Saved("MLP gate output", x.e * sbf, tp), Saved("MLP up output", x.e * sbf, tp),
                    Saved("MLP activation output", x.e * sbf, tp),
                    Saved("MLP down-projection input", x.e * sbf, tp)])
    else:
        out.extend([Saved("MLP activation input", x.e * sbf, tp),
                    Saved("MLP second linear input", x.e * sbf, tp)])
        if arch.activation == "gelu_new":
            # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) as eager operations (transformers'
            # NewGELUActivation): tanh saves its output, the last product both its operands,
            # 0.5·x and 1 + tanh(…); pow's input is the activation input above
            out.extend([Saved("MLP activation: tanh output", x.e * sbf, tp),
                        Saved("MLP activation: 0.5·x", x.e * sbf, tp),
                        Saved("MLP activation: 1 + tanh", x.e * sbf, tp)])
    if arch.dropout:
        out.append(Saved("attention output dropout mask", mask * sbh, rep))
        out.append(Saved("MLP output dropout mask", mask * sbh, rep))
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
        divisor = 1 if item.split is Split.WHOLE else t if (item.split is Split.TENSOR or sp) else 1
        total = total + item.bytes / divisor
    return total / c


def activation_cost(d: Domain, strategy: Strategy, activation_bytes: Num) -> ActivationCost | None:
    arch = strategy.model.arch
    if arch is None:
        return None
    x = layer_shape(d, arch, activation_bytes)
    kernels = layer_kernels(strategy.mesh.memory_profile)
    saved = saved_tensors(arch, x, kernels)
    t, sp, c = parallel_sizes(d, strategy)
    recompute = strategy.recompute.kind
    full_layer = per_layer_bytes(saved, t, sp, c, drop_core=False)
    if recompute is RecomputeKind.FULL:
        per_layer = x.e * x.s * x.b * x.h / ((t if sp else 1) * c)
        # one layer rebuilt at a time: the larger kind where dense and MoE layers differ
        working_set = full_layer if not arch.mixed_layers else d.max(*(
            per_layer_bytes(saved_tensors(arch, layer_shape(d, arch, activation_bytes, kind),
                                          kernels), t, sp, c, drop_core=False)
            for kind in (True, False)))
        kept, held = recomputed_layers(strategy)
        if kept < held:  # every n-th layer recomputed, the others keep everything
            per_layer = (per_layer * kept + full_layer * (held - kept)) / held
    elif recompute is RecomputeKind.SELECTIVE_OP:
        per_layer = per_layer_bytes(op_policy_tensors(arch, x, sp), t, sp, c, drop_core=False)
        working_set = full_layer
    else:
        per_layer = per_layer_bytes(saved, t, sp, c, drop_core=recompute is RecomputeKind.SELECTIVE)
        working_set = d.const(0)
    layers, in_flight, rule = _pipeline_factors(d, strategy, arch)
    return ActivationCost(per_layer, layers, in_flight, per_layer * layers * in_flight, working_set,
                          rule)


def recomputed_layers(strategy: Strategy) -> tuple[int, int]:
    """(layers recomputed, layers held) on a pipeline stage under ``recompute full``.

    ``every = n`` recomputes every n-th layer, as torchtitan's selective layer checkpointing
    (``selective_ac_option = "n"``: the n-th, 2n-th, ... transformer block is wrapped), so
    ⌊layers / n⌋ of a stage's layers; ``every = 1`` all of them. The stage is the fullest: L / p
    layers, or the most a listed stage holds."""
    arch = strategy.model.arch
    assert arch is not None
    pipeline = strategy.pipeline
    p = strategy.size(pipeline.axis) if pipeline else 1
    listed = stage_layers(strategy)
    held = max(1, max(listed) if listed is not None else arch.layers // p)
    return held // max(1, strategy.recompute.every), held


def op_policy_tensors(arch: Transformer, x: LayerShape, sp: bool) -> list[Saved]:
    """What ``recompute selective_op`` keeps per layer: torchtitan's op-level policy
    (``torchtitan/parallelisms/parallelize_llama.py``, ``checkpoint_wrapper``, commit 0413364 of
    April 2024) saves the outputs of ``aten.mm`` except every second one counted through the
    layer, of the fused attention kernels and of reduce-scatters; everything else is recomputed
    from the layer's input. In the block's order the matmuls are Q, K, V, the output
    projection, then gate, up, down (gated) or the two MLP matmuls (plain): Q, V and the gate /
    first MLP matmul are kept, and the down projection's (the 7th) in a gated MLP. A row-parallel
    matmul's output is a partial sum of the whole hidden state on every tensor-parallel rank; under
    sequence parallelism its reduce-scatter's output (1/t of it) is kept too."""
    sbh = x.s * x.b * x.h
    rep, tp = Split.REPLICATED, Split.TENSOR
    out = [
        Saved("layer input", x.e * sbh, rep),
        Saved("Q", x.e * sbh, tp),
        Saved("V", x.e * sbh * x.kv / x.a, tp),
    ]
    if arch.attention == "flash":
        out.append(Saved("attention output", x.e * sbh, tp))
        out.append(Saved("softmax log-sum-exp (fp32)", 4 * x.a * x.s * x.b, tp))
    sbf = x.s * x.b * x.f * x.k
    out.append(Saved("MLP gate output" if arch.gated else "MLP first matmul output", x.e * sbf, tp))
    if arch.gated:
        out.append(Saved("MLP down-projection output (partial sum)", x.e * sbh, Split.WHOLE))
    if sp:
        out.append(Saved("reduce-scatter outputs (output projection, MLP)", 2 * x.e * sbh, rep))
    return out


def tensor_size(strategy: Strategy) -> int:
    """The product of the tensor axes' sizes (the t that pads and splits the vocabulary)."""
    size = 1
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            size *= strategy.size(p.axis)
    return size


def outside_layers(d: Domain, strategy: Strategy, activation_bytes: Num, first: bool,
                   last: bool) -> list[tuple[str, Num]]:
    """Bytes a stage keeps for the work outside the transformer layers, part by part.

    As Megatron-core runs it (Korthikanti et al. §4.3 count the same tensors, 4sbh/t(1 + v/h) on
    the last stage under sequence parallelism):

    - first stage: the embedding's dropout mask (1 byte per element, ÷ t under sequence
      parallelism) for every micro-batch in flight there. The embedding output itself is the
      first layer's saved input, counted with the layer; the vocab-parallel embedding's backward
      needs only the token ids.
    - last stage: the final norm's input and the output layer's input (``layers.py``
      ``LinearWithGradAccumulationAndAsyncCommunication.forward``, ``ctx.save_for_backward(input,
      weight)``: the sequence shard under sequence parallelism, the whole replicated input
      without), e bytes; the logits b·s·V/t in the activation dtype (the vocab-parallel output
      layer, ``gather_output = False``), alive until the model's forward returns; and the loss's
      fp32 copy of them (``cross_entropy.py``, ``calculate_logits_max``:
      ``vocab_parallel_logits.float()``, turned into the softmax in place and kept by
      ``ctx.save_for_backward(exp_logits, ...)`` until that micro-batch's backward), 4·b·s·V/t.
      With fp32 activations ``.float()`` is the logits themselves: one tensor, counted once.
      The logits exist for one micro-batch at a time; the fp32 copy, the norm and output-layer
      inputs for every micro-batch whose backward has not run on the last stage: one under no
      pipeline, 1F1B and interleaved 1F1B (the last stage runs each micro-batch's backward right
      after its forward), m under GPipe.

    V is the vocabulary padded as the memory model pads it; every part is ÷ cp (each context
    rank holds its share of the tokens).
    """
    arch = strategy.model.arch
    if arch is None or not (first or last):
        return []
    t, sp, c = parallel_sizes(d, strategy)
    s, b, h = d.sym("s", arch.seq), d.sym("b", arch.micro_batch), d.sym("h", arch.hidden)
    tokens = s * b / c
    shard = t if sp else 1  # sequence parallelism splits the hidden states over tp
    parts: list[tuple[str, Num]] = []
    if first and arch.dropout:
        in_flight, _ = stage_in_flight(d, strategy, 0)
        mask = activation_bytes if layer_kernels(strategy.mesh.memory_profile).float_masks else 1
        parts.append(("embedding dropout mask", mask * tokens * h / shard * in_flight))
    if last:
        padded = arch.padded_vocab(tensor_size(strategy))
        v = d.sym("V" if padded == arch.vocab else "V_padded", padded)
        pipeline = strategy.pipeline
        gpipe = pipeline is not None and strategy.size(pipeline.axis) > 1 \
            and pipeline.schedule is Schedule.GPIPE
        pending = d.sym("m", strategy.microbatches) if gpipe else d.const(1)
        e = activation_bytes
        parts.append(("final norm input", e * tokens * h / shard * pending))
        parts.append(("output layer input", e * tokens * h / shard * pending))
        if e != 4:
            parts.append(("logits", e * tokens * v / t))
        parts.append(("fp32 logits for the loss", 4 * tokens * v / t * pending))
    return parts


def stage_layer_count(d: Domain, strategy: Strategy, layers: int) -> Num:
    """The symbol of a listed stage layer count: ``L_s<i>``, after the first stage i that holds
    that many layers."""
    listed = stage_layers(strategy)
    assert listed is not None
    return d.sym(f"L_s{listed.index(layers)}", layers)


def stage_share(d: Domain, strategy: Strategy, arch: Transformer) -> Num:
    """Layers of the pipeline stage holding the most: L / p, or the largest listed count."""
    pipeline = strategy.pipeline
    listed = stage_layers(strategy)
    if listed is not None:
        return stage_layer_count(d, strategy, max(listed))
    L = d.sym("L", arch.layers)
    if pipeline is None or strategy.size(pipeline.axis) == 1:
        return L
    return L / d.sym(pipeline.axis, strategy.size(pipeline.axis))


def stage_in_flight(d: Domain, strategy: Strategy, stage: int) -> tuple[Num, str]:
    """Micro-batches' worth of its layers' activations that pipeline stage ``stage`` (0-based)
    holds at its peak, and the rule that gives it.

    - GPipe: all m, on every stage (every forward runs before any backward).
    - 1F1B (Narayanan et al. 2021, §2.2; Megatron-LM ``megatron/core/pipeline_parallel/
      schedules.py``, ``forward_backward_pipelining_without_interleaving``:
      ``num_warmup_microbatches = total_stages - current_stage - 1``, capped at m; each steady
      step runs one forward before one backward): min(m, p − i).
    - Interleaved 1F1B with v chunks (the same file, ``get_pp_rank_microbatches``:
      ``num_warmup_microbatches = (p - rank - 1) * 2 + (v - 1) * microbatch_group_size_per_vp_stage``,
      the group size defaulting to p, ``model_parallel_config.py``; capped at m·v, when every
      virtual micro-batch is in warm-up): W + 1 virtual micro-batches in flight (the warm-up and
      the steady step's forward), each one chunk of 1/v of the stage's layers, so
      min(2(p − i − 1) + (v − 1)p + 1, m·v) / v = min((p(v + 1) − 2i − 1) / v, m). On stage 0
      this is Korthikanti et al.'s p(1 + (p − 1)/(pv)) (arXiv 2205.05198, §4.2.3). The chunks of a
      stage are taken as equal (with a written list of layers, each chunk 1/v of the stage's).
    """
    pipeline = strategy.pipeline
    if pipeline is None or strategy.size(pipeline.axis) == 1:
        return d.const(1), "one micro-batch at a time"
    p_value = strategy.size(pipeline.axis)
    p = d.sym(pipeline.axis, p_value)
    m_value = strategy.microbatches
    m = d.sym("m", m_value)
    if pipeline.schedule is Schedule.GPIPE:
        return m, "GPipe: all m micro-batches in flight on every stage"
    if pipeline.schedule is Schedule.INTERLEAVED:
        v_value = pipeline.chunks
        if p_value * (v_value + 1) - 2 * stage - 1 >= m_value * v_value:
            return m, "interleaved 1F1B: every micro-batch in warm-up, m in flight"
        v = d.sym("v", v_value)
        return ((p * (v + 1) - 2 * stage - 1) / v,
                "interleaved 1F1B: (p(v+1) - 2i - 1)/v micro-batches in flight on stage i")
    if m_value < p_value - stage:
        return m, "1F1B with m < p - i: m micro-batches in flight"
    return p - stage, "1F1B: p - i micro-batches in flight on stage i"


def stage_layer_counts(strategy: Strategy, arch: Transformer) -> tuple[int | None, ...]:
    """Layers of each pipeline stage: the listed counts, or None for each of p even stages."""
    listed = stage_layers(strategy)
    if listed is not None:
        return listed
    pipeline = strategy.pipeline
    return (None,) * (1 if pipeline is None else max(1, strategy.size(pipeline.axis)))


def _pipeline_factors(d: Domain, strategy: Strategy, arch: Transformer) -> tuple[Num, Num, str]:
    """Layers and micro-batches in flight of the stage holding the most layers' activations:
    the largest layers_i × in_flight_i over the stages (the first of equals; stage 0 when the
    stages are even, as in-flight counts never grow with the stage index)."""
    counts = stage_layer_counts(strategy, arch)
    exact = Exact()
    best, best_value = 0, Fraction(-1)
    for i, n in enumerate(counts):
        value = Fraction(n if n is not None else 1) * Fraction(stage_in_flight(exact, strategy, i)[0])
        if value > best_value:
            best, best_value = i, value
    in_flight, rule = stage_in_flight(d, strategy, best)
    n = counts[best]
    layers = stage_share(d, strategy, arch) if n is None else stage_layer_count(d, strategy, n)
    where = f"; stage {best} holds the most" if len(counts) > 1 else ""
    return layers, in_flight, rule + where
