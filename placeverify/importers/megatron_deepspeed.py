"""Megatron-DeepSpeed: Megatron-LM's arguments with ``--deepspeed``, the model run by DeepSpeed's
engine (bigscience-workshop/Megatron-DeepSpeed, which trained BLOOM, and
deepspeedai/Megatron-DeepSpeed).

What the engine decides, from the DeepSpeed JSON named by ``--deepspeed_config`` (a file the
launch script writes from a here-document, ``cat <<EOT > $config_json``, or one beside it):

- **The model is a DeepSpeed pipeline** (``GPTModelPipe``, a ``PipelineModule``) unless
  ``--no-pipeline-parallel``: DeepSpeed's ``PipelineEngine`` runs 1F1B (``TrainSchedule``), with
  no interleaving, and reduces the gradients after the whole schedule (its ``ReduceGrads``
  instruction): nothing overlapped. It asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are
  incompatible with pipeline parallelism", ``runtime/pipe/engine.py``).
- **Pipeline stages**: how DeepSpeed's ``PipelineModule`` splits GPTModelPipe's layers
  (:mod:`.deepspeed_pipe`).
- **The optimizer** (``runtime/engine.py``, ``_configure_optimizer``): ZeRO stage 0 with bf16 in
  a pipeline is DeepSpeed's ``BF16_Optimizer`` (``runtime/bf16_optimizer.py``): fp32 master
  weights and Adam sharded over the data-parallel ranks, an fp32 gradient accumulation buffer
  for every parameter beside the bf16 ``.grad`` the pipeline engine keeps
  (``update_hp_grads(clear_lp_grads=False)``), the fp32 gradients all-reduced: ``zero1`` with
  ``precision megatron`` under the ``megatron_deepspeed`` memory profile (which adds the bf16
  gradients). Stage 0 with fp16 is ``FP16_Optimizer`` (everything replicated: ``ddp``); stages
  1-3 are DeepSpeed's ZeRO as the DeepSpeed importer reads them.
- Batch: the JSON's ``train_micro_batch_size_per_gpu`` must be ``--micro-batch-size`` and
  ``train_batch_size`` = micro x accumulation x data-parallel size (the engine asserts it);
  the clipping is the JSON's ``gradient_clipping`` (the engine clips; ``--clip-grad`` is not
  used).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from placeverify.diagnostics import Code, PlaceError, Source, Span
from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Line, Plan, Reader, leftovers
from placeverify.importers.deepspeed import (
    KEYS,
    ZERO_KEYS,
    Config,
    KeyPath,
    Launch,
    data_overlap,
    precision_line,
)

# partition_balanced and its predecessor are re-exported: the tests reach them here
from placeverify.importers.deepspeed_pipe import partition_balanced as partition_balanced
from placeverify.importers.deepspeed_pipe import (
    partition_balanced_before_4312 as partition_balanced_before_4312,
)
from placeverify.importers.deepspeed_pipe import pipeline_line
from placeverify.importers.origins import Origin, Value
from placeverify.importers.positions import load_json
from placeverify.importers.rules import Facts, batch_rule
from placeverify.importers.shell import Script
from placeverify.importers.shell_values import Word, Written

CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed-config", "--deepscale_config")
# Read here (or by the Megatron importer) when --deepspeed is given; named once in the header.
USED = ("--deepspeed", "--zero-stage", "--deepspeed-activation-checkpointing",
        "--no-pipeline-parallel", "--pp-partition-method", "--clip-grad", *CONFIG_FLAGS)
NOT_MODELLED = {
    "--partition-activations": "activation checkpoints split over the tensor-parallel ranks "
                               "(each rank's saved layer inputs counted whole)",
    "--cpu-optimizer": "DeepSpeed's CPU Adam (the optimizer is placed by the JSON's offload)",
    "--contigious-checkpointing": "contiguous activation-checkpoint buffers",
    "--checkpoint-in-cpu": "activation checkpoints moved to the host",
}


@dataclass
class Engine:
    """What DeepSpeed's engine makes of the run: the lines that replace Megatron-LM's."""

    data: Line  # place ... over dp
    precision: Line
    pipeline: Line | None  # place pipeline(...) over pp
    clip: Line | None
    microbatches: int | None  # from the JSON when --global-batch-size is not given
    body: list[Line] = field(default_factory=list)  # offload


def read_engine(args: Arguments, reader: Reader, script: Script | None, plan: Plan, *, t: int,
                p: int, dp: int, micro: Value | None, microbatches: int,
                global_batch: bool) -> Engine | None:
    """The engine's lines when ``--deepspeed`` is given (else None)."""
    given = args.flag("--deepspeed")
    if given is None:
        for flag in CONFIG_FLAGS:
            if flag in args.flags:
                args.used.add(flag)
                reader.warning(f"{flag} without --deepspeed: Megatron-DeepSpeed runs Megatron's "
                               "own training loop and does not read it",
                               args.origin(args.flags[flag][0]), code=Code.CONFLICT)
        return None
    for name in USED:
        args.used.add(name)
    doc = _config(args, reader, script, dp)
    if doc is None:
        reader.raise_if_errors()
        return None
    pipe = args.flags.get("--no-pipeline-parallel") is None
    stage_v = doc.integer("zero_optimization", "stage", low=0)
    stage = 0 if stage_v is None else int(stage_v.value)
    origin = stage_v.origin if stage_v else Origin("zero_optimization.stage (default 0)",
                                                   doc.source)
    zero_flag = args.integer("--zero-stage", low=0)
    if zero_flag is not None and int(str(zero_flag.value)) != stage:
        reader.warning(f"--zero-stage {zero_flag.value}, but the DeepSpeed configuration's "
                       f"stage is {stage}: the engine runs the configuration's (Megatron-DeepSpeed "
                       "uses --zero-stage only to build the model under zero.Init at 3)",
                       zero_flag.origin, code=Code.CONFLICT)
    if pipe and stage >= 2:
        reader.error(f"ZeRO stage {stage} with DeepSpeed's pipeline engine: it asserts 'ZeRO-2 "
                     "and ZeRO-3 are incompatible with pipeline parallelism' "
                     "(runtime/pipe/engine.py); Megatron-DeepSpeed builds the model as a pipeline "
                     "unless --no-pipeline-parallel", origin, code=Code.CONFLICT)
        return None
    chosen = _optimizer(args, reader, doc, stage, origin, pipe)
    if chosen is None:
        return None
    data, precision, float16 = chosen
    engine = Engine(data, precision, None, _clip(doc), None)
    _batch(args, reader, doc, plan, micro, dp, microbatches, global_batch, engine)
    if pipe and p > 1:
        engine.pipeline = pipeline_line(args, reader, p, float16,
                                        engine.microbatches or microbatches)
    _rest(args, reader, doc, plan, engine, stage)
    plan.framework = "megatron_deepspeed"
    return engine


