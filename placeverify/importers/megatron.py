"""Megatron-LM arguments: a launch script (bash, read never run), a file of arguments, or one of
Megatron-LM's own test configurations (``MODEL_ARGS`` in YAML, :mod:`.megatron_yaml`).

Flag names and defaults are NVIDIA/Megatron-LM's: explicit ones in
``megatron/training/arguments.py``, the rest generated from config dataclass fields by
``megatron/training/argument_utils.py`` (``field_name`` -> ``--field-name``):
``megatron/core/model_parallel_config.py`` (tensor_model_parallel_size, pipeline_model_parallel_size,
context_parallel_size, expert_model_parallel_size, expert_tensor_parallel_size defaulting to TP,
sequence_parallel) and ``megatron/core/transformer/transformer_config.py`` (num_layers,
hidden_size, num_attention_heads, num_query_groups, ffn_hidden_size, recompute_granularity,
hidden_dropout / attention_dropout 0.1). Rules taken from ``validate_args`` in arguments.py:
DP = world / (TP * PP * CP) with world divisible; sequence parallelism is switched off (a
warning) when TP = 1; ffn_hidden_size defaults to 4h, or int(4h * 2/3 / 64) * 64 with --swiglu;
global batch defaults to micro * DP; seq divisible by 2 * CP. Expert parallelism
(``megatron/core/parallel_state.py``): world divisible by ETP * EP * PP, expert DP = world /
(ETP * EP * PP), so with ETP = TP the EP ranks come out of DP * CP. Loss
(``megatron/core/pipeline_parallel/schedules.py``): without --calculate-per-token-loss each
micro-batch's token mean is divided by the number of micro-batches (microbatch_mean).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from placeverify.diagnostics import Code, Severity, Source, Span
from placeverify.importers import megatron_yaml
from placeverify.importers.arguments import Arguments, Launch, split_launch
from placeverify.importers.common import Line, Plan, Reader, ignored_header
from placeverify.importers.hf_config import attach_model
from placeverify.importers.megatron_deepspeed import read_engine
from placeverify.importers.megatron_model import REFUSED, cross_check, model_lines
from placeverify.importers.origins import Origin, Value
from placeverify.importers.rules import Facts, Rule, batch_rule, reads_tensor, world_rule
from placeverify.importers.shell import Script, Word

NPROC_FLAGS = ("--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus")
NNODES_FLAGS = ("--nnodes", "--num_nodes", "--num-nodes")
# Flags with no effect on placement, memory or communication: listed once in the header.
IGNORED = frozenset({
    "--lr", "--min-lr", "--weight-decay", "--init-method-std", "--train-iters", "--train-samples",
    "--split", "--save", "--load", "--vocab-file", "--merge-file", "--tokenizer-model", "--seed",
    "--distributed-backend", "--use-mcore-models", "--transformer-impl", "--num-workers",
    "--dataloader-type", "--norm-epsilon", "--rotary-base", "--rotary-percent",
    "--use-rotary-position-embeddings", "--attention-softmax-in-fp32", "--mock-data",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion", "--no-rope-fusion", "--cross-entropy-loss-fusion",
    "--use-checkpoint-args", "--manual-gc", "--profile", "--timing-log-level", "--mmap-warmup",
    "--no-mmap-bin-files", "--moe-aux-loss-coeff", "--moe-router-load-balancing-type",
    "--moe-z-loss-coeff", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
    "--untie-embeddings-and-output-weights", "--adam-beta1", "--adam-beta2", "--adam-eps",
    "--check-for-nan-in-loss-and-grad", "--sgd-momentum",
    "--position-embedding-type",
    # Megatron-DeepSpeed (bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py)
    "--abort-on-unmet-fused-kernel-constraints", "--kill-switch-path", "--valid-num-workers",
    "--train-weighted-split-paths-path", "--valid-weighted-split-paths-path",
    "--test-weighted-split-paths-path", "--reset-progress", "--skip-train-iteration-range",
    "--universal-checkpoint", "--no-query-key-layer-scaling",
})
IGNORED_PREFIXES = ("--log-", "--wandb-", "--tensorboard-", "--eval-", "--save-", "--exit-",
                    "--ckpt-", "--lr-", "--data-", "--no-load-", "--no-save-", "--dist-ckpt-")
NOT_MODELLED = {
    "--rampup-batch-size": "a batch-size ramp-up; the final --global-batch-size is used",
    "--step-batch-size-schedule": "a batch-size schedule; --global-batch-size is used",
    "--recompute-method": "partial recomputation; every layer is recomputed as modelled",
    "--recompute-num-layers": "partial recomputation; every layer is recomputed as modelled",
    "--fp8-format": "FP8 GEMMs (parameters, gradients and optimizer keep the --bf16/--fp16 sizes)",
    "--num-distributed-optimizer-instances": "several distributed-optimizer instances",
    "--sync-tp-duplicated-parameters": "Megatron-DeepSpeed's all-reduce of the parameters every "
                                       "tensor-parallel rank duplicates (the LayerNorms) each "
                                       "step; its traffic is not counted",
}


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    script: Script | None = None
    if megatron_yaml.is_test_config(source):
        started = Launch([], None, megatron_yaml.arguments(source), False)
    else:
        script = Script(source)
        started = split_launch(script)
    launch, words, launched = started.launcher, started.arguments, started.launched
    plan = Plan("megatron", source.path)
    args = Arguments(reader, words, source)
    runner = Arguments(reader, launch, source)

    # ---- world size: torchrun --nproc-per-node x --nnodes, srun's tasks, or --world ----
    tasks = None if launched or script is None else _srun_tasks(launch, script, reader)
    if tasks is not None:
        world_value, world_line, replaced = _tasks_world(tasks, reader, world)
    else:
        world_value, world_line, replaced = _world(runner, reader, world,
                                                   launched or not launch, launch)
    for name in (*NPROC_FLAGS, *NNODES_FLAGS):
        runner.used.add(name)

    # ---- parallel sizes ----
    tp = args.integer("--tensor-model-parallel-size", 1)
    pp = args.integer("--pipeline-model-parallel-size", 1)
    cp = args.integer("--context-parallel-size", 1)
    ep = args.integer("--expert-model-parallel-size", 1)
    etp = args.integer("--expert-tensor-parallel-size")
    sizes = [v for v in (tp, pp, cp, ep) if v is not None]
    if len(sizes) < 4:
        reader.raise_if_errors()
    assert tp is not None and pp is not None and cp is not None and ep is not None
    t, p, c, e = (int(str(v.value)) for v in (tp, pp, cp, ep))
    if etp is not None and etp.value != t and e > 1:
        reader.error(f"not modelled: --expert-tensor-parallel-size {etp.value} differs from "
                     f"--tensor-model-parallel-size {t}", etp.origin, code=Code.NOT_MODELLED)
    dp = 1
    divisible = world_value is not None and world_value % (t * p * c) == 0
    if world_value is not None and not divisible:
        # validate_args asserts it; judged on the final mesh (rules.py), so that an override
        # (--set mesh.pp=1, --set mesh.dp=...) can give a mesh the launcher's world makes. The
        # text keeps dp = 1 and no world line until then.
        origin = (tp.origin if tp.origin.span else world_line.origin
                  if world_line is not None and world_line.origin is not None else tp.origin)
        plan.rules.append(world_rule(origin, world_value, "Megatron-LM asserts world = "
                                     "TP x PP x CP x DP in validate_args"))
        reader.pending_error(f"world size {world_value} is not divisible by TP * PP * CP = {t} "
                             f"* {p} * {c} = {t * p * c} (Megatron-LM asserts it in "
                             "validate_args)", origin, Code.NOT_DIVISIBLE)
        world_line = None
    elif world_value is not None:
        dp = world_value // (t * p * c)
        x = int(str(etp.value)) if etp is not None else t
        if e > 1 and world_value % (x * e * p):
            reader.error(f"world size {world_value} is not divisible by ETP * EP * PP = {x} * {e} "
                         f"* {p} = {x * e * p}: Megatron-core refuses the launch "
                         "(parallel_state.initialize_model_parallel: 'world_size is not divisible "
                         "by expert_tensor_model_pipeline_parallel size')", ep.origin,
                         code=Code.NOT_DIVISIBLE)
        elif e > 1 and dp % e:
            reader.error(f"not modelled: --expert-model-parallel-size {e} does not divide the "
                         f"data-parallel size {dp} (Megatron takes EP ranks from DP * CP; "
                         "placeverify's ep axis is carved out of dp)", ep.origin,
                         code=Code.NOT_MODELLED)
    sp = args.flag("--sequence-parallel")
    overlap = args.flag("--tp-comm-overlap")
    if overlap is not None:
        # validate_args: sequence parallelism off with one tensor-parallel rank, then
        # "assert args.sequence_parallel == True" under --tp-comm-overlap
        plan.rules.append(Rule(Severity.ERROR, Code.CONFLICT, overlap.origin,
                               _overlap_without_sp(sp is not None), reads_tensor))
    if sp is not None:
        # validate_args switches sequence parallelism off with one tensor-parallel rank, silently;
        # judged on the final tensor-parallel size (an override may change it).
        plan.rules.append(Rule(Severity.WARNING, Code.CONFLICT, sp.origin, _sp_ignored,
                               reads_tensor))
        if t == 1:
            sp = None

    # ---- batch ----
    micro = args.integer("--micro-batch-size", 1)
    glob = args.integer("--global-batch-size")
    m = 1
    if micro is not None and world_value is not None:
        per_step = int(str(micro.value)) * dp
        if glob is not None:
            # num_microbatches_calculator.py: global / (micro x dp), which must be whole; the
            # rule is judged on the final values (rounded down here, at least 1).
            total = int(str(glob.value))
            m = max(1, total // per_step)
            plan.rules.append(batch_rule(glob.origin, total, _global_batch_broken(total)))

    # ---- model ----
    seq = args.integer("--seq-length")
    own = None if model is not None else model_lines(
        args, reader, started.program.text if started.program is not None else None)
    if model is not None:
        for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                     "--num-query-groups", "--group-query-attention", "--swiglu", "--normalization",
                     "--disable-bias-linear", "--vocab-size", "--tokenizer-type",
                     "--max-position-embeddings", "--make-vocab-size-divisible-by",
                     "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                     "--hidden-dropout", "--attention-dropout", "--attention-backend",
                     "--use-flash-attn"):
            args.used.add(flag)
    hf = attach_model(plan, reader, model, seq, micro, own, "the Megatron-LM arguments")
    if hf is not None:
        cross_check(args, reader, hf, plan.model)

    # ---- precision ----
    bf16, fp16 = args.flag("--bf16"), args.flag("--fp16")
    fp32_grads = args.flag("--accumulate-allreduce-grads-in-fp32")
    bf16_grads = args.flag("--grad-reduce-in-bf16")
    static_scale = args.text("--loss-scale")
    args.used.add("--initial-loss-scale")
    optimizer = args.text("--optimizer")
    if optimizer is not None and optimizer.value != "adam":
        reader.error(f"not modelled: --optimizer {optimizer.value} (Adam's 12 bytes per parameter "
                     "are modelled)", optimizer.origin, code=Code.NOT_MODELLED)
    if bf16 is not None:
        plan.precision = (Line("precision megatron", "--bf16: bf16 Θ, fp32 main grads, Adam 12 B",
                               bf16.origin) if bf16_grads is None else
                          Line("precision { params = bf16, grads = bf16, optimizer = 12, "
                               "activations = bf16, loss_scale = none }",
                               "--bf16 --grad-reduce-in-bf16", bf16_grads.origin))
    elif fp16 is not None:
        grads = "fp32" if fp32_grads is not None else "fp16"
        scale = "static" if static_scale is not None else "dynamic"
        plan.precision = Line(f"precision {{ params = fp16, grads = {grads}, optimizer = 12, "
                              f"activations = fp16, loss_scale = {scale} }}",
                              "--fp16" + (" --loss-scale" if static_scale else ""), fp16.origin)
    else:
        plan.precision = Line("precision fp32_adam", "no --bf16/--fp16: fp32 training")

    # ---- mesh, in Megatron's rank order tp-cp-ep-dp-pp (parallel_state.initialize_model_parallel)
    d = dp // e if e > 1 and dp % e == 0 else dp
    if t > 1:
        plan.mesh.append(Line(f"tp = {t}", tp.origin.key, tp.origin))
    if c > 1:
        plan.mesh.append(Line(f"cp = {c}", cp.origin.key, cp.origin))
    if e > 1:
        plan.mesh.append(Line(f"ep = {e}", ep.origin.key, ep.origin))
    plan.mesh.append(Line(f"dp = {d}", f"world / (tp * pp * cp) = {dp}" + (f", / ep = {d}"
                                                                          if e > 1 else "")
                          if world_line is not None or world_value is None else
                          f"world {world_value} is not divisible by tp * pp * cp = {t * p * c}: "
                          "dp 1 until an override gives a mesh of that world"))
    if p > 1:
        plan.mesh.append(Line(f"pp = {p}", pp.origin.key, pp.origin))
    if world_line is not None:
        plan.mesh.append(world_line)

    # ---- placements ----
    fsdp2 = args.flag("--use-torch-fsdp2")
    dist_opt = args.flag("--use-distributed-optimizer")
    # Megatron-LM's column-parallel layers (LinearWithGradAccumulationAndAsyncCommunication)
    # all-gather their input again in backward beside the input-gradient GEMM and
    # reduce-scatter (without sequence parallelism: all-reduce) the input gradient beside the
    # weight-gradient GEMM, async; --no-async-tensor-model-parallel-allreduce (until 2026) turned
    # the all-reduce's off. Megatron-DeepSpeed's copy of Megatron-LM (2021) waits for both.
    engine_tp = "--deepspeed" in args.flags
    no_async = args.flag("--no-async-tensor-model-parallel-allreduce")
    if sp is not None and overlap is not None:
        plan.body.append(Line("place megatron(sequence_parallel, overlap = true) over tp",
                              f"{tp.origin.key} + --sequence-parallel + --tp-comm-overlap",
                              overlap.origin))
    elif sp is not None:
        plan.body.append(Line("place megatron(sequence_parallel) over tp" if engine_tp else
                              "place megatron(sequence_parallel, overlap = backward) over tp",
                              f"{tp.origin.key} + --sequence-parallel" + (
                                  " (Megatron-DeepSpeed's layers wait for every collective)"
                                  if engine_tp else "; the backward's re-gather and "
                                  "reduce-scatter run beside the GEMMs"), sp.origin))
    elif t > 1 and (engine_tp or no_async is not None):
        plan.body.append(Line("place megatron over tp", tp.origin.key + (
            " + --no-async-tensor-model-parallel-allreduce" if no_async is not None else
            " (Megatron-DeepSpeed's layers wait for every collective)"),
            no_async.origin if no_async is not None else tp.origin))
    elif t > 1:
        plan.body.append(Line("place megatron(overlap = backward) over tp",
                              f"{tp.origin.key}; the input-gradient all-reduce runs beside the "
                              "weight-gradient GEMM", tp.origin))
    if c > 1:
        sharded = dist_opt is not None
        plan.body.append(Line("place context(R, S, R, S) over cp" if sharded else
                              "place context over cp",
                              cp.origin.key + (" (the distributed optimizer shards over dp x cp)"
                                               if sharded else ""), cp.origin))
    if e > 1:
        plan.body.append(Line("place expert over ep", ep.origin.key, ep.origin))
    engine = read_engine(args, reader, script, plan, t=t, p=p, dp=d, micro=micro,
                         microbatches=m, global_batch=glob is not None)
    if engine is not None:  # DeepSpeed's engine places the data axis and runs the pipeline
        m = engine.microbatches or m
        plan.precision = engine.precision
        plan.body += [engine.data, *engine.body]
        if engine.pipeline is not None:
            plan.body.append(engine.pipeline)
    else:
        plan.body.append(_data_placement(args, reader, fsdp2, dist_opt))
    vpp = _virtual_stages(args, reader, p)
    where = glob.origin if glob is not None else (micro.origin if micro else None)
    uneven = _uneven_stages(args, reader, p, vpp)
    accounted = _accounted_stages(args, reader, p, vpp)
    if engine is not None:
        if p == 1 and m > 1:
            plan.body.append(Line(f"microbatches = {m}", "DeepSpeed's gradient accumulation: "
                                  "global / (micro x dp)", where))
    elif p > 1:
        if vpp is not None:
            listed = ("" if accounted is None else
                      f", layers = [{', '.join(str(n) for n in accounted.value)}]")
            plan.body.append(Line(f"place pipeline(interleaved, chunks = {vpp.value}, "
                                  f"microbatches = {m}{listed}) over pp",
                                  f"{vpp.origin.key}; micro-batches = global / (micro x dp)"
                                  + ("" if accounted is None else f"; {accounted.origin.key}"),
                                  vpp.origin))
        elif accounted is not None:
            plan.body.append(Line(f"place pipeline(1f1b, microbatches = {m}, layers = "
                                  f"[{', '.join(str(n) for n in accounted.value)}]) over pp",
                                  f"{accounted.origin.key}; micro-batches = global / (micro x dp)",
                                  accounted.origin))
        elif uneven is not None:
            plan.body.append(Line(f"place pipeline(1f1b, microbatches = {m}, layers = "
                                  f"[{', '.join(str(n) for n in uneven.value)}]) over pp",
                                  f"{uneven.origin.key}; micro-batches = global / (micro x dp)",
                                  uneven.origin))
        else:
            plan.body.append(Line(f"place pipeline(1f1b, microbatches = {m}) over pp",
                                  f"{pp.origin.key}; micro-batches = global / (micro x dp)",
                                  pp.origin))
    elif m > 1:
        plan.body.append(Line(f"microbatches = {m}", "--global-batch-size / "
                              "(--micro-batch-size x dp)", where))
    per_token = args.flag("--calculate-per-token-loss")
    plan.body.append(Line("loss token_mean", "--calculate-per-token-loss", per_token.origin)
                     if per_token is not None else
                     Line("loss microbatch_mean", "Megatron's default: each micro-batch's token "
                          "mean, divided by the number of micro-batches"))
    clip = args.real("--clip-grad", 1.0) if engine is None else None
    if clip is not None and float(str(clip.value)) > 0:
        plan.body.append(Line(f"clip max_norm = {clip.value}", clip.origin.key, clip.origin))
    elif engine is not None and engine.clip is not None:
        plan.body.append(engine.clip)
    granularity = args.text("--recompute-granularity")
    if args.flag("--recompute-activations") is not None and granularity is None:
        granularity = Value("selective", Origin("--recompute-activations", source))
    # Megatron-LM before --recompute-granularity (2021-22, and Megatron-DeepSpeed): every layer's
    # input checkpointed, the layer re-run in backward (--checkpoint-num-layers per checkpoint)
    old_style = args.flag("--checkpoint-activations")
    if old_style is not None and granularity is None:
        granularity = Value("full", old_style.origin)
        span = args.integer("--checkpoint-num-layers", 1)
        if span is not None and int(str(span.value)) > 1:
            reader.warning(f"not modelled: --checkpoint-num-layers {span.value} (one checkpoint "
                           "per span of layers; every layer's input is counted as kept)",
                           span.origin)
    if granularity is not None:
        if granularity.value not in ("full", "selective"):
            reader.error(f"--recompute-granularity is full or selective, not "
                         f"'{granularity.value}'", granularity.origin)
        else:
            plan.body.append(Line(f"recompute {granularity.value}", granularity.origin.key,
                                  granularity.origin))
    offload = args.flag("--optimizer-cpu-offload")
    if offload is not None:
        plan.body.append(Line("offload optimizer to cpu", "--optimizer-cpu-offload", offload.origin))
    parts = [f"tp = {t}", f"pp = {p}", f"dp = {d}"] + ([f"cp = {c}"] if c > 1 else []) + \
        ([f"ep = {e}"] if e > 1 else [])
    plan.title = f"{Path(source.path).name}: " + \
        ("Megatron-DeepSpeed" if engine is not None else "Megatron-LM") + ", " + ", ".join(parts)
    _leftovers(args, runner, reader, plan)
    for swallowed, line in script.swallowed if script is not None else []:
        reader.warning(f"the shell reads {swallowed.text} as the file of a redirection ('<' or "
                       f"'>') in the command at line {line}, not as an argument: a '<...>' "
                       "placeholder left in the script? The flag is not read",
                       Origin(swallowed.text, source, swallowed.span), code=Code.NOT_STATIC)
    for sourced in script.sourced if script is not None else []:
        reader.warning(f"the script sources {sourced.text}, which placeverify does not read: a "
                       "variable that file sets is taken as the script leaves it",
                       Origin("source", source, sourced.span), code=Code.NOT_STATIC)
    assumed = [a for a in dict.fromkeys([*runner.assumed(), *args.assumed(),
                                                  *(script.decided if script is not None else [])])
               if a not in replaced]
    if assumed:
        plan.header.append("Assumed about the launch (defaults of variables the environment or "
                           "the script's arguments may set): " + "; ".join(assumed))
    return plan


_SRUN_OPTIONS = {"--nodes": "--nodes", "-N": "--nodes", "--ntasks-per-node": "--ntasks-per-node",
                 "--ntasks": "--ntasks", "-n": "--ntasks"}


@dataclass(frozen=True, slots=True)
class Tasks:
    """The processes ``srun`` starts, one per task (srun(1)): ``--ntasks``, else nodes x
    ``--ntasks-per-node``; each count from srun's own option or the allocation's ``#SBATCH``
    line. ``count`` is None when the counts do not give it (``why`` says which is missing)."""

    count: int | None
    why: str
    origin: Origin


def _srun_tasks(launch: list[Word], script: Script, reader: Reader) -> Tasks | None:
    """The tasks of an ``srun`` that runs the training program itself (no torchrun under it),
    or None when no srun starts it. An option whose value only running the script gives is an
    error at the word."""
    at = next((k for k, w in enumerate(launch) if w.text.rsplit("/", 1)[-1] == "srun"), None)
    if at is None:
        return None
    sbatch: dict[str, tuple[int, str, Span | None]] = {
        o: (v.value, f"#SBATCH {o}={v.value} (line {v.span.line})", v.span)
        for o, v in script.sbatch.items()}
    own: dict[str, tuple[int, str, Span | None]] = {}
    k = at + 1
    while k < len(launch):
        text = launch[k].text
        name, eq, inline = text.partition("=") if text.startswith("--") else (text[:2], "", text[2:])
        option = _SRUN_OPTIONS.get(name)
        if option is None:
            k += 1
            continue
        value_word = launch[k] if (eq or inline) else launch[k + 1] if k + 1 < len(launch) else None
        k += 1 if (eq or inline) else 2
        if value_word is None:
            continue
        if value_word.unresolved:
            reader.error(f"srun {name}: {value_word.unresolved}; write the number or pass "
                         "--world N", Origin(name, script.source, value_word.span),
                         code=Code.NOT_STATIC)
            continue
        value = inline if (eq or inline) else value_word.text
        if value.isdigit():
            own[option] = (int(value), f"srun {name} {value}", value_word.span)
    # srun's own counts first; the allocation's fill in what srun leaves (srun(1): the
    # SLURM_NTASKS / SLURM_NNODES / SLURM_NTASKS_PER_NODE of the job are its defaults)
    if "--ntasks" in own:
        count, why, span = own["--ntasks"]
        return Tasks(count, why, Origin("--ntasks", script.source, span))
    given = {**sbatch, **own}
    if "--ntasks" in sbatch and not own:
        count, why, span = sbatch["--ntasks"]
        return Tasks(count, why, Origin("--ntasks", script.source, span))
    if "--ntasks-per-node" in given and "--nodes" in given:
        per, per_why, span = given["--ntasks-per-node"]
        nodes, nodes_why, _ = given["--nodes"]
        return Tasks(per * nodes, f"{per_why} x {nodes_why}",
                     Origin("--ntasks-per-node", script.source, span))
    missing = " and ".join(o for o in ("--nodes", "--ntasks-per-node") if o not in given)
    return Tasks(None, f"srun starts the training program with no {missing} (from its own "
                 "options or an #SBATCH line); Slurm's default of one task per node is not "
                 "assumed", Origin("srun", script.source, launch[at].span))


def _tasks_world(tasks: Tasks, reader: Reader, world: int | None
                 ) -> tuple[int | None, Line | None, list[str]]:
    """The world of an srun launch: its task count, or --world where the script does not give
    it; a --world that contradicts it is an error."""
    if tasks.count is None:
        if world is not None:
            return world, Line(f"world = {world}", "--world (placeverify option): "
                               + tasks.why.split(";")[0]), []
        reader.error(f"world size unknown: {tasks.why}; pass --world N", tasks.origin,
                     code=Code.MISSING)
        return None, None, []
    if world is not None and world != tasks.count:
        reader.error(f"--world {world} contradicts srun's {tasks.count} tasks ({tasks.why})",
                     tasks.origin, code=Code.WORLD_MISMATCH)
    return tasks.count, Line(f"world = {tasks.count}", f"srun tasks, one process each: "
                             f"{tasks.why}", tasks.origin), []


def _world(runner: Arguments, reader: Reader, world: int | None, launched: bool,
           launch: list[Word]) -> tuple[int | None, Line | None, list[str]]:
    """The world size: torchrun's --nproc-per-node x --nnodes, or --world; and the assumptions
    --world replaced. A launcher value only running the script gives (``--nnodes $SLURM_NNODES``)
    or a default of one (``${SLURM_NNODES:-1}``) leaves it to --world, which must then be a
    multiple of a known --nproc-per-node."""
    # torchrun's names, then the deepspeed launcher's (deepspeed/launcher/runner.py)
    nproc_name = next((n for n in NPROC_FLAGS if n in runner.flags), "--nproc-per-node")
    nnodes_name = next((n for n in NNODES_FLAGS if n in runner.flags), "--nnodes")
    unknown = [n for n in (nproc_name, nnodes_name) if runner.unresolved(n) is not None]
    assumed = runner.assumed_of(nproc_name, nnodes_name)
    guess = f"; assumed: {'; '.join(assumed)}" if assumed else ""
    # a value taken from a default (NNODES=${SLURM_NNODES:-1}) is a guess that --world replaces
    guessed = [n for n in (nproc_name, nnodes_name) if n not in unknown and runner.assumed_of(n)]
    if (unknown or guessed) and world is not None:
        nproc = None if nproc_name in unknown else runner.integer(nproc_name)
        if nproc is not None and world % int(str(nproc.value)):
            reader.error(f"--world {world} is not a multiple of {nproc.origin.key} {nproc.value} "
                         "(torchrun starts that many processes on each node)", nproc.origin,
                         code=Code.WORLD_MISMATCH)
        runner.used.update(unknown + guessed)
        return world, Line(f"world = {world}", "--world (placeverify option), in place of the "
                           "script's " + " and ".join(unknown + guessed)
                           + (f" (a default: {'; '.join(assumed)})" if assumed else "")), assumed
    fix = "write the number or pass --world N"
    nproc = runner.integer(nproc_name, fix=fix)
    nnodes = runner.integer(nnodes_name, 1, fix=fix)
    if nproc is not None and nnodes is not None:
        world_value = int(str(nproc.value)) * int(str(nnodes.value))
        if world is not None and world != world_value:
            reader.error(f"--world {world} contradicts the launcher's {nproc.value} x "
                         f"{nnodes.value} = {world_value} processes", nproc.origin,
                         code=Code.WORLD_MISMATCH)
        return world_value, Line(f"world = {world_value}", f"{nproc.origin.key} {nproc.value} x "
                                 f"{nnodes.origin.key} {nnodes.value}" + guess, nproc.origin), []
    if world is not None and not unknown:
        return world, Line(f"world = {world}", "--world (placeverify option)"), []
    if not unknown:
        hidden = next((w for w in launch if w.unresolved), None)
        why = (f"the launcher {hidden.text} is not known: {hidden.unresolved}" if hidden else
               "the script launches no torchrun with --nproc-per-node/--nnodes" if launched
               else "the launcher gives no --nproc-per-node")
        reader.error(f"world size unknown: {why}; pass --world N",
                     Origin("launcher", reader.source, hidden.span) if hidden else None,
                     code=Code.MISSING)
    return None, None, []


def _uneven_stages(args: Arguments, reader: Reader, p: int, vpp: Value | None) -> Value | None:
    """Layers per stage from --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers:
    the given end stages hold those counts, the other stages the remaining layers evenly
    (megatron/core/transformer/transformer_block.py, ``get_num_layers_to_build``, which asserts
    that the rest divides evenly over the remaining stages)."""
    first = args.integer("--decoder-first-pipeline-num-layers")
    last = args.integer("--decoder-last-pipeline-num-layers")
    given = first or last
    if given is None:
        return None
    if vpp is not None or p < 2:
        why = "with a virtual pipeline" if vpp is not None else "without pipeline stages"
        reader.error(f"not modelled: uneven pipeline stages {why}", given.origin,
                     code=Code.NOT_MODELLED)
        return None
    layers = args.integer("--num-layers")
    if layers is None:
        reader.error(f"{given.origin.key} needs --num-layers to split the other stages",
                     given.origin, code=Code.MISSING)
        return None
    rest, left = int(str(layers.value)), p
    for end in (first, last):
        if end is not None:
            rest, left = rest - int(str(end.value)), left - 1
    if (left == 0 and rest != 0) or (left > 0 and (rest <= 0 or rest % left)):
        reader.error(f"--num-layers {layers.value} leaves {rest} layers for the other {left} "
                     f"pipeline stages, not a positive multiple of {left} (Megatron-LM asserts "
                     "that the remaining layers split evenly)", given.origin,
                     code=Code.NOT_DIVISIBLE)
        return None
    middle = rest // left if left else 0
    stages = [middle] * p
    if first is not None:
        stages[0] = int(str(first.value))
    if last is not None:
        stages[-1] = int(str(last.value))
    return Value(tuple(stages), given.origin)


def _accounted_stages(args: Arguments, reader: Reader, p: int,
                      vpp: Value | None) -> Value | None:
    """Layers per virtual stage under --account-for-embedding-in-pipeline-split /
    --account-for-loss-in-pipeline-split (megatron/core/transformer/transformer_block.py,
    ``get_num_layers_to_build``): the embedding and the loss count as a layer each, L + 1 (+ 1)
    split evenly over the p · v virtual stages, and the first (last) virtual stage builds one
    transformer layer fewer; the total must divide by p and each stage's share by v."""
    emb = args.flag("--account-for-embedding-in-pipeline-split")
    loss = args.flag("--account-for-loss-in-pipeline-split")
    given = emb or loss
    if given is None or p < 2:
        return None
    flags = " and ".join(name for name, v in (("--account-for-embedding-in-pipeline-split", emb),
                                              ("--account-for-loss-in-pipeline-split", loss))
                         if v is not None)
    if args.integer("--decoder-first-pipeline-num-layers") or \
            args.integer("--decoder-last-pipeline-num-layers"):
        reader.error(f"{flags} with --decoder-first/last-pipeline-num-layers: Megatron-LM "
                     "asserts they do not combine (get_num_layers_to_build)", given.origin,
                     code=Code.CONFLICT)
        return None
    layers = args.integer("--num-layers")
    if layers is None:
        return None  # already an error: no model
    v = int(str(vpp.value)) if vpp is not None else 1
    total = int(str(layers.value)) + (emb is not None) + (loss is not None)
    said = f"--num-layers {layers.value} + {total - int(str(layers.value))} ({flags})"
    if total % p or (total // p) % v:
        over = f"pp {p}" if total % p else f"pp {p} x virtual stages {v}"
        reader.error(f"{said} = {total} does not split evenly over {over} (Megatron-LM asserts "
                     "it, get_num_layers_to_build)", given.origin, code=Code.NOT_DIVISIBLE)
        return None
    counts = [total // (p * v)] * (p * v)
    if emb is not None:
        counts[0] -= 1
    if loss is not None:
        counts[-1] -= 1
    return Value(tuple(counts), Origin(f"{said} = {total} over {p * v} virtual stages, "
                                       f"{total // (p * v)} each, one fewer at the ends",
                                       given.origin.source, given.origin.span))


def _data_placement(args: Arguments, reader: Reader, fsdp2: Value | None,
                    dist_opt: Value | None) -> Line:
    """Megatron-LM's data axis: torch FSDP2, the distributed optimizer (ZeRO-1) or DDP, with the
    overlap its flags give."""
    overlap_on = _data_overlap(args, reader, dist_opt is not None)
    if fsdp2 is not None:
        return Line("place fsdp over dp", "--use-torch-fsdp2", fsdp2.origin)
    if dist_opt is not None:
        return Line(f"place zero1{overlap_on.value} over dp",
                    f"--use-distributed-optimizer; {overlap_on.origin.key}", dist_opt.origin)
    return Line(f"place ddp{overlap_on.value} over dp",
                f"no --use-distributed-optimizer; {overlap_on.origin.key}", overlap_on.origin)


def _data_overlap(args: Arguments, reader: Reader, dist_opt: bool) -> Value:
    """The data axis's overlap option from --overlap-grad-reduce / --overlap-param-gather, both
    off by default (``DistributedDataParallelConfig``): without the first, the gradients are
    reduced after the last backward, nothing overlapped; with it alone, the distributed
    optimizer's parameter all-gather still runs after the update. validate_args asserts the
    second only with the first and the distributed optimizer."""
    grads = args.flag("--overlap-grad-reduce")
    params = args.flag("--overlap-param-gather")
    if params is not None and (grads is None or not dist_opt):
        need = "--overlap-grad-reduce" if grads is None else "--use-distributed-optimizer"
        reader.error(f"--overlap-param-gather without {need}: Megatron-LM asserts it "
                     "(validate_args)", params.origin, code=Code.BAD_VALUE)
    if grads is None:
        return Value("(overlap = none)",
                     Origin("no --overlap-grad-reduce: gradients reduced after the backward",
                            reader.source, None))
    if params is None and dist_opt:
        return Value("(overlap = grads)", Origin(
            "--overlap-grad-reduce, no --overlap-param-gather: parameters gathered after the "
            "update", grads.origin.source, grads.origin.span))
    return Value("", Origin("--overlap-grad-reduce" + (" + --overlap-param-gather" if dist_opt
                                                        else ""),
                            grads.origin.source, grads.origin.span))


def _overlap_without_sp(written: bool) -> Callable[[Facts], str | None]:
    def check(facts: Facts) -> str | None:
        if written and facts.tensor > 1:
            return None
        why = ("without --sequence-parallel" if not written else
               "with one tensor-parallel rank (validate_args turns sequence parallelism off)")
        return (f"--tp-comm-overlap {why}: Megatron-LM asserts 'Tensor parallel "
                "communication/GEMM overlap can happen only when sequence parallelism is "
                "enabled' (validate_args)")
    return check


def _sp_ignored(facts: Facts) -> str | None:
    if facts.tensor > 1:
        return None
    return ("--sequence-parallel with one tensor-parallel rank: Megatron-LM switches sequence "
            "parallelism off (validate_args)")


def _global_batch_broken(total: int) -> Callable[[Facts, int], str]:
    def message(facts: Facts, product: int) -> str:
        return (f"--global-batch-size {total} != --micro-batch-size {facts.micro_batch} x "
                f"micro-batches {facts.microbatches} x data-parallel size {facts.batch_degree} = "
                f"{product} (Megatron-LM's micro-batch calculator derives the micro-batches from "
                "it and asserts it divides)")

    return message


def _virtual_stages(args: Arguments, reader: Reader, p: int) -> Value | None:
    per_stage = args.integer("--num-layers-per-virtual-pipeline-stage")
    stages = args.integer("--num-virtual-stages-per-pipeline-rank") or \
        args.integer("--virtual-pipeline-model-parallel-size")
    if stages is not None:
        return stages if int(str(stages.value)) > 1 else None
    if per_stage is None:
        return None
    layers = args.integer("--num-layers")
    if layers is None:
        return None
    # validate_args counts the embedding and the loss as layers when the split accounts for them
    extra = sum(args.flag(name) is not None for name in (
        "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"))
    per_rank, rest = divmod(int(str(layers.value)) + extra, p)
    if rest or per_rank % int(str(per_stage.value)):
        counted = f" + {extra} (the split accounts for them)" if extra else ""
        reader.error(f"--num-layers {layers.value}{counted} / --pipeline-model-parallel-size {p} "
                     f"is not a multiple of {per_stage.value} layers per virtual stage",
                     per_stage.origin, code=Code.NOT_DIVISIBLE)
        return None
    chunks = per_rank // int(str(per_stage.value))
    return Value(chunks, per_stage.origin) if chunks > 1 else None


def _leftovers(args: Arguments, runner: Arguments, reader: Reader, plan: Plan) -> None:
    ignored: list[str] = []
    for name, (word, _) in args.flags.items():
        if name in args.used:
            continue
        if name in NOT_MODELLED:
            reader.warning(f"not modelled: {name}: {NOT_MODELLED[name]}", args.origin(word))
        elif name in REFUSED:
            pass  # reported with the model
        elif name in IGNORED or name.startswith(IGNORED_PREFIXES):
            ignored.append(name)
        else:
            reader.warning(f"not modelled: {name} (placeverify does not read this argument)",
                           args.origin(word))
    for name in runner.flags:
        if name not in runner.used:
            ignored.append(name)
    ignored_header(plan, sorted(set(ignored)))
