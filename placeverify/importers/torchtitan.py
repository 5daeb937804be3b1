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

from collections.abc import Callable
from typing import Any

from placeverify.diagnostics import Code, Source
from placeverify.importers.common import Keys, Line, Plan, Reader, leftovers, mesh_title
from placeverify.importers.hf_config import attach_model
from placeverify.importers.origins import Origin, Value
from placeverify.importers.positions import load_toml
from placeverify.importers.rules import Facts, batch_rule
from placeverify.ir.model import ARCHITECTURES

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
PRESETS = {("llama3", "8B"): "llama3_8b", ("llama3", "70B"): "llama3_70b",
           ("llama3", "405B"): "llama3_405b"}
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}
# Flavors described entry by entry, from torchtitan's own model arguments (before the move to
# Python config registries, commit 9810191bb): torchtitan/models/llama3/__init__.py (debugmodel:
# dim 256, 6 layers, 16 heads, n_kv_heads None = n_heads, vocab 2048; the SwiGLU width of
# model.py's FeedForward: int(2 x 4 x 256 / 3) = 682 rounded up to multiple_of 256 = 768; an
# untied output layer) and torchtitan/models/qwen3/__init__.py (Qwen3ModelArgs: head_dim 128,
# qk_norm, enable_weight_tying as given, default False).
_QWEN3 = ("mlp = gated, norm = rmsnorm, bias = false, position = rotary, attention = flash, "
          "qk_norm = true, head_dim = 128")
