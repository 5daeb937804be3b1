"""Lower a model's fine-tuning keys (``docs/language/model.md``): frozen groups, LoRA / QLoRA
adapters and a quantised base.

``frozen = [dense, embedding] | all`` freezes parameter groups (Megatron-LM's ``--freeze-LM``,
PEFT's frozen base); ``adapter = lora | qlora`` with ``lora_rank = r`` and ``lora_targets = [q,
k, v, o, gate, up, down]`` adds a trained ``adapters`` group (PEFT's ``LoraConfig`` ``r`` and
``target_modules``); ``base_dtype = nf4 | nf4_dq | int8`` stores the frozen layers' linear
weights quantised (bitsandbytes; ``qlora`` defaults to ``nf4``). An adapter freezes every base
group unless ``frozen`` says which.
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.diagnostics import Code, Span, did_you_mean
from placeverify.ir.model import BASE_DTYPES, BASE_GROUPS, LORA_MODULES, Adapter, Model, ParamGroup
from placeverify.ir.placement import AxisPlacement, Role
from placeverify.lower.values import MAX_DIM, Context, value_text
from placeverify.syntax import ast

FINE_TUNE_KEYS = ("frozen", "adapter", "lora_rank", "lora_targets", "base_dtype")


def split_fine_tune(entries: dict[str, ast.Entry]) -> tuple[dict[str, ast.Entry],
                                                             dict[str, ast.Entry]]:
    """(the architecture's entries, the fine-tuning entries)."""
    return ({k: e for k, e in entries.items() if k not in FINE_TUNE_KEYS},
            {k: e for k, e in entries.items() if k in FINE_TUNE_KEYS})


def read_fine_tune(ctx: Context, model: Model, entries: dict[str, ast.Entry],
                   span: Span) -> Model | None:
    """The model with its fine-tuning keys applied (``entries`` holds only those)."""
    if not entries:
        return model
    adapter = _adapter(ctx, model, entries, span)
    if adapter is False:
        return None
    assert adapter is not True
    base = None
    if "base_dtype" in entries:
        base = ctx.word(entries["base_dtype"].value, "base dtype", BASE_DTYPES)
        if base is None:
            return None
    elif adapter is not None and adapter.kind == "qlora":
        base = "nf4"  # QLoRA (Dettmers et al., arXiv 2305.14314): a 4-bit NormalFloat base
    held = model.groups_held()
    frozen: frozenset[ParamGroup] = frozenset(held) - {ParamGroup.ADAPTERS} \
        if adapter is not None else frozenset()
    if "frozen" in entries:
        named = _groups(ctx, entries["frozen"].value, held)
        if named is None:
            return None
        frozen = named
    if base is not None and model.arch is None:
        ctx.error("'base_dtype' quantises the layers' linear weights: give the architecture, "
                  "not a bare 'params' count", Code.CONFLICT, entries["base_dtype"].key.span
                  if "base_dtype" in entries else span)
        return None
    if base is not None and model.arch is not None and model.arch.latent is not None:
        ctx.error("not modelled: a quantised base of multi-head latent attention (its linear "
                  "layers are not Llama's)", Code.NOT_MODELLED,
                  entries["base_dtype"].span if "base_dtype" in entries else span)
        return None
    if base is not None and ParamGroup.DENSE not in frozen:
        ctx.error(f"a quantised base ({base}) is frozen: 'frozen' must name dense", Code.CONFLICT,
                  entries["base_dtype"].span if "base_dtype" in entries else span)
        return None
    if adapter is None and not any(g not in frozen for g in held):
        ctx.error("every parameter group is frozen: nothing is trained (add an adapter, or "
                  "leave a group out of 'frozen')", Code.BAD_VALUE, entries["frozen"].span
                  if "frozen" in entries else span)
        return None
    params = model.params + (0 if adapter is None or model.arch is None
                             else model.arch.adapter_params(adapter))
    return replace(model, params=params, frozen=frozen, adapter=adapter, base_dtype=base)


def _adapter(ctx: Context, model: Model, entries: dict[str, ast.Entry],
             span: Span) -> Adapter | bool | None:
    """The adapter the keys describe, None for none, False after an error."""
    lora_keys = [k for k in ("lora_rank", "lora_targets") if k in entries]
    if "adapter" not in entries:
        if lora_keys:
            ctx.error(f"'{lora_keys[0]}' describes an adapter: add 'adapter = lora' or "
                      "'adapter = qlora'", Code.MISSING, entries[lora_keys[0]].key.span)
            return False
        return None
    kind = ctx.word(entries["adapter"].value, "adapter", ["lora", "qlora"])
    if kind is None:
        return False
    if model.arch is None:
        ctx.error("an adapter is added to named linear layers: give the architecture, not a "
                  "bare 'params' count", Code.CONFLICT, entries["adapter"].key.span)
        return False
    if model.arch.moe or model.arch.latent is not None:
        ctx.error("adapters on a mixture of experts are not modelled" if model.arch.moe else
                  "adapters on multi-head latent attention are not modelled", Code.BAD_VALUE,
                  entries["adapter"].span)
        return False
    missing = [k for k in ("lora_rank", "lora_targets") if k not in entries]
    if missing:
        ctx.error(f"an adapter needs {' and '.join(repr(m) for m in missing)} (PEFT's r and "
                  "target_modules)", Code.MISSING, entries["adapter"].span)
        return False
    rank = ctx.integer(entries["lora_rank"].value, "lora_rank", 1, MAX_DIM)
    targets = _targets(ctx, entries["lora_targets"].value, tuple(model.arch.linears()))
    if rank is None or targets is None:
        return False
    return Adapter(kind, rank, targets)


def _names(value: ast.Value) -> tuple[ast.Value, ...]:
    return value.items if isinstance(value, ast.ListValue) else (value,)


def _targets(ctx: Context, value: ast.Value, linears: tuple[str, ...]) -> tuple[str, ...] | None:
    out: list[str] = []
    for item in _names(value):
        name = value_text(item).removesuffix("_proj")
        if not isinstance(item, ast.NameValue) or name not in LORA_MODULES:
            ctx.error(f"unknown LoRA target '{value_text(item)}'"
                      f"{did_you_mean(name, LORA_MODULES)}", Code.UNKNOWN_NAME, item.span,
                      "targets: " + ", ".join(LORA_MODULES))
            return None
        if name not in linears:
            ctx.error(f"this model has no '{name}' linear layer (a plain MLP has up and down "
                      "only)", Code.BAD_VALUE, item.span)
            return None
        if name in out:
            ctx.error(f"LoRA target '{name}' is named twice", Code.DUPLICATE, item.span)
            return None
        out.append(name)
    return tuple(out)


def _groups(ctx: Context, value: ast.Value, held: tuple[ParamGroup, ...]
            ) -> frozenset[ParamGroup] | None:
    if isinstance(value, ast.NameValue) and value.name.text == "all":
        return frozenset(g for g in held if g in BASE_GROUPS)
    names = {g.value: g for g in BASE_GROUPS}
    out: set[ParamGroup] = set()
    for item in _names(value):
        text = value_text(item)
        group = names.get(text)
        if not isinstance(item, ast.NameValue) or group is None:
            hint = " (adapters are what a fine-tune trains)" if text == "adapters" else \
                did_you_mean(text, [*names, "all"])
            ctx.error(f"unknown frozen group '{text}'{hint}", Code.UNKNOWN_NAME, item.span)
            return None
        if group not in held:
            ctx.error(f"this model has no '{text}' parameters (it has "
                      f"{', '.join(g.value for g in held)})", Code.BAD_VALUE, item.span)
            return None
        out.add(group)
    return frozenset(out)


NOT_SPLIT = (Role.TENSOR, Role.PIPELINE, Role.EXPERT)


def check_fine_tune(ctx: Context, model: Model, placements: tuple[AxisPlacement, ...] | list[
        AxisPlacement], sizes: dict[str, int], span: Span) -> None:
    """Adapters and a quantised base are modelled on data and context axes only (Hugging Face's
    PEFT under FSDP or DeepSpeed); a tensor, pipeline or expert axis larger than 1 that splits
    them is an error that says so."""
    if model.adapter is None and model.base_dtype is None:
        return
    for p in placements:
        if p.role in NOT_SPLIT and sizes.get(p.axis, 1) > 1:
            what = "adapters" if model.adapter is not None else f"a {model.base_dtype} base"
            ctx.error(f"{what} split over a {p.role.value} axis ('{p.axis}') are not modelled: "
                      "place them over data or context axes", Code.BAD_VALUE, p.span or span)
            return
