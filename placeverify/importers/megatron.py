"""Megatron-LM arguments: a launch script (bash, read never run) or a file of arguments.

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

from pathlib import Path

from placeverify.diagnostics import Code, Source
from placeverify.importers.common import Line, Origin, Plan, Reader, Value
from placeverify.importers.hf_config import HFModel, attach_model
from placeverify.importers.shell import Script, Word

LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
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
})
IGNORED_PREFIXES = ("--log-", "--wandb-", "--tensorboard-", "--eval-", "--save-", "--exit-",
                    "--ckpt-", "--lr-", "--data-", "--no-load-", "--no-save-", "--dist-ckpt-")
NOT_MODELLED = {
    "--overlap-grad-reduce": "overlap of the gradient reduction with backward (costs assume none)",
    "--overlap-param-gather": "overlap of the parameter all-gather with forward (costs assume none)",
    "--rampup-batch-size": "a batch-size ramp-up; the final --global-batch-size is used",
    "--step-batch-size-schedule": "a batch-size schedule; --global-batch-size is used",
    "--recompute-method": "partial recomputation; every layer is recomputed as modelled",
    "--recompute-num-layers": "partial recomputation; every layer is recomputed as modelled",
    "--tp-comm-overlap": "overlap of tensor-parallel communication with GEMMs",
    "--fp8-format": "FP8 GEMMs (parameters, gradients and optimizer keep the --bf16/--fp16 sizes)",
    "--decoder-first-pipeline-num-layers": "uneven pipeline stages (layers split evenly)",
    "--decoder-last-pipeline-num-layers": "uneven pipeline stages (layers split evenly)",
    "--account-for-embedding-in-pipeline-split": "uneven pipeline stages (layers split evenly)",
    "--num-distributed-optimizer-instances": "several distributed-optimizer instances",
}
REFUSED = {
    "--multi-latent-attention": "multi-head latent attention",
    "--moe-shared-expert-intermediate-size": "shared experts",
    "--moe-layer-freq": "a mix of dense and MoE layers",
    "--use-megatron-fsdp": "Megatron-FSDP (use --use-torch-fsdp2 or the distributed optimizer)",
    "--kv-channels": "a head dimension other than hidden / heads",
}
# GPT-2 BPE (Megatron's GPT2BPETokenizer): 50,257 tokens before padding.
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257}


class Arguments:
    """``--flag [values...]`` words with their positions; each read marks the flag used."""

    def __init__(self, reader: Reader, words: list[Word], source: Source) -> None:
        self.reader = reader
        self.source = source
        self.flags: dict[str, tuple[Word, list[Word]]] = {}
        self.used: set[str] = set()
        i = 0
        while i < len(words):
            word = words[i]
            if not word.text.startswith("--"):
                i += 1  # a positional word (the training script's own): not an argument
                continue
            name, eq, inline = word.text.partition("=")
            values: list[Word] = [Word(inline, word.span, word.unresolved)] if eq else []
            i += 1
            while not eq and i < len(words) and not words[i].text.startswith("--"):
                values.append(words[i])
                i += 1
            if name in self.flags:
                reader.warning(f"{name} is given twice; the last one counts (argparse)",
                               self.origin(self.flags[name][0]), code=Code.DUPLICATE)
            self.flags[name] = (Word(name, word.span, word.unresolved), values)

    def origin(self, word: Word, key: str | None = None) -> Origin:
        return Origin(key or word.text, self.source, word.span)

    def has(self, name: str) -> bool:
        self.used.add(name)
        return name in self.flags

    def flag(self, name: str) -> Value | None:
        if not self.has(name):
            return None
        word, values = self.flags[name]
        if values:
            self.reader.error(f"{name} takes no value", self.origin(values[0], name))
        return Value(True, self.origin(word))

    def text(self, name: str) -> Value | None:
        if not self.has(name):
            return None
        word, values = self.flags[name]
        if len(values) != 1:
            self.reader.error(f"{name} takes one value", self.origin(word))
            return None
        if values[0].unresolved:
            self.reader.error(f"{name}: {values[0].unresolved} is not assigned in this script "
                              "(only running it would give the value); write the number",
                              self.origin(values[0], name), code=Code.NOT_STATIC)
            return None
        return Value(values[0].text, Origin(name, self.source, word.span))

    def integer(self, name: str, default: int | None = None, low: int = 1) -> Value | None:
        v = self.text(name)
        if v is None:
            return None if default is None else Value(default, Origin(f"{name} (default)",
                                                                      self.source))
        try:
            number = int(str(v.value))
        except ValueError:
            self.reader.error(f"{name} takes a whole number, not '{v.value}'", v.origin)
            return None
        if number < low:
            self.reader.error(f"{name} must be at least {low}, not {number}", v.origin)
            return None
        return Value(number, v.origin)

    def real(self, name: str, default: float) -> Value:
        v = self.text(name)
        if v is None:
            return Value(default, Origin(f"{name} (default)", self.source))
        try:
            return Value(float(str(v.value)), v.origin)
        except ValueError:
            self.reader.error(f"{name} takes a number, not '{v.value}'", v.origin)
            return Value(default, v.origin)


def _split_launch(script: Script) -> tuple[list[Word], list[Word], bool]:
    """(launcher words, training arguments, whether a launcher was found)."""
    for command in script.commands:
        words = list(command.words)
        texts = [w.text for w in words]
        py = next((i for i, t in enumerate(texts) if t.endswith(".py")), None)
        if py is None:
            continue
        launcher = any(t.endswith(LAUNCHERS) or t in LAUNCHERS for t in texts[:py])
        return words[:py], words[py + 1:], launcher
    # an argument file: every word of every command is an argument
    return [], [w for c in script.commands for w in c.words], False


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    script = Script(source)
    launch, words, launched = _split_launch(script)
    plan = Plan("megatron", source.path)
    args = Arguments(reader, words, source)
    runner = Arguments(reader, launch, source)

    # ---- world size: torchrun --nproc-per-node x --nnodes, or --world ----
    nproc = runner.integer("--nproc_per_node") or runner.integer("--nproc-per-node")
    nnodes = runner.integer("--nnodes") or runner.integer("--nnodes", 1)
    world_line: Line | None = None
    world_value: int | None = None
    if nproc is not None and nnodes is not None:
        world_value = int(str(nproc.value)) * int(str(nnodes.value))
        world_line = Line(f"world = {world_value}", f"{nproc.origin.key} {nproc.value} x "
                          f"{nnodes.origin.key} {nnodes.value}", nproc.origin)
        if world is not None and world != world_value:
            reader.error(f"--world {world} contradicts the launcher's {nproc.value} x "
                         f"{nnodes.value} = {world_value} processes", nproc.origin,
                         code=Code.WORLD_MISMATCH)
    elif world is not None:
        world_value = world
        world_line = Line(f"world = {world}", "--world (placeverify option)")
    else:
        why = ("the script launches no torchrun with --nproc-per-node/--nnodes" if launched
               or not launch else "the launcher gives no --nproc-per-node")
        reader.error(f"world size unknown: {why}; pass --world N", None, code=Code.MISSING)
    for name in ("--nproc_per_node", "--nproc-per-node", "--nnodes"):
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
    if world_value is not None:
        if world_value % (t * p * c):
            reader.error(f"world size {world_value} is not divisible by TP * PP * CP = {t} * {p} "
                         f"* {c} = {t * p * c} (Megatron-LM asserts it in validate_args)",
                         tp.origin if tp.origin.span else (world_line.origin if world_line else None),
                         code=Code.NOT_DIVISIBLE)
        else:
            dp = world_value // (t * p * c)
            if e > 1 and dp % e:
                reader.error(f"not modelled: --expert-model-parallel-size {e} does not divide the "
                             f"data-parallel size {dp} (Megatron takes EP ranks from DP * CP; "
                             "placeverify's ep axis is carved out of dp)", ep.origin,
                             code=Code.NOT_MODELLED)
    sp = args.flag("--sequence-parallel")
    if sp is not None and t == 1:
        reader.warning("--sequence-parallel with --tensor-model-parallel-size 1: Megatron-LM "
                       "switches sequence parallelism off (validate_args)", sp.origin,
                       code=Code.CONFLICT)
        sp = None

    # ---- batch ----
    micro = args.integer("--micro-batch-size", 1)
    glob = args.integer("--global-batch-size")
    m = 1
    if micro is not None and world_value is not None and world_value % (t * p * c) == 0:
        per_step = int(str(micro.value)) * dp
        if glob is not None:
            if int(str(glob.value)) % per_step:
                reader.error(f"--global-batch-size {glob.value} is not divisible by "
                             f"--micro-batch-size {micro.value} x data-parallel size {dp} = "
                             f"{per_step} (Megatron-LM's micro-batch calculator asserts it)",
                             glob.origin, code=Code.NOT_DIVISIBLE)
            else:
                m = int(str(glob.value)) // per_step

    # ---- model ----
    seq = args.integer("--seq-length")
    own = None if model is not None else _model_lines(args, reader)
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
        _cross_check(args, reader, hf, plan.model)

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
                                                                          if e > 1 else "")))
    if p > 1:
        plan.mesh.append(Line(f"pp = {p}", pp.origin.key, pp.origin))
    if world_line is not None:
        plan.mesh.append(world_line)

    # ---- placements ----
    fsdp2 = args.flag("--use-torch-fsdp2")
    dist_opt = args.flag("--use-distributed-optimizer")
    if sp is not None:
        plan.body.append(Line("place megatron(sequence_parallel) over tp",
                              f"{tp.origin.key} + --sequence-parallel", sp.origin))
    elif t > 1:
        plan.body.append(Line("place megatron over tp", tp.origin.key, tp.origin))
    if c > 1:
        sharded = dist_opt is not None
        plan.body.append(Line("place context(R, S, R, S) over cp" if sharded else
                              "place context over cp",
                              cp.origin.key + (" (the distributed optimizer shards over dp x cp)"
                                               if sharded else ""), cp.origin))
    if e > 1:
        plan.body.append(Line("place expert over ep", ep.origin.key, ep.origin))
    if fsdp2 is not None:
        plan.body.append(Line("place fsdp over dp", "--use-torch-fsdp2", fsdp2.origin))
    elif dist_opt is not None:
        plan.body.append(Line("place zero1 over dp", "--use-distributed-optimizer", dist_opt.origin))
    else:
        plan.body.append(Line("place ddp over dp", "no --use-distributed-optimizer"))
    vpp = _virtual_stages(args, reader, p)
    where = glob.origin if glob is not None else (micro.origin if micro else None)
    if p > 1:
        if vpp is not None:
            plan.body.append(Line(f"place pipeline(interleaved, chunks = {vpp.value}, "
                                  f"microbatches = {m}) over pp",
                                  f"{vpp.origin.key}; micro-batches = global / (micro x dp)",
                                  vpp.origin))
        else:
            plan.body.append(Line(f"place pipeline(1f1b, microbatches = {m}) over pp",
                                  f"{pp.origin.key}; micro-batches = global / (micro x dp)",
                                  where or pp.origin))
    elif m > 1:
        plan.body.append(Line(f"microbatches = {m}", "--global-batch-size / "
                              "(--micro-batch-size x dp)", where))
    per_token = args.flag("--calculate-per-token-loss")
    plan.body.append(Line("loss token_mean", "--calculate-per-token-loss", per_token.origin)
                     if per_token is not None else
                     Line("loss microbatch_mean", "Megatron's default: each micro-batch's token "
                          "mean, divided by the number of micro-batches"))
    clip = args.real("--clip-grad", 1.0)
    if float(str(clip.value)) > 0:
        plan.body.append(Line(f"clip max_norm = {clip.value}", clip.origin.key, clip.origin))
    granularity = args.text("--recompute-granularity")
    if args.flag("--recompute-activations") is not None and granularity is None:
        granularity = Value("selective", Origin("--recompute-activations", source))
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
    plan.title = f"{Path(source.path).name}: Megatron-LM, " + ", ".join(parts)
    _leftovers(args, runner, reader, plan)
    return plan


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
    per_rank, rest = divmod(int(str(layers.value)), p)
    if rest or per_rank % int(str(per_stage.value)):
        reader.error(f"--num-layers {layers.value} / --pipeline-model-parallel-size {p} is not a "
                     f"multiple of {per_stage.value} layers per virtual stage", per_stage.origin,
                     code=Code.NOT_DIVISIBLE)
        return None
    chunks = per_rank // int(str(per_stage.value))
    return Value(chunks, per_stage.origin) if chunks > 1 else None


def _model_lines(args: Arguments, reader: Reader) -> list[Line]:
    """``model transformer`` entries from Megatron's own model flags."""
    def line(entry: str, v: Value | None, text: object | None = None) -> Line:
        if v is None:
            return Line(f"{entry} = 1")
        return Line(f"{entry} = {v.value if text is None else text}", v.origin.key, v.origin)

    for flag, what in REFUSED.items():
        if args.has(flag):
            reader.error(f"not modelled: {flag} ({what})", args.origin(args.flags[flag][0]),
                         code=Code.NOT_MODELLED)
    layers, hidden = args.integer("--num-layers"), args.integer("--hidden-size")
    heads = args.integer("--num-attention-heads")
    for name, v in (("--num-layers", layers), ("--hidden-size", hidden),
                    ("--num-attention-heads", heads)):
        if v is None and name not in args.flags:
            reader.error(f"no model: {name} is missing; give the model flags or --model "
                         "config.json", None, code=Code.MISSING)
    if layers is None or hidden is None or heads is None:
        return []
    h = int(str(hidden.value))
    gqa = args.flag("--group-query-attention")
    groups = args.integer("--num-query-groups")
    kv = groups if gqa is not None and groups is not None else Value(
        heads.value, Origin("--num-attention-heads (no --group-query-attention)", args.source))
    swiglu = args.flag("--swiglu")
    ffn = args.integer("--ffn-hidden-size") or Value(
        int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h,
        Origin("--ffn-hidden-size (default: " + ("int(4h * 2/3 / 64) * 64 with --swiglu)"
                                                 if swiglu else "4h)"), args.source))
    vocab = args.integer("--vocab-size")
    if vocab is None:
        tokenizer = args.text("--tokenizer-type")
        if tokenizer is not None and tokenizer.value in TOKENIZER_VOCAB:
            vocab = Value(TOKENIZER_VOCAB[str(tokenizer.value)], tokenizer.origin)
        else:
            reader.error("the vocabulary size is not in the arguments (it comes from the "
                         "tokenizer): add --vocab-size N or give --model config.json",
                         tokenizer.origin if tokenizer else None, code=Code.MISSING)
    divisible = args.integer("--make-vocab-size-divisible-by", 128)
    untie = args.flag("--untie-embeddings-and-output-weights")
    norm = args.text("--normalization") or Value("LayerNorm", Origin("--normalization (default)",
                                                                     args.source))
    if norm.value not in ("LayerNorm", "RMSNorm"):
        reader.error(f"--normalization is LayerNorm or RMSNorm, not '{norm.value}'", norm.origin)
    no_bias = args.flag("--disable-bias-linear")
    position = args.text("--position-embedding-type") or Value(
        "learned_absolute", Origin("--position-embedding-type (default)", args.source))
    positions = {"learned_absolute": "learned", "rope": "rotary", "none": "none"}
    if position.value not in positions:
        reader.error(f"not modelled: --position-embedding-type {position.value}", position.origin,
                     code=Code.NOT_MODELLED)
    max_position = args.integer("--max-position-embeddings")
    dropout = max(float(str(args.real("--hidden-dropout", 0.1).value)),
                  float(str(args.real("--attention-dropout", 0.1).value)))
    backend = args.text("--attention-backend")
    flash = args.flag("--use-flash-attn")
    standard = backend is not None and backend.value in ("unfused", "local")
    lines = [line("layers", layers), line("hidden", hidden), line("heads", heads),
             line("kv_heads", kv), line("ffn", ffn),
             Line("mlp = gated", "--swiglu", swiglu.origin) if swiglu else
             Line("mlp = plain", "no --swiglu: GeLU"),
             line("vocab", vocab), line("vocab_divisible_by", divisible),
             Line("embeddings = untied", "--untie-embeddings-and-output-weights", untie.origin)
             if untie else Line("embeddings = tied", "no --untie-embeddings-and-output-weights"),
             line("position", position, positions.get(str(position.value), "learned"))]
    if positions.get(str(position.value)) == "learned" and max_position is not None:
        lines.append(line("max_position", max_position))
    lines += [line("norm", norm, str(norm.value).lower()),
              Line("bias = false", "--disable-bias-linear", no_bias.origin) if no_bias else
              Line("bias = true", "no --disable-bias-linear"),
              Line(f"dropout = {'true' if dropout > 0 else 'false'}",
                   "--hidden-dropout / --attention-dropout (default 0.1)"),
              Line(f"attention = {'standard' if standard else 'flash'}",
                   backend.origin.key if backend else ("--use-flash-attn" if flash else
                                                       "--attention-backend (default auto)"),
                   backend.origin if backend else None)]
    experts = args.integer("--num-experts")
    if experts is not None:
        top_k = args.integer("--moe-router-topk", 2)
        lines += [line("experts", experts), line("top_k", top_k)]
        moe_ffn = args.integer("--moe-ffn-hidden-size")
        if moe_ffn is not None:
            lines.append(line("expert_ffn", moe_ffn))
    return lines


def _cross_check(args: Arguments, reader: Reader, hf: HFModel, lines: list[Line]) -> None:
    """Megatron's model flags, when given beside --model, must agree with config.json."""
    for flag, entry in (("--num-layers", "layers"), ("--hidden-size", "hidden"),
                        ("--num-attention-heads", "heads"), ("--ffn-hidden-size", "ffn"),
                        ("--num-query-groups", "kv_heads"), ("--num-experts", "experts")):
        if flag not in args.flags:
            continue
        v = args.integer(flag)
        expected = hf.value_of(entry, lines)
        if v is not None and expected is not None and str(v.value) != expected:
            reader.error(f"{flag} {v.value} contradicts --model's {entry} = {expected}", v.origin,
                         code=Code.CONFLICT)


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
    if ignored:
        plan.header.append("Read but without effect on placement, memory or communication: "
                           + " ".join(sorted(set(ignored))))
