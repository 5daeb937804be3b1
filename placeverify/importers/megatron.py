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
from pathlib import Path

from placeverify.diagnostics import Code, Severity, Source
from placeverify.importers import megatron_fsdp
from placeverify.importers.common import Line, Plan, Reader
from placeverify.importers.hf_config import attach_model
from placeverify.importers.megatron_data import data_placement
from placeverify.importers.megatron_deepspeed import read_engine
from placeverify.importers.megatron_flags import leftovers
from placeverify.importers.megatron_model import cross_check, model_lines
from placeverify.importers.megatron_run import Run, start
from placeverify.importers.megatron_stages import pipeline_line, read_stages
from placeverify.importers.origins import Origin, Value
from placeverify.importers.rules import Facts, Rule, batch_rule, reads_tensor, world_rule


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    """The plan of Megatron-LM arguments: the launch (:func:`.megatron_run.start`), then each
    of :data:`STEPS` in turn."""
    run = start(reader, source, model, world)
    for step in STEPS:
        step(run)
    return run.plan


def _data_parallel(run: Run) -> None:
    """DP = world / (TP x PP x CP), which must be whole, and the expert ranks within it."""
    reader, world_value, (t, p, c, e) = run.reader, run.world, run.sizes
    divisible = world_value is not None and world_value % (t * p * c) == 0
    if world_value is not None and not divisible:
        # validate_args asserts it; judged on the final mesh (rules.py), so that an override
        # (--set mesh.pp=1, --set mesh.dp=...) can give a mesh the launcher's world makes. The
        # text keeps dp = 1 and no world line until then.
        world_line = run.world_line
        origin = (run.tp.origin if run.tp.origin.span else world_line.origin
                  if world_line is not None and world_line.origin is not None else run.tp.origin)
        run.plan.rules.append(world_rule(origin, world_value, "Megatron-LM asserts world = "
                                         "TP x PP x CP x DP in validate_args"))
        reader.pending_error(f"world size {world_value} is not divisible by TP * PP * CP = {t} "
                             f"* {p} * {c} = {t * p * c} (Megatron-LM asserts it in "
                             "validate_args)", origin, Code.NOT_DIVISIBLE)
        run.world_line = None
    elif world_value is not None:
        run.dp = dp = world_value // (t * p * c)
        x = int(str(run.etp.value)) if run.etp is not None else t
        if e > 1 and world_value % (x * e * p):
            reader.error(f"world size {world_value} is not divisible by ETP * EP * PP = {x} * {e} "
                         f"* {p} = {x * e * p}: Megatron-core refuses the launch "
                         "(parallel_state.initialize_model_parallel: 'world_size is not divisible "
                         "by expert_tensor_model_pipeline_parallel size')", run.ep.origin,
                         code=Code.NOT_DIVISIBLE)
        elif e > 1 and dp % run.ep_axis:
            reader.error(f"not modelled: --expert-model-parallel-size {e} does not divide the "
                         f"data-parallel size {dp} (Megatron takes EP ranks from DP * CP; "
                         "placeverify's ep axis is carved out of dp)", run.ep.origin,
                         code=Code.NOT_MODELLED)


def _sequence_parallel(run: Run) -> None:
    """--sequence-parallel and --tp-comm-overlap, with the rules validate_args applies to them."""
    run.sp = sp = run.args.flag("--sequence-parallel")
    run.overlap = overlap = run.args.flag("--tp-comm-overlap")
    if overlap is not None:
        # validate_args: sequence parallelism off with one tensor-parallel rank, then
        # "assert args.sequence_parallel == True" under --tp-comm-overlap
        run.plan.rules.append(Rule(Severity.ERROR, Code.CONFLICT, overlap.origin,
                                   _overlap_without_sp(sp is not None), reads_tensor))
    if sp is not None:
        # validate_args switches sequence parallelism off with one tensor-parallel rank, silently;
        # judged on the final tensor-parallel size (an override may change it).
        run.plan.rules.append(Rule(Severity.WARNING, Code.CONFLICT, sp.origin, _sp_ignored,
                                   reads_tensor))
        if run.sizes[0] == 1:
            run.sp = None


