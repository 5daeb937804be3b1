"""What each framework's mixed-precision setting means, as a ``precision`` line.

One place for the frameworks' policies (the dtypes themselves are :mod:`placeverify.ir.precision`'s):
torchtitan's ``maybe_enable_amp`` (``torchtitan/distributed/utils.py``: fully_shard's
MixedPrecisionPolicy under FSDP, torch.autocast for DDP or one device, fp32 with tensor or pipeline
parallelism and no FSDP) and accelerate's FSDP plugin (``set_mixed_precision``: param_dtype =
reduce_dtype = the mixed_precision dtype) or autocast. DeepSpeed's and Megatron-LM's lines are
their importers' (``communication_data_type``, ``--grad-reduce-in-bf16``).
"""

from __future__ import annotations

from placeverify.importers.common import Line, Reader
from placeverify.importers.origins import Value

TORCH_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def torchtitan(reader: Reader, param: Value, reduce: Value, *, fsdp: bool,
               model_parallel: bool) -> Line:
    """``[training] mixed_precision_param`` and ``mixed_precision_reduce`` (defaults bfloat16 and
    float32) under FSDP (a shard or context degree above 1, ``ParallelDims.fsdp_enabled``): fp32
    sharded Θ and G, the gather and compute in the param dtype, the reduce-scatter in the reduce
    dtype; DDP or one device autocasts to the param dtype; tensor or pipeline parallelism without
    FSDP trains in fp32 (torchtitan disables mixed precision there)."""
    dtypes: list[str] = []
    for value, default in ((param, "bf16"), (reduce, "fp32")):
        dtype = TORCH_DTYPES.get(str(value.value))
        if dtype is None:
            reader.error(f"{value.origin.key} is bfloat16, float16 or float32, not "
                         f"{value.value!r}", value.origin)
        dtypes.append(dtype or default)
    gather, reduced = dtypes
    if fsdp:
        text = ("precision torchtitan_bf16" if (gather, reduced) == ("bf16", "fp32") else
                f"precision {{ params = fp32, gather = {gather}, grads = fp32, reduce = {reduced}, "
                f"optimizer = 8, activations = {gather}, loss_scale = none }}")
        why = (f"{param.origin.key} {param.value}, {reduce.origin.key} {reduce.value}: FSDP2 "
               f"MixedPrecisionPolicy (fp32 sharded Θ and G, {gather} gather and compute, "
               f"{reduced} reduce-scatter), AdamW 8 B")
    elif model_parallel:
        text = "precision { params = fp32, grads = fp32, optimizer = 8, activations = fp32 }"
        why = "tensor or pipeline parallelism without FSDP: torchtitan trains in fp32 (maybe_enable_amp)"
    else:
        text = (f"precision {{ params = fp32, compute = {gather if gather != 'fp32' else 'tf32'}, "
                f"grads = fp32, optimizer = 8, activations = {gather}, loss_scale = none }}")
        why = f"{param.origin.key} {param.value}: DDP under torch.autocast, fp32 Θ and G, AdamW 8 B"
    return Line(text, why, param.origin)


def accelerate(act: str, kind: Value, mp: Value) -> Line:
    """accelerate's ``mixed_precision``: under FSDP the plugin's policy gathers, computes and
    reduces in the one dtype over fp32 sharded Θ and G; otherwise torch.autocast computes in it
    over fp32 Θ and G (the gradients are reduced in fp32). AdamW's 8 B of Ω either way."""
    scale = "dynamic" if act == "fp16" else "none"
    if act == "fp32":
        return Line("precision { params = fp32, grads = fp32, optimizer = 8, activations = fp32, "
                    "loss_scale = none }", f"mixed_precision {mp.value}: fp32 training", mp.origin)
    if kind.value == "FSDP":
        text = ("precision accelerate_fsdp_bf16" if act == "bf16" else
                f"precision {{ params = fp32, gather = {act}, grads = fp32, reduce = {act}, "
                f"optimizer = 8, activations = {act}, loss_scale = {scale} }}")
        return Line(text, f"mixed_precision {mp.value}: FSDP MixedPrecision param_dtype = "
                    f"reduce_dtype = {act} over fp32 sharded Θ and G, AdamW 8 B", mp.origin)
    return Line(f"precision {{ params = fp32, compute = {act}, grads = fp32, optimizer = 8, "
                f"activations = {act}, loss_scale = {scale} }}",
                f"mixed_precision {mp.value}: torch.autocast to {act} over fp32 Θ and G, AdamW",
                mp.origin)
