"""A DeepSpeed JSON configuration (deepspeedai/DeepSpeed).

Keys and rules: ``deepspeed/runtime/constants.py`` (train_batch_size,
train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping,
prescale_gradients, gradient_predivide_factor, gradient_allreduce_op mean|sum),
``deepspeed/runtime/config.py`` (``_batch_assertion``: train = micro x accumulation x world,
where world is the data-parallel size, world / sequence_parallel_size without an mpu;
``_set_batch_related_parameters`` derives a missing one; bf16 and fp16 cannot both be enabled),
``deepspeed/runtime/zero/config.py`` (zero_optimization.stage 0-3, offload_optimizer,
offload_param, zero_hpz_partition_size, mics_shard_size) and ``zero/offload_config.py``
(device none|cpu|nvme). The pipeline lives in code (PipelineModule), not in the JSON: the whole
world is one data-parallel axis. The engine scales each micro-batch's loss by
1 / gradient_accumulation_steps and averages gradients over dp (gradient_allreduce_op mean).

:func:`translate` reads a :class:`Config` under a :class:`Launch` (the world, and the "auto"
values the launcher fills): a JSON file here, and the configuration accelerate builds or names
(``importers/accelerate.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placeverify.diagnostics import Code, Severity, Source, Span
from placeverify.importers.common import Keys, Line, Plan, Reader, leftovers
from placeverify.importers.hf_config import attach_model
from placeverify.importers.origins import Origin, Value
from placeverify.importers.positions import load_json, syntax_error
from placeverify.importers.rules import Facts, Rule, batch_rule, reads_placement

TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
       "zero_optimization", "bf16", "bfloat16", "fp16", "gradient_clipping", "optimizer",
       "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op",
       "sequence_parallel_size", "activation_checkpointing", "seq_parallel_communication_data_type",
       "communication_data_type"}
IGNORED_TOP = {"steps_per_print", "wall_clock_breakdown", "scheduler", "zero_allow_untested_optimizer",
               "tensorboard", "wandb", "csv_monitor", "comms_logger", "flops_profiler",
               "dump_state", "checkpoint", "dataloader_drop_last", "memory_breakdown",
               "zero_force_ds_cpu_optimizer", "gradient_accumulation_dtype"}
ZERO_READ = {"stage", "offload_optimizer", "offload_param", "mics_shard_size",
             "zero_hpz_partition_size", "overlap_comm"}
ZERO_IGNORED = {"contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
                "allgather_partitions", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold", "stage3_max_live_parameters",
                "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
                "sub_group_size", "round_robin_gradients", "elastic_checkpoint",
                "load_from_fp32_weights", "ignore_unused_parameters"}
MICRO = ("train_micro_batch_size_per_gpu",)
KEYS = Keys(TOP, IGNORED_TOP, unknown=lambda key: f"not modelled: DeepSpeed key '{key}'")
ZERO_KEYS = Keys(ZERO_READ, ZERO_IGNORED, name=lambda key: f"zero_optimization.{key}")


KeyPath = tuple[str, ...]
Fill = tuple[Any, str] | None  # an "auto" a launcher fills: (value, why), or None: left unset


@dataclass(frozen=True)
class Launch:
    """What the program that starts the engine decides around a DeepSpeed configuration: the
    world size and where it comes from, and the ``"auto"`` values it fills in. DeepSpeed itself
    takes no ``"auto"``; transformers' Trainer and accelerate replace them before
    ``deepspeed.initialize``. ``fills`` maps a key to what the launcher puts there (None: a value
    the training script decides, left unset here); any other ``"auto"`` is an error that says
    ``filler``."""

    world: int
    world_why: str = "--world (placeverify option)"
    world_origin: Origin | None = None
    filler: str = "transformers' Trainer fills it at launch"
    fills: Mapping[KeyPath, Fill] = field(default_factory=dict)
    what: str = "a DeepSpeed JSON"  # the file, as messages name it
    hints: Mapping[KeyPath, str] = field(default_factory=dict)  # the --set that gives an "auto"
    seq: Value | None = None  # the sequence length, where the launcher's configuration gives it


class Config:
    """A DeepSpeed configuration as the engine would receive it: the JSON object, where each key
    is written (``spans``) and how messages name it (``names``: by default its dotted path; an
    importer that builds the object from other keys names those)."""

    def __init__(self, reader: Reader, source: Source, data: dict[str, Any],
                 spans: Mapping[KeyPath, Span], launch: Launch,
                 names: Mapping[KeyPath, str] | None = None) -> None:
        self.reader, self.source, self.data, self.spans = reader, source, data, spans
        self.launch = launch
        self.names: Mapping[KeyPath, str] = names or {}
        self.filled: dict[KeyPath, Origin] = {}  # the "auto" values the launcher filled, by key

    @staticmethod
    def load(reader: Reader, source: Source, launch: Launch) -> Config:
        """The configuration of a DeepSpeed JSON file."""
        data, spans = _object(source)
        return Config(reader, source, data, spans, launch)

    def origin(self, *path: str) -> Origin:
        return Origin(self.names.get(path, ".".join(path)), self.source, self.spans.get(path))

    def get(self, *path: str) -> Value | None:
        node: Any = self.data
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        origin = self.origin(*path)
        if node == "auto":
            if path in self.launch.fills:
                self.filled[path] = origin
                fill = self.launch.fills[path]
                return None if fill is None else Value(fill[0], Origin(
                    f'{origin.key} "auto": {fill[1]}', origin.source, origin.span))
            hint = self.launch.hints.get(path)
            self.reader.error(f'{origin.key} is "auto": {self.launch.filler}; write the value'
                              + (f" or give it with --set {hint}" if hint else ""),
                              origin, code=Code.NOT_STATIC)
            return None
        return Value(node, origin)

    def integer(self, *path: str, low: int = 1) -> Value | None:
        v = self.get(*path)
        if v is None:
            return None
        if isinstance(v.value, bool) or not isinstance(v.value, int) or v.value < low:
            self.reader.error(f"{v.origin.key} must be a whole number >= {low}, not {v.value!r}",
                              v.origin)
            return None
        return v


def _object(source: Source) -> tuple[dict[str, Any], dict[KeyPath, Span]]:
    data, spans = load_json(source)
    if not isinstance(data, dict):
        raise syntax_error(source, "a DeepSpeed configuration is a JSON object", None)
    return data, spans


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    plan = Plan("deepspeed", source.path)
    data, spans = _object(source)
    if world is None:
        reader.error("world size unknown: a DeepSpeed JSON leaves it to the launcher; pass "
                     "--world N", None, code=Code.MISSING)
        reader.raise_if_errors()
    assert world is not None
    doc = Config(reader, source, data, spans, trainer_launch(world, reader.given))
    stage = translate(doc, plan, model)
    plan.title = f"{Path(source.path).name}: DeepSpeed ZeRO-{stage}, dp = {world}"
    # The top level first, then zero_optimization's keys (each in turn, not where they stand).
    leftovers(reader, plan, source, doc.data, doc.spans, ((), KEYS),
              (("zero_optimization",), ZERO_KEYS))
    return plan


# transformers' Trainer fills a DeepSpeed JSON's "auto" values from TrainingArguments at launch
# (transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process):
# train_batch_size = world x micro x accumulation, derived here as DeepSpeed derives a missing one;
# the others come from the training script, so an override must give them (KEY=VALUE as --set
# names it, and the placeholder the import writes for the override to replace).
TRAINER_GIVEN: dict[KeyPath, tuple[str, Any]] = {
    MICRO: ("model.micro_batch", 1), ("gradient_accumulation_steps",): ("microbatches", 1),
    ("bf16", "enabled"): ("precision", False), ("bfloat16", "enabled"): ("precision", False),
    ("fp16", "enabled"): ("precision", False), ("gradient_clipping",): ("clip.max_norm", 1.0),
}


def trainer_launch(world: int, given: frozenset[str]) -> Launch:
    """A standalone DeepSpeed JSON's launch: "auto" values are what transformers' Trainer fills,
    each accepted where an override gives it (``given``, :attr:`Options.given`)."""
    fills: dict[KeyPath, Fill] = {("train_batch_size",): None}
    for path, (key, placeholder) in TRAINER_GIVEN.items():
        if key in given:
            fills[path] = (placeholder, f"given by --set {key}")
    return Launch(world, fills=fills,
                  hints={path: f"{key}=..." for path, (key, _) in TRAINER_GIVEN.items()})


def translate(doc: Config, plan: Plan, model: str | None) -> int:
    """Fill ``plan`` with what a DeepSpeed configuration means (model, precision, mesh, ZeRO
    stage, micro-batches, loss, clipping, offload) and give its ZeRO stage; the title and the
    leftover keys are the caller's, who knows the file."""
    _sequence_parallel(doc)
    ga, acc, micro_value = _batch(doc, plan)
    attach_model(plan, doc.reader, model, doc.launch.seq, micro_value, None, doc.launch.what)
    plan.precision = precision_line(doc)
    stage = _zero(doc, plan)
    _accumulation_loss_clip(doc, plan, ga, acc)
    _offload(doc, plan, stage)
    return stage


