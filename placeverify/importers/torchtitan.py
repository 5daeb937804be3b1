"""A torchtitan TOML job config (pytorch/torchtitan, before the move to Python registries).

Keys and defaults: ``torchtitan/config/job_config.py`` ([parallelism] data_parallel_replicate_degree 1,
data_parallel_shard_degree -1, fsdp_reshard_after_forward default, tensor_parallel_degree,
pipeline_parallel_degree, pipeline_parallel_schedule 1F1B, pipeline_parallel_microbatch_size 1,
context_parallel_degree, expert_parallel_degree, expert_tensor_parallel_degree; [training]
local_batch_size 8, global_batch_size -1, seq_len 2048, max_norm 1.0, mixed_precision_param
bfloat16, enable_cpu_offload; [activation_checkpoint] mode selective, selective_ac_option "2").
Rules:
``torchtitan/distributed/parallel_dims.py`` (dp_shard -1 = world / (replicate * cp * tp * pp);
the product must equal the world), ``torchtitan/train.py`` (accumulation = global / (local x
(replicate x shard)); loss = local sum / global valid tokens), ``models/llama3/infra/parallelize.py``
(reshard "default" = not pipeline-parallel; norms under TP use SequenceParallel; fp32 sharded
parameters with a bf16 compute copy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from placeverify.diagnostics import Code, Source, Span
from placeverify.importers import policies, torchtitan_registry
from placeverify.importers.common import Keys, Line, Plan, Reader, leftovers, mesh_title
from placeverify.importers.hf_config import attach_model
from placeverify.importers.origins import Origin, Value
from placeverify.importers.positions import load_toml
from placeverify.importers.rules import Facts, batch_rule
from placeverify.importers.torchtitan_flavors import FLAVORS, PRESETS
from placeverify.importers.torchtitan_stages import layer_count, stage_split

READ = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "context_parallel_degree",
                    "expert_parallel_degree", "expert_tensor_parallel_degree",
                    "pipeline_parallel_layers_per_stage", "enable_async_tensor_parallel",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "module_fqns_per_model_part"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "max_norm",
                 "mixed_precision_param", "mixed_precision_reduce", "enable_cpu_offload"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "model": {"name", "flavor"},
}
IGNORED_TABLES = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint",
                  "compile", "validation", "comm", "float8", "quantize", "memory_estimation",
                  "fault_tolerance", "experimental"}
IGNORED_KEYS = {"steps", "dataset", "dataset_path", "seed", "deterministic", "gc_freq",
                "warmup_steps"}
# Tables are read through ``inside`` (a table that is not one is not modelled); IGNORED_KEYS are
# ignored in every table, before what the table reads.
def _in_table(table: str) -> Callable[[str], str]:
    return lambda key: f"[{table}] {key}"


KEYS = Keys(ignored=IGNORED_TABLES, name=lambda table: f"[{table}]", inside={
    table: Keys(keys, IGNORED_KEYS, name=_in_table(table)) for table, keys in READ.items()})
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}


class _Job:
    """A torchtitan job config being read: each key's value with its origin (the default when
    it is not written), and the plan it fills."""

    def __init__(self, reader: Reader, source: Source, data: dict[str, Any],
                 spans: Mapping[tuple[str, ...], Span | None],
                 names: Mapping[tuple[str, str], str] | None = None) -> None:
        self.reader, self.source = reader, source
        self.data, self.spans = data, spans
        # a key as the file writes it, by TOML key: a registry's ``table.key`` (its own names
        # for the keys it translates), else the TOML's ``[table] key``
        self.names = names
        self.plan = Plan("torchtitan", source.path)

    def get(self, table: str, key: str, default: Any) -> Value:
        section = self.data.get(table, {})
        name = (f"[{table}] {key}" if self.names is None
                else self.names.get((table, key), f"{table}.{key}"))
        if isinstance(section, dict) and key in section:
            return Value(section[key], Origin(name, self.source, self.spans.get((table, key))))
        return Value(default, Origin(f"{name} (default)", self.source))

    def integer(self, table: str, key: str, default: int, low: int = 1) -> int:
        v = self.get(table, key, default)
        if isinstance(v.value, bool) or not isinstance(v.value, int) or (
                v.value < low and not (key == "data_parallel_shard_degree" and v.value == -1)):
            self.reader.error(f"{v.origin.key} must be a whole number >= {low}, not {v.value!r}",
                              v.origin)
            return default if default > 0 else 1
        return v.value


@dataclass(frozen=True, slots=True)
class _Sizes:
    """The parallel degrees (``ParallelDims``), the shard degree resolved from -1, and the
    data-parallel shard without the expert ranks."""

    world: int
    rep: int
    shard: int
    shard_v: Value  # data_parallel_shard_degree as written
    tp: int
    pp: int
    cp: int
    ep: int
    ep_origin: Origin

    @property
    def shard_dp(self) -> int:
        return self.shard // self.ep if self.ep > 1 else self.shard

    @property
    def fsdp(self) -> bool:
        """FSDP is applied over dp_shard x cp whenever either is > 1 (parallel_dims.py:644-645,
        ``fsdp_enabled``: dp_shard_enabled or cp_enabled; :281, the "fsdp" mesh of
        dp_shard * cp; before 183a0d2 the same mesh was flattened as "dp_shard_cp", :183)."""
        return self.shard_dp > 1 or self.cp > 1

    @property
    def hsdp(self) -> bool:
        """fully_shard over ("dp_replicate", "fsdp") when dp_replicate is enabled
        (models/llama3/parallelize.py:62-64 at b5bcd76; ("dp_replicate", "dp_shard_cp") in
        models/llama3/infra/parallelize.py:116 before 183a0d2)."""
        return self.rep > 1 and self.fsdp


@dataclass(frozen=True, slots=True)
class _Batch:
    """The local and global batch and the accumulation steps they give."""

    local: Value
    glob: Value
    accumulation: int


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    """A TOML job config, or a config registry's function (:mod:`.torchtitan_registry`)."""
    if torchtitan_registry.is_registry(source):
        registry = torchtitan_registry.Translation(reader, source, reader.config)
        job = _Job(reader, source, registry.data, registry.spans, registry.names)
        _translate(job, model, world)
        registry.header(job.plan)
        job.plan.title = mesh_title(job.plan, source, "torchtitan")
        return job.plan
    data, spans = load_toml(source)
    job = _Job(reader, source, data, spans)
    _translate(job, model, world)
    leftovers(reader, job.plan, source, job.data, spans, ((), KEYS))
    job.plan.title = mesh_title(job.plan, source, "torchtitan")
    return job.plan


