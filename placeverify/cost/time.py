"""Step time: compute, exposed communication, pipeline bubble and optimizer step per device.

The model (``docs/models/step-time.md``; validated by ``benchmarks/step_time.py``):

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
  behind the next forward (ZeRO-3 and FSDP unit by unit, one unit prefetched: the first unit's
  gather of a forward and the last unit's reduction of a backward exposed whole, each unit's
  collectives with their own ring latency: :func:`~.exposure.by_units`, :func:`fsdp_units`);
  what does not fit in its window is exposed, and at least the share
  ``1 - data_overlap`` of it is (NCCL's kernels share the GPU with the compute they hide
  behind; fitted like the tensor-parallel shares). Gradients reduced once
  a step per model chunk (``reduce = step``) in a pipeline whose backward runs chunk by chunk
  queue on the link behind the later chunks' backward (:func:`~.exposure.reduced_by_chunk`). A data axis
  placed ``overlap = none`` hides none of its collectives, ``overlap = grads`` none of its
  parameter gathers, ``overlap = params`` none of its gradient reductions (:func:`~.exposure.waits`):
  inside the loop they lengthen every micro-batch, after it they add to the step. Host
  transfers are exposed.
- **Bubble**: the other stages' work in micro-batch times of the slowest (:func:`pace`): ``p - 1``
  for equal stages (1F1B, GPipe), divided by ``v`` interleaved.
- **Optimizer**: memory-bound: each optimizer-state element is read and written, its gradient
  read and its parameter written, at HBM bandwidth times an efficiency.
- **MFU** (PaLM, Chowdhery et al. 2022, App. B): model FLOPs without recomputation and with the
  full ``s²`` attention, ``3 ×`` forward, over the step time and the peak of every device.

The FLOPs are :mod:`placeverify.cost.flops`, the constants :mod:`placeverify.cost.calibration`,
the communication's windows and what they leave exposed :mod:`placeverify.cost.exposure`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from placeverify.cost import Costs
from placeverify.cost.activations import recomputed_layers
from placeverify.cost.calibration import CALIBRATION, Calibration
from placeverify.cost.exposure import Windows, expose
from placeverify.cost.flops import (
    column_flops,
    ffn_width,
    fine_tune_shares,
    gemm_inputs,
    layer_flops,
    model_flops_per_token,
    op_policy_flops,
    output_flops,
    training_flops_per_token,
)
from placeverify.ir.devices import Device
from placeverify.ir.model import Transformer
from placeverify.ir.placement import Role, Schedule, State
from placeverify.ir.strategy import Strategy
from placeverify.roles.pipeline import stage_layers

# CALIBRATION, Calibration and model_flops_per_token were defined here: benchmarks/ and tests/
# import them from this module.
__all__ = ["CALIBRATION", "Calibration", "StepTime", "default_matmul", "model_flops_per_token",
           "pace", "slowest_stage", "stage_work", "step_time"]


@dataclass(frozen=True, slots=True)
class StepTime:
    """The step-time estimate of one strategy, per device (the ``time`` section of ``check --json``)."""

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



# ---- the model ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageWork:
    """The FLOPs per micro-batch of the pipeline stage that sets the pace, on one device."""

    t: int  # tensor-parallel size
    c: int  # context-parallel size
    pp: int  # pipeline stages
    v: int  # model chunks per stage (interleaved)
    tokens: float  # queries per device per micro-batch
    flash: bool  # fused attention
    layer: float  # forward FLOPs of one layer
    core: float  # of which the attention core
    share: float  # the share of the layers full recomputation re-runs
    recompute: str
    layers: float  # the stage's layers
    output: float  # the output layer's forward FLOPs (on the last stage)
    bubble: float  # the bubble in micro-batch times
    forward: float
    extra_gemm: float  # recomputed FLOPs outside the attention core
    extra_core: float  # recomputed FLOPs of the attention core

    @property
    def per_microbatch(self) -> float:
        """Hardware FLOPs per micro-batch: forward, backward twice forward, recomputation."""
        return 3 * self.forward + self.extra_gemm + self.extra_core


def stage_work(strategy: Strategy, arch: Transformer) -> StageWork:
    """The slowest stage's FLOPs per micro-batch (the module docstring's "FLOPs")."""
    t = c = 1
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            t *= strategy.size(p.axis)
        elif p.role is Role.CONTEXT:
            c *= strategy.size(p.axis)
    pipeline = strategy.pipeline
    pp = strategy.size(pipeline.axis) if pipeline else 1
    v = pipeline.chunks if pipeline and pipeline.schedule is Schedule.INTERLEAVED else 1
    tokens = arch.micro_batch * arch.seq / c
    flash = arch.attention == "flash"
    layer, core = layer_flops(arch, tokens, arch.seq, t, flash)
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
    bubble = 0.0 if pp <= 1 else idle / v
    return StageWork(t, c, pp, v, tokens, flash, layer, core, share, recompute, layers, output,
                     bubble, layers * layer + output, layers * gemm_again, layers * core_again)


def _rates(device: Device | None, matmul: str, flash: bool, cal: Calibration
           ) -> tuple[float | None, float | None, float | None]:
    """η_max, the achieved matmul FLOP rate and the attention core's rate (None: no device)."""
    peak = None if device is None else device.peak(matmul)
    eta = None
    if peak is not None and device is not None:
        eta = cal.eta_max(device.compute_key, matmul)
    rate = None if peak is None or eta is None else float(peak) * eta
    # The attention core (Q·Kᵀ, scores·V) runs in 16 bits when the matmuls are fp8: Transformer
    # Engine's recipes leave fp8 attention off (DelayedScaling fp8_dpa = False); fused (flash)
    # kernels at attention_efficiency of the 16-bit GEMM rate.
    attention_rate = rate
    if rate is not None and device is not None and matmul == "fp8":
        peak16 = device.peak("bf16")
        attention_rate = None if peak16 is None else float(peak16) * cal.eta_max(device.compute_key, "bf16")
    if attention_rate is not None and flash:
        attention_rate *= cal.attention_efficiency
    return eta, rate, attention_rate