def _sequence_parallel(doc: Config) -> None:
    """DeepSpeed-Ulysses (sequence_parallel_size > 1) is not modelled."""
    reader = doc.reader
    sp = doc.integer("sequence_parallel_size")
    if sp is not None and sp.value != 1:
        reader.error("not modelled: sequence_parallel_size > 1 (DeepSpeed-Ulysses)", sp.origin,
                     code=Code.NOT_MODELLED)
    ulysses = doc.get("seq_parallel_communication_data_type")
    if ulysses is not None:  # runtime/constants.py: the dtype of DeepSpeed-Ulysses' all-to-alls
        reader.warning("not modelled: seq_parallel_communication_data_type is for DeepSpeed-Ulysses "
                       "sequence parallelism, whose size the training script sets (an mpu, or "
                       "accelerate's ParallelismConfig(sp_size)); none assumed", ulysses.origin)


def _batch(doc: Config, plan: Plan) -> tuple[int | None, Value | None, Value | None]:
    """The accumulation steps, the key that gives them, and the micro-batch: train = micro x
    accumulation x world, a missing one derived (DeepSpeedConfig._set_batch_related_parameters
    and _batch_assertion)."""
    reader, source, world = doc.reader, doc.source, doc.launch.world
    train = doc.integer("train_batch_size")
    micro = doc.integer("train_micro_batch_size_per_gpu")
    acc = doc.integer("gradient_accumulation_steps")
    t = None if train is None else int(train.value)
    mb = None if micro is None else int(micro.value)
    ga = None if acc is None else int(acc.value)
    micro_value = micro
    # A missing one is derived as _set_batch_related_parameters does (rounded down, at least 1);
    # the rule train = micro x accumulation x world is judged on the final values (rules.py).
    if t is not None and mb is not None and ga is None:
        ga = max(1, t // (mb * world))
    elif t is not None and mb is None:
        ga = ga or 1
        mb = max(1, t // (world * ga))
    elif mb is not None:
        ga = ga or 1
    elif MICRO in doc.filled:  # the launcher gives the dataloader's batch size: not in the file
        mb, ga = 1, ga or 1
        at = doc.filled[MICRO]
        micro_value = Value(1, Origin(f'{at.key} "auto": set by the training script; 1 assumed',
                                      at.source, at.span))
    elif doc.data.get(MICRO[0]) != "auto":  # an "auto" micro-batch is an error of its own
        reader.error("either train_batch_size or train_micro_batch_size_per_gpu is needed "
                     "(DeepSpeed asserts it)", Origin("train_batch_size", source),
                     code=Code.MISSING)
    if train is not None and t is not None:
        given = ("train_micro_batch_size_per_gpu" if micro is not None else "micro-batch",
                 "gradient_accumulation_steps" if acc is not None else "accumulation steps")

        def broken(facts: Facts, product: int, total: int = t,
                   names: tuple[str, str] = given) -> str:
            return (f"train_batch_size {total} != {names[0]} {facts.micro_batch} x {names[1]} "
                    f"{facts.microbatches} x data-parallel size {facts.batch_degree} = {product} "
                    "(DeepSpeed asserts train = micro x accumulation x world)")

        plan.rules.append(batch_rule(train.origin, t, broken))
    if micro_value is None and mb:
        micro_value = Value(mb, Origin("train_batch_size / world / accumulation", source))
    return ga, acc, micro_value


def _zero(doc: Config, plan: Plan) -> int:
    """The ZeRO stage's placement over the data axis (MiCS: hsdp over its shard groups), and
    the stage."""
    reader, launch, world = doc.reader, doc.launch, doc.launch.world
    stage_v = doc.integer("zero_optimization", "stage", low=0)
    stage = 0 if stage_v is None else int(stage_v.value)
    if stage > 3 and stage_v is not None:
        reader.error(f"{stage_v.origin.key} is 0 to 3, not {stage}", stage_v.origin)
    mics = doc.integer("zero_optimization", "mics_shard_size", low=-1)
    hpz = doc.integer("zero_optimization", "zero_hpz_partition_size", low=0)
    if hpz is not None and int(hpz.value) > 1:
        reader.warning("not modelled: zero_hpz_partition_size (ZeRO++ secondary parameter "
                       "partition); modelled as plain ZeRO-3", hpz.origin)
    preset = ("ddp", "zero1", "zero2", "zero3")[min(stage, 3)]
    why = f"{stage_v.origin.key} {stage}" if stage_v else "no zero_optimization: stage 0"
    origin = stage_v.origin if stage_v else None
    overlap, overlap_why = data_overlap(reader, doc, stage)
    preset += overlap
    why += f"; {overlap_why}"
    if mics is not None and int(mics.value) > 0 and stage == 3:
        shard = int(mics.value)
        if world % shard:
            reader.error(f"world {world} is not divisible by mics_shard_size {shard}", mics.origin,
                         code=Code.NOT_DIVISIBLE)
            shard = 1
        plan.mesh += [Line(f"shard = {shard}", "zero_optimization.mics_shard_size", mics.origin),
                      Line(f"replica = {world // shard}", "world / mics_shard_size"),
                      Line(f"world = {world}", launch.world_why, launch.world_origin)]
        plan.body.append(Line(f"place hsdp{overlap} over shard * replica", "MiCS: ZeRO-3 inside "
                              "mics_shard_size ranks, replicated across groups", mics.origin))
    else:
        plan.mesh += [Line(f"dp = {world}", f"{launch.world_why}: all data-parallel",
                           launch.world_origin)]
        plan.body.append(Line(f"place {preset} over dp", why, origin))
    return stage


def _accumulation_loss_clip(doc: Config, plan: Plan, ga: int | None, acc: Value | None) -> None:
    """The micro-batches, the loss (gradient_allreduce_op) and the clipping."""
    reader = doc.reader
    if ga and ga > 1:
        plan.body.append(Line(f"microbatches = {ga}", acc.origin.key if acc else
                              "gradient_accumulation_steps", acc.origin if acc else None))
    op = doc.get("gradient_allreduce_op")
    if op is not None and op.value == "sum":
        plan.body.append(Line("loss token_mean", "gradient_allreduce_op sum: correct only with a "
                              "loss divided by the global token count", op.origin))
        reader.warning("gradient_allreduce_op sum: gradients are summed over dp; placeverify "
                       "checks the step that divides each loss by the global token count",
                       op.origin, code=Code.CONFLICT)
    else:
        plan.body.append(Line("loss microbatch_mean", "DeepSpeed scales each micro-batch's loss "
                              "by 1 / gradient_accumulation_steps and averages over dp"))
    doc.get("prescale_gradients")
    doc.get("gradient_predivide_factor")  # divides before and multiplies after: same gradient
    clip = doc.get("gradient_clipping")
    if clip is not None and isinstance(clip.value, (int, float)) and clip.value > 0:
        plan.body.append(Line(f"clip max_norm = {clip.value}", clip.origin.key, clip.origin))
    ckpt = doc.get("activation_checkpointing")
    if ckpt is not None:
        reader.warning("not modelled: activation_checkpointing configures DeepSpeed's "
                       "checkpointing API; which layers are checkpointed is in the model code",
                       ckpt.origin)


def _offload(doc: Config, plan: Plan, stage: int) -> None:
    """offload_optimizer and offload_param (the latter only at stage 3: judged on the final
    placement below it)."""
    reader = doc.reader
    for what, key in (("optimizer", "offload_optimizer"), ("params", "offload_param")):
        device = doc.get("zero_optimization", key, "device")
        if device is None or device.value in ("none", None):
            continue
        if device.value not in ("cpu", "nvme"):
            reader.error(f"{device.origin.key} is none, cpu or nvme, not {device.value!r}",
                         device.origin)
            continue
        if key == "offload_param" and stage != 3:
            # Left out of the text; judged on the final placement (rules.py), since an override
            # to ZeRO-3 is where DeepSpeed would honour it.
            offloads = "params" + (",optimizer" if _offloads_optimizer(doc) else "")
            plan.rules.append(Rule(Severity.WARNING, Code.CONFLICT, device.origin,
                                   _param_offload_ignored(stage, offloads), reads_placement))
            continue
        if device.value == "nvme":
            reader.warning("nvme offload is modelled as host memory", device.origin)
        plan.body.append(Line(f"offload {what} to cpu", device.origin.key, device.origin))


# deepspeed/runtime/config.py get_communication_data_type: the names it accepts
COMMUNICATION_DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "bfp16": "bf16"}


def precision_line(doc: Config) -> Line:
    """The precision a DeepSpeed configuration trains in: ``bf16.enabled`` (bf16 Θ and G, Adam
    12 B), ``fp16.enabled`` (the ZeRO paper's mixed precision, a static loss scale when
    ``fp16.loss_scale`` is not 0), else fp32; bf16 and fp16 together are refused, as the engine
    does. ``communication_data_type`` is the dtype gradients are reduced in (default: the
    model's)."""
    line = _model_precision(doc)
    comm = doc.get("communication_data_type")
    if comm is None or comm.value is None:
        return line
    dtype = COMMUNICATION_DTYPES.get(str(comm.value).lower())
    if dtype is None:
        doc.reader.error(f"communication_data_type is fp32, fp16 or bf16, not {comm.value!r}",
                         comm.origin, code=Code.BAD_VALUE)
        return line
    words = line.text.removeprefix("precision ").strip()
    block = (f"{{ {words[2:-2]}, reduce = {dtype} }}" if words.startswith("{")
             else f"{words} {{ reduce = {dtype} }}")
    return Line(f"precision {block}", f"{line.why}; gradients reduced in {dtype} "
                f"({comm.origin.key})", comm.origin)


def _model_precision(doc: Config) -> Line:
    reader = doc.reader
    bf16 = doc.get("bf16", "enabled") or doc.get("bfloat16", "enabled")
    fp16 = doc.get("fp16", "enabled")
    if bf16 is not None and bf16.value is True and fp16 is not None and fp16.value is True:
        reader.error("bf16 and fp16 are both enabled (DeepSpeed refuses it)", fp16.origin,
                     code=Code.CONFLICT)
    opt = doc.get("optimizer", "type")
    if opt is not None and str(opt.value).lower() not in ("adam", "adamw", "fusedadam", "cpuadam",
                                                           "onebitadam", "zerooneadam", "lamb"):
        reader.error(f"not modelled: optimizer {opt.value} (Adam-like optimizers are modelled)",
                     opt.origin, code=Code.NOT_MODELLED)
    if bf16 is not None and bf16.value is True:
        return Line("precision bf16_adam", f"{bf16.origin.key}: bf16 Θ and G, Adam 12 B",
                    bf16.origin)
    if fp16 is not None and fp16.value is True:
        scale = doc.get("fp16", "loss_scale")
        if scale is not None and scale.value not in (0, 0.0):
            return Line("precision { params = fp16, grads = fp16, optimizer = 12, "
                        "activations = fp16, loss_scale = static }",
                        "fp16.enabled, fp16.loss_scale != 0", scale.origin)
        return Line("precision mixed_adam", f"{fp16.origin.key} (loss_scale 0: dynamic)",
                    fp16.origin)
    return Line("precision fp32_adam", "neither bf16 nor fp16 enabled")


def _offloads_optimizer(doc: Config) -> bool:
    device = doc.get("zero_optimization", "offload_optimizer", "device")
    return device is not None and device.value in ("cpu", "nvme")


def _param_offload_ignored(stage: int, offloads: str) -> Callable[[Facts], str | None]:
    """zero/config.py: ``offload_param`` is valid only for stage 3; below it DeepSpeed ignores it,
    so the import leaves it out. Under an override that shards the parameters (``--set
    place.dp=zero3``) DeepSpeed would honour it, and the strategy, still without it, would not
    be what that configuration runs."""

    def check(facts: Facts) -> str | None:
        if facts.params_offloaded:
            return None
        if not facts.params_gathered:
            return "offload_param needs ZeRO stage 3; DeepSpeed ignores it here"
        return (f"offload_param is left out at the file's ZeRO stage {stage}, but at stage 3, "
                f"as overridden, DeepSpeed offloads the parameters: add --set offload={offloads} "
                "to check what that configuration runs")

    return check


def data_overlap(reader: Reader, doc: Any, stage: int) -> tuple[str, str]:
    """The data axis's overlap option (written after the preset) and why. Stage 0: the engine
    all-reduces the gradients after the backward (``allreduce_gradients``), nothing overlapped.
    Stages 1-3: ``zero_optimization.overlap_comm`` (ZeRO config validator ``overlap_comm_valid``:
    true at stage 3, false below unless given) overlaps the gradient reductions with the
    backward; stages 1-2 all-gather the updated parameters after the step, stage 3 prefetches
    its gathers either way."""
    if stage == 0:
        return "(overlap = none)", "the engine all-reduces the gradients after the backward"
    given = doc.get("zero_optimization", "overlap_comm")
    if given is not None and not isinstance(given.value, bool):
        reader.error(f"{given.origin.key} is true or false, not {given.value!r}", given.origin)
        given = None
    on = stage >= 3 if given is None else bool(given.value)
    key = "zero_optimization.overlap_comm" + ("" if given is not None else
                                              f" (default at stage {min(stage, 3)})")
    if stage >= 3:
        return ("", f"{key} {str(on).lower()}") if on else \
            ("(overlap = params)", f"{key} false: prefetched gathers, reductions waited for")
    return ("(overlap = grads)" if on else "(overlap = none)",
            f"{key} {str(on).lower()}; parameters all-gathered after the step")