def _batch(run: Run) -> None:
    """The micro-batch and the micro-batches per step: --global-batch-size / (micro x dp)."""
    run.micro = micro = run.args.integer("--micro-batch-size", 1)
    run.glob = glob = run.args.integer("--global-batch-size")
    if micro is not None and run.world is not None:
        per_step = int(str(micro.value)) * run.dp
        if glob is not None:
            # num_microbatches_calculator.py: global / (micro x dp), which must be whole; the
            # rule is judged on the final values (rounded down here, at least 1).
            total = int(str(glob.value))
            run.m = max(1, total // per_step)
            run.plan.rules.append(batch_rule(glob.origin, total, _global_batch_broken(total)))


# Megatron's model flags, read from --model's config.json instead when it is given
MODEL_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
               "--num-query-groups", "--group-query-attention", "--swiglu", "--normalization",
               "--disable-bias-linear", "--vocab-size", "--tokenizer-type",
               "--max-position-embeddings", "--make-vocab-size-divisible-by", "--num-experts",
               "--moe-router-topk", "--moe-ffn-hidden-size", "--hidden-dropout",
               "--attention-dropout", "--attention-backend", "--use-flash-attn")


def _model(run: Run) -> None:
    """The model block: Megatron's model flags, or --model's config.json (cross-checked against
    the flags that are given)."""
    args, reader, model, program = run.args, run.reader, run.model, run.started.program
    seq = args.integer("--seq-length")
    own = None if model is not None else model_lines(
        args, reader, program.text if program is not None else None)
    if model is not None:
        for flag in MODEL_FLAGS:
            args.used.add(flag)
    hf = attach_model(run.plan, reader, model, seq, run.micro, own, "the Megatron-LM arguments")
    if hf is not None:
        cross_check(args, reader, hf, run.plan.model)


def _precision(run: Run) -> None:
    """--bf16 (bf16 Θ, fp32 main gradients unless --grad-reduce-in-bf16), --fp16 (a dynamic loss
    scale unless --loss-scale), else fp32; Adam's 12 bytes per parameter."""
    args, reader = run.args, run.reader
    bf16, fp16 = args.flag("--bf16"), args.flag("--fp16")
    fp32_grads = args.flag("--accumulate-allreduce-grads-in-fp32")
    bf16_grads = args.flag("--grad-reduce-in-bf16")
    static_scale = args.text("--loss-scale")
    args.used.add("--initial-loss-scale")
    optimizer = args.text("--optimizer")
    if optimizer is not None and optimizer.value != "adam":
        reader.error(f"not modelled: --optimizer {optimizer.value} (Adam's 12 bytes per parameter "
                     "are modelled)", optimizer.origin, code=Code.NOT_MODELLED)
    fsdp = megatron_fsdp.flag(args)
    if fsdp is not None and (bf16 is not None or fp16 is not None):
        run.plan.precision = megatron_fsdp.precision(args, reader, "bf16" if bf16 else "fp16")
    elif bf16 is not None:
        run.plan.precision = (Line("precision megatron", "--bf16: bf16 Θ, fp32 main grads, Adam "
                                   "12 B", bf16.origin) if bf16_grads is None else
                              Line("precision { params = bf16, grads = bf16, optimizer = 12, "
                                   "activations = bf16, loss_scale = none }",
                                   "--bf16 --grad-reduce-in-bf16", bf16_grads.origin))
    elif fp16 is not None:
        grads = "fp32" if fp32_grads is not None else "fp16"
        scale = "static" if static_scale is not None else "dynamic"
        run.plan.precision = Line(f"precision {{ params = fp16, grads = {grads}, optimizer = 12, "
                                  f"activations = fp16, loss_scale = {scale} }}",
                                  "--fp16" + (" --loss-scale" if static_scale else ""),
                                  fp16.origin)
    else:
        run.plan.precision = Line("precision fp32_adam", "no --bf16/--fp16: fp32 training")


