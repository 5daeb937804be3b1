"""Step time: compute, exposed communication, pipeline bubble and optimizer step per device.

The model (README "Step time"; validated by ``benchmarks/step_time.py``):

- **FLOPs** per micro-batch per pipeline stage, matmuls only (2 FLOPs per multiply-add): the
  QKV projection with grouped-query attention ``2bs·h(h + 2·kv·d)``, the attention core
  ``4b·s·s·h`` (half of it with ``attention = flash``, whose causal kernels skip the masked
  half), the output projection ``2bsh²``, the MLP ``2·2bsh·f`` or ``3·2bsh·f`` gated (SwiGLU),
  MoE ``top_k`` expert MLPs plus the router, and the output layer ``2bsh·V`` on the last stage;
  divided by the tensor-parallel size and the context-parallel size (queries). Backward is twice
  forward; ``recompute full`` runs each layer's forward again (``every = n``: ⌊layers / n⌋ of a
  stage's layers), ``selective`` its attention core (Korthikanti et al. 2022 §4; fused too:
  Megatron-core checkpoints the core whatever its backend),
  ``selective_op`` the matmuls torchtitan's op policy does not keep (:func:`op_policy_flops`).
- **Achieved FLOP rate**: matmuls run at peak (the profile, in the ``matmul`` dtype) times
  ``η_max`` (per device and dtype kind); beside them, memory-bound work runs at HBM bandwidth:
  ``score_passes`` activation-sized passes over the ``b·a·s²/t`` attention scores of unfused
  (``standard``) attention (softmax, mask, dropout: Korthikanti's ``5as/h`` term) and
  ``hidden_passes`` over the ``b·s·h`` hidden states of the replicated region (÷ t under
  sequence parallelism: norms, residuals, dropout) and ``ffn_passes`` over the ``b·s·f / t``
  MLP intermediate (bias, activation), forward once, backward twice; with fp8 matmuls, the casts
  of the GEMM inputs (``fp8_cast_bytes`` per element, :func:`gemm_inputs`). The attention core
  runs in 16 bits (Transformer Engine's ``fp8_dpa`` is off by default) and, fused (``flash``),
  at ``attention_efficiency`` of the 16-bit GEMM rate. The constants are calibrated by
  ``benchmarks/step_time.py`` on its calibration rows (CALIBRATION holds them).
- **Communication**, α-β per collective: ``bytes / (bandwidth · link efficiency) + latency ·
  ring steps`` over the slowest axis of the group. Overlap by kind: tensor, context, expert and
  pipeline traffic is exposed and lengthens every micro-batch (so the bubble scales it too),
  except tensor-parallel collectives placed ``overlap = true``: they run beside the linear
  layers' GEMMs of the micro-batch, and what outlasts those GEMMs is exposed, or the share
  ``1 - tp_overlap`` of them if more (chunked collectives do not hide entirely); placed
  ``overlap = backward``, only the column-parallel layers' backward collectives (the input
  gathered again, the input gradient reduce-scattered or all-reduced) run beside those layers'
  input- and weight-gradient GEMMs (:func:`column_flops`), by the same rule;
  parameter gathers for forward hide behind the micro-batch's forward, gathers for backward and
  gradient reductions inside the loop behind its backward, gradient reductions after the loop
  behind the last micro-batch's backward, the parameter all-gather after a sharded update
  behind the next forward; what does not fit in its window is exposed, and at least the share
  ``1 - data_overlap`` of it is (NCCL's kernels share the GPU with the compute they hide
  behind; fitted like the tensor-parallel shares). Gradients reduced once
  a step per model chunk (``reduce = step``) in a pipeline whose backward runs chunk by chunk
  queue on the link behind the later chunks' backward (:func:`reduced_by_chunk`). A data axis
  placed ``overlap = none`` hides none of its collectives, ``overlap = grads`` none of its
  parameter gathers, ``overlap = params`` none of its gradient reductions (:func:`waits`):
  inside the loop they lengthen every micro-batch, after it they add to the step. Host
  transfers are exposed.
- **Bubble**: the other stages' work in micro-batch times of the slowest (:func:`pace`): ``p - 1``
  for equal stages (1F1B, GPipe), divided by ``v`` interleaved.
- **Optimizer**: memory-bound: each optimizer-state element is read and written, its gradient
  read and its parameter written, at HBM bandwidth times an efficiency.
- **MFU** (PaLM, Chowdhery et al. 2022, App. B): model FLOPs without recomputation and with the
  full ``s²`` attention, ``3 ×`` forward, over the step time and the peak of every device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from placeverify.cost import Costs
from placeverify.cost.activations import recomputed_layers
from placeverify.cost.communication import CommItem
from placeverify.ir.devices import Device
from placeverify.ir.model import Transformer
from placeverify.ir.placement import Overlap, Reduce, Role, Schedule, State, TensorOverlap
from placeverify.ir.strategy import Strategy
from placeverify.roles.pipeline import chunk_ordered, stage_layers


@dataclass(frozen=True, slots=True)
class Calibration:
    """The model's fitted constants (see the module docstring)."""

    efficiency: tuple[tuple[str, float], ...]  # ("device:kind", "kind" or "default", η_max)
    score_passes: float  # memory-bound passes over the s×s attention scores (unfused softmax,
    # mask, dropout), in activation-sized elements per score per layer forward
    hidden_passes: float  # memory-bound passes over the b·s·h hidden states of the replicated
    # region (norms, residuals, dropout: ÷ t under sequence parallelism only) per layer forward
    attention_efficiency: float  # fused (flash) attention kernels' rate relative to GEMMs
    link_efficiency: float  # achieved fraction of a link's bandwidth (NCCL bus bandwidth)
    fp8_cast_bytes: float  # HBM bytes per element of a GEMM input cast to fp8 per layer
    # forward (read, amax, write, transposed copy), twice in backward; matmul = fp8 only
    memory_efficiency: float  # achieved fraction of HBM bandwidth in the optimizer step
    # the share of an overlapped tensor-parallel collective's time that can hide behind the
    # GEMMs (``overlap = true``; the rest is exposed, as is what outlasts the GEMMs)
    tp_overlap: float = 1.0
    # the share of a column-parallel layer's backward collective that can hide behind its
    # input- or weight-gradient GEMM (``overlap = backward``: NCCL's kernels share the GPU with
    # the GEMM they run beside)
    backward_overlap: float = 1.0
    # memory-bound passes over the MLP's b·s·f intermediate (bias, activation; ``top_k`` experts'
    # under MoE), the tensor-parallel region (÷ t with or without sequence parallelism), per
    # layer forward
    ffn_passes: float = 0.0
    # the share of an overlapped data-parallel collective's time (a parameter gather, a gradient
    # reduction) that can hide behind the compute of its window; the rest is exposed, as is
    # what outlasts the window (NCCL's kernels share the GPU with the compute they run beside)
    data_overlap: float = 1.0

    def eta_max(self, device: str, dtype: str) -> float:
        """η_max for a device's matmuls in ``dtype`` (kind ``16bit`` for bf16 and fp16)."""
        kind = "16bit" if dtype in ("bf16", "fp16") else dtype
        table = dict(self.efficiency)
        return table.get(f"{device}:{kind}", table.get(kind, table["default"]))


