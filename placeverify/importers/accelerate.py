"""An accelerate config YAML (huggingface/accelerate).

Keys: ``src/accelerate/commands/config/config_args.py`` (distributed_type, mixed_precision,
num_processes: all processes of the job, num_machines, fsdp_config, deepspeed_config,
parallelism_config), ``commands/launch.py`` (fsdp_config keys are ``fsdp_*``; parallelism_config
keys are ``parallelism_config_{dp_replicate,dp_shard,tp,cp}_size``), ``utils/dataclasses.py``
(FullyShardedDataParallelPlugin: fsdp_version, fsdp_sharding_strategy FULL_SHARD |
SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD, fsdp_reshard_after_forward, fsdp_offload_params,
fsdp_activation_checkpointing) and ``src/accelerate/parallelism_config.py`` (mesh order
dp_replicate, dp_shard, cp, sp, tp outermost first; dp_replicate > 1 with dp_shard = 1 is
refused). Batch size, sequence length and gradient accumulation live in the training script,
not in this file. FSDP and DDP keep fp32 parameters, gradients and AdamW state; mixed_precision
sets the compute (activation) dtype.
"""

from __future__ import annotations

from typing import Any

from placeverify.diagnostics import Code, Source
from placeverify.importers.common import (
    Keys,
    Line,
    Origin,
    Plan,
    Reader,
    Value,
    leftovers,
    mesh_title,
)
from placeverify.importers.hf_config import attach_model
from placeverify.importers.positions import load_yaml

READ_TOP = {"distributed_type", "mixed_precision", "num_processes", "num_machines",
            "fsdp_config", "parallelism_config", "deepspeed_config"}
IGNORED_TOP = {"compute_environment", "debug", "downcast_bf16", "enable_cpu_affinity",
               "machine_rank", "main_training_function", "rdzv_backend", "same_network",
               "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "gpu_ids",
               "main_process_ip", "main_process_port", "dynamo_config"}
FSDP_READ = {"fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward",
             "fsdp_offload_params", "fsdp_activation_checkpointing"}
