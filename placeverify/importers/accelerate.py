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

distributed_type DEEPSPEED is read as accelerate turns it into a DeepSpeed configuration, which
the DeepSpeed importer then reads (:func:`placeverify.importers.deepspeed.translate`). Without a
``deepspeed_config_file``, ``DeepSpeedPlugin.__post_init__`` (``utils/dataclasses.py``) builds
``{train_batch_size: "auto", train_micro_batch_size_per_gpu: "auto", gradient_accumulation_steps,
zero_optimization: {stage, offload_optimizer.device, offload_param.device}, gradient_clipping}``
from ``zero_stage`` (default 2), ``offload_{optimizer,param}_device`` (default none),
``gradient_accumulation_steps`` and ``gradient_clipping`` (default "auto"), which the launcher
passes on (``utils/launch.py``, ``prepare_deepspeed_cmd_env``); ``set_mixed_precision`` adds
``bf16.enabled`` for bf16 and fp8, ``fp16.enabled`` for fp16. With one, that JSON is the
configuration, and the keys above and ``mixed_precision`` beside it are refused
(``_deepspeed_config_checks``); a file without ``gradient_accumulation_steps`` gets 1. Either way
``Accelerator._prepare_deepspeed`` fills what is still "auto": the micro-batch from the
dataloader, ``train_batch_size`` = micro x accumulation x processes, the accumulation from
``Accelerator(gradient_accumulation_steps)`` and ``gradient_clipping`` with 1.0.
``parallelism_config_sp_size`` (ALST/Ulysses) counts in the world (``ParallelismConfig.total_size``).
"""

from __future__ import annotations

import os
from typing import Any

from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source, Span
from placeverify.importers import deepspeed, policies
from placeverify.importers.common import Keys, Line, Plan, Reader, leftovers, mesh_title
from placeverify.importers.hf_config import attach_model
from placeverify.importers.origins import Origin, Value
from placeverify.importers.yaml_nodes import Get, load_settings
from placeverify.syntax.source import read_source

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
SIZES = ("dp_replicate", "dp_shard", "tp", "cp", "sp")
PARALLELISM_READ = {f"parallelism_config_{k}_size" for k in SIZES}
# cp_backend has one value (torch); the sp_* keys configure ALST/Ulysses, refused when sp_size > 1
PARALLELISM_IGNORED = {"parallelism_config_cp_backend", "parallelism_config_sp_backend",
                       "parallelism_config_sp_seq_length",
                       "parallelism_config_sp_seq_length_is_variable",
                       "parallelism_config_sp_attn_implementation"}
PARALLELISM_KEYS = Keys(PARALLELISM_READ, PARALLELISM_IGNORED,
                        name=lambda key: f"parallelism_config.{key}")
KEYS = Keys(READ_TOP, IGNORED_TOP, {
    "fsdp_config": Keys(FSDP_READ, FSDP_IGNORED, name=lambda key: f"fsdp_config.{key}"),
    "parallelism_config": PARALLELISM_KEYS})
# deepspeed_config keys (commands/config/cluster.py writes them; launch.py passes them on)
DEEPSPEED_READ = {"zero_stage", "offload_optimizer_device", "offload_param_device",
                  "gradient_accumulation_steps", "gradient_clipping", "deepspeed_config_file"}
# Without effect on a training step: zero3_init_flag builds the model already partitioned
# (deepspeed.zero.Init: loading), zero3_save_16bit_model gathers weights when saving, the nvme
# paths say where nvme offload lives, the multinode launcher and host filters start processes,
# deepspeed_moe_layer_cls_names makes a MoE block one ZeRO-3 fetch unit (set_z3_leaf_modules).
DEEPSPEED_IGNORED = {"zero3_init_flag", "zero3_save_16bit_model", "offload_optimizer_nvme_path",
                     "offload_param_nvme_path", "deepspeed_multinode_launcher",
                     "deepspeed_hostfile", "deepspeed_exclusion_filter",
                     "deepspeed_inclusion_filter", "deepspeed_moe_layer_cls_names"}
# DeepSpeedPlugin._deepspeed_config_checks: refused beside a deepspeed_config_file
REFUSED_WITH_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                     "offload_optimizer_device", "offload_param_device",
                     "offload_param_nvme_path", "offload_optimizer_nvme_path",
                     "zero3_save_16bit_model")
DEEPSPEED_KEYS = Keys(READ_TOP, IGNORED_TOP, {
    "deepspeed_config": Keys(DEEPSPEED_READ, DEEPSPEED_IGNORED,
                             name=lambda key: f"deepspeed_config.{key}"),
    "parallelism_config": PARALLELISM_KEYS})
# The "auto" values Accelerator._prepare_deepspeed fills (None: the training script decides);
# a zero stage or offload device left "auto" gets DeepSpeedPlugin's defaults (fill_match).
FILLS: dict[tuple[str, ...], deepspeed.Fill] = {
    ("train_batch_size",): None,
    deepspeed.MICRO: None,
    ("gradient_accumulation_steps",): None,
    ("gradient_clipping",): (1.0, "1.0, accelerate's default"),
    ("zero_optimization", "stage"): (2, "2, accelerate's default"),
    ("zero_optimization", "offload_optimizer", "device"): ("none", "none, accelerate's default"),
    ("zero_optimization", "offload_param", "device"): ("none", "none, accelerate's default"),
}
FILLER = "accelerate fills it at launch from `accelerate launch` flags or the training script"
STRATEGIES = {"FULL_SHARD": "fsdp", "1": "fsdp", "SHARD_GRAD_OP": "fsdp(grad_op)",
              "2": "fsdp(grad_op)", "NO_SHARD": "ddp", "3": "ddp", "HYBRID_SHARD": "hsdp",
              "4": "hsdp"}


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    data, spans, get = load_settings(reader, source, "accelerate's yaml.safe_load")
    plan = Plan("accelerate", source.path)
    kind = get("distributed_type", default="NO")
    if kind.value not in ("DEEPSPEED", "FSDP", "MULTI_GPU", "NO"):
        reader.error(f"not modelled: distributed_type {kind.value}", kind.origin,
                     code=Code.NOT_MODELLED)
    world, world_line = _world(reader, get, world)
    sizes = {k: get("parallelism_config", f"parallelism_config_{k}_size", default=1)
             for k in SIZES}
    values = [_size(reader, sizes[k]) for k in SIZES]
    rep, shard, tp, cp, _ = (v or 1 for v in values)
    _check_parallelism(reader, source, data, spans, sizes, values, world)
    if kind.value == "DEEPSPEED":
        for name, size in (("dp_replicate", rep), ("tp", tp), ("cp", cp)):
            if size > 1:
                reader.error(f"not modelled: parallelism_config_{name}_size > 1 with "
                             "distributed_type DEEPSPEED (DeepSpeed's ZeRO spans every rank)",
                             sizes[name].origin, code=Code.NOT_MODELLED)
        return _deepspeed(reader, source, data, spans, get, plan, model, world, world_line)
    section = data.get("deepspeed_config")
    if isinstance(section, dict) and section:
        reader.warning(f"deepspeed_config has no effect with distributed_type {kind.value}",
                       get("deepspeed_config").origin, code=Code.CONFLICT)
    if not (isinstance(data.get("parallelism_config"), dict) and data["parallelism_config"]):
        shard = world if kind.value == "FSDP" else 1
        rep = world if kind.value != "FSDP" else 1
    preset, why, origin = _data_preset(reader, get, kind)
    if tp > 1:
        plan.mesh.append(Line(f"tp = {tp}", "parallelism_config_tp_size", sizes["tp"].origin))
        plan.body.append(Line("place megatron(sequence_parallel) over tp",
                              "parallelism_config_tp_size", sizes["tp"].origin))
    if cp > 1:
        plan.mesh.append(Line(f"cp = {cp}", "parallelism_config_cp_size", sizes["cp"].origin))
        plan.body.append(Line("place context over cp", "parallelism_config_cp_size",
                              sizes["cp"].origin))
    _data_placements(plan, sizes, rep, shard, cp, preset, why, origin)
    plan.mesh.append(world_line)
    _training(reader, plan, get, model, kind)
    leftovers(reader, plan, source, data, spans, ((), KEYS))
    plan.title = mesh_title(plan, source, f"accelerate {kind.value}")
    return plan


def _data_placements(plan: Plan, sizes: dict[str, Value], rep: int, shard: int, cp: int,
                     preset: str, why: str, origin: Origin | None) -> None:
    """The data axes and FSDP's placement over them. FSDP2 shards over the flattened
    ``dp_shard_cp`` mesh when cp > 1 (accelerate src/accelerate/parallelism_config.py:136-143,
    ``dp_shard_cp_dim_names``: dp_shard and cp; :158-164, ``fsdp_dim_names``: dp_replicate, if
    enabled, then dp_shard_cp; :239-240 flattens it; utils/fsdp_utils.py:770 passes
    ``mesh[fsdp_dim_names]`` to fully_shard, at 16cb6eb): ``fsdp over dp * cp``, and with
    dp_replicate HSDP over (dp_replicate, dp_shard_cp): ``fsdp over shard * cp`` with ``ddp
    over replica``."""
    flat = " * cp" if cp > 1 else ""
    if rep > 1 and shard > 1:
        plan.mesh += [Line(f"shard = {shard}", sizes["dp_shard"].origin.key, sizes["dp_shard"].origin),
                      Line(f"replica = {rep}", sizes["dp_replicate"].origin.key,
                           sizes["dp_replicate"].origin)]
        if cp > 1:  # hsdp places two axes: the shard group (dp_shard_cp) and the replicas
            plan.body.append(Line("place fsdp over shard * cp", why + "; FSDP2 shards over "
                                  "dp_shard x cp (dp_shard_cp)", origin))
            plan.body.append(Line("place ddp over replica", why + "; replicated over "
                                  "dp_replicate", origin))
        else:
            plan.body.append(Line("place hsdp over shard * replica", why, origin))
        return
    plan.mesh.append(Line(f"dp = {rep * shard}", "num_processes / (tp x cp)"))
    placed = "ddp" if preset == "hsdp" else preset
    if placed != "ddp" and flat:
        why += "; FSDP2 shards over dp_shard x cp (dp_shard_cp)"
    plan.body.append(Line(f"place {placed} over dp{flat if placed != 'ddp' else ''}", why,
                          origin))


def _world(reader: Reader, get: Get, world: int | None) -> tuple[int, Line]:
    """The world: num_processes (all processes of the job), else --world."""
    world_line: Line | None = None
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
    assert world_line is not None
    return world, world_line


def _check_parallelism(reader: Reader, source: Source, data: dict[str, Any],
                       spans: dict[tuple[str, ...], Span], sizes: dict[str, Value],
                       values: list[int | None], world: int) -> None:
    """ParallelismConfig's checks of its sizes, and the sequence parallelism not modelled."""
    rep, shard, tp, cp, sp = (v or 1 for v in values)
    if isinstance(data.get("parallelism_config"), dict) and data["parallelism_config"]:
        # ParallelismConfig.total_size; _validate_accelerator skips the check for DeepSpeed's
        # sequence parallelism (sp > 1), refused below
        if rep * shard * tp * cp * sp != world and sp == 1 and None not in values:
            reader.error(f"dp_replicate {rep} x dp_shard {shard} x tp {tp} x cp {cp} x sp {sp} != "
                         f"num_processes {world}", Origin("parallelism_config", source,
                                                          spans.get(("parallelism_config",))),
                         code=Code.WORLD_MISMATCH)
        if rep > 1 and shard == 1:
            reader.error("dp_replicate_size > 1 with dp_shard_size 1 is refused by accelerate "
                         "(ParallelismConfig)", sizes["dp_replicate"].origin, code=Code.CONFLICT)
    if sp > 1:
        reader.error("not modelled: parallelism_config_sp_size > 1 (ALST/Ulysses sequence "
                     "parallelism, DeepSpeed's sequence_parallel_size)", sizes["sp"].origin,
                     code=Code.NOT_MODELLED)