# Fitted by benchmarks/step_time.py on its calibration rows (printed there; held-out rows judge).
CALIBRATION = Calibration(
    efficiency=(("default", 0.5), ("a100_80gb_sxm:16bit", 0.687), ("h100_sxm:16bit", 0.609),
                ("h100_sxm:fp8", 0.597)),
    score_passes=8.0,
    hidden_passes=8.0,
    attention_efficiency=0.3,
    link_efficiency=1.0,
    fp8_cast_bytes=8.0,
    memory_efficiency=0.7,
    tp_overlap=1.0,
    backward_overlap=1.0,
    ffn_passes=8.0,
    data_overlap=0.9,
)


def outlasting(total: float, window: float, share: float) -> float:
    """The exposed part of ``total`` seconds of communication that runs beside ``window``
    seconds of compute and can hide at most the fraction ``share`` of itself: what outlasts the
    window, or ``1 - share`` of it if more (the overlap shares of :class:`Calibration`)."""
    return max(total * (1 - share), total - window)


@dataclass(frozen=True, slots=True)
class StepTime:
    device: str | None
    matmul: str
    peak_flops: float | None  # per device
    efficiency: float | None  # achieved fraction of peak in matmuls
    microbatches: int
    flops_per_microbatch: float  # hardware FLOPs per micro-batch on the slowest stage's device
    model_flops: float  # per step, all devices, no recomputation (PaLM)
    tokens: int  # per step
    compute_seconds: float | None  # micro-batches' compute, no bubble
    bubble_seconds: float | None
    optimizer_seconds: float | None
    exposed: tuple[tuple[str, float], ...]  # exposed communication seconds per axis group
    step_seconds: float | None
    notes: tuple[str, ...] = ()
    world: int = 1

    @property
    def tokens_per_second(self) -> float | None:
        return None if not self.step_seconds else self.tokens / self.step_seconds

    @property
    def mfu(self) -> float | None:
        if not self.step_seconds or not self.peak_flops:
            return None
        return self.model_flops / (self.step_seconds * self.peak_flops * self.world)

    def to_json(self) -> dict[str, Any]:
        """The ``time`` section of ``check --json``."""
        return {
            "device": self.device, "matmul": self.matmul, "peak_flops": self.peak_flops,
            "matmul_efficiency": self.efficiency, "microbatches": self.microbatches,
            "step_seconds": self.step_seconds, "tokens_per_step": self.tokens,
            "tokens_per_second": self.tokens_per_second, "mfu": self.mfu,
            "model_flops_per_step": self.model_flops,
            "hardware_flops_per_microbatch": self.flops_per_microbatch,
            "breakdown": {
                "compute_seconds": self.compute_seconds,
                "exposed_communication_seconds": dict(self.exposed),
                "bubble_seconds": self.bubble_seconds,
                "optimizer_seconds": self.optimizer_seconds},
            "notes": list(self.notes)}