FSDP_IGNORED = {"fsdp_auto_wrap_policy", "fsdp_backward_prefetch", "fsdp_cpu_ram_efficient_loading",
                "fsdp_forward_prefetch", "fsdp_state_dict_type", "fsdp_sync_module_states",
                "fsdp_use_orig_params", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params"}
KEYS = Keys(READ_TOP, IGNORED_TOP, {
    "fsdp_config": Keys(FSDP_READ, FSDP_IGNORED, name=lambda key: f"fsdp_config.{key}")})
STRATEGIES = {"FULL_SHARD": "fsdp", "1": "fsdp", "SHARD_GRAD_OP": "fsdp(grad_op)",
              "2": "fsdp(grad_op)", "NO_SHARD": "ddp", "3": "ddp", "HYBRID_SHARD": "hsdp",
              "4": "hsdp"}


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    data, spans = load_yaml(source)
    plan = Plan("accelerate", source.path)

    def get(*path: str, default: Any = None) -> Value:
        node: Any = data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return Value(default, Origin(".".join(path) + " (default)", source))
        return Value(node, Origin(".".join(path), source, spans.get(path)))

    kind = get("distributed_type", default="NO")
    if kind.value == "DEEPSPEED":
        reader.error("distributed_type DEEPSPEED: import the DeepSpeed JSON itself "
                     "(deepspeed_config.deepspeed_config_file) with --world", kind.origin,
                     code=Code.NOT_MODELLED)
    elif kind.value not in ("FSDP", "MULTI_GPU", "NO"):
        reader.error(f"not modelled: distributed_type {kind.value}", kind.origin,
                     code=Code.NOT_MODELLED)
    procs = get("num_processes", default=-1)
    if isinstance(procs.value, int) and procs.value > 0:
        if world is not None and world != procs.value:
            reader.error(f"--world {world} contradicts num_processes {procs.value}", procs.origin,
                         code=Code.WORLD_MISMATCH)
        world = procs.value
        world_line = Line(f"world = {world}", "num_processes", procs.origin)
    elif world is not None:
        world_line = Line(f"world = {world}", "--world (placeverify option)")
    else:
        reader.error("world size unknown: no num_processes; pass --world N", None,
                     code=Code.MISSING)
    reader.raise_if_errors()
    assert world is not None

    sizes = {k: get("parallelism_config", f"parallelism_config_{k}_size", default=1)
             for k in ("dp_replicate", "dp_shard", "tp", "cp")}
    rep, shard, tp, cp = (int(sizes[k].value) for k in ("dp_replicate", "dp_shard", "tp", "cp"))
    if isinstance(data.get("parallelism_config"), dict) and data["parallelism_config"]:
        if rep * shard * tp * cp != world:
            reader.error(f"dp_replicate {rep} x dp_shard {shard} x tp {tp} x cp {cp} != "
                         f"num_processes {world}", Origin("parallelism_config", source,
                                                          spans.get(("parallelism_config",))),
                         code=Code.WORLD_MISMATCH)
        if rep > 1 and shard == 1:
            reader.error("dp_replicate_size > 1 with dp_shard_size 1 is refused by accelerate "
                         "(ParallelismConfig)", sizes["dp_replicate"].origin, code=Code.CONFLICT)
    else:
        shard = world if kind.value == "FSDP" else 1
        rep = world if kind.value != "FSDP" else 1
    strategy = get("fsdp_config", "fsdp_sharding_strategy", default="FULL_SHARD")
    version = get("fsdp_config", "fsdp_version", default=1)
    reshard = get("fsdp_config", "fsdp_reshard_after_forward")
    preset = "ddp"
    why, origin = f"distributed_type {kind.value}", kind.origin
    if kind.value == "FSDP":
        if reshard.value is not None and int(version.value) == 2:
            preset = "fsdp" if reshard.value is True else "fsdp(grad_op)"
            why, origin = f"fsdp_version 2, fsdp_reshard_after_forward {reshard.value}", reshard.origin
        else:
            text = str(reshard.value if reshard.value is not None else strategy.value)
            found = STRATEGIES.get(text.upper())
            if found is None:
                reader.error(f"not modelled: FSDP sharding strategy {text}", strategy.origin,
                             code=Code.NOT_MODELLED)
                found = "fsdp"
            preset = found
            why, origin = f"fsdp_sharding_strategy {text}", (reshard if reshard.value is not None
                                                            else strategy).origin
    if tp > 1:
        plan.mesh.append(Line(f"tp = {tp}", "parallelism_config_tp_size", sizes["tp"].origin))
        plan.body.append(Line("place megatron(sequence_parallel) over tp",
                              "parallelism_config_tp_size", sizes["tp"].origin))
    if cp > 1:
        plan.mesh.append(Line(f"cp = {cp}", "parallelism_config_cp_size", sizes["cp"].origin))
        plan.body.append(Line("place context over cp", "parallelism_config_cp_size",
                              sizes["cp"].origin))
    if rep > 1 and shard > 1:
        plan.mesh += [Line(f"shard = {shard}", sizes["dp_shard"].origin.key, sizes["dp_shard"].origin),
                      Line(f"replica = {rep}", sizes["dp_replicate"].origin.key,
                           sizes["dp_replicate"].origin)]
        plan.body.append(Line("place hsdp over shard * replica", why, origin))
    else:
        plan.mesh.append(Line(f"dp = {rep * shard}", "num_processes / (tp x cp)"))
        plan.body.append(Line(f"place {'ddp' if preset == 'hsdp' else preset} over dp", why, origin))
    plan.mesh.append(world_line)

    mp = get("mixed_precision", default="no")
    act = {"bf16": "bf16", "fp16": "fp16", "no": "fp32", "fp8": "bf16"}.get(str(mp.value))
    if act is None:
        reader.error(f"mixed_precision is no, fp16 or bf16, not {mp.value!r}", mp.origin)
        act = "fp32"
    scale = "dynamic" if act == "fp16" else "none"
    plan.precision = Line(f"precision {{ params = fp32, grads = fp32, optimizer = 8, "
                          f"activations = {act}, loss_scale = {scale} }}",
                          f"mixed_precision {mp.value}: fp32 Θ, G, AdamW; {act} compute",
                          mp.origin)
    attach_model(plan, reader, model, None, None, None, "an accelerate config")
    plan.body.append(Line("loss microbatch_mean", "accelerate divides each micro-batch's loss by "
                          "gradient_accumulation_steps"))
    ac = get("fsdp_config", "fsdp_activation_checkpointing", default=False)
    if ac.value is True:
        plan.body.append(Line("recompute full", ac.origin.key, ac.origin))
    offload = get("fsdp_config", "fsdp_offload_params", default=False)
    if offload.value is True:
        plan.body.append(Line("offload optimizer, gradients, params to cpu", offload.origin.key,
                              offload.origin))
    reader.warning("batch size, gradient accumulation and clipping are set in the training "
                   "script, not in an accelerate config: micro_batch = 1, no accumulation, no "
                   "clipping assumed", kind.origin, code=Code.MISSING)
    leftovers(reader, plan, source, data, spans, ((), KEYS))
    plan.title = mesh_title(plan, source, f"accelerate {kind.value}")
    return plan

