"""The model keys that make a layer other than Llama's: multi-head latent attention, shared experts,
dense layers among MoE ones (``docs/language/model.md``, "Latent attention, shared experts and
dense layers")."""

from __future__ import annotations

from dataclasses import replace

from placeverify.diagnostics import Code, Span
from placeverify.ir.latent import Latent
from placeverify.ir.model import Transformer
from placeverify.lower.values import MAX_DIM, MAX_LAYERS, Context
from placeverify.syntax import ast

# key -> (least value, what it is); the latent ones are transformers' DeepseekV3Config names
LATENT_KEYS = {"kv_lora_rank": 1, "q_lora_rank": 0, "qk_rope_head_dim": 1,
               "qk_nope_head_dim": 1, "v_head_dim": 1}
LAYER_KEYS = {"shared_experts": 0, "dense_layers": 0, "moe_every": 1}
KIND_KEYS = (*LATENT_KEYS, *LAYER_KEYS)


def read_kind_key(ctx: Context, key: str, value: ast.Value) -> int | None:
    low = LATENT_KEYS.get(key, LAYER_KEYS.get(key, 0))
    return ctx.integer(value, key, low, MAX_LAYERS if key == "dense_layers" else MAX_DIM)


def apply_kinds(ctx: Context, arch: Transformer, given: dict[str, int],
                entries: dict[str, ast.Entry], span: Span) -> Transformer | None:
    """The architecture with the layer-kind keys ``given`` (already read) applied; None after an
    error, each at the key it is about."""
    latent = _latent(ctx, arch, given, entries)
    if latent is None:
        return None
    arch = latent
    layer_keys = {k: v for k, v in given.items() if k in LAYER_KEYS}
    for key in layer_keys:
        if not arch.experts:
            ctx.error(f"'{key}' describes a mixture of experts; give 'experts' and 'top_k'",
                      Code.CONFLICT, entries[key].key.span)
            return None
    arch = replace(arch, **layer_keys)  # type: ignore[arg-type]
    if arch.moe and not arch.moe_layers:
        key = "dense_layers" if "dense_layers" in given else "moe_every"
        where = entries[key].value.span if key in entries else span
        ctx.error(f"dense_layers = {arch.dense_layers} and moe_every = {arch.moe_every} leave no "
                  f"MoE layer among the {arch.layers} layers", Code.BAD_VALUE, where)
        return None
    return arch


def _latent(ctx: Context, arch: Transformer, given: dict[str, int],
            entries: dict[str, ast.Entry]) -> Transformer | None:
    latent_keys = [k for k in LATENT_KEYS if k in given]
    if not latent_keys:
        return arch
    if "kv_lora_rank" not in given:
        key = latent_keys[0]
        ctx.error(f"'{key}' describes multi-head latent attention; give 'kv_lora_rank' (the "
                  "key/value latent's rank) too", Code.MISSING, entries[key].key.span)
        return None
    where = entries["kv_lora_rank"].key.span
    missing = [k for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
               if k not in given]
    if missing:
        ctx.error("multi-head latent attention needs " + ", ".join(f"'{m}'" for m in missing),
                  Code.MISSING, where)
        return None
    for key, why in (("head_dim", "its heads are qk_nope_head_dim + qk_rope_head_dim wide "
                      "(v_head_dim for values)"),
                     ("qkv_bias", "its projections' biases follow 'bias' (attention_bias)"),
                     ("qk_norm", "its latents are normalised, not its heads")):
        if key in entries:
            ctx.error(f"'{key}' does not apply to multi-head latent attention: {why}",
                      Code.CONFLICT, entries[key].key.span)
            return None
    if "kv_heads" in entries and arch.kv_heads != arch.heads:
        ctx.error(f"multi-head latent attention has a key and a value per head: kv_heads "
                  f"({arch.kv_heads}) must be heads ({arch.heads})", Code.CONFLICT,
                  entries["kv_heads"].value.span)
        return None
    latent = Latent(kv_rank=given["kv_lora_rank"], q_rank=given.get("q_lora_rank", 0),
                    rope_dim=given["qk_rope_head_dim"], nope_dim=given["qk_nope_head_dim"],
                    v_dim=given["v_head_dim"])
    return replace(arch, latent=latent, kv_heads=arch.heads, head_size=0, qkv_bias=False,
                   qk_norm=False)