# ---- FLOPs ----------------------------------------------------------------------------------


def layer_flops(arch: Transformer, tokens: float, keys: float, t: float, causal_skip: bool
                ) -> tuple[float, float]:
    """Forward matmul FLOPs of one layer on one device: (everything, the attention core).

    ``tokens`` queries per device attend to ``keys`` keys; ``t`` tensor-parallel ranks split
    heads and the MLP."""
    h, f, q = arch.hidden, arch.ffn, arch.q_dim
    kv = arch.kv_dim
    dense = 2 * tokens * (h * (q + 2 * kv) + q * h)
    mlp_mats = 3 if arch.gated else 2
    if arch.moe:
        f_e = arch.expert_ffn or f
        dense += 2 * tokens * (arch.top_k * mlp_mats * h * f_e + h * arch.experts * t)
    else:
        dense += 2 * tokens * mlp_mats * h * f
    core = 4 * tokens * keys * q * (0.5 if causal_skip else 1.0)
    return (dense + core) / t, core / t


def column_flops(arch: Transformer, tokens: float, t: float) -> float:
    """Forward GEMM FLOPs of one layer's column-parallel linear layers on one device, whose
    input- and weight-gradient GEMMs the backward collectives of ``overlap = backward`` run
    beside: the QKV projection and the MLP's first matmul (both halves of a gated one); an MoE
    layer's experts have no such collectives of their own (cost.communication), only its QKV
    projection counts."""
    h, kv = arch.hidden, arch.kv_dim
    first = 0 if arch.moe else (2 if arch.gated else 1) * h * arch.ffn
    return 2 * tokens * (h * (arch.q_dim + 2 * kv) + first) / t


def ffn_width(arch: Transformer) -> float:
    """The MLP intermediate's width per token: ``ffn`` (``expert_ffn`` times ``top_k`` under
    MoE), the elements ``ffn_passes`` counts."""
    return float((arch.expert_ffn or arch.ffn) * (arch.top_k if arch.moe else 1))


def op_policy_flops(arch: Transformer, tokens: float, t: float) -> float:
    """Forward matmul FLOPs ``recompute selective_op`` runs again per layer on one device: the
    matmuls torchtitan's op policy does not save (every second one, README "Step time"): K, the
    output projection, and the up projection (gated) or the second MLP matmul (plain)."""
    h, q = arch.hidden, arch.q_dim
    kv = arch.kv_dim
    f = (arch.expert_ffn or arch.ffn) * (arch.top_k if arch.moe else 1)
    return 2 * tokens * (h * kv + q * h + h * f) / t


def gemm_inputs(arch: Transformer, tokens: float, t: float, sp: bool) -> float:
    """Elements a layer's forward casts to fp8 on one device: the inputs of the QKV projection
    and the first MLP matmul (the hidden states; the sequence shard under sequence parallelism,
    which casts before its all-gather), of the output projection and of the last MLP matmul."""
    h = arch.hidden
    f = (arch.expert_ffn or arch.ffn) * (arch.top_k if arch.moe else 1)
    return tokens * (2 * h / (t if sp else 1) + (arch.q_dim + f) / t)


