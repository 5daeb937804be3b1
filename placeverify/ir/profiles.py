"""Implementation memory profiles: what an implementation holds beyond the placement's states at
its peak (``mesh { memory_profile = torch }``). The numbers they add are computed in
:mod:`placeverify.cost.peak`; each entry here says what the profile follows."""

from __future__ import annotations

MEMORY_PROFILES: dict[str, str] = {
    # Megatron-LM: gradients in persistent contiguous buffers (``main_grad``, DistributedDataParallel
    # ``param_and_grad_buffer.py``), reduced in place; the fused Adam of Apex / Transformer Engine
    # updates in place (no optimizer temporaries).
    "megatron": "Megatron-LM: persistent gradient buffers, fused in-place Adam",
    # DeepSpeed ZeRO (``runtime/zero/stage_1_and_2.py``): as Megatron, plus the fp32 gradient
    # partition of ZeRO-1/2 (``single_partition_of_fp32_groups`` grads, 4 bytes per element of the
    # partition) that DeepSpeed's own estimator counts.
    "deepspeed": "DeepSpeed ZeRO: plus the fp32 gradient partition of stages 1-2",
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