def _mesh(run: Run) -> None:
    """The mesh, in Megatron's rank order tp-cp-ep-dp-pp
    (parallel_state.initialize_model_parallel)."""
    (t, p, c, e), dp, mesh, a = run.sizes, run.dp, run.plan.mesh, run.ep_axis
    run.d = d = dp // a if e > 1 and dp % a == 0 else dp
    x = run.etp_size
    if run.split and run.etp is not None and x > 1:
        # the expert tensor-parallel ranks: the fastest part of the dense tp group
        mesh.append(Line(f"etp = {x}", f"{run.etp.origin.key} (the dense tensor-parallel "
                         "group is tp x etp)", run.etp.origin))
    for axis, size, given in (("tp", t // x, run.tp), ("cp", c, run.cp)):
        if size > 1:
            mesh.append(Line(f"{axis} = {size}", given.origin.key + (
                f" / {run.etp.origin.key}" if x > 1 and run.etp is not None else ""),
                given.origin))
    if run.split and run.etp is not None:
        # parallel_state.py: the expert mesh (tp=ETP, ep=EP, dp=world / (ETP * EP * PP)) in
        # the order tp-cp-ep-dp-pp: an expert-parallel group spans whole dense tensor groups
        mesh.append(Line(f"ep = {a}", f"{x} x {run.ep.origin.key} / {run.tp.origin.key} (the "
                         "experts split whole over tp x ep)" if x > 1 else
                         f"{run.ep.origin.key} / {run.tp.origin.key} (--expert-tensor-parallel-"
                         "size 1: the experts split whole over tp x ep)", run.etp.origin))
    elif e > 1:
        mesh.append(Line(f"ep = {e}", run.ep.origin.key, run.ep.origin))
    mesh.append(Line(f"dp = {d}", f"world / (tp * pp * cp) = {dp}" + (f", / ep = {d}"
                                                                      if e > 1 else "")
                     if run.world_line is not None or run.world is None else
                     f"world {run.world} is not divisible by tp * pp * cp = {t * p * c}: "
                     "dp 1 until an override gives a mesh of that world"))
    if p > 1:
        mesh.append(Line(f"pp = {p}", run.pp.origin.key, run.pp.origin))
    if run.world_line is not None:
        mesh.append(run.world_line)


def _model_parallel(run: Run) -> None:
    """The tensor-, context- and expert-parallel placements.

    Megatron-LM's column-parallel layers (LinearWithGradAccumulationAndAsyncCommunication)
    all-gather their input again in backward beside the input-gradient GEMM and reduce-scatter
    (without sequence parallelism: all-reduce) the input gradient beside the weight-gradient GEMM,
    async; --no-async-tensor-model-parallel-allreduce (until 2026) turned the all-reduce's off.
    Megatron-DeepSpeed's copy of Megatron-LM (2021) waits for both."""
    args, body, tp = run.args, run.plan.body, run.tp
    t, _, c, e = run.sizes
    run.fsdp2 = args.flag("--use-torch-fsdp2")
    run.dist_opt = args.flag("--use-distributed-optimizer")
    engine_tp = "--deepspeed" in args.flags
    no_async = args.flag("--no-async-tensor-model-parallel-allreduce")
    waits = " (Megatron-DeepSpeed's layers wait for every collective)"
    if run.sp is not None and run.overlap is not None:
        body.append(Line("place megatron(sequence_parallel, overlap = true) over tp",
                         f"{tp.origin.key} + --sequence-parallel + --tp-comm-overlap",
                         run.overlap.origin))
    elif run.sp is not None:
        body.append(Line("place megatron(sequence_parallel) over tp" if engine_tp else
                         "place megatron(sequence_parallel, overlap = backward) over tp",
                         f"{tp.origin.key} + --sequence-parallel" + (
                             waits if engine_tp else "; the backward's re-gather and "
                             "reduce-scatter run beside the GEMMs"), run.sp.origin))
    elif t > 1 and (engine_tp or no_async is not None):
        body.append(Line("place megatron over tp", tp.origin.key + (
            " + --no-async-tensor-model-parallel-allreduce" if no_async is not None else waits),
            no_async.origin if no_async is not None else tp.origin))
    elif t > 1:
        body.append(Line("place megatron(overlap = backward) over tp",
                         f"{tp.origin.key}; the input-gradient all-reduce runs beside the "
                         "weight-gradient GEMM", tp.origin))
    if c > 1:
        sharded = run.dist_opt is not None
        body.append(Line("place context(R, S, R, S) over cp" if sharded else
                         "place context over cp",
                         run.cp.origin.key + (" (the distributed optimizer shards over dp x cp)"
                                              if sharded else ""), run.cp.origin))
    if run.split and run.etp is not None:
        if run.etp_size > 1:  # the same tensor placement over the expert tensor-parallel part
            last = body[-1]
            body.append(Line(last.text.replace(" over tp", " over etp"), last.why + " (etp: the "
                             "expert tensor-parallel part of the dense group)", last.origin))
        if run.sp is None:
            # megatron/core/transformer/moe/moe_layer.py:636-640 (MoELayer.forward) raises in
            # training for MoE with tensor parallelism and no sequence parallelism
            run.reader.error("--expert-model-parallel-size with --tensor-model-parallel-size "
                             f"{t} needs --sequence-parallel: Megatron-core's MoE layer "
                             "refuses tensor parallelism without it in training",
                             run.etp.origin, code=Code.CONFLICT)
        body.append(Line("place expert over tp * ep", f"{run.ep.origin.key} + "
                         f"{run.etp.origin.key}: the expert data-parallel group is dp",
                         run.etp.origin))
    elif e > 1:
        body.append(Line("place expert over ep", run.ep.origin.key, run.ep.origin))


def _data(run: Run) -> None:
    """The data axis: DeepSpeed's engine when --deepspeed is given (Megatron-DeepSpeed: it also
    decides the precision and runs the pipeline), else Megatron-LM's own."""
    t, p, _, _ = run.sizes
    plan = run.plan
    run.engine = engine = read_engine(run.args, run.reader, run.script, plan, t=t, p=p, dp=run.d,
                                      micro=run.micro, microbatches=run.m,
                                      global_batch=run.glob is not None)
    if engine is not None:
        run.m = engine.microbatches or run.m
        plan.precision = engine.precision
        plan.body += [engine.data, *engine.body]
        if engine.pipeline is not None:
            plan.body.append(engine.pipeline)
    else:
        line = data_placement(run.args, run.reader, run.fsdp2, run.dist_opt)
        experts = run.split or run.sizes[3] > 1
        if experts and run.dist_opt is not None and run.fsdp2 is None and \
                megatron_fsdp.flag(run.args) is None:
            # the distributed optimizer shards the dense parameters' state over the dense
            # data-parallel group (ep x dp here), the experts' over the expert data-parallel
            # group dp (megatron/core/distributed/distributed_data_parallel.py:280-290: the
            # expert-parallel buffers take intra_expt_dp_group, the others intra_dp_cp_group)
            line = Line(line.text.replace(" over dp", " over ep * dp"),
                        line.why + "; the dense state over ep x dp, the experts' over dp",
                        line.origin)
        plan.body.append(line)


def _pipeline(run: Run) -> None:
    """The pipeline (Megatron-LM's; DeepSpeed's engine placed its own), or the micro-batches of
    gradient accumulation without one."""
    p, m = run.sizes[1], run.m
    stages = read_stages(run.args, run.reader, p)
    where = run.glob.origin if run.glob is not None else (run.micro.origin if run.micro else None)
    if run.engine is not None:
        if p == 1 and m > 1:
            run.plan.body.append(Line(f"microbatches = {m}", "DeepSpeed's gradient accumulation: "
                                      "global / (micro x dp)", where))
    elif p > 1:
        run.plan.body.append(pipeline_line(stages, run.pp, m))
    elif m > 1:
        run.plan.body.append(Line(f"microbatches = {m}", "--global-batch-size / "
                                  "(--micro-batch-size x dp)", where))


def _loss_and_clip(run: Run) -> None:
    """The loss (Megatron's micro-batch mean unless --calculate-per-token-loss) and the clipping
    (--clip-grad; the engine's under --deepspeed)."""
    args, body, engine = run.args, run.plan.body, run.engine
    per_token = args.flag("--calculate-per-token-loss")
    body.append(Line("loss token_mean", "--calculate-per-token-loss", per_token.origin)
                if per_token is not None else
                Line("loss microbatch_mean", "Megatron's default: each micro-batch's token "
                     "mean, divided by the number of micro-batches"))
    clip = args.real("--clip-grad", 1.0) if engine is None else None
    if clip is not None and float(str(clip.value)) > 0:
        body.append(Line(f"clip max_norm = {clip.value}", clip.origin.key, clip.origin))
    elif engine is not None and engine.clip is not None:
        body.append(engine.clip)


def _recompute(run: Run) -> None:
    """--recompute-granularity (--recompute-activations: selective), or Megatron-LM's older
    --checkpoint-activations (full); and --optimizer-cpu-offload."""
    args, reader, body = run.args, run.reader, run.plan.body
    granularity = args.text("--recompute-granularity")
    if args.flag("--recompute-activations") is not None and granularity is None:
        granularity = Value("selective", Origin("--recompute-activations", run.source))
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
            body.append(Line(f"recompute {granularity.value}", granularity.origin.key,
                             granularity.origin))
    offload = args.flag("--optimizer-cpu-offload")
    if offload is not None:
        body.append(Line("offload optimizer to cpu", "--optimizer-cpu-offload", offload.origin))


def _finish(run: Run) -> None:
    """The title, the flags not read, and what the script leaves to its launch."""
    reader, source, script, plan = run.reader, run.source, run.script, run.plan
    t, p, c, e = run.sizes
    parts = [f"tp = {t}", f"pp = {p}", f"dp = {run.d}"] + ([f"cp = {c}"] if c > 1 else []) + \
        ([f"ep = {e}"] if e > 1 else []) + ([f"etp = {run.etp_size}"] if run.split else [])
    plan.title = f"{Path(source.path).name}: " + \
        ("Megatron-DeepSpeed" if run.engine is not None else "Megatron-LM") + ", " + ", ".join(parts)
    leftovers(run.args, run.runner, reader, plan)
    for swallowed, line in script.swallowed if script is not None else []:
        reader.warning(f"the shell reads {swallowed.text} as the file of a redirection ('<' or "
                       f"'>') in the command at line {line}, not as an argument: a '<...>' "
                       "placeholder left in the script? The flag is not read",
                       Origin(swallowed.text, source, swallowed.span), code=Code.NOT_STATIC)
    for sourced in script.sourced if script is not None else []:
        reader.warning(f"the script sources {sourced.text}, which placeverify does not read: a "
                       "variable that file sets is taken as the script leaves it",
                       Origin("source", source, sourced.span), code=Code.NOT_STATIC)
    assumed = [a for a in dict.fromkeys([*run.runner.assumed(), *run.args.assumed(),
                                         *(script.decided if script is not None else [])])
               if a not in run.replaced]
    given = reader.inputs.describe()
    if given and script is not None:
        plan.header.append(f"The script read as run with {given}")
    if assumed:
        plan.header.append("Assumed about the launch (defaults of variables the environment or "
                           "the script's arguments may set): " + "; ".join(assumed))


# The steps of reading a launch, in order: each adds its lines to the plan and reports its
# diagnostics (the order of the messages is the order of the steps).
STEPS: tuple[Callable[[Run], None], ...] = (
    _data_parallel, _sequence_parallel, _batch, _model, _precision, _mesh, _model_parallel,
    _data, _pipeline, _loss_and_clip, _recompute, _finish)


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