def output_flops(arch: Transformer, tokens: float, t: int) -> float:
    return 2 * tokens * arch.hidden * arch.padded_vocab(t) / t


def model_flops_per_token(arch: Transformer) -> float:
    """Forward + backward model FLOPs per token (PaLM: no recomputation, full s² attention)."""
    layer, _ = layer_flops(arch, 1, arch.seq, 1, False)
    return 3 * (arch.layers * layer + output_flops(arch, 1, 1))


# ---- communication ----------------------------------------------------------------------------


def item_seconds(strategy: Strategy, item: CommItem, cal: Calibration) -> float | None:
    """α-β time of one collective item over a step (None when a link is not given)."""
    mesh = strategy.mesh
    total = float(Fraction(item.bytes))
    calls = float(Fraction(item.calls))
    if item.pcie:
        return None if mesh.pcie_bandwidth is None else total / float(mesh.pcie_bandwidth)
    links = [mesh.axis(a) for a in item.axes]
    if not links or total == 0:
        return 0.0
    if any(a.bandwidth is None for a in links):
        return None
    bandwidth = min(float(a.bandwidth) for a in links if a.bandwidth is not None)
    latency = max(float(a.latency or 0) for a in links)
    n = item.group_size
    steps = {"all_reduce": 2 * (n - 1), "send": 1}.get(item.op, n - 1)
    return total / (bandwidth * cal.link_efficiency) + latency * steps * calls


def _label(item: CommItem) -> str:
    return " * ".join(item.axes) if item.axes else "host"


# ---- the model ---------------------------------------------------------------------------------


