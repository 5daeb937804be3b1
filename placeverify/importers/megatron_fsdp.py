"""Megatron-FSDP (``--use-megatron-fsdp``, earlier ``--use-custom-fsdp``): Megatron-LM's own
fully sharded data parallelism, read from its flags (NVIDIA/Megatron-LM d98e8a6).

``megatron/training/arguments.py``: ``--data-parallel-sharding-strategy`` (default
optim_grads_params) shards the optimizer state (optim), also the gradients (optim_grads), also
the parameters (optim_grads_params), or nothing (no_shard); ``--outer-dp-sharding-strategy``
(default no_shard) is HSDP's outer replicas; Megatron-FSDP version 1 turns the distributed
optimizer on (lines 1118-1135). The mixed-precision buffers
(``megatron/core/distributed/distributed_data_parallel_config.py`` lines 188-212 and
``megatron_fsdp/param_and_grad_buffer.py`` ``_resolve_group_grad_dtype``):
``--megatron-fsdp-main-params-dtype`` fp32 by default (the optimizer's master weights),
``--megatron-fsdp-main-grads-dtype`` auto = the model's compute dtype (bf16 under --bf16: the
gradients are kept and reduced in bf16, unlike the distributed optimizer's fp32 main grads),
``--megatron-fsdp-grad-comm-dtype`` auto = the main gradients' dtype.
"""

from __future__ import annotations

from placeverify.diagnostics import Code
from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Line, Reader
from placeverify.importers.origins import Value

FLAGS = ("--use-megatron-fsdp", "--use-custom-fsdp")
# --data-parallel-sharding-strategy: the placement over dp
STRATEGIES = {"optim_grads_params": "zero3", "optim_grads": "zero2", "optim": "zero1",
              "no_shard": "ddp"}
DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def flag(args: Arguments) -> Value | None:
    """The flag that turns Megatron-FSDP on, if any."""
    for name in FLAGS:
        v = args.flag(name)
        if v is not None:
            return v
    return None


def placement(args: Arguments, reader: Reader, on: Value) -> Line:
    """``place zero3 | zero2 | zero1 | ddp over dp`` as --data-parallel-sharding-strategy says."""
    strategy = args.text("--data-parallel-sharding-strategy")
    word = "optim_grads_params" if strategy is None else str(strategy.value)
    preset = STRATEGIES.get(word)
    if preset is None:
        assert strategy is not None
        reader.error(f"--data-parallel-sharding-strategy is one of {', '.join(STRATEGIES)}, "
                     f"not {word!r}", strategy.origin)
        preset = "zero3"
    outer = args.text("--outer-dp-sharding-strategy")
    if outer is not None and outer.value != "no_shard":
        reader.error(f"not modelled: --outer-dp-sharding-strategy {outer.value} (the outer "
                     "replicas of Megatron-FSDP's HSDP sharding the optimizer state)",
                     outer.origin, code=Code.NOT_MODELLED)
    args.used.update({"--megatron-fsdp-version", "--fsdp-double-buffer",
                      "--suggested-communication-unit-size"})
    why = f"{on.origin.key}; --data-parallel-sharding-strategy {word}" + (
        " (default)" if strategy is None else "")
    return Line(f"place {preset} over dp", why, on.origin if strategy is None else strategy.origin)


def precision(args: Arguments, reader: Reader, half: str) -> Line:
    """The precision under --bf16 / --fp16 (``half``): fp32 master weights in the optimizer,
    the gradients kept and reduced in the main gradients' dtype."""
    main_params = args.text("--megatron-fsdp-main-params-dtype")
    if main_params is not None and main_params.value != "fp32":
        reader.error(f"not modelled: --megatron-fsdp-main-params-dtype {main_params.value} "
                     "(master weights other than fp32)", main_params.origin,
                     code=Code.NOT_MODELLED)
    grads_v = args.text("--megatron-fsdp-main-grads-dtype")
    grads = half if grads_v is None or grads_v.value == "auto" else DTYPES.get(str(grads_v.value))
    comm_v = args.text("--megatron-fsdp-grad-comm-dtype")
    comm = grads if comm_v is None or comm_v.value == "auto" else DTYPES.get(str(comm_v.value))
    if grads is None or comm is None:
        bad = grads_v if grads is None else comm_v
        assert bad is not None
        reader.error(f"{bad.origin.key} is fp32, bf16, fp16 or auto, not {bad.value!r}",
                     bad.origin)
        grads = comm = half
    scale = "dynamic" if half == "fp16" and args.text("--loss-scale") is None else (
        "static" if half == "fp16" else "none")
    reduce = f", reduce = {comm}" if comm != grads else ""
    keys = " ".join(v.origin.key for v in (grads_v, comm_v) if v is not None)
    why = (f"--{half} with Megatron-FSDP: {half} Θ, fp32 main params in the optimizer (12 B), "
           f"gradients in {grads}" + (f", reduced in {comm}" if reduce else "")
           + (f" ({keys})" if keys else " (main grads auto: the model's dtype)"))
    origin = (grads_v or comm_v or flag(args))
    return Line(f"precision {{ params = {half}, grads = {grads}, optimizer = 12, "
                f"activations = {half}, loss_scale = {scale}{reduce} }}", why,
                origin.origin if origin is not None else None)