def _memory_bound(strategy: Strategy, arch: Transformer, work: StageWork, device: Device,
                  matmul: str, cal: Calibration) -> tuple[float, float]:
    """Seconds of memory-bound work beside the matmuls: per layer forward, and recomputed in the
    stage's backward."""
    b, s, t, c = arch.micro_batch, arch.seq, work.t, work.c
    sp = any(p.role is Role.TENSOR and p.sequence_parallel for p in strategy.placements)
    e = float(strategy.precision.activations)
    scores = 0.0 if work.flash else cal.score_passes * b * arch.heads * (s / c) * s / t
    hidden = (cal.hidden_passes * work.tokens * arch.hidden / (t if sp else 1)
              + cal.ffn_passes * work.tokens * ffn_width(arch) / t)
    casts = cal.fp8_cast_bytes * gemm_inputs(arch, work.tokens, t, sp) if matmul == "fp8" else 0.0
    hbm = float(device.memory_bandwidth)
    mem_layer = ((scores + hidden) * e + casts) / hbm
    mem_extra = work.share * work.layers * mem_layer
    if hbm and work.recompute == "selective" and not work.flash:
        mem_extra = work.layers * scores * e / hbm
    elif work.recompute == "selective_op":  # every elementwise op runs again
        mem_extra = work.layers * mem_layer
    return mem_layer, mem_extra