def _translate(job: _Job, model: str | None, world: int | None) -> None:
    """The plan of a job config's tables, however they were written."""
    sizes = _sizes(job, world)
    batch = _batch(job, sizes)
    preset = _model(job, model, sizes, batch)
    _precision(job, sizes)
    _mesh(job, sizes)
    _placements(job, sizes)
    if sizes.pp > 1:
        job.plan.body.append(_pipeline(job, sizes, batch, preset))
    elif batch.accumulation > 1:
        job.plan.body.append(Line(f"microbatches = {batch.accumulation}",
                                  "global / (local x dp degree)", batch.glob.origin))
    _training(job)


def _sizes(job: _Job, world: int | None) -> _Sizes:
    """The parallel degrees; their product must be the world (ParallelDims), the shard degree
    -1 taking what the others leave."""
    reader = job.reader
    if world is None:
        reader.error("world size unknown: torchtitan takes it from the launcher (NGPU); pass "
                     "--world N", None, code=Code.MISSING)
        reader.raise_if_errors()
    assert world is not None
    rep = job.integer("parallelism", "data_parallel_replicate_degree", 1)
    shard_v = job.get("parallelism", "data_parallel_shard_degree", -1)
    shard = job.integer("parallelism", "data_parallel_shard_degree", -1)
    tp = job.integer("parallelism", "tensor_parallel_degree", 1)
    pp = job.integer("parallelism", "pipeline_parallel_degree", 1)
    cp = job.integer("parallelism", "context_parallel_degree", 1)
    ep = job.integer("parallelism", "expert_parallel_degree", 1)
    etp = job.integer("parallelism", "expert_tensor_parallel_degree", 1)
    rest = rep * cp * tp * pp
    if shard == -1:
        shard = world // rest if world % rest == 0 else 0
    if shard < 1 or rep * shard * cp * tp * pp != world:
        reader.error(f"replicate {rep} x shard {shard_v.value} x cp {cp} x tp {tp} x pp {pp} != "
                     f"world {world} (torchtitan's ParallelDims asserts it)", shard_v.origin,
                     code=Code.WORLD_MISMATCH)
        reader.raise_if_errors()
    ep_origin = job.get("parallelism", "expert_parallel_degree", 1).origin
    if ep > 1 and (cp > 1 or shard % ep or (etp != tp and tp > 1)):
        reader.error("not modelled: expert parallelism that does not come out of the shard "
                     "degree alone (cp = 1, ep divides data_parallel_shard_degree, etp = tp)",
                     ep_origin, code=Code.NOT_MODELLED)
    return _Sizes(world, rep, shard, shard_v, tp, pp, cp, ep, ep_origin)