def _optimizer(args: Arguments, reader: Reader, doc: Config, stage: int, origin: Origin,
               pipe: bool) -> tuple[Line, Line, bool] | None:
    """The data axis and the precision of the optimizer DeepSpeed wraps (module docstring):
    BF16_Optimizer, FP16_Optimizer or plain training at stage 0, ZeRO at 1-3, and whether the
    model trains in 16 bits; None, after an error, where placeverify does not model which
    optimizer runs."""
    _precision_agrees(args, reader, doc)
    precision = precision_line(doc)
    bf16, fp16 = _enabled(doc, "bf16"), _enabled(doc, "fp16")
    after = "reduced after the whole pipeline schedule (ReduceGrads)"
    if stage == 0 and bf16 and not pipe:
        reader.error("not modelled: bf16 without ZeRO outside DeepSpeed's pipeline engine (which "
                     "optimizer wraps it depends on the DeepSpeed version: BF16_Optimizer in "
                     "0.7-0.8, plain bf16 training after)", origin, code=Code.NOT_MODELLED)
        return None
    if stage == 0 and bf16:
        data = Line("place zero1(overlap = none) over dp", f"{origin.key} 0 with bf16 in a "
                    f"pipeline: DeepSpeed's BF16_Optimizer shards fp32 master and Adam over dp; "
                    f"fp32 gradients {after}", origin)
        precision = Line("precision megatron", "BF16_Optimizer: bf16 Θ, fp32 gradient "
                         "accumulation, fp32 master + Adam 12 B", precision.origin)
        reader.warning("BF16_Optimizer all-reduces the fp32 gradients over dp (2(n-1)/n of them "
                       "per rank) where zero1 reduce-scatters them ((n-1)/n): the data-parallel "
                       "gradient traffic is counted at half", origin, code=Code.NOT_MODELLED)
    elif stage == 0:
        kind = "FP16_Optimizer" if fp16 else "fp32 training"
        data = Line("place ddp(overlap = none) over dp", f"{origin.key} 0: {kind}, everything "
                    "replicated; gradients all-reduced " + (after if pipe else
                                                            "after the backward"), origin)
    else:
        preset = ("zero1", "zero2", "zero3")[min(stage, 3) - 1]
        overlap, why = ("(overlap = none)", after) if pipe else data_overlap(reader, doc, stage)
        data = Line(f"place {preset}{overlap} over dp", f"{origin.key} {stage}; {why}", origin)
    return data, precision, bf16 or fp16