def _data_preset(reader: Reader, get: Get, kind: Value) -> tuple[str, str, Origin]:
    """The data axis's preset, why, and the key it comes from: FSDP's sharding strategy (or
    fsdp_reshard_after_forward under FSDP2), else DDP."""
    strategy = get("fsdp_config", "fsdp_sharding_strategy", default="FULL_SHARD")
    version = get("fsdp_config", "fsdp_version", default=1)
    reshard = get("fsdp_config", "fsdp_reshard_after_forward")
    preset = "ddp"
    why, origin = f"distributed_type {kind.value}", kind.origin
    if version.value not in (1, 2, "1", "2"):  # FullyShardedDataParallelPlugin: 1 or 2
        reader.error(f"fsdp_config.fsdp_version is 1 or 2, not {version.value!r}", version.origin)
        reader.raise_if_errors()
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
    return preset, why, origin


def _training(reader: Reader, plan: Plan, get: Get, model: str | None, kind: Value) -> None:
    """The precision (mixed_precision: the compute dtype), the model, the loss, the
    recomputation and the offload; what the training script decides is named in a warning."""
    mp = get("mixed_precision", default="no")
    act = {"bf16": "bf16", "fp16": "fp16", "no": "fp32", "fp8": "bf16"}.get(str(mp.value))
    if act is None:
        reader.error(f"mixed_precision is no, fp16 or bf16, not {mp.value!r}", mp.origin)
        act = "fp32"
    plan.precision = policies.accelerate(act, kind, mp)
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


