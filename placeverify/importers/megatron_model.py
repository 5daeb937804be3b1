"""The model of a Megatron-LM argument list: ``--num-layers``, ``--hidden-size``,
``--num-attention-heads``, ``--num-query-groups``, ``--ffn-hidden-size``, ``--seq-length``, the
vocabulary, MoE flags (``megatron/training/arguments.py`` and the config dataclasses it
generates flags from), and the cross-check against a Hugging Face config given with --model.
"""

from __future__ import annotations

from collections.abc import Callable

from placeverify.diagnostics import Code
from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Line, Reader
from placeverify.importers.hf_config import HFModel
from placeverify.importers.origins import Origin, Value

# GPT-2 BPE (Megatron's GPT2BPETokenizer): 50,257 tokens before padding.
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257}
# The tokenizer a training program sets when --tokenizer-type is not given: Megatron-LM's
# pretrain_gpt.py calls initialize_megatron with args_defaults={'tokenizer_type':
# 'GPT2BPETokenizer'} (from 152aab304d, 2021-01, to the current tree; Megatron-DeepSpeed keeps it)
DEFAULT_TOKENIZER = {"pretrain_gpt.py": "GPT2BPETokenizer"}
OLD_RECOMPUTE_FLAGS = ("--checkpoint-activations", "--activations-checkpoint-method")
# A hybrid Mamba / attention stack (megatron/core/models/hybrid, arguments.py): its layers come
# from a pattern, not --num-layers; refused at the flag.
HYBRID = ("--hybrid-layer-pattern", "--hybrid-override-pattern", "--is-hybrid-model")
# Flags that change the model in ways placeverify does not model: an error at the flag.
REFUSED = {
    "--multi-latent-attention": "multi-head latent attention",
    "--moe-shared-expert-intermediate-size": "shared experts",
    "--moe-layer-freq": "a mix of dense and MoE layers",
}


def model_lines(args: Arguments, reader: Reader, program: str | None = None) -> list[Line]:
    """``model transformer`` entries from Megatron's own model flags."""
    def line(entry: str, v: Value | None, text: object | None = None) -> Line:
        if v is None:
            return Line(f"{entry} = 1")
        return Line(f"{entry} = {v.value if text is None else text}", v.origin.key, v.origin)

    if _refused(args, reader):
        return []
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
    channels = args.integer("--kv-channels")  # the head dimension; Megatron's default hidden / heads
    qk = args.flag("--qk-layernorm")  # Q and K normalised per head (--normalization's kind)
    gqa = args.flag("--group-query-attention")
    groups = args.integer("--num-query-groups")
    kv_heads = args.integer("--num-key-value-heads")  # Megatron-DeepSpeed's GQA flag
    kv = groups if gqa is not None and groups is not None else kv_heads or Value(
        heads.value, Origin("--num-attention-heads (no --group-query-attention)", args.source))
    swiglu = args.flag("--swiglu")
    gated = _gated(args, reader, swiglu)
    ffn = args.integer("--ffn-hidden-size") or Value(
        int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h,
        Origin("--ffn-hidden-size (default: " + ("int(4h * 2/3 / 64) * 64 with --swiglu)"
                                                 if swiglu else "4h)"), args.source))
    vocab, divisible = _vocabulary(args, reader, program)
    untie = args.flag("--untie-embeddings-and-output-weights")
    norm = args.text("--normalization") or Value("LayerNorm", Origin("--normalization (default)",
                                                                     args.source))
    # Megatron-LM spells them LayerNorm / RMSNorm, Megatron-DeepSpeed layernorm / rmsnorm
    norm = Value({"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}.get(str(norm.value).lower(),
                                                                      norm.value), norm.origin)
    if norm.value not in ("LayerNorm", "RMSNorm"):
        reader.error(f"--normalization is LayerNorm or RMSNorm, not '{norm.value}'", norm.origin)
    no_bias = args.flag("--disable-bias-linear")
    position = args.text("--position-embedding-type") or Value(
        "learned_absolute", Origin("--position-embedding-type (default)", args.source))
    # alibi (Megatron-DeepSpeed): a bias added to the attention scores, no position parameters
    positions = {"learned_absolute": "learned", "rope": "rotary", "none": "none", "alibi": "none"}
    if position.value not in positions:
        reader.error(f"not modelled: --position-embedding-type {position.value}", position.origin,
                     code=Code.NOT_MODELLED)
    max_position = args.integer("--max-position-embeddings")
    dropout = max(float(str(args.real("--hidden-dropout", 0.1).value)),
                  float(str(args.real("--attention-dropout", 0.1).value)))
    attention = _attention(args)
    lines = [line("layers", layers), line("hidden", hidden), line("heads", heads),
             line("kv_heads", kv), line("ffn", ffn),
             *([line("head_dim", channels)] if channels is not None else []),
             *([Line("qk_norm = true", "--qk-layernorm", qk.origin)] if qk is not None else []),
             gated,
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
              attention]
    embed_norm = args.flag("--embed-layernorm")
    if embed_norm is not None:
        reader.warning("not modelled: --embed-layernorm (a LayerNorm after the word embedding: "
                       "2h parameters and its saved input on the first stage)", embed_norm.origin)
    lines += _experts(args, line)
    return lines + _multimodal(args, reader)


