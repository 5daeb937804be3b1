"""Implementation memory profiles: what an implementation holds beyond the placement's states at
its peak (``mesh { memory_profile = torch }``). The numbers they add are computed in
:mod:`placeverify.cost.peak`; each entry here says what the profile follows."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

MEMORY_PROFILES: dict[str, str] = {
    # Megatron-LM: gradients in persistent contiguous buffers (``main_grad``, DistributedDataParallel
    # ``param_and_grad_buffer.py``), reduced in place; the fused Adam of Apex / Transformer Engine
    # updates in place (no optimizer temporaries).
    "megatron": "Megatron-LM: persistent gradient buffers, fused in-place Adam",
    # DeepSpeed ZeRO (``runtime/zero/stage_1_and_2.py``): as Megatron, plus the fp32 gradient
    # partition of ZeRO-1/2 (``single_partition_of_fp32_groups`` grads, 4 bytes per element of the
    # partition) that DeepSpeed's own estimator counts.
    "deepspeed": "DeepSpeed ZeRO: plus the fp32 gradient partition of stages 1-2",
    # Megatron-DeepSpeed: Megatron's model under DeepSpeed's engine. Its optimizers hold what the
    # deepspeed profile counts, and BF16_Optimizer (``runtime/bf16_optimizer.py``; bf16 Θ with
    # fp32 gradient accumulation, written ``precision megatron`` with ZeRO-1) keeps the bf16
    # ``.grad`` of every parameter beside the fp32 accumulation buffer: the pipeline engine
    # calls ``update_hp_grads(clear_lp_grads=False)`` after each backward
    # (``runtime/pipe/engine.py``), so 2 bytes per parameter more than the placement's G.
    "megatron_deepspeed": "Megatron-DeepSpeed: as deepspeed, plus BF16_Optimizer's 16-bit "
                          "gradients beside its fp32 accumulation",
    # torch on CUDA: ``optimizer.zero_grad(set_to_none=True)`` frees the gradients between steps;
    # DistributedDataParallel keeps bucket buffers as large as the replicated gradients
    # (``gradient_as_bucket_view=False``, the default); ``torch.optim.Adam`` picks its foreach
    # implementation for CUDA tensors (``optimizer.py``, ``_default_to_fused_or_foreach``), whose
    # ``_foreach_sqrt(exp_avg_sqs)`` makes one fp32 copy of the state it updates.
    "torch": "torch (CUDA): gradients freed between steps, DDP buckets, foreach Adam temporaries",
    # torch on CPU: the same, but Adam runs its single-tensor loop (foreach is for accelerators):
    # ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` holds two temporaries of one parameter.
    "torch_cpu": "torch (CPU): as torch, with single-tensor Adam temporaries",
}
DEFAULT_MEMORY_PROFILE = "megatron"

# Profiles whose offloaded gradient partition is fp32 on the host whatever the model's gradient
# dtype: DeepSpeed's ZeRO-Offload (CPU Adam updates fp32 master weights from fp32 gradients).
# deepspeedai/DeepSpeed edaa722, ``runtime/zero/stage_1_and_2.py``: with ``cpu_offload``
# ``self.device = 'cpu'`` (line 238) and ``initialize_optimizer_states`` (lines 837-854) allocates
# ``torch.zeros(partition_size, dtype=single_partition_of_fp32_groups[i].dtype, device=self.device)``
# as the fp32 partition's ``.grad``, kept (set to None only without offload);
# ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` (line 1590) copies each 16-bit gradient
# into it ``.to(self.master_weights_and_grads_dtype)``. ``runtime/zero/stage3.py``
# ``_create_fp32_partitions`` / the optimizer-state setup (lines 1255-1292): ``gradient_dtype =
# self.fp32_partitioned_groups_flat[0].dtype`` and, under ``offload_optimizer``, a
# ``subgroup_gradient_buffer`` of that dtype on ``self.device`` (the CPU) per sub-group.
FP32_HOST_GRADIENTS = frozenset({"deepspeed", "megatron_deepspeed"})


def host_gradient_bytes(profile: str | None, grads: Fraction) -> Fraction:
    """Bytes per element of an offloaded gradient partition on the host under ``profile``: 4
    where the implementation keeps it in fp32 (:data:`FP32_HOST_GRADIENTS`), else the gradients'
    own ``grads`` bytes."""
    return Fraction(4) if (profile or DEFAULT_MEMORY_PROFILE) in FP32_HOST_GRADIENTS else grads


@dataclass(frozen=True, slots=True)
class LayerKernels:
    """How a profile's transformer layer saves tensors for backward where implementations differ
    (:func:`placeverify.cost.activations.saved_tensors`)."""

    fused_swiglu: bool  # a gated MLP saves the fc1 output (gate and up) and the fc2 input: 3 f-wide
    eager_rmsnorm: bool  # RMSNorm as written in eager torch: an fp32 copy, the normalised input
    layernorm_stats: bool = False  # LayerNorm keeps its fp32 mean and rstd per token as well
    float_masks: bool = False  # dropout masks in the activation dtype, not 1 byte


# Korthikanti et al.'s list as placeverify generalises it (a gated MLP saves the gate, up,
# activation and product outputs: 4 f-wide; a norm its input): the per-tensor model of the
# measure backend (cost/implementations/activations.py) adds torch's norm extras to it itself.
GENERALISED = LayerKernels(fused_swiglu=False, eager_rmsnorm=False)

LAYER_KERNELS: dict[str, LayerKernels] = {
    # Megatron-core with --swiglu: bias_swiglu_fusion defaults on (training/arguments.py,
    # ``--no-bias-swiglu-fusion`` is ``store_false``; argument_utils.py sets
    # ``bias_activation_fusion = args.bias_swiglu_fusion``), so transformer/mlp.py calls
    # ``bias_swiglu_impl``, whose ``SwiGLUFunction`` / ``BiasSwiGLUFunction``
    # (fusions/fused_bias_swiglu.py) ``ctx.save_for_backward(input_for_backward)``: the fc1 output,
    # gate and up side by side (2 f-wide); linear_fc2 saves its input (1 f-wide): 3 in all. The
    # fused RMSNorm (Transformer Engine / Apex) keeps its input and a per-token rstd.
    "megatron": LayerKernels(fused_swiglu=True, eager_rmsnorm=False),
    # DeepSpeed ZeRO trains Hugging Face models as written (eager): transformers' LlamaMLP
    # ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` saves the gate output (SiLU's input), the
    # SiLU output and the up output (the product's operands) and the product (down_proj's input):
    # 4 f-wide; LlamaRMSNorm ``hidden_states.to(torch.float32)``, ``.pow(2)`` (saves the fp32
    # copy), ``* torch.rsqrt(...)`` (saves the rstd), ``self.weight * hidden_states.to(input_dtype)``
    # (saves the normalised input in the activation dtype); the bf16 input itself is not saved.
    "deepspeed": LayerKernels(fused_swiglu=False, eager_rmsnorm=True, layernorm_stats=True),
    # Megatron-DeepSpeed's layers (megatron/model/transformer.py of its forks): Apex's fused
    # LayerNorm (``MixedFusedLayerNorm``, which saves the input, mean and inverse variance), the
    # bias-GeLU fusion, and for --swiglu an eager ``F.silu(x[0]) * x[1]`` and an eager RMSNorm.
    "megatron_deepspeed": LayerKernels(fused_swiglu=False, eager_rmsnorm=True,
                                       layernorm_stats=True),
    # torch-native training of the same eager model (FSDP2, DDP, DTensor TP); ``layer_norm``
    # (``native_layer_norm``) saves its input, mean and rstd (fp32 per token), and CUDA's
    # ``native_dropout`` a bool mask.
    "torch": LayerKernels(fused_swiglu=False, eager_rmsnorm=True, layernorm_stats=True),
    # on CPU dropout is ``input * mask`` with a mask of the input's dtype (aten ``dropout``'s
    # non-fused path, ``_dropout_impl``: ``at::empty_like(input).bernoulli_(1 - p)``)
    "torch_cpu": LayerKernels(fused_swiglu=False, eager_rmsnorm=True, layernorm_stats=True,
                              float_masks=True),
}


def layer_kernels(profile: str | None) -> LayerKernels:
    """The layer kernels of a memory profile (None: the default, ``megatron``)."""
    return LAYER_KERNELS[profile or DEFAULT_MEMORY_PROFILE]