def _size(reader: Reader, size: Value) -> int | None:
    """A parallelism_config size: a whole number >= 1 (ParallelismConfig refuses less); None,
    after an error at the key, for anything else."""
    value = size.value
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        reader.error(f"{size.origin.key} must be a whole number >= 1, not {size.value!r}",
                     size.origin)
        return None
    return value


def _deepspeed(reader: Reader, source: Source, data: dict[str, Any],
               spans: dict[tuple[str, ...], Span], get: Get, plan: Plan, model: str | None,
               world: int, world_line: Line) -> Plan:
    """distributed_type DEEPSPEED: the DeepSpeed configuration accelerate hands the engine, read
    by the DeepSpeed importer."""
    kind = get("distributed_type")
    launch = deepspeed.Launch(world, world_line.why, world_line.origin, FILLER, FILLS,
                              "an accelerate config")
    section = data.get("deepspeed_config")
    given = section if isinstance(section, dict) else {}
    file = get("deepspeed_config", "deepspeed_config_file")
    mp = get("mixed_precision", default="no")
    fsdp = data.get("fsdp_config")
    if isinstance(fsdp, dict) and fsdp:
        reader.warning("fsdp_config has no effect with distributed_type DEEPSPEED",
                       get("fsdp_config").origin, code=Code.CONFLICT)
    if file.value is not None and str(file.value).lower() != "none":
        for key in given:  # in the file's order
            if key in REFUSED_WITH_FILE:
                reader.error(f"deepspeed_config.{key} beside deepspeed_config_file: accelerate "
                             "refuses it (DeepSpeedPlugin); set it in the DeepSpeed JSON",
                             get("deepspeed_config", key).origin, code=Code.CONFLICT)
        if "mixed_precision" in data:
            reader.error("mixed_precision beside deepspeed_config_file: accelerate refuses it "
                         "(DeepSpeedPlugin); set bf16 or fp16 in the DeepSpeed JSON", mp.origin,
                         code=Code.CONFLICT)
        reader.raise_if_errors()
        json_source = _json_source(file, source)
        doc = deepspeed.Config.load(reader, json_source, launch)
        if "zero_optimization" not in doc.data:
            reader.error("accelerate refuses a DeepSpeed JSON without zero_optimization "
                         "(DeepSpeedPlugin)", Origin("zero_optimization", json_source),
                         code=Code.MISSING)
        doc.data.setdefault("gradient_accumulation_steps", 1)  # as DeepSpeedPlugin does
    else:
        doc = _inline(reader, source, get, given, mp, launch)
    stage = deepspeed.translate(doc, plan, model)
    plan.framework = "deepspeed"
    _assumed(reader, doc, kind.origin)
    leftovers(reader, plan, source, data, spans, ((), DEEPSPEED_KEYS))
    if doc.source is not source:
        leftovers(reader, plan, doc.source, doc.data, doc.spans, ((), deepspeed.KEYS),
                  (("zero_optimization",), deepspeed.ZERO_KEYS))
    plan.title = f"{os.path.basename(source.path)}: accelerate DeepSpeed ZeRO-{stage}, dp = {world}"
    return plan