def _multimodal(args: Arguments, reader: Reader) -> list[Line]:
    """Megatron-LM's multimodal run (``examples/multimodal/multimodal_args.py``: ``--freeze-LM``,
    ``--freeze-ViT``, ``--vision-model-type``, default clip): the flags read here describe the
    language model only. ``--freeze-LM`` freezes all of it (``frozen = all``): what the run
    trains, the vision projection and the encoder unless ``--freeze-ViT``, is a second model, not
    modelled, so the import is an error at the flag rather than a language model counted with an
    optimizer state it does not have. A vision encoder beside a trained language model is a
    warning: its parameters (only Θ under ``--freeze-ViT``), activations and the projection are
    not counted."""
    freeze_lm = args.flag("--freeze-LM")
    freeze_vit = args.flag("--freeze-ViT")
    vision = args.text("--vision-model-type")
    if freeze_lm is not None:
        trained = "the vision projection" + ("" if freeze_vit is not None else
                                             " and the vision encoder")
        reader.error("not modelled: --freeze-LM freezes the whole language model; what this run "
                     f"trains ({trained}) is a second model beside it, which placeverify does "
                     "not model", freeze_lm.origin, code=Code.NOT_MODELLED)
        return [Line("frozen = all", "--freeze-LM", freeze_lm.origin)]
    if freeze_vit is not None or vision is not None:
        kind = vision.value if vision is not None else "clip"
        held = "its frozen parameters (Θ only, --freeze-ViT)" if freeze_vit is not None else \
            "its parameters, gradients and optimizer state"
        origin = freeze_vit.origin if freeze_vit is not None else vision.origin  # type: ignore[union-attr]
        reader.warning(f"not modelled: the vision encoder ({kind}) beside the language model: "
                       f"{held}, its activations and the projection are not counted; the figures "
                       "are the language model's", origin)
    return []


Entry = Callable[[str, Value | None], Line]  # ``entry = value`` at the flag it comes from


def _gated(args: Arguments, reader: Reader, swiglu: Value | None) -> Line:
    """``mlp = gated`` for --swiglu and for --quick-geglu, else ``mlp = plain``.

    Megatron-LM's ``megatron/training/argument_utils.py`` (core_transformer_config_from_args)
    sets ``gated_linear_unit = True`` for both (``activation_func`` F.silu or quick_gelu, and
    asserts that --quick-geglu comes without --swiglu), and ``megatron/core/transformer/mlp.py``
    doubles fc1's output width for a gated linear unit (``ffn_hidden_size *= 2``): gate and up
    projections, 3 h f weights as SwiGLU. Only --swiglu changes the default --ffn-hidden-size
    (``megatron/training/arguments.py``, validate_args): with --quick-geglu it stays 4h."""
    geglu = args.flag("--quick-geglu")
    if geglu is not None and swiglu is not None:
        reader.error("--quick-geglu and --swiglu together: Megatron-LM asserts 'not "
                     "args.swiglu' with --quick-geglu (argument_utils.py)", geglu.origin,
                     code=Code.CONFLICT)
    if swiglu is not None:
        return Line("mlp = gated", "--swiglu", swiglu.origin)
    if geglu is not None:
        return Line("mlp = gated", "--quick-geglu: gated quick-GeLU, fc1 2 x ffn wide",
                    geglu.origin)
    return Line("mlp = plain", "no --swiglu or --quick-geglu: GeLU")


def _refused(args: Arguments, reader: Reader) -> bool:
    """Whether the model is one placeverify does not model (an error at the flag): another
    model provider, a hybrid stack; the flags of REFUSED are errors but leave the model read."""
    provider = args.text("--model-provider")  # which model pretrain_*.py builds; default gpt
    if provider is not None and provider.value != "gpt":
        reader.error(f"not modelled: --model-provider {provider.value} (placeverify models "
                     "GPT-style transformers)", provider.origin, code=Code.NOT_MODELLED)
        return True
    for flag in HYBRID:
        if args.has(flag):
            reader.error(f"not modelled: {flag} (a hybrid Mamba / attention stack)",
                         args.origin(args.flags[flag][0]), code=Code.NOT_MODELLED)
            return True
    for flag, what in REFUSED.items():
        if args.has(flag):
            reader.error(f"not modelled: {flag} ({what})", args.origin(args.flags[flag][0]),
                         code=Code.NOT_MODELLED)
    return False