def step_time(strategy: Strategy, costs: Costs, cal: Calibration = CALIBRATION) -> StepTime | None:
    """The step-time estimate, or None for a bare parameter count (no architecture)."""
    arch = strategy.model.arch
    if arch is None:
        return None
    mesh = strategy.mesh
    notes: list[str] = []
    t = c = 1
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            t *= strategy.size(p.axis)
        elif p.role is Role.CONTEXT:
            c *= strategy.size(p.axis)
    pipeline = strategy.pipeline
    pp = strategy.size(pipeline.axis) if pipeline else 1
    v = pipeline.chunks if pipeline and pipeline.schedule is Schedule.INTERLEAVED else 1
    m = strategy.microbatches

    b, s = arch.micro_batch, arch.seq
    tokens = b * s / c
    flash = arch.attention == "flash"
    layer, core = layer_flops(arch, tokens, s, t, flash)
    recompute = strategy.recompute.kind.value
    # the share of a stage's layers that full recomputation re-runs (every n-th with every = n)
    share = 0.0
    if recompute == "full":
        kept, held = recomputed_layers(strategy)
        share = kept / held
    # recomputed forward FLOPs per layer in backward: (matmuls outside the attention core, core)
    gemm_again, core_again = share * (layer - core), share * core
    if recompute == "selective":  # fused or not, the core runs again (Megatron-core's
        # checkpoint_core_attention re-runs the attention backend's forward in backward)
        core_again = core
    elif recompute == "selective_op":
        gemm_again = op_policy_flops(arch, tokens, t)
        core_again = 0.0 if flash else core  # the fused kernels' outputs are kept
    layers, output, idle = slowest_stage(strategy, arch, pp, layer, gemm_again + core_again,
                                         output_flops(arch, tokens, t))
    bubble_mb = 0.0 if pp <= 1 else idle / v  # the bubble in micro-batch times
    forward = layers * layer + output
    extra_gemm, extra_core = layers * gemm_again, layers * core_again
    per_mb = 3 * forward + extra_gemm + extra_core

    replicas = mesh.world // (t * pp * c)
    step_tokens = b * s * m * replicas
    model_flops = model_flops_per_token(arch) * step_tokens

    device: Device | None = mesh.device
    matmul = mesh.matmul or default_matmul(strategy)
    peak = None if device is None else device.peak(matmul)
    eta = None
    if peak is not None and device is not None:
        eta = cal.eta_max(device.key, matmul)
    rate = None if peak is None or eta is None else float(peak) * eta
    if device is None:
        notes.append("no device profile: name one ('device = h100_sxm') for compute time")
    # The attention core (Q·Kᵀ, scores·V) runs in 16 bits when the matmuls are fp8: Transformer
    # Engine's recipes leave fp8 attention off (DelayedScaling fp8_dpa = False); fused (flash)
    # kernels at attention_efficiency of the 16-bit GEMM rate.
    attention_rate = rate
    if rate is not None and device is not None and matmul == "fp8":
        peak16 = device.peak("bf16")
        attention_rate = None if peak16 is None else float(peak16) * cal.eta_max(device.key, "bf16")
    if attention_rate is not None and flash:
        attention_rate *= cal.attention_efficiency

    # memory-bound work per layer forward (seconds), beside the matmuls
    sp = any(p.role is Role.TENSOR and p.sequence_parallel for p in strategy.placements)
    e = float(strategy.precision.activations)
    scores = 0.0 if flash else cal.score_passes * b * arch.heads * (s / c) * s / t
    hidden = (cal.hidden_passes * tokens * arch.hidden / (t if sp else 1)
              + cal.ffn_passes * tokens * ffn_width(arch) / t)
    casts = cal.fp8_cast_bytes * gemm_inputs(arch, tokens, t, sp) if matmul == "fp8" else 0.0
    hbm = None if device is None else float(device.memory_bandwidth)
    mem_layer = 0.0 if hbm is None else ((scores + hidden) * e + casts) / hbm
    mem_extra = share * layers * mem_layer
    if hbm and recompute == "selective" and not flash:
        mem_extra = layers * scores * e / hbm
    elif recompute == "selective_op":  # every elementwise op runs again
        mem_extra = layers * mem_layer

    t_fwd = t_bwd = None
    if rate is not None and attention_rate is not None:
        gemm, attention = forward - layers * core, layers * core
        t_fwd = gemm / rate + attention / attention_rate + layers * mem_layer
        t_bwd = (2 * gemm + extra_gemm) / rate + (2 * attention + extra_core) / attention_rate \
            + 2 * layers * mem_layer + mem_extra

    exposed: dict[str, float] = {}
    per_mb_exposed = 0.0  # lengthens every micro-batch (tensor, context, expert, pipeline)
    loop_fwd: list[tuple[CommItem, float]] = []
    loop_bwd: list[tuple[CommItem, float]] = []
    post_bwd: list[tuple[CommItem, float]] = []
    next_fwd: list[tuple[CommItem, float]] = []
    missing = False
    waited = 0.0  # data-parallel collectives after the loop that nothing hides (overlap = none)
    beside_gemms: list[tuple[CommItem, float]] = []  # overlapped tensor-parallel collectives
    beside_backward: list[tuple[CommItem, float]] = []  # overlap = backward: beside its GEMMs
    for item in costs.comm:
        sec = item_seconds(strategy, item, cal)
        if sec is None:
            missing = True
            continue
        if sec == 0:
            continue
        in_loop = m > 1 and Fraction(item.calls) % m == 0
        if item.state == "activations" and not item.pcie and overlapped(strategy, item):
            beside_gemms.append((item, sec))
        elif item.state == "activations" and item.beside_gemm:
            beside_backward.append((item, sec))
        elif not item.pcie and (item.state == "activations" or (
                waits(strategy, item) and (in_loop or item.source == "placement"))):
            # every micro-batch waits for it: tensor, context, expert and pipeline traffic, and
            # the data-parallel collectives of the loop that nothing hides
            per_mb_exposed += sec / m
            exposed[_label(item)] = exposed.get(_label(item), 0.0) + sec * (1 + bubble_mb / m)
        elif item.pcie or item.state in ("scalar", "optimizer"):
            exposed[_label(item)] = exposed.get(_label(item), 0.0) + sec
        elif waits(strategy, item):
            waited += sec
            exposed[_label(item)] = exposed.get(_label(item), 0.0) + sec
        elif item.source == "placement" and "forward" in item.what:
            loop_fwd.append((item, sec / m))
        elif item.source == "placement":
            loop_bwd.append((item, sec / m))
        elif item.state == "params":
            next_fwd.append((item, sec))
        elif in_loop:
            loop_bwd.append((item, sec / m))
        else:
            post_bwd.append((item, sec))
    if missing:
        notes.append("some axes have no bandwidth: their collectives are not timed")
    def beside(items: list[tuple[CommItem, float]], gemm_flops: float, share: float) -> float:
        """Collectives run beside GEMMs of ``gemm_flops`` per micro-batch: what outlasts the
        GEMMs, or the part ``1 - share`` of them if more, lengthens each micro-batch; no
        device, no GEMM time to hide in."""
        window = 0.0 if rate is None else gemm_flops / rate
        total = sum(sec for _, sec in items)
        left = outlasting(total / m, window, share)
        for item, sec in items:
            exposed[_label(item)] = exposed.get(_label(item), 0.0) + \
                left * m * (1 + bubble_mb / m) * sec / total
        return left

    if beside_gemms:
        # overlapped with the linear layers' GEMMs of the micro-batch (forward, backward and
        # recomputed)
        per_mb_exposed += beside(beside_gemms, 3 * (forward - layers * core) + extra_gemm,
                                 cal.tp_overlap)
    if beside_backward:
        # the column-parallel layers' backward collectives beside their input- and
        # weight-gradient GEMMs (each as long as the layer's forward GEMM), the output layer's
        # too when this stage holds it
        per_mb_exposed += beside(beside_backward, 2 * (layers * column_flops(arch, tokens, t)
                                                       + output), cal.backward_overlap)

    def hide(items: list[tuple[CommItem, float]], window: float | None, times: int) -> float:
        total = sum(sec for _, sec in items)
        if total == 0:
            return 0.0
        left = outlasting(total, window or 0.0, cal.data_overlap)
        for item, sec in items:
            exposed[_label(item)] = exposed.get(_label(item), 0.0) + times * left * sec / total
        return times * left

    # without a device there is no backward to queue behind: they stay after the loop
    by_chunk = [(item, sec) for item, sec in post_bwd
                if t_bwd is not None and reduced_by_chunk(strategy, item)]
    post_bwd = [entry for entry in post_bwd if entry not in by_chunk]
    data_exposed = (hide(loop_fwd, t_fwd, m) + hide(loop_bwd, t_bwd, m)
                    + hide(post_bwd, t_bwd, 1) + hide(next_fwd, t_fwd, 1) + waited)
    if by_chunk and t_bwd is not None:  # (t_bwd is known whenever by_chunk is not empty)
        # one chunk's share after each chunk's backward, queued on the link: chunk k's starts
        # once k + 1 of the v chunks' backward (m · t_bwd / v each) are done, so the last ends
        # max(T / v, T - (v - 1) · m · t_bwd / v) after the backward does, and at least the
        # share 1 - data_overlap of T is exposed (as every hidden data-parallel collective)
        total = sum(sec for _, sec in by_chunk)
        left = max(total / v, outlasting(total, (v - 1) * m * t_bwd / v, cal.data_overlap))
        for item, sec in by_chunk:
            exposed[_label(item)] = exposed.get(_label(item), 0.0) + left * sec / total
        data_exposed += left

    optimizer = _optimizer_seconds(strategy, costs, device, cal)
    if rate is None or t_fwd is None or t_bwd is None:
        return StepTime(None if device is None else device.key, matmul,
                        None if peak is None else float(peak), None, m, per_mb, model_flops,
                        step_tokens, None, None, optimizer, tuple(sorted(exposed.items())), None,
                        tuple(notes), mesh.world)
    t_mb = t_fwd + t_bwd + per_mb_exposed
    compute = m * (t_fwd + t_bwd)
    bubble = bubble_mb * t_mb
    scalars_and_host = sum(sec for item in costs.comm
                           for sec in [item_seconds(strategy, item, cal)]
                           if sec and (item.pcie or item.state in ("scalar", "optimizer")))
    step = m * t_mb + bubble + data_exposed + scalars_and_host + (optimizer or 0.0)
    return StepTime(device.key if device else None, matmul, float(peak) if peak else None, eta, m,
                    per_mb, model_flops, step_tokens, compute, bubble, optimizer,
                    tuple(sorted(exposed.items())), step, tuple(notes), mesh.world)


