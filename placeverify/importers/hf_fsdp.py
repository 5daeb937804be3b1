"""FSDP as a Trainer run asks accelerate for it: axolotl's ``fsdp_config`` (``utils/schemas/fsdp.py``:
keys with or without their ``fsdp_`` prefix, FSDP on with either ``fsdp`` or ``fsdp_config``) and
transformers' ``TrainingArguments`` (``fsdp``: ``full_shard``, ``shard_grad_op``, ``hybrid_shard``,
``no_shard``, ``offload``, ``auto_wrap``; ``fsdp_config`` read only with ``fsdp``, its ``fsdp_``
prefixes stripped), which TRL's YAML sets. accelerate's plugin maps FULL_SHARD (or
``reshard_after_forward: true``) to ``fsdp``, SHARD_GRAD_OP (or ``false``) to ``fsdp(grad_op)``,
NO_SHARD to ``ddp``; HYBRID_SHARD's groups are not in these files (not modelled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from placeverify.diagnostics import Code, Span
from placeverify.importers.common import Keys, Reader
from placeverify.importers.origins import Origin, Value

READ = {"version", "offload_params", "sharding_strategy", "reshard_after_forward",
        "activation_checkpointing"}
IGNORED = {"state_dict_type", "auto_wrap_policy", "transformer_layer_cls_to_wrap",
           "cpu_ram_efficient_loading", "limit_all_gathers", "sync_module_states",
           "use_orig_params", "backward_prefetch", "forward_prefetch", "min_num_params",
           "xla", "xla_fsdp_grad_ckpt"}
KEYS = Keys(READ, IGNORED, name=lambda key: f"fsdp_config.{key}")
STRATEGIES: dict[str, str | None] = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "fsdp(grad_op)",
                                     "NO_SHARD": "ddp", "HYBRID_SHARD": None,
                                     "HYBRID_SHARD_ZERO2": None}
Get = Callable[..., Value]


def placement(reader: Reader, data: dict[str, Any], get: Get, framework: str, *,
              needs_list: bool) -> tuple[Value | None, Value | None]:
    """FSDP's preset from the key that decides it, and the parameter offload's key; (None,
    None) without FSDP. ``needs_list``: FSDP is on only with ``fsdp`` (TrainingArguments)."""
    config, words_key = data.get("fsdp_config"), get("fsdp")
    words = (words_key.value if isinstance(words_key.value, list)
             else str(words_key.value or "").split())
    words = [str(w).lower() for w in words]
    if needs_list and not words:
        if isinstance(config, dict) and config:
            reader.warning("fsdp_config has no effect without fsdp (TrainingArguments)",
                           get("fsdp_config").origin, code=Code.CONFLICT)
        return None, None
    if not isinstance(config, dict) and not words:
        return None, None
    config = config if isinstance(config, dict) else {}
    if get("deepspeed").value:
        reader.error(f"fsdp beside deepspeed: {framework} runs one of them",
                     get("fsdp_config").origin if config else words_key.origin,
                     code=Code.CONFLICT)

    def key(name: str) -> Value:
        for written in (name, f"fsdp_{name}"):
            if written in config:
                return get("fsdp_config", written)
        return Value(None, Origin(f"fsdp_config.{name} (default)", words_key.origin.source))

    reshard, strategy = key("reshard_after_forward"), key("sharding_strategy")
    named = next((w for w in words if w.upper() in STRATEGIES), None)
    if reshard.value is not None:
        preset = Value("fsdp" if reshard.value is True else "fsdp(grad_op)", reshard.origin)
    elif strategy.value is not None or named is not None:
        where = strategy if strategy.value is not None else words_key
        text = str(strategy.value if strategy.value is not None else named).upper()
        found = STRATEGIES.get(text)
        if found is None:
            reader.error(f"not modelled: FSDP sharding strategy {text} (its shard and replica "
                         "groups are not in this file)", where.origin, code=Code.NOT_MODELLED)
            found = "fsdp"
        preset = Value(found, where.origin)
    else:
        preset = Value("fsdp", words_key.origin if words else get("fsdp_config").origin)
    offload = key("offload_params")
    if "offload" in words and offload.value is None:
        offload = Value(True, words_key.origin)
    return preset, offload


def checkpointing(reader: Reader, get: Get, ckpt: Value) -> Value:
    """The recomputation's key: ``gradient_checkpointing``, else FSDP's
    ``activation_checkpointing``; checkpoints offloaded to the host are not modelled."""
    if ckpt.value in ("offload", "offload_disk"):
        reader.error(f"not modelled: gradient_checkpointing {ckpt.value} (checkpointed layer "
                     "inputs offloaded to host memory or disk)", ckpt.origin,
                     code=Code.NOT_MODELLED)
    if ckpt.value is not True:
        for name in ("activation_checkpointing", "fsdp_activation_checkpointing"):
            fc = get("fsdp_config", name)
            if fc.value is True:
                return fc
    return ckpt


def strip_prefix(data: dict[str, Any], spans: dict[tuple[str, ...], Span]) -> None:
    """fsdp_config's keys without the ``fsdp_`` prefix both readers also take (in place: the
    leftovers see the names they read)."""
    config = data.get("fsdp_config")
    if not isinstance(config, dict):
        return
    renamed: dict[str, Any] = {}
    for name, value in config.items():
        short = name[5:] if name.startswith("fsdp_") else name
        renamed[short] = value
        if ("fsdp_config", name) in spans:
            spans[("fsdp_config", short)] = spans[("fsdp_config", name)]
    data["fsdp_config"] = renamed