def _json_source(file: Value, yaml: Source) -> Source:
    """The DeepSpeed JSON a deepspeed_config_file names, relative to the YAML's folder (accelerate
    opens it from the folder it is launched in); an unreadable one is an error at the key."""
    name = str(file.value)
    path = os.path.normpath(os.path.join(os.path.dirname(yaml.path), name))
    try:
        return read_source(path)
    except PlaceError as error:
        if error.exit_code is not ExitCode.READ_ERROR:
            raise
        why = error.diagnostics[0].message if error.diagnostics else "cannot read file"
        raise PlaceError([Diagnostic(
            Severity.ERROR, f"deepspeed_config_file {name}: {why} ({path}, relative to this "
            "file's folder)", Code.READ, file.origin.span)], yaml, ExitCode.READ_ERROR) from None


def _inline(reader: Reader, source: Source, get: Get, given: dict[str, Any], mp: Value,
            launch: deepspeed.Launch) -> deepspeed.Config:
    """The DeepSpeed configuration DeepSpeedPlugin builds from deepspeed_config's keys (the
    launcher passes them as text, which the plugin reads back as numbers), each DeepSpeed key
    named and placed at the accelerate key it comes from."""
    names: dict[tuple[str, ...], str] = {}
    where: dict[tuple[str, ...], Span] = {}

    def take(key: str, path: tuple[str, ...], default: Any) -> Any:
        v = get("deepspeed_config", key, default=default)
        names[path] = v.origin.key
        if v.origin.span is not None:
            where[path] = v.origin.span
        if isinstance(v.value, str) and v.value.isdigit():
            return int(v.value)
        return v.value

    stage = take("zero_stage", ("zero_optimization", "stage"), 2)
    optimizer = take("offload_optimizer_device", ("zero_optimization", "offload_optimizer",
                                                  "device"), "none")
    params = take("offload_param_device", ("zero_optimization", "offload_param", "device"), "none")
    accumulation = take("gradient_accumulation_steps", ("gradient_accumulation_steps",), "auto")
    clip = take("gradient_clipping", ("gradient_clipping",), "auto")
    config: dict[str, Any] = {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": {"stage": stage,
                              "offload_optimizer": {"device": str(optimizer).lower()},
                              "offload_param": {"device": str(params).lower()}}}
    if clip != "auto":
        try:
            clip = float(clip)
        except (TypeError, ValueError):
            reader.error(f"deepspeed_config.gradient_clipping is a number, not {clip!r}",
                         get("deepspeed_config", "gradient_clipping").origin)
            clip = 0.0
    if clip:  # DeepSpeedPlugin leaves 0 out: DeepSpeed's default, no clipping
        config["gradient_clipping"] = clip
    precision = str(mp.value).lower()
    if precision not in ("no", "fp16", "bf16", "fp8"):
        reader.error(f"mixed_precision is no, fp16, bf16 or fp8, not {mp.value!r}", mp.origin)
    if precision == "fp8":
        reader.warning("not modelled: mixed_precision fp8 with DeepSpeed runs bf16 autocast with "
                       "fp8 matrix multiplications (Transformer Engine or MS-AMP); modelled as "
                       "bf16", mp.origin)
    config["fp16"] = {"enabled": precision == "fp16"}
    config["bf16"] = {"enabled": precision in ("bf16", "fp8")}
    for path in (("fp16", "enabled"), ("bf16", "enabled")):
        names[path] = mp.origin.key
        if mp.origin.span is not None:
            where[path] = mp.origin.span
    names[("train_batch_size",)] = "train_batch_size (accelerate)"
    names[deepspeed.MICRO] = "train_micro_batch_size_per_gpu (accelerate)"
    return deepspeed.Config(reader, source, config, where, launch, names)