def overlapped(strategy: Strategy, item: CommItem) -> bool:
    """Is ``item`` a tensor-parallel collective overlapped with the GEMMs: over tensor axes
    placed ``overlap = true`` only (Megatron-LM's --tp-comm-overlap splits each sequence-parallel
    all-gather and reduce-scatter into chunks pipelined with the GEMM that consumes or produces
    it; torchtitan's async tensor parallelism likewise)? (``overlap = backward`` overlaps only
    the items marked ``beside_gemm``.)"""
    return bool(item.axes) and all(strategy.placement(a).role is Role.TENSOR
                                   and strategy.placement(a).overlap is TensorOverlap.ALL
                                   for a in item.axes)


def waits(strategy: Strategy, item: CommItem) -> bool:
    """Does compute wait for ``item``, a collective over data axes, one of which is placed
    ``overlap = none`` (nothing overlapped: Megatron-LM without --overlap-grad-reduce reduces
    after the last backward), or, for a parameter gather, ``overlap = grads`` (Megatron-LM's
    distributed optimizer all-gathers the updated parameters after the step without
    --overlap-param-gather), for a gradient reduction ``overlap = params``?"""
    levels = [strategy.placement(a).data_overlap for a in item.axes
              if strategy.placement(a).role is Role.DATA]
    hidden = {"params": (Overlap.ALL, Overlap.PARAMS), "gradients": (Overlap.ALL, Overlap.GRADS)}
    return item.state in hidden and any(level not in hidden[item.state] for level in levels)


