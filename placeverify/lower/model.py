"""Lower the ``model`` statement: a bundled model, a bare parameter count, or an architecture."""

from __future__ import annotations

from dataclasses import replace

from placeverify.diagnostics import Code, Span, did_you_mean
from placeverify.ir.model import ARCHITECTURES, BARE_MODELS, MODEL_PRESETS, Model, Transformer
from placeverify.lower.fine_tune import read_fine_tune, split_fine_tune
from placeverify.lower.layer_kinds import KIND_KEYS, apply_kinds, read_kind_key
from placeverify.lower.values import MAX_DIM, MAX_LAYERS, MAX_PARAMS, MAX_SEQ, Context, literal
from placeverify.syntax import ast

ARCH_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn", "mlp", "vocab",
             "vocab_divisible_by", "embeddings", "seq", "micro_batch", "position",
             "max_position", "norm", "bias", "dropout", "attention", "experts", "top_k",
             "expert_ffn", "head_dim", "qkv_bias", "qk_norm", "sandwich_norm", "activation",
             *KIND_KEYS)


def read_model(ctx: Context, stmt: ast.ModelStmt) -> Model | None:
    entries = ctx.unique(stmt.block.entries if stmt.block else (), lambda e: e.key.text,
                         lambda e: e.key.span, "model key")
    entries, tuning = split_fine_tune(entries)
    model = _read_model(ctx, stmt, entries)
    return None if model is None else read_fine_tune(ctx, model, tuning, stmt.span)


def _read_model(ctx: Context, stmt: ast.ModelStmt, entries: dict[str, ast.Entry]) -> Model | None:
    name = stmt.name.text if stmt.name else None
    if name is not None and name not in (*MODEL_PRESETS, "transformer"):
        ctx.error(f"unknown model '{name}'{did_you_mean(name, MODEL_PRESETS)}",
                  Code.UNKNOWN_NAME, stmt.name.span if stmt.name else stmt.span,
                  "bundled models: " + ", ".join(MODEL_PRESETS))
        return None
    if name in BARE_MODELS or (name is None and "params" in entries):
        return bare_model(ctx, name, entries, stmt)
    base = ARCHITECTURES.get(name or "")
    if "largest_tensor" in entries:
        ctx.error("'largest_tensor' is derived from the architecture; give it with a bare "
                  "'params' count only", Code.CONFLICT, entries["largest_tensor"].key.span)
        return None
    if "params" in entries:
        ctx.error("'params' is derived from the architecture; give either 'params' alone or "
                  "the architecture", Code.CONFLICT, entries["params"].span)
        return None
    arch = architecture(ctx, base, entries, stmt)
    if arch is None:
        return None
    return Model(name or "transformer", arch.params(), arch)


def bare_model(ctx: Context, name: str | None, entries: dict[str, ast.Entry],
               stmt: ast.ModelStmt) -> Model | None:
    params = BARE_MODELS.get(name or "")
    largest: int | None = None
    for key, entry in entries.items():
        if key == "largest_tensor":
            largest = ctx.integer(entry.value, key, 1, MAX_PARAMS)
        elif key == "params":
            number = ctx.number(entry.value, "params")
            if number is None:
                continue
            if number.denominator != 1:
                ctx.error(f"params must be a whole number, not {literal(entry.value, number)}",
                          Code.BAD_VALUE, entry.value.span)
                continue
            params = ctx.in_range(int(number), "params", entry.value.span, 1, MAX_PARAMS)
        elif key in ARCH_KEYS:
            ctx.error(f"'{key}' describes an architecture, but this model is a bare parameter "
                      "count; give the architecture without 'params'", Code.CONFLICT,
                      entry.key.span)
        else:
            ctx.error(f"unknown model key '{key}'"
                      f"{did_you_mean(key, ['params', 'largest_tensor'])}",
                      Code.UNKNOWN_NAME, entry.key.span)
    if params is None:
        return None
    if largest is not None and largest > params:
        ctx.error(f"largest_tensor ({largest:,}) is more than the model's {params:,} parameters",
                  Code.BAD_VALUE, entries["largest_tensor"].value.span)
        return None
    return Model(name or "model", params, None, largest)