def _phases(strategy: Strategy, arch: Transformer, work: StageWork, device: Device, matmul: str,
            rate: float, attention_rate: float, cal: Calibration) -> tuple[float, float]:
    """Seconds of a micro-batch's forward and backward compute on the slowest stage. A
    fine-tune's backward runs the input gradients of every matmul but the weight gradients of
    the trained weights only, and its adapters add their own matmuls
    (:func:`placeverify.cost.flops.fine_tune_shares`)."""
    mem_layer, mem_extra = _memory_bound(strategy, arch, work, device, matmul, cal)
    layers = work.layers
    gemm, attention = work.forward - layers * work.core, layers * work.core
    trained, adapters = fine_tune_shares(strategy.model)
    t_fwd = gemm * (1 + adapters) / rate + attention / attention_rate + layers * mem_layer
    t_bwd = ((1 + trained + 2 * adapters) * gemm + work.extra_gemm) / rate \
        + (2 * attention + work.extra_core) / attention_rate + 2 * layers * mem_layer + mem_extra
    return t_fwd, t_bwd


def step_time(strategy: Strategy, costs: Costs, cal: Calibration = CALIBRATION) -> StepTime | None:
    """The step-time estimate, or None for a bare parameter count (no architecture)."""
    arch = strategy.model.arch
    if arch is None:
        return None
    mesh = strategy.mesh
    notes: list[str] = []
    m = strategy.microbatches
    work = stage_work(strategy, arch)
    step_tokens = arch.micro_batch * arch.seq * m * (mesh.world // (work.t * work.pp * work.c))
    fine_tune = bool(strategy.model.frozen) or strategy.model.adapter is not None
    model_flops = (training_flops_per_token(strategy.model) if fine_tune
                   else model_flops_per_token(arch)) * step_tokens

    device: Device | None = mesh.device
    matmul = mesh.matmul or default_matmul(strategy)
    peak = None if device is None else device.peak(matmul)
    eta, rate, attention_rate = _rates(device, matmul, work.flash, cal)
    if device is None:
        notes.append("no device profile: name one ('device = h100_sxm') for compute time")
    t_fwd = t_bwd = None
    if rate is not None and attention_rate is not None and device is not None:
        t_fwd, t_bwd = _phases(strategy, arch, work, device, matmul, rate, attention_rate, cal)

    windows = Windows(m, work.bubble, work.v, rate,
                      3 * (work.forward - work.layers * work.core) + work.extra_gemm,
                      2 * (work.layers * column_flops(arch, work.tokens, work.t) + work.output),
                      t_fwd, t_bwd, fsdp_units(work.layers))
    exposure = expose(strategy, costs.comm, cal, windows)
    if exposure.missing:
        notes.append("some axes have no bandwidth: their collectives are not timed")
    exposed = tuple(sorted(exposure.by_group.items()))
    optimizer = _optimizer_seconds(strategy, costs, device, cal)
    if rate is None or t_fwd is None or t_bwd is None:
        return StepTime(None if device is None else device.key, matmul,
                        None if peak is None else float(peak), None, m, work.per_microbatch,
                        model_flops, step_tokens, None, None, optimizer, exposed, None,
                        tuple(notes), mesh.world)
    t_mb = t_fwd + t_bwd + exposure.microbatch
    compute = m * (t_fwd + t_bwd)
    bubble = work.bubble * t_mb
    step = m * t_mb + bubble + exposure.data + exposure.once + (optimizer or 0.0)
    return StepTime(device.key if device else None, matmul, float(peak) if peak else None, eta, m,
                    work.per_microbatch, model_flops, step_tokens, compute, bubble, optimizer,
                    exposed, step, tuple(notes), mesh.world)


def fsdp_units(layers: float) -> int:
    """FSDP's wrapping units over a stage of ``layers`` layers: one per layer (torchtitan's
    ``apply_fsdp`` and llm-foundry's ``fsdp_wrap_fn`` wrap each transformer block) and one for
    the parameters outside the layers (the root: embeddings, final norm, output layer)."""
    return max(1, round(layers)) + 1


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
    """The dtype matmuls run in when the mesh does not say: the precision's (its ``compute``,
    else the gathered parameters' dtype; :attr:`placeverify.ir.precision.Precision.matmul`)."""
    return strategy.precision.matmul


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