def reduced_by_chunk(strategy: Strategy, item: CommItem) -> bool:
    """Is ``item`` a gradient reduction after the loop that runs chunk by chunk: over data axes
    placed ``reduce = step`` (each model chunk reduced after its last micro-batch) in a pipeline
    whose backward finishes one chunk before the next (:func:`roles.pipeline.chunk_ordered`)?"""
    return (item.state == "gradients" and bool(item.axes) and chunk_ordered(strategy)
            and all(strategy.placement(a).role is Role.DATA
                    and strategy.placement(a).reduce is Reduce.STEP for a in item.axes))


def slowest_stage(strategy: Strategy, arch: Transformer, pp: int, layer: float, extra: float,
                  output: float) -> tuple[float, float, float]:
    """Layers and output-layer FLOPs of the pipeline stage with the most work per micro-batch,
    the one that sets the pipeline's pace, and the bubble in its micro-batch times before the
    interleaving divides it (:func:`pace`). The stages hold L / p layers each, or their listed
    counts; the last stage also the output layer (its fewer layers may make room for it)."""
    listed = stage_layers(strategy)
    counts = listed if listed is not None else (arch.layers / pp,) * pp
    slowest, idle = pace(counts, 3 * layer + extra, 3 * output)
    return float(counts[slowest]), output if slowest == len(counts) - 1 else 0.0, idle


def pace(counts: Sequence[float], layer_work: float, output_work: float) -> tuple[int, float]:
    """The stage that sets a pipeline's pace, and the pipeline's fill and drain in its
    micro-batch times: stage i works ``counts[i] · layer_work`` per micro-batch, the last also
    ``output_work``. In 1F1B (and GPipe) the slowest stage k runs its m micro-batches back to
    back once the first one has passed the stages before it, and the last one's backward then
    passes them again: step ≈ m·w_k + Σ_{i≠k} w_i, so the bubble is Σ_{i≠k} w_i / w_k, the
    textbook p − 1 for equal stages; interleaving divides it by v. A stage that holds only the
    embedding (Llama 3's first model chunk) adds next to nothing."""
    work = [n * layer_work + (output_work if i == len(counts) - 1 else 0.0)
            for i, n in enumerate(counts)]
    slowest = max(range(len(work)), key=lambda i: (work[i], i))
    if len(work) <= 1 or work[slowest] <= 0:
        return slowest, 0.0
    return slowest, (sum(work) - work[slowest]) / work[slowest]


def default_matmul(strategy: Strategy) -> str:
    dtype = strategy.precision.params_dtype
    return "tf32" if dtype == "fp32" else dtype if dtype in ("bf16", "fp16", "fp8") else "bf16"


def _optimizer_seconds(strategy: Strategy, costs: Costs, device: Device | None,
                       cal: Calibration) -> float | None:
    if device is None:
        return None
    prec = strategy.precision
    if prec.optimizer == 0 or State.OPTIMIZER in strategy.offloaded:
        return 0.0
    elements = float(Fraction(costs.device_bytes()["optimizer"])) / float(prec.optimizer)
    touched = elements * float(2 * prec.optimizer + prec.grads + prec.params)
    return touched / (float(device.memory_bandwidth) * cal.memory_efficiency)
