"""A Hugging Face Trainer run as axolotl and TRL configure it: what the two YAML importers share.

Both end in transformers' ``Trainer`` (``trainer.py``, ``training_args.py``) over a model loaded
with ``from_pretrained`` and, for fine-tuning with adapters, PEFT's ``get_peft_model``:

- ``per_device_train_batch_size`` sequences per micro-batch, ``gradient_accumulation_steps``
  micro-batches per step; the loss of a causal LM is summed over the accumulated tokens and
  divided by their count (``num_items_in_batch``, ``average_tokens_across_devices``): the mean
  over the global batch's tokens, ``loss token_mean``; ``max_grad_norm`` (default 1.0) clips;
  ``gradient_checkpointing`` recomputes every layer;
- ``bf16`` / ``fp16`` autocast the forward to that dtype over the parameters as loaded; the
  loaded dtype is the framework's (:class:`Run`); torch's AdamW keeps ``exp_avg`` and
  ``exp_avg_sq`` in each parameter's dtype (``torch/optim/adamw.py``: ``zeros_like``);
- bitsandbytes' 8-bit Adam (``adamw_bnb_8bit``, ``adamw_8bit``, ``paged_adamw_8bit``:
  ``bitsandbytes/optim/optimizer.py``, ``Optimizer2State`` with ``optim_bits=8``) keeps both
  states as one byte per element with one fp32 ``absmax`` per block of 256 each: 2 + 8/256 bytes
  per parameter; its 32-bit states are fp32 (8 bytes); torchao's 8-bit and 4-bit AdamW
  (``adamw_torch_8bit``, ``adamw_torch_4bit``) keep uint8 codes (two 4-bit codes a byte) beside
  per-block scales, which are not counted (a warning);
- PEFT casts the adapters to fp32 over a 16-bit base (``get_peft_model(...,
  autocast_adapter_dtype=True)``, its default): their G and Ω are fp32's;
- a DeepSpeed JSON (``deepspeed``) is read by the DeepSpeed importer, its ``"auto"`` values
  filled as ``HfTrainerDeepSpeedConfig.trainer_config_process`` fills them
  (``integrations/deepspeed.py``: the micro-batch, the accumulation, ``gradient_clipping`` from
  ``max_grad_norm``, ``bf16.enabled`` / ``fp16.enabled`` from the flags);
- FSDP through accelerate's plugin: with mixed precision accelerate upcasts the trained
  parameters to fp32 (FSDP2 before ``fully_shard``, ``utils/fsdp_utils.py``
  ``fsdp2_prepare_model``; FSDP1 each trained flat parameter, ``accelerator.py``
  ``prepare_model``), gathers and reduces in the mixed dtype.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from placeverify.diagnostics import Code, PlaceError, Source
from placeverify.importers import deepspeed
from placeverify.importers.common import Line, Plan, Reader, leftovers, mesh_title, number_text
from placeverify.importers.hf_config import attach_model
from placeverify.importers.origins import Origin, Value
from placeverify.syntax.source import read_source

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# PEFT's module names of a Llama-style layer, as the language names them
TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
           "up_proj": "up", "down_proj": "down"}
LINEAR_ALL = ("q", "k", "v", "o", "gate", "up", "down")
BLOCK = {short: "self_attn" if short in ("q", "k", "v", "o") else "mlp" for short in LINEAR_ALL}
# model types whose linears are Llama's seven projections (no fused q/k/v or gate/up)
LLAMA_LINEARS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
# PEFT's default targets (utils/constants.py, TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
# at huggingface/peft 00073fe: q_proj and v_proj for each of these)
PEFT_DEFAULT = {kind: ("q", "v") for kind in (*LLAMA_LINEARS, "mixtral")}
STATE_BYTES: dict[str, tuple[Fraction | None, str]] = {
    **{name: (None, "torch AdamW: m and v in the trained parameters' dtype")
       for name in ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw")},
    **{name: (Fraction(2) + Fraction(8, 256), "bitsandbytes 8-bit Adam: 1 B per state and one "
              "fp32 absmax per block of 256") for name in ("adamw_bnb_8bit", "adamw_8bit",
                                                           "paged_adamw_8bit")},
    **{name: (Fraction(8), "bitsandbytes 32-bit Adam: fp32 m and v")
       for name in ("paged_adamw_32bit", "paged_adamw")},
    "adamw_torch_8bit": (Fraction(2), "torchao AdamW8bit: uint8 codes for m and v"),
    "adamw_torch_4bit": (Fraction(1), "torchao AdamW4bit: 4-bit codes for m and v"),
}


@dataclass(frozen=True)
class Adapter:
    """LoRA as PEFT builds it: the kind, ``r``, the target modules (PEFT's names, or None), all
    linear layers instead (``all-linear``, axolotl's ``lora_target_linear``), the quantised base."""

    kind: Value  # "lora" or "qlora"
    rank: Value
    targets: Value | None
    linear: Value | None = None
    base: Value | None = None  # "nf4", "nf4_dq" or "int8"


@dataclass(frozen=True)
class Run:
    """What one Trainer run is, each value with the key it comes from."""

    framework: str  # "axolotl" or "trl"
    what: str  # the file, as messages name it: "an axolotl config"
    world: Value
    model: str | None
    seq: Value | None
    micro: Value
    accumulation: Value
    dtype: Value  # the dtype the model is loaded in: bf16, fp16 or fp32
    mixed: Value  # the Trainer's autocast: bf16, fp16 or no
    checkpointing: Value
    clip: Value
    optimizer: Value
    adapter: Adapter | None = None
    deepspeed: Value | None = None  # the JSON's path
    fsdp: Value | None = None  # fsdp or fsdp(grad_op), from the key that says so
    offload: Value | None = None  # FSDP's parameter offload


def translate(reader: Reader, source: Source, plan: Plan, run: Run) -> None:
    """Fill ``plan`` with what the run means."""
    if run.deepspeed is not None:
        _deepspeed(reader, source, plan, run)
    else:
        hf = attach_model(plan, reader, run.model, run.seq, run.micro, None, run.what)
        plan.mesh.append(Line(f"dp = {run.world.value}", run.world.origin.key, run.world.origin))
        plan.mesh.append(Line(f"world = {run.world.value}", run.world.origin.key,
                              run.world.origin))
        preset = run.fsdp if run.fsdp is not None else Value(
            "ddp", Origin("no deepspeed or fsdp: DDP", source))
        plan.body.append(Line(f"place {preset.value} over dp", preset.origin.key, preset.origin))
        plan.precision = _precision(reader, run)
        _adapter(reader, plan, run, hf.data if hf is not None else {})
        accumulation = int(run.accumulation.value)
        if accumulation > 1:
            plan.body.append(Line(f"microbatches = {accumulation}", run.accumulation.origin.key,
                                  run.accumulation.origin))
        plan.body.append(Line("loss token_mean", "Trainer: the loss summed over the accumulated "
                              "tokens, divided by their count over every rank (num_items_in_batch)"))
        clip = run.clip.value
        if isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0:
            plan.body.append(Line(f"clip max_norm = {number_text(clip)}", run.clip.origin.key,
                                  run.clip.origin))
        if run.offload is not None and run.offload.value is True:
            plan.body.append(Line("offload optimizer, gradients, params to cpu",
                                  run.offload.origin.key, run.offload.origin))
    if run.checkpointing.value is True:
        plan.body.append(Line("recompute full", run.checkpointing.origin.key,
                              run.checkpointing.origin))


def _dtype_of(run: Run) -> tuple[str, str]:
    """The loaded dtype and the autocast dtype (the loaded one without mixed precision)."""
    dtype = str(run.dtype.value)
    mixed = str(run.mixed.value)
    return dtype, (mixed if mixed in ("bf16", "fp16") else dtype)


def _precision(reader: Reader, run: Run) -> Line:
    """The precision line: Θ as loaded, G and Ω in the trained parameters' dtype (the adapters'
    fp32 with LoRA); under FSDP with mixed precision accelerate's upcast trained parameters are
    fp32, gathered and reduced in the mixed dtype."""
    dtype, act = _dtype_of(run)
    lora = run.adapter is not None
    mixed = str(run.mixed.value) in ("bf16", "fp16")
    params = dtype
    trained = "fp32" if lora and dtype != "fp32" else dtype
    if run.fsdp is not None and mixed and not lora:
        params = trained = "fp32"
    if lora and params != "fp32" and run.adapter is not None:
        reader.warning(f"PEFT keeps the adapters in fp32 over a {params} base; placeverify "
                       f"stores every Θ in one dtype: the adapters' Θ is counted in {params}, "
                       "2 bytes per adapter parameter less than it holds", run.adapter.kind.origin)
    optimizer = _optimizer(reader, run, trained)
    if run.fsdp is not None:
        middle = f"gather = {act}, grads = {trained}, reduce = {act}"
    else:
        middle = f"compute = {act if act != 'fp32' else 'tf32'}, grads = {trained}"
    scale = "dynamic" if act == "fp16" else "none"
    text = (f"precision {{ params = {params}, {middle}, optimizer = {optimizer}, "
            f"activations = {act}, loss_scale = {scale} }}")
    autocast = f"autocast to {run.mixed.value}" if mixed else "no autocast"
    state = STATE_BYTES.get(str(run.optimizer.value), (None, "not modelled"))[1]
    why = (f"loaded in {dtype} ({run.dtype.origin.key}), {autocast} ({run.mixed.origin.key}); "
           f"{run.optimizer.value}: {state}")
    return Line(text, why, run.dtype.origin)


def _optimizer(reader: Reader, run: Run, trained: str) -> str:
    """Ω's bytes per trained parameter for the Trainer's ``optim``."""
    name = str(run.optimizer.value)
    known = STATE_BYTES.get(name)
    if known is None:
        reader.error(f"not modelled: optimizer {name} (placeverify models "
                     + ", ".join(STATE_BYTES) + ")", run.optimizer.origin, code=Code.NOT_MODELLED)
        return "8"
    size, _ = known
    if size is None:
        size = Fraction(2 * BYTES.get(trained, 4))
    if name.startswith("adamw_torch_") and name[-4:] in ("8bit", "4bit"):
        reader.warning(f"optimizer {name}: torchao's per-block scales beside the codes are not "
                       "counted", run.optimizer.origin)
    if name.startswith("paged_"):
        reader.warning(f"optimizer {name}: bitsandbytes pages the states to host memory only "
                       "when the device runs out; counted on the device", run.optimizer.origin)
    return number_text(size)


def _adapter(reader: Reader, plan: Plan, run: Run, config: dict[str, Any]) -> None:
    """The model entries of a LoRA or QLoRA run: the adapter, its rank, its targets, the base."""
    adapter = run.adapter
    if adapter is None:
        return
    names = _targets(reader, adapter, config)
    plan.model.append(Line(f"adapter = {adapter.kind.value}", adapter.kind.origin.key,
                           adapter.kind.origin))
    rank = adapter.rank
    if isinstance(rank.value, bool) or not isinstance(rank.value, int) or rank.value < 1:
        reader.error(f"{rank.origin.key} must be a whole number >= 1, not {rank.value!r}",
                     rank.origin)
    else:
        plan.model.append(Line(f"lora_rank = {rank.value}", rank.origin.key, rank.origin))
    if names is not None:
        plan.model.append(Line(f"lora_targets = [{', '.join(names[0])}]", names[1].key,
                               names[1]))
    if adapter.base is not None:
        plan.model.append(Line(f"base_dtype = {adapter.base.value}", adapter.base.origin.key,
                               adapter.base.origin))


def _targets(reader: Reader, adapter: Adapter, config: dict[str, Any]) -> tuple[list[str], Origin] | None:
    """The targeted linears in the language's names, and the key that says them. A list names
    modules by the end of their names, a string is a pattern their whole names must match
    (PEFT's ``check_target_module_exists``: ``re.fullmatch``)."""
    kind = config.get("model_type")
    found: list[str] = []
    origin: Origin | None = None
    given = adapter.targets
    if given is not None and isinstance(given.value, str) and given.value != "all-linear":
        return _pattern(reader, given, config)
    if given is not None and given.value not in (None, []):
        origin = given.origin
        items = given.value if isinstance(given.value, list) else [given.value]
        for item in items:
            text = str(item)
            if text == "all-linear":
                found.extend(t for t in _all_linear(reader, given, kind) if t not in found)
                continue
            short = TARGETS.get(text.rsplit(".", 1)[-1])
            if short is None:
                reader.error(f"not modelled: LoRA target {text!r} is none of the linears "
                             "placeverify knows (" + ", ".join(TARGETS) + "); name those the "
                             "model has", given.origin, code=Code.NOT_MODELLED)
                return None
            if short not in found:
                found.append(short)
    if adapter.linear is not None and adapter.linear.value is True:
        origin = origin or adapter.linear.origin
        found.extend(t for t in _all_linear(reader, adapter.linear, kind) if t not in found)
    if not found:
        default = PEFT_DEFAULT.get(str(kind))
        where = given.origin if given is not None else adapter.kind.origin
        if default is None:
            reader.error(f"no LoRA targets: PEFT's default targets for model_type {kind!r} are "
                         "not modelled; name them (q_proj, k_proj, v_proj, o_proj, gate_proj, "
                         "up_proj, down_proj)", where, code=Code.NOT_MODELLED)
            return None
        return list(default), Origin(f"{where.key}: PEFT's default for {kind} (q_proj, v_proj)",
                                     where.source, where.span)
    order = [t for t in LINEAR_ALL if t in found]
    assert origin is not None
    return order, origin


def _pattern(reader: Reader, given: Value, config: dict[str, Any]) -> tuple[list[str], Origin] | None:
    """The linears a pattern matches, by their names in a Llama-style causal LM
    (``model.layers.N.self_attn.q_proj``, ``model.layers.N.mlp.gate_proj``); the same ones in
    every layer, or an error."""
    kind, layers = config.get("model_type"), config.get("num_hidden_layers")
    if kind not in LLAMA_LINEARS or not isinstance(layers, int):
        reader.error(f"not modelled: a LoRA target pattern for model_type {kind!r} (placeverify "
                     "knows the module names of " + ", ".join(LLAMA_LINEARS) + "); name the "
                     "targets as a list", given.origin, code=Code.NOT_MODELLED)
        return None
    try:
        pattern = re.compile(str(given.value))
    except re.error as error:
        reader.error(f"{given.origin.key} is not a regular expression: {error}", given.origin)
        return None
    per_layer: set[tuple[str, ...]] = set()
    for index in range(layers):
        names = [f"model.layers.{index}.{BLOCK[short]}.{module}" for module, short in TARGETS.items()]
        per_layer.add(tuple(TARGETS[n.rsplit(".", 1)[-1]] for n in names if pattern.fullmatch(n)))
    if per_layer == {()}:
        reader.error(f"{given.origin.key} matches none of the model's linears (their names are "
                     "model.layers.N.self_attn.q_proj ... model.layers.N.mlp.down_proj); name "
                     "the targets", given.origin, code=Code.BAD_VALUE)
        return None
    if len(per_layer) > 1:
        reader.error(f"not modelled: {given.origin.key} puts adapters on some layers only; "
                     "placeverify's lora_targets are the same in every layer", given.origin,
                     code=Code.NOT_MODELLED)
        return None
    return list(per_layer.pop()), given.origin


def _all_linear(reader: Reader, key: Value, kind: Any) -> tuple[str, ...]:
    """Every linear layer but the output layer (PEFT's ``all-linear``, axolotl's
    ``find_all_linear_names``), for a model whose linears are Llama's seven."""
    if kind not in LLAMA_LINEARS:
        reader.error(f"not modelled: LoRA on every linear layer of model_type {kind!r} (placeverify "
                     "knows the linears of " + ", ".join(LLAMA_LINEARS) + "); name the targets",
                     key.origin, code=Code.NOT_MODELLED)
        return ()
    return LINEAR_ALL


def resolve(reader: Reader, path: Value, source: Source) -> Source:
    """A file a YAML names (a DeepSpeed JSON), relative to the YAML's folder or, as when the run
    is launched from a folder above it, to the nearest folder above that holds it."""
    name = str(path.value)
    folder = os.path.dirname(os.path.abspath(source.path))
    tried = os.path.normpath(os.path.join(os.path.dirname(source.path), name))
    while True:
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate):
            break
        parent = os.path.dirname(folder)
        if parent == folder or os.path.isabs(name):
            reader.error(f"{path.origin.key} {name}: no such file relative to this file's folder "
                         f"({tried}) or a folder above it; give the path from this file's folder",
                         path.origin, code=Code.READ)
            reader.raise_if_errors()
        folder = parent
    shown = os.path.relpath(candidate) if not os.path.isabs(name) else candidate
    if os.path.normpath(shown) != tried:
        reader.warning(f"{path.origin.key} {name} is read from {shown}, as when the run is "
                       "launched from the folder above that holds it", path.origin,
                       code=Code.MISSING)
    try:
        return read_source(shown)
    except PlaceError:
        reader.error(f"{path.origin.key} {name}: cannot read {shown}", path.origin, code=Code.READ)
        reader.raise_if_errors()
        raise


def _deepspeed(reader: Reader, source: Source, plan: Plan, run: Run) -> None:
    """The DeepSpeed JSON the run names, its "auto" values filled as the Trainer fills them."""
    assert run.deepspeed is not None
    json_source = resolve(reader, run.deepspeed, source)
    mixed = str(run.mixed.value)
    fills: dict[tuple[str, ...], deepspeed.Fill] = {
        ("train_batch_size",): None,
        deepspeed.MICRO: (run.micro.value, run.micro.origin.key),
        ("gradient_accumulation_steps",): (run.accumulation.value, run.accumulation.origin.key),
        ("gradient_clipping",): (run.clip.value, run.clip.origin.key),
        ("bf16", "enabled"): (mixed == "bf16", run.mixed.origin.key),
        ("bfloat16", "enabled"): (mixed == "bf16", run.mixed.origin.key),
        ("fp16", "enabled"): (mixed == "fp16", run.mixed.origin.key),
    }
    launch = deepspeed.Launch(int(run.world.value), run.world.origin.key, run.world.origin,
                              f"the {run.framework} config fills it", fills, run.what,
                              seq=run.seq)
    doc = deepspeed.Config.load(reader, json_source, launch)
    _agrees(doc, fills)
    deepspeed.translate(doc, plan, run.model)
    plan.framework = "deepspeed"
    if run.optimizer.value not in ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw") \
            and "optimizer" not in doc.data:
        reader.warning(f"not modelled: optimizer {run.optimizer.value} under DeepSpeed; the "
                       "DeepSpeed precision's fp32 Adam states are counted", run.optimizer.origin)
    if run.adapter is not None:
        config: Any = {}
        if run.model is not None:
            try:
                config = json.loads(read_source(run.model).text)
            except ValueError:
                config = {}  # the DeepSpeed importer has reported it
        _adapter(reader, plan, run, config if isinstance(config, dict) else {})
    leftovers(reader, plan, doc.source, doc.data, doc.spans, ((), deepspeed.KEYS),
              (("zero_optimization",), deepspeed.ZERO_KEYS))


def _agrees(doc: deepspeed.Config, fills: dict[tuple[str, ...], deepspeed.Fill]) -> None:
    """A value the JSON writes (not "auto") must be the Trainer's own: ``fill_match`` collects
    each that differs and the Trainer raises (``HfTrainerDeepSpeedConfig.trainer_config_process``)."""
    for path, fill in fills.items():
        node: Any = doc.data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if fill is None or node is None or node == "auto":
            continue
        value, key_name = fill
        if isinstance(node, bool) != isinstance(value, bool) or node != value:
            origin = doc.origin(*path)
            doc.reader.error(f"{origin.key} {json.dumps(node)} differs from {key_name} "
                             f"{json.dumps(value)}: transformers' Trainer refuses a DeepSpeed value "
                             'that is not its own; write "auto" or the same value', origin,
                             code=Code.CONFLICT)


# ---- what axolotl's and TRL's readers share -------------------------------------------------


def whole(reader: Reader, value: Value, low: int = 1) -> Value:
    """A whole-number setting (>= ``low``), or an error at it."""
    if isinstance(value.value, bool) or not isinstance(value.value, int) or value.value < low:
        reader.error(f"{value.origin.key} must be a whole number >= {low}, not {value.value!r}",
                     value.origin)
        return Value(low, value.origin)
    return value


def model_config(reader: Reader, name: Value, model: str | None) -> str | None:
    """The model's config.json: ``--model``, else the local folder the file's model key names
    (``name``) when it holds one; a hub id is refused at the key, since no hub is read."""
    if model is not None:
        return model
    source = name.origin.source
    if name.value is None:
        reader.error(f"no {name.origin.key.split(' ')[0]}: the model is not named; give its "
                     "Hugging Face config with --model config.json", None, code=Code.MISSING)
        return None
    local = os.path.join(os.path.dirname(source.path), str(name.value), "config.json")
    if os.path.isfile(local):
        return local
    reader.error(f"{name.origin.key} {name.value!r} is a Hugging Face hub id (no such folder "
                 "beside this file): placeverify reads no hub; give the model's config.json with "
                 "--model config.json", name.origin, code=Code.MISSING)
    return None


def deepspeed_path(reader: Reader, ds: Value) -> Value | None:
    """The DeepSpeed JSON's path; a configuration written inline is refused at the key."""
    if isinstance(ds.value, dict):
        reader.error("not modelled: deepspeed written inline; write it to a JSON file and give "
                     "its path", ds.origin, code=Code.NOT_MODELLED)
    return ds if isinstance(ds.value, str) and ds.value else None


def title(plan: Plan, source: Source, run: Run, what: str) -> str:
    """The strategy's title: the file, the framework and the mesh."""
    what += " DeepSpeed" if run.deepspeed is not None else ""
    return mesh_title(plan, source, what) if plan.mesh else f"{os.path.basename(source.path)}: {what}"