def _rest(args: Arguments, reader: Reader, doc: Config, plan: Plan, engine: Engine,
          stage: int) -> None:
    """The engine's optimizer offload, and the warnings about what it does not read or model;
    the configuration's keys left over."""
    offload = doc.get("zero_optimization", "offload_optimizer", "device")
    if offload is not None and offload.value in ("cpu", "nvme") and stage >= 1:
        engine.body.append(Line("offload optimizer to cpu", offload.origin.key, offload.origin))
    checkpointing = doc.get("activation_checkpointing")
    if checkpointing is not None:
        reader.warning("not modelled: activation_checkpointing (DeepSpeed's checkpointing "
                       "options; which layers are recomputed is --checkpoint-activations)",
                       checkpointing.origin)
    for flag, what in NOT_MODELLED.items():
        if flag in args.flags:
            args.used.add(flag)
            reader.warning(f"not modelled: {flag}: {what}", args.origin(args.flags[flag][0]))
    clip = args.flags.get("--clip-grad")
    if clip is not None:
        reader.warning("--clip-grad is not used under --deepspeed: the engine clips by the "
                       "configuration's gradient_clipping", args.origin(clip[0]),
                       code=Code.CONFLICT)
    leftovers(reader, plan, doc.source, doc.data, doc.spans, ((), KEYS),
              (("zero_optimization",), ZERO_KEYS))


def _precision_agrees(args: Arguments, reader: Reader, doc: Config) -> None:
    """Megatron's --bf16 / --fp16 build the model in that dtype; the engine's bf16 / fp16 must
    say the same (Megatron-DeepSpeed passes both to the same run)."""
    for dtype in ("bf16", "fp16"):
        flag, on = f"--{dtype}", _enabled(doc, dtype)
        if (flag in args.flags) != on:
            where = args.origin(args.flags[flag][0]) if flag in args.flags else \
                doc.origin(dtype, "enabled")
            reader.error(f"{flag} {'is' if flag in args.flags else 'is not'} given but the "
                         f"DeepSpeed configuration's {dtype}.enabled is "
                         f"{'true' if on else 'not true'}: the model and the engine would train "
                         "in different precisions", where, code=Code.CONFLICT)


def _enabled(doc: Config, dtype: str) -> bool:
    """Whether the configuration enables ``bf16`` (also spelt ``bfloat16``) or ``fp16``."""
    keys = ("bf16", "bfloat16") if dtype == "bf16" else (dtype,)
    return any((v := doc.get(key, "enabled")) is not None and v.value is True for key in keys)


def _clip(doc: Config) -> Line | None:
    clip = doc.get("gradient_clipping")
    if clip is not None and isinstance(clip.value, (int, float)) and not isinstance(clip.value, bool) \
            and clip.value > 0:
        return Line(f"clip max_norm = {clip.value}", clip.origin.key, clip.origin)
    return None