FLAVORS: dict[tuple[str, str], str] = {
    ("llama3", "debugmodel"): "layers = 6, hidden = 256, heads = 16, kv_heads = 16, ffn = 768, "
                              "vocab = 2048, embeddings = untied, mlp = gated, norm = rmsnorm, "
                              "bias = false, position = rotary, attention = flash",
    ("qwen3", "debugmodel"): "layers = 8, hidden = 256, heads = 16, kv_heads = 8, ffn = 3072, "
                             f"vocab = 2048, embeddings = tied, {_QWEN3}",
    ("qwen3", "0.6B"): "layers = 28, hidden = 1024, heads = 16, kv_heads = 8, ffn = 3072, "
                       f"vocab = 151936, embeddings = tied, {_QWEN3}",
    ("qwen3", "1.7B"): "layers = 28, hidden = 2048, heads = 16, kv_heads = 8, ffn = 6144, "
                       f"vocab = 151936, embeddings = tied, {_QWEN3}",
    ("qwen3", "4B"): "layers = 36, hidden = 2560, heads = 32, kv_heads = 8, ffn = 9728, "
                     f"vocab = 151936, embeddings = tied, {_QWEN3}",
    ("qwen3", "8B"): "layers = 36, hidden = 4096, heads = 32, kv_heads = 8, ffn = 12288, "
                     f"vocab = 151936, embeddings = untied, {_QWEN3}",
    ("qwen3", "14B"): "layers = 40, hidden = 5120, heads = 40, kv_heads = 8, ffn = 17408, "
                      f"vocab = 151936, embeddings = untied, {_QWEN3}",
    ("qwen3", "32B"): "layers = 64, hidden = 5120, heads = 64, kv_heads = 8, ffn = 25600, "
                      f"vocab = 151936, embeddings = untied, {_QWEN3}",
}


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    data, spans = load_toml(source)
    plan = Plan("torchtitan", source.path)

    def get(table: str, key: str, default: Any) -> Value:
        section = data.get(table, {})
        if isinstance(section, dict) and key in section:
            return Value(section[key], Origin(f"[{table}] {key}", source, spans.get((table, key))))
        return Value(default, Origin(f"[{table}] {key} (default)", source))

    def integer(table: str, key: str, default: int, low: int = 1) -> int:
        v = get(table, key, default)
        if isinstance(v.value, bool) or not isinstance(v.value, int) or (
                v.value < low and not (key == "data_parallel_shard_degree" and v.value == -1)):
            reader.error(f"{v.origin.key} must be a whole number >= {low}, not {v.value!r}",
                         v.origin)
            return default if default > 0 else 1
        return v.value

    if world is None:
        reader.error("world size unknown: torchtitan takes it from the launcher (NGPU); pass "
                     "--world N", None, code=Code.MISSING)
        reader.raise_if_errors()
    assert world is not None
    rep = integer("parallelism", "data_parallel_replicate_degree", 1)
    shard_v = get("parallelism", "data_parallel_shard_degree", -1)
    shard = integer("parallelism", "data_parallel_shard_degree", -1)
    tp = integer("parallelism", "tensor_parallel_degree", 1)
    pp = integer("parallelism", "pipeline_parallel_degree", 1)
    cp = integer("parallelism", "context_parallel_degree", 1)
    ep = integer("parallelism", "expert_parallel_degree", 1)
    etp = integer("parallelism", "expert_tensor_parallel_degree", 1)
    rest = rep * cp * tp * pp
    if shard == -1:
        shard = world // rest if world % rest == 0 else 0
    if shard < 1 or rep * shard * cp * tp * pp != world:
        reader.error(f"replicate {rep} x shard {shard_v.value} x cp {cp} x tp {tp} x pp {pp} != "
                     f"world {world} (torchtitan's ParallelDims asserts it)", shard_v.origin,
                     code=Code.WORLD_MISMATCH)
        reader.raise_if_errors()
    ep_origin = get("parallelism", "expert_parallel_degree", 1).origin
    if ep > 1 and (cp > 1 or shard % ep or (etp != tp and tp > 1)):
        reader.error("not modelled: expert parallelism that does not come out of the shard "
                     "degree alone (cp = 1, ep divides data_parallel_shard_degree, etp = tp)",
                     ep_origin, code=Code.NOT_MODELLED)
    local = get("training", "local_batch_size", 8)
    glob = get("training", "global_batch_size", -1)
    batch_degree = rep * shard
    g = int(glob.value) if isinstance(glob.value, int) and glob.value > 0 else int(local.value) * batch_degree
    # train.py: accumulation = global / (local x dp degree), asserted whole; judged on the final
    # values (rules.py), rounded down here (at least 1).
    ga = max(1, g // (int(local.value) * batch_degree))
    if isinstance(glob.value, int) and glob.value > 0:
        def broken(facts: Facts, product: int, total: int = g) -> str:
            return (f"global_batch_size {total} != micro-batch {facts.micro_batch} x micro-batches "
                    f"{facts.microbatches} x data-parallel size {facts.batch_degree} = {product} "
                    "(torchtitan asserts global_batch_size = local_batch_size x accumulation "
                    "steps x data-parallel degree)")

        plan.rules.append(batch_rule(glob.origin, g, broken))
    seq = get("training", "seq_len", 2048)
    pp_mb = get("parallelism", "pipeline_parallel_microbatch_size", 1)
    micro = pp_mb if pp > 1 else local

    # ---- model: --model, or a bundled Llama 3 flavor ----
    name, flavor = get("model", "name", "llama3"), get("model", "flavor", "debugmodel")
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

    param = get("training", "mixed_precision_param", "bfloat16")
    act = "bf16" if param.value == "bfloat16" else "fp32"
    plan.precision = Line(f"precision {{ params = fp32, grads = fp32, optimizer = 8, "
                          f"activations = {act}, loss_scale = none }}",
                          f"{param.origin.key}: fp32 sharded Θ, {act} compute (FSDP2 "
                          "MixedPrecisionPolicy), AdamW 8 B", param.origin)

    # ---- mesh (innermost first: tp, cp, ep, shard, replicate, pp; ParallelDims.build_mesh) ----
    axes = [("tp", tp, "tensor_parallel_degree"), ("cp", cp, "context_parallel_degree"),
            ("ep", ep, "expert_parallel_degree")]
    for axis, size, key in axes:
        if size > 1:
            v = get("parallelism", key, 1)
            plan.mesh.append(Line(f"{axis} = {size}", v.origin.key, v.origin))
    shard_dp = shard // ep if ep > 1 else shard
    hsdp = rep > 1 and shard_dp > 1
    if hsdp:
        plan.mesh.append(Line(f"shard = {shard_dp}", shard_v.origin.key, shard_v.origin))
        plan.mesh.append(Line(f"replica = {rep}", "[parallelism] data_parallel_replicate_degree",
                              get("parallelism", "data_parallel_replicate_degree", 1).origin))
    else:
        plan.mesh.append(Line(f"dp = {shard_dp * rep}", shard_v.origin.key, shard_v.origin))
    if pp > 1:
        v = get("parallelism", "pipeline_parallel_degree", 1)
        plan.mesh.append(Line(f"pp = {pp}", v.origin.key, v.origin))
    plan.mesh.append(Line(f"world = {world}", "--world (placeverify option)"))

    # ---- placements ----
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
    kept_anyway = pp > 1 and reshard is True and (hsdp or shard_dp > 1)
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

    if hsdp:  # parallelize.py's apply_fsdp: HSDP is fully_shard on the 2-D mesh, same policy
        plan.body.append(Line(f"place {placed('hsdp', 'reshard_after_forward = false')} over "
                              "shard * replica",
                              f"replicate and shard degrees > 1; {policy.origin.key} "
                              f"{policy.value}: reshard_after_forward = {reshard}{staged}",
                              shard_v.origin))
    elif shard_dp > 1:
        plan.body.append(Line(f"place {placed('fsdp', 'grad_op')} over dp",
                              f"{policy.origin.key} {policy.value}: reshard_after_forward = "
                              f"{reshard}{staged}", policy.origin))
    else:
        plan.body.append(Line("place ddp over dp", "data_parallel_shard_degree 1"))
    if pp > 1:
        schedule = get("parallelism", "pipeline_parallel_schedule", "1F1B")
        kind = SCHEDULES.get(str(schedule.value))
        if kind is None:
            reader.error(f"not modelled: pipeline schedule {schedule.value} (1F1B, GPipe and "
                         "Interleaved1F1B are)", schedule.origin, code=Code.NOT_MODELLED)
            kind = "1f1b"
        m = int(local.value) // int(pp_mb.value) * ga
        split = _stage_split(reader, get, integer, pp, kind != "interleaved",
                             _layer_count(plan, preset))
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
        plan.body.append(Line(f"place pipeline({', '.join(options)}) over pp", why,
                              schedule.origin))
    elif ga > 1:
        plan.body.append(Line(f"microbatches = {ga}", "global / (local x dp degree)", glob.origin))
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
    leftovers(reader, plan, source, data, spans, ((), KEYS))
    plan.title = mesh_title(plan, source, "torchtitan")
    return plan



def _layer_count(plan: Plan, preset: str | None) -> int | None:
    """The model's transformer layers: a bundled preset's, else the ``layers`` entry of the model
    block (a described flavor, or --model's config.json)."""
    if plan.model_name is not None and preset is not None:
        return ARCHITECTURES[preset].layers
    for line in plan.model:
        name, _, value = line.text.partition(" = ")
        if name == "layers" and value.isdigit():
            return int(value)
    return None


def _stage_split(reader: Reader, get: Callable[[str, str, Any], Value],
                 integer: Callable[..., int], pp: int, single: bool,
                 layers: int | None) -> Value | None:
    """Transformer layers per virtual stage, in stage order, as torchtitan builds them (the last
    TOML release, 9810191bb^, torchtitan/distributed/pipeline_parallel.py): the stages come from
    ``pipeline_parallel_layers_per_stage`` (ceil((L + first + last) / n) virtual stages), else
    one per rank for a single-stage schedule and two for a looped one; L + first + last
    "effective" layers, the embedding and the output counted as ``..._first_stage_less_layers``
    and ``..._last_stage_less_layers`` layers (1 each by default), split evenly, the remainder
    one each to the first stages; or ``module_fqns_per_model_part`` as written. Virtual stage k
    runs on rank k mod pp (the "loop" style of its looped schedules), placeverify's order too.
    None when the model's layers are unknown (already an error)."""
    parts = get("parallelism", "module_fqns_per_model_part", None)
    if parts.value is not None:
        return _written_parts(reader, parts, pp, single, layers)
    if layers is None:
        return None
    first = get("parallelism", "pipeline_parallel_first_stage_less_layers", 1)
    last = get("parallelism", "pipeline_parallel_last_stage_less_layers", 1)
    first_n = integer("parallelism", "pipeline_parallel_first_stage_less_layers", 1, low=0)
    last_n = integer("parallelism", "pipeline_parallel_last_stage_less_layers", 1, low=0)
    effective = layers + first_n + last_n
    per_stage = get("parallelism", "pipeline_parallel_layers_per_stage", None)
    where = first.origin if first.origin.span is not None else last.origin
    if per_stage.value is not None:
        size = integer("parallelism", "pipeline_parallel_layers_per_stage", 1)
        stages = -(-effective // size)
        ranks = stages // pp
        said = (f"{per_stage.origin.key} {size}: ceil(({layers} layers + {first_n} + {last_n}) / "
                f"{size}) = {stages} virtual stages")
        if stages % pp:
            reader.error(f"{said}, not a multiple of pipeline_parallel_degree {pp} (torchtitan "
                         "raises ValueError)", per_stage.origin, code=Code.NOT_DIVISIBLE)
            return None
        if single and ranks != 1:
            reader.error(f"{said}, {ranks} per rank: a single-stage schedule needs exactly 1 "
                         "(torchtitan raises ValueError)", per_stage.origin, code=Code.BAD_VALUE)
            return None
        if not single and ranks < 2:
            reader.error(f"{said}, {ranks} per rank: a looped schedule needs at least 2 "
                         "(torchtitan raises ValueError)", per_stage.origin, code=Code.BAD_VALUE)
            return None
        where = per_stage.origin
    else:
        stages = pp * (1 if single else 2)
    base, extra = divmod(effective, stages)
    counts = [base + (i < extra) for i in range(stages)]
    counts[0] -= first_n
    counts[-1] -= last_n
    kind = "stages" if single else "virtual stages"
    said = (f"{layers} layers + {first_n} + {last_n} over {stages} {kind}: {base} each"
            + (f", one more on the first {extra}" if extra else ""))
    if base == 0 or first_n > base or last_n > base:
        reader.error(f"{said}; torchtitan refuses a stage with fewer layers than the embedding's "
                     "or the output's weight (ValueError)", where, code=Code.BAD_VALUE)
        return None
    return Value(tuple(counts), Origin(said, where.source, where.span))


def _written_parts(reader: Reader, parts: Value, pp: int, single: bool,
                   layers: int | None) -> Value | None:
    """``module_fqns_per_model_part``: one list of module names per virtual stage; placeverify
    reads how many ``layers.N`` each holds, with the embedding on the first and the output on
    the last."""
    chunks = parts.value
    at = parts.origin
    if not (isinstance(chunks, list) and chunks and all(
            isinstance(c, list) and all(isinstance(n, str) for n in c) for c in chunks)):
        reader.error(f"{at.key} must be a list of lists of module names", at)
        return None
    if len(chunks) % pp or (single and len(chunks) != pp) or (not single and len(chunks) < 2 * pp):
        need = f"{pp}" if single else f"a multiple of {pp}, at least {2 * pp}"
        reader.error(f"{at.key} lists {len(chunks)} stages; the schedule over "
                     f"pipeline_parallel_degree {pp} needs {need}", at, code=Code.BAD_VALUE)
        return None
    held: list[int] = []
    counts = []
    for chunk in chunks:
        mine = [n for n in chunk if n.startswith("layers.")]
        held += [int(n[7:]) for n in mine if n[7:].isdigit()]
        counts.append(len(mine))
    ends = "tok_embeddings" in chunks[0] and any(n in chunks[-1] for n in ("output", "lm_head"))
    if layers is not None and sorted(held) != list(range(layers)):
        reader.error(f"{at.key} does not name each of layers.0 .. layers.{layers - 1} once",
                     at, code=Code.BAD_VALUE)
        return None
    if not ends or min(counts) < 1:
        reader.error(f"not modelled: {at.key} without the embedding first, the output last and "
                     "a transformer layer in every stage", at, code=Code.NOT_MODELLED)
        return None
    return Value(tuple(counts), at)