def _assumed(reader: Reader, doc: deepspeed.Config, at: Origin) -> None:
    """The warning that names what the launcher or the training script decides: the values
    assumed for the "auto" keys accelerate fills."""
    assumed = []
    train, micro = doc.get("train_batch_size"), doc.get(*deepspeed.MICRO)
    if deepspeed.MICRO in doc.filled and train is None:
        assumed.append(("batch size", "micro_batch = 1"))
    # with both batch sizes given, the accumulation is derived from them (translate)
    if ("gradient_accumulation_steps",) in doc.filled and (train is None or micro is None):
        assumed.append(("gradient accumulation", "no accumulation"))
    if ("gradient_clipping",) in doc.filled:
        assumed.append(("clipping", "max_norm 1.0 (accelerate's default)"))
    if not assumed:
        return
    subjects = [s for s, _ in assumed]
    subject = (subjects[0] if len(subjects) == 1 else
               ", ".join(subjects[:-1]) + " and " + subjects[-1])
    first = doc.filled.get(deepspeed.MICRO)
    where = first if first is not None and first.span is not None else at
    reader.warning(f"{subject} {'is' if len(assumed) == 1 else 'are'} set in the training script "
                   "or by `accelerate launch` (\"auto\"), not in this configuration: "
                   + ", ".join(a for _, a in assumed) + " assumed", where, code=Code.MISSING)