def architecture(ctx: Context, base: Transformer | None, entries: dict[str, ast.Entry],
                 stmt: ast.ModelStmt) -> Transformer | None:
    values: dict[str, object] = {}
    kinds: dict[str, int | None] = {}
    for key, entry in entries.items():
        v = entry.value
        if key in KIND_KEYS:
            kinds[key] = read_kind_key(ctx, key, v)
        elif key in ("layers", "heads", "kv_heads", "experts", "top_k"):
            low = 0 if key in ("experts", "top_k") else 1
            high = MAX_LAYERS if key == "layers" else MAX_DIM
            values[key] = ctx.integer(v, key, low, high)
        elif key == "head_dim":
            values["head_size"] = ctx.integer(v, key, 1, MAX_DIM)
        elif key in ("hidden", "ffn", "vocab", "micro_batch", "vocab_divisible_by",
                     "max_position", "expert_ffn"):
            low = 0 if key in ("max_position", "expert_ffn") else 1
            values[key] = ctx.integer(v, key, low, MAX_SEQ if key == "max_position" else MAX_DIM)
        elif key == "seq":
            values[key] = ctx.integer(v, key, 1, MAX_SEQ)
        elif key == "mlp":
            word = ctx.word(v, "mlp kind", ["plain", "gated", "swiglu", "geglu"])
            values["gated"] = None if word is None else word != "plain"
        elif key == "embeddings":
            word = ctx.word(v, "embeddings kind", ["tied", "untied"])
            values["tied_embeddings"] = None if word is None else word == "tied"
        elif key == "position":
            values[key] = ctx.word(v, "position encoding", ["learned", "rotary", "none"])
        elif key == "norm":
            values[key] = ctx.word(v, "norm", ["layernorm", "rmsnorm"])
        elif key == "attention":
            values[key] = ctx.word(v, "attention kind", ["standard", "flash"])
        elif key == "activation":
            values[key] = ctx.word(v, "activation", ["gelu", "gelu_new"])
        elif key in ("bias", "dropout", "qkv_bias", "qk_norm", "sandwich_norm"):
            values[key] = ctx.boolean(v, key)
        else:
            ctx.error(f"unknown model key '{key}'{did_you_mean(key, ARCH_KEYS)}",
                      Code.UNKNOWN_NAME, entry.key.span)
    if any(v is None for v in (*values.values(), *kinds.values())):
        return None
    if base is None:
        missing = [k for k in ("layers", "hidden", "heads", "vocab", "seq") if k not in values]
        if missing:
            ctx.error("a transformer needs " + ", ".join(f"'{m}'" for m in missing),
                      Code.MISSING, stmt.span)
            return None
        hidden = values["hidden"]
        assert isinstance(hidden, int)
        base = Transformer(
            layers=1, hidden=hidden, heads=1, kv_heads=0, ffn=4 * hidden, gated=False, vocab=1,
            seq=1, micro_batch=1, tied_embeddings=False, position="rotary", norm="layernorm",
            bias=False, dropout=False, attention="standard")
    arch = replace(base, **values)  # type: ignore[arg-type]
    if arch.kv_heads == 0 or ("heads" in values and "kv_heads" not in values
                              and base.kv_heads == base.heads):
        arch = replace(arch, kv_heads=arch.heads)
    span = stmt.span
    if arch.head_size == arch.hidden // arch.heads and not arch.hidden % arch.heads:
        arch = replace(arch, head_size=0)  # the default width, written out
    given = {k: v for k, v in kinds.items() if v is not None}
    kind = apply_kinds(ctx, arch, given, entries, span)
    return None if kind is None else validate(ctx, kind, entries, span)


def validate(ctx: Context, arch: Transformer, entries: dict[str, ast.Entry],
             span: Span) -> Transformer:
    """The architecture's checks across keys, each error at the key it is about."""
    if arch.latent is not None:  # the heads' widths are given: nothing to divide
        pass
    elif arch.hidden % arch.heads and not arch.head_size:
        ctx.error(f"hidden ({arch.hidden}) must be divisible by heads ({arch.heads})",
                  Code.NOT_DIVISIBLE, entry_span(entries, "hidden", span))
    elif arch.heads % arch.kv_heads:
        ctx.error(f"heads ({arch.heads}) must be divisible by kv_heads ({arch.kv_heads})",
                  Code.NOT_DIVISIBLE, entry_span(entries, "kv_heads", span))
    if arch.gated and arch.activation != "gelu":
        ctx.error(f"activation = {arch.activation} is a plain MLP's; a gated MLP's is its own "
                  "(SwiGLU's SiLU)", Code.CONFLICT, entry_span(entries, "activation", span))
    if arch.experts and not arch.top_k:
        ctx.error("a mixture of experts needs 'top_k' (experts per token)", Code.MISSING,
                  entry_span(entries, "experts", span))
    if arch.top_k > max(arch.experts, 0) and arch.top_k:
        ctx.error(f"top_k ({arch.top_k}) cannot exceed experts ({arch.experts})",
                  Code.BAD_VALUE, entry_span(entries, "top_k", span))
    if arch.position == "learned" and arch.max_position and arch.seq > arch.max_position:
        ctx.error(f"seq ({arch.seq}) exceeds the learned position table ({arch.max_position} "
                  "rows)", Code.BAD_VALUE, entry_span(entries, "seq", span))
    if arch.params() > MAX_PARAMS:
        ctx.error(f"this architecture has {arch.params():,} parameters, absurdly many",
                  Code.BAD_VALUE, span)
    return arch


def entry_span(entries: dict[str, ast.Entry], key: str, default: Span) -> Span:
    return entries[key].span if key in entries else default