def _batch(args: Arguments, reader: Reader, doc: Config, plan: Plan, micro: Value | None,
           dp: int, microbatches: int, global_batch: bool, engine: Engine) -> None:
    ds_micro = doc.integer("train_micro_batch_size_per_gpu")
    if ds_micro is not None and micro is not None and int(ds_micro.value) != int(str(micro.value)):
        reader.error(f"train_micro_batch_size_per_gpu {ds_micro.value} is not --micro-batch-size "
                     f"{micro.value}: the pipeline engine's buffers and Megatron's data loader "
                     "would disagree", ds_micro.origin, code=Code.CONFLICT)
    train = doc.integer("train_batch_size")
    doc.integer("gradient_accumulation_steps")
    if train is None:
        return
    total = int(train.value)

    def broken(facts: Facts, product: int) -> str:
        return (f"train_batch_size {total} != micro-batch {facts.micro_batch} x micro-batches "
                f"{facts.microbatches} x data-parallel size {facts.batch_degree} = {product} "
                "(DeepSpeed asserts train = micro x accumulation x data-parallel size)")

    plan.rules.append(batch_rule(train.origin, total, broken))
    if not global_batch and micro is not None:
        engine.microbatches = max(1, total // (int(str(micro.value)) * dp))


# ---- the DeepSpeed configuration ----------------------------------------------------------------

def _config(args: Arguments, reader: Reader, script: Script | None, dp: int) -> Config | None:
    flag = next((f for f in CONFIG_FLAGS if f in args.flags), None)
    if flag is None:
        reader.error("--deepspeed without --deepspeed_config: DeepSpeed's engine needs its "
                     "configuration (give it, or import the JSON alone)",
                     args.origin(args.flags["--deepspeed"][0]), code=Code.MISSING)
        return None
    word, values = args.flags[flag]
    if len(values) != 1:
        reader.error(f"{flag} takes one value", args.origin(word), code=Code.BAD_VALUE)
        return None
    name = values[0]
    launch = Launch(dp, f"data-parallel size {dp}", what="the DeepSpeed configuration",
                    filler="Megatron-DeepSpeed fills no \"auto\"")
    written = script.files.get(name.name) if script is not None else None
    if written is not None and written.by is not None:
        reader.error(f"{flag} {name.text}: the script writes it with {written.by} at line "
                     f"{written.line}, which placeverify does not run; import that JSON on its "
                     "own, or put it beside the script under this name",
                     args.origin(name, flag), code=Code.NOT_STATIC)
        return None
    if written is not None:
        return _from_heredoc(reader, script, written, name, launch)  # type: ignore[arg-type]
    if name.unresolved:
        reader.error(f"{flag}: {name.unresolved}, and the script writes no such file; write "
                     "the path", args.origin(name, flag), code=Code.NOT_STATIC)
        return None
    beside = Path(args.source.path).parent / name.text
    if not beside.is_file():
        reader.error(f"{flag} {name.text}: the script does not write it and no such file is "
                     f"beside it ({beside})", args.origin(name, flag), code=Code.MISSING)
        return None
    try:
        text = beside.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reader.error(f"{flag} {name.text}: cannot read {beside}: {error}",
                     args.origin(name, flag), code=Code.READ)
        return None
    source = Source(str(beside), text)
    data, spans = load_json(source)
    if not isinstance(data, dict):
        reader.error(f"{beside}: a DeepSpeed configuration is a JSON object",
                     args.origin(name, flag), code=Code.SYNTAX)
        return None
    return Config(reader, source, data, spans, launch)


def _from_heredoc(reader: Reader, script: Script, written: Written, name: Word,
                  launch: Launch) -> Config | None:
    """The configuration the script writes: the here-document's JSON, its keys pointed at the
    script's text (where the heredoc writes them)."""
    chars = written.text.chars
    unknown = written.text.problem()
    text = written.text.text
    inner = Source(script.source.path, text)
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def offset(line: int, column: int) -> int:
        return min(starts[line - 1] + column - 1, len(chars) - 1)

    def moved(span: Span) -> Span:
        begin = chars[offset(span.line, span.column)][1] if chars else -1
        end = chars[max(0, offset(span.end_line, span.end_column) - 1)][1] if chars else -1
        if begin < 0:
            return Span.point(written.line, 1)
        return script.span(begin, max(begin, end) + 1)

    try:
        data, spans = load_json(inner)
    except PlaceError as error:
        where = error.diagnostics[0].span if error.diagnostics else None
        at = moved(where) if where is not None else Span.point(written.line, 1)
        why = f" ({unknown.reason})" if unknown is not None else ""
        reader.error(f"the DeepSpeed configuration written at line {written.line} for "
                     f"{name.text} is not valid JSON{why}: {error.diagnostics[0].message}",
                     Origin("here-document", script.source, at), code=Code.SYNTAX)
        return None
    if not isinstance(data, dict):
        reader.error(f"the DeepSpeed configuration written at line {written.line} is not a JSON "
                     "object", Origin("here-document", script.source,
                                      Span.point(written.line, 1)), code=Code.SYNTAX)
        return None
    if written.maybe is not None:
        reader.error(f"the DeepSpeed configuration {name.text} is written at line "
                     f"{written.line} {written.maybe.reason}", Origin("here-document",
                     script.source, Span.point(written.line, 1)), code=Code.NOT_STATIC)
    placed: dict[KeyPath, Span] = {path: moved(span) for path, span in spans.items()}
    return Config(reader, script.source, data, placed, launch)