def _vocabulary(args: Arguments, reader: Reader, program: str | None
                ) -> tuple[Value | None, Value | None]:
    """The vocabulary (--vocab-size, --pad-vocab-size-to, or the tokenizer's) and the multiple
    it is padded to."""
    vocab = args.integer("--vocab-size")
    # Megatron-DeepSpeed (megatron/tokenizer/tokenizer.py, _vocab_size_with_padding): the padded
    # vocabulary is --pad-vocab-size-to exactly (asserted a multiple of TP and at least the
    # tokenizer's), whatever --make-vocab-size-divisible-by says
    padded = args.integer("--pad-vocab-size-to")
    if padded is not None:
        vocab = padded
        for flag in ("--tokenizer-type", "--tokenizer-name-or-path", "--make-vocab-size-divisible-by"):
            args.used.add(flag)
    if vocab is None:
        tokenizer = args.text("--tokenizer-type")
        if tokenizer is None and program is not None and \
                program.rsplit("/", 1)[-1] in DEFAULT_TOKENIZER:
            name = program.rsplit("/", 1)[-1]
            tokenizer = Value(DEFAULT_TOKENIZER[name], Origin(
                f"--tokenizer-type (default of {name}: {DEFAULT_TOKENIZER[name]})", args.source))
        if tokenizer is not None and tokenizer.value in TOKENIZER_VOCAB:
            vocab = Value(TOKENIZER_VOCAB[str(tokenizer.value)], tokenizer.origin)
        elif "model.vocab" not in reader.given:  # else the override's value replaces 'vocab = 1'
            reader.error("the vocabulary size is not in the arguments (it comes from the "
                         "tokenizer): add --vocab-size N, give --model config.json, or "
                         "--set model.vocab=N", tokenizer.origin if tokenizer else None,
                         code=Code.MISSING)
    divisible = args.integer("--make-vocab-size-divisible-by", 128) if padded is None else \
        Value(1, Origin("--pad-vocab-size-to (the padded size as given)", args.source))
    return vocab, divisible


def _attention(args: Arguments) -> Line:
    """``attention = standard`` (the fused masked softmax) or ``flash``."""
    backend = args.text("--attention-backend")
    flash = args.flag("--use-flash-attn") or args.flag("--use-flash-attn-v2") or \
        args.flag("--use-flash-attn-triton")
    # Megatron-DeepSpeed's softmax is Megatron's fused masked softmax unless a --use-flash-attn*
    # flag asks for FlashAttention (its forks have no --attention-backend)
    # A Megatron-LM that takes --checkpoint-activations / --activations-checkpoint-method (renamed
    # --recompute-activations / --recompute-method in bbab79f869, 2022-05; the old names only
    # kept as deprecated aliases) predates FlashAttention in Megatron-LM (--use-flash-attn,
    # d693034ecf, 2022-12): its softmax is the fused masked softmax as well
    old = next((f for f in OLD_RECOMPUTE_FLAGS if f in args.flags), None)
    legacy = ("--deepspeed" in args.flags or old is not None) and backend is None and flash is None
    standard = legacy or (backend is not None and backend.value in ("unfused", "local"))
    return Line(f"attention = {'standard' if standard else 'flash'}",
                backend.origin.key if backend else (flash.origin.key if flash else
                                                    f"{old or '--deepspeed'}: no --use-flash-attn"
                                                    if legacy
                                                    else "--attention-backend (default auto)"),
                backend.origin if backend else None)


def _experts(args: Arguments, line: Entry) -> list[Line]:
    """A mixture of experts: --num-experts, --moe-router-topk, --moe-ffn-hidden-size."""
    lines: list[Line] = []
    experts = args.integer("--num-experts")
    if experts is not None:
        top_k = args.integer("--moe-router-topk", 2)
        lines += [line("experts", experts), line("top_k", top_k)]
        moe_ffn = args.integer("--moe-ffn-hidden-size")
        if moe_ffn is not None:
            lines.append(line("expert_ffn", moe_ffn))
    return lines


def cross_check(args: Arguments, reader: Reader, hf: HFModel, lines: list[Line]) -> None:
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