def _batch(job: _Job, sizes: _Sizes) -> _Batch:
    """The accumulation steps: global / (local x dp degree), asserted whole by train.py; judged
    on the final values (rules.py), rounded down here (at least 1)."""
    local = job.get("training", "local_batch_size", 8)
    glob = job.get("training", "global_batch_size", -1)
    batch_degree = sizes.rep * sizes.shard
    given = isinstance(glob.value, int) and glob.value > 0
    g = int(glob.value) if given else int(local.value) * batch_degree
    ga = max(1, g // (int(local.value) * batch_degree))
    if given:
        def broken(facts: Facts, product: int, total: int = g) -> str:
            return (f"global_batch_size {total} != micro-batch {facts.micro_batch} x micro-batches "
                    f"{facts.microbatches} x data-parallel size {facts.batch_degree} = {product} "
                    "(torchtitan asserts global_batch_size = local_batch_size x accumulation "
                    "steps x data-parallel degree)")

        job.plan.rules.append(batch_rule(glob.origin, g, broken))
    return _Batch(local, glob, ga)


def _model(job: _Job, model: str | None, sizes: _Sizes, batch: _Batch) -> str | None:
    """The model block: --model's config.json, or a bundled preset or described flavor (the
    preset's name, or None)."""
    plan, reader = job.plan, job.reader
    seq = job.get("training", "seq_len", 2048)
    pp_mb = job.get("parallelism", "pipeline_parallel_microbatch_size", 1)
    micro = pp_mb if sizes.pp > 1 else batch.local
    name, flavor = job.get("model", "name", "llama3"), job.get("model", "flavor", "debugmodel")
    preset = PRESETS.get((str(name.value), str(flavor.value)))
    if model is None and preset is not None:
        plan.model_name = preset
        plan.model_origin = flavor.origin
        plan.model = [Line(f"seq = {seq.value}", seq.origin.key, seq.origin),
                      Line(f"micro_batch = {micro.value}", micro.origin.key, micro.origin)]
        plan.header.append(f"model: torchtitan's {name.value} {flavor.value} "
                           f"(torchtitan/models/{name.value}/__init__.py) is placeverify's {preset}")
    elif model is None and (str(name.value), str(flavor.value)) in FLAVORS:
        source_file = f"torchtitan/models/{name.value}/__init__.py"
        plan.model = [Line(entry.strip(), f"{name.value} {flavor.value} ({source_file})",
                           flavor.origin)
                      for entry in FLAVORS[(str(name.value), str(flavor.value))].split(",")]
        plan.model += [Line(f"seq = {seq.value}", seq.origin.key, seq.origin),
                       Line(f"micro_batch = {micro.value}", micro.origin.key, micro.origin)]
    else:
        if model is None:
            reader.error(f"no model: torchtitan flavor {name.value} {flavor.value} is not bundled "
                         "with placeverify; give its Hugging Face config with --model config.json",
                         flavor.origin, code=Code.MISSING)
        attach_model(plan, reader, model, seq, micro, None, "the torchtitan config")
    return preset


def _precision(job: _Job, sizes: _Sizes) -> None:
    """torchtitan's mixed precision: :func:`placeverify.importers.policies.torchtitan`."""
    job.plan.precision = policies.torchtitan(
        job.reader, job.get("training", "mixed_precision_param", "bfloat16"),
        job.get("training", "mixed_precision_reduce", "float32"),
        fsdp=sizes.shard > 1 or sizes.cp > 1, model_parallel=sizes.tp > 1 or sizes.pp > 1)


def _mesh(job: _Job, sizes: _Sizes) -> None:
    """The mesh, innermost first: tp, cp, ep, shard, replicate, pp (ParallelDims.build_mesh)."""
    mesh, shard_v = job.plan.mesh, sizes.shard_v
    for axis, size, key in (("tp", sizes.tp, "tensor_parallel_degree"),
                            ("cp", sizes.cp, "context_parallel_degree"),
                            ("ep", sizes.ep, "expert_parallel_degree")):
        if size > 1:
            v = job.get("parallelism", key, 1)
            mesh.append(Line(f"{axis} = {size}", v.origin.key, v.origin))
    if sizes.hsdp:
        mesh.append(Line(f"shard = {sizes.shard_dp}", shard_v.origin.key, shard_v.origin))
        replicas = job.get("parallelism", "data_parallel_replicate_degree", 1).origin
        mesh.append(Line(f"replica = {sizes.rep}", replicas.key, replicas))
    else:
        mesh.append(Line(f"dp = {sizes.shard_dp * sizes.rep}", shard_v.origin.key, shard_v.origin))
    if sizes.pp > 1:
        v = job.get("parallelism", "pipeline_parallel_degree", 1)
        mesh.append(Line(f"pp = {sizes.pp}", v.origin.key, v.origin))
    mesh.append(Line(f"world = {sizes.world}", "--world (placeverify option)"))


def _placements(job: _Job, sizes: _Sizes) -> None:
    """The tensor-, context- and expert-parallel placements, and FSDP's over the data axes
    (parallelize.py's apply_fsdp, with fsdp_reshard_after_forward)."""
    plan, reader, get = job.plan, job.reader, job.get
    tp, cp, ep, pp, ep_origin = sizes.tp, sizes.cp, sizes.ep, sizes.pp, sizes.ep_origin
    shard_v, hsdp = sizes.shard_v, sizes.hsdp
    if tp > 1:
        v = get("parallelism", "tensor_parallel_degree", 1)
        asynctp = get("parallelism", "enable_async_tensor_parallel", False)
        if asynctp.value is True:  # the collectives fused with the matmuls (symmetric memory)
            plan.body.append(Line("place megatron(sequence_parallel, overlap = true) over tp",
                                  f"{v.origin.key} (norms use SequenceParallel); "
                                  f"{asynctp.origin.key} true", asynctp.origin))
        else:
            plan.body.append(Line("place megatron(sequence_parallel) over tp", v.origin.key +
                                  " (norms use SequenceParallel)", v.origin))
    if cp > 1:
        v = get("parallelism", "context_parallel_degree", 1)
        plan.body.append(Line("place context over cp", v.origin.key, v.origin))
    if ep > 1:
        plan.body.append(Line("place expert over ep", ep_origin.key, ep_origin))
    policy = get("parallelism", "fsdp_reshard_after_forward", "default")
    reshard = {"always": True, "never": False, "default": pp == 1}.get(str(policy.value))
    if reshard is None:
        reader.error(f"fsdp_reshard_after_forward is default, always or never, not "
                     f"{policy.value!r}", policy.origin)
    # torch.distributed.pipelining runs an FSDP stage's backward without gradient sync and
    # reduce-scatters after its last micro-batch (stage.py: backward_maybe_with_nosync,
    # perform_reduce_grad): reduce = step
    staged = "; the pipeline reduces once a step" if pp > 1 else ""
    # Under pipelining every backward runs with set_reshard_after_backward(False): the stage's
    # parameters stay gathered from a backward to the next forward, which reshards each layer
    # after it runs ("always") and the next backward gathers again. The peak holds the whole
    # stage gathered, as reshard_after_forward = false places it; the traffic differs.
    kept_anyway = pp > 1 and reshard is True and sizes.fsdp
    if kept_anyway:
        staged += " and keeps the parameters gathered after each backward"
        reader.warning("not modelled: under torch.distributed.pipelining FSDP keeps the "
                       "parameters it gathers for backward (set_reshard_after_backward(False)) "
                       "and regathers them each backward after 'always' resharded them after "
                       "forward; written reshard_after_forward = false, whose peak holds the "
                       "stage gathered as the run does, but whose traffic counts one gather a "
                       "step, not one a micro-batch", policy.origin)

    def placed(preset: str, kept: str) -> str:
        """``preset(options)``: ``kept`` when the parameters stay gathered (also under
        pipelining, see above), reduce = step in a pipeline."""
        options = [o for o, on in ((kept, reshard is False or kept_anyway),
                                   ("reduce = step", pp > 1)) if on]
        return f"{preset}({', '.join(options)})" if options else preset

    # FSDP2 shards over dp_shard x cp (torchtitan's "fsdp" mesh, "dp_shard_cp" before): the
    # product, with the replicas beside it under HSDP
    over = "shard" if hsdp else "dp"
    over += " * cp" if cp > 1 else ""
    reshard_why = f"{policy.origin.key} {policy.value}: reshard_after_forward = {reshard}{staged}"
    if hsdp and cp == 1:  # parallelize.py's apply_fsdp: HSDP is fully_shard on the 2-D mesh
        plan.body.append(Line(f"place {placed('hsdp', 'reshard_after_forward = false')} over "
                              "shard * replica", f"replicate and shard degrees > 1; {reshard_why}",
                              shard_v.origin))
    elif sizes.fsdp:
        flat = "; sharded over dp_shard x cp" if cp > 1 else ""
        plan.body.append(Line(f"place {placed('fsdp', 'grad_op')} over {over}",
                              reshard_why + flat, policy.origin))
        if hsdp:
            plan.body.append(Line("place ddp over replica", "data_parallel_replicate_degree > 1: "
                                  "HSDP's replicas of the dp_shard x cp shards",
                                  job.get("parallelism", "data_parallel_replicate_degree",
                                          1).origin))
    else:
        plan.body.append(Line("place ddp over dp", "data_parallel_shard_degree 1"))


def _pipeline(job: _Job, sizes: _Sizes, batch: _Batch, preset: str | None) -> Line:
    """``place pipeline(...) over pp``: the schedule, the micro-batches (local / microbatch
    size x accumulation) and the layers of each stage (:func:`.torchtitan_stages.stage_split`)."""
    plan, reader, get, pp = job.plan, job.reader, job.get, sizes.pp
    local, ga = batch.local, batch.accumulation
    pp_mb = get("parallelism", "pipeline_parallel_microbatch_size", 1)
    schedule = get("parallelism", "pipeline_parallel_schedule", "1F1B")
    kind = SCHEDULES.get(str(schedule.value))
    if kind is None:
        reader.error(f"not modelled: pipeline schedule {schedule.value} (1F1B, GPipe and "
                     "Interleaved1F1B are)", schedule.origin, code=Code.NOT_MODELLED)
        kind = "1f1b"
    m = int(local.value) // int(pp_mb.value) * ga
    split = stage_split(reader, get, job.integer, pp, kind != "interleaved",
                        layer_count(plan, preset))
    options = [kind]
    if split is not None and len(split.value) > pp:
        options.append(f"chunks = {len(split.value) // pp}")
    elif split is None and kind == "interleaved":
        options.append("chunks = 2")
    options.append(f"microbatches = {m}")
    if split is not None and len(set(split.value)) > 1:
        options.append(f"layers = [{', '.join(str(n) for n in split.value)}]")
    why = f"{schedule.origin.key}; local_batch_size / microbatch_size x accumulation"
    if split is not None:
        why += f"; {split.origin.key}"
    return Line(f"place pipeline({', '.join(options)}) over pp", why, schedule.origin)


def _training(job: _Job) -> None:
    """The loss, the clipping, the recomputation and the offload."""
    plan, reader, get = job.plan, job.reader, job.get
    plan.body.append(Line("loss token_mean", "torchtitan: local loss sum / global valid tokens"))
    norm = get("training", "max_norm", 1.0)
    if isinstance(norm.value, (int, float)) and norm.value > 0:
        plan.body.append(Line(f"clip max_norm = {norm.value}", norm.origin.key, norm.origin))
    mode = get("activation_checkpoint", "mode", "selective")
    if mode.value == "full":
        plan.body.append(Line("recompute full", mode.origin.key, mode.origin))
    elif mode.value == "selective":
        # activation_checkpoint.selective_ac_option (default "2"): "op" is the op-level policy,
        # a whole number n wraps every n-th transformer block (0 and 1: every block)
        option = get("activation_checkpoint", "selective_ac_option", "2")
        word = str(option.value)
        if word == "op":
            plan.body.append(Line("recompute selective_op", f"{mode.origin.key} selective, "
                                  f"{option.origin.key} op", option.origin))
        elif word.isdigit():
            n = int(word)
            every = f"(every = {n})" if n > 1 else ""
            plan.body.append(Line(f"recompute full{every}", f"{mode.origin.key} selective, "
                                  f"{option.origin.key} {word}", option.origin))
        else:
            reader.error(f"not modelled: selective_ac_option {option.value!r} (op or a whole "
                         "number are)", option.origin, code=Code.NOT_MODELLED)
    elif mode.value != "none":
        reader.error(f"not modelled: activation_checkpoint mode {mode.value!r}", mode.origin,
                     code=Code.NOT_MODELLED)
    offload = get("training", "enable_cpu_offload", False)
    if offload.value is True:
        plan.body.append(Line("offload optimizer, gradients, params to cpu", offload.origin.key,
                              offload.origin))
