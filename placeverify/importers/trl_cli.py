"""A TRL command-line YAML (huggingface/trl): ``trl sft --config FILE.yaml``.

``TrlParser.parse_args_and_config`` (``trl/scripts/utils.py``) loads the file with
``yaml.safe_load``, sets ``env`` as environment variables and makes every other key the default
of the script's dataclasses' field of that name: ``ScriptArguments``, ``SFTConfig``
(``trl/trainer/sft_config.py``: transformers' ``TrainingArguments`` with ``max_length`` 1024,
``gradient_checkpointing`` true, ``bf16`` true unless ``fp16``, ``trl/trainer/base_config.py``)
and ``ModelConfig`` (``trl/trainer/model_config.py``: ``dtype`` float32, ``use_peft`` false,
``lora_r`` 16, ``lora_target_modules`` None: PEFT's default for the model, ``load_in_4bit``,
``load_in_8bit``, ``bnb_4bit_quant_type`` nf4, ``use_bnb_nested_quant`` false). A key no
dataclass has goes to ``accelerate launch`` (``trl/cli/commands/training.py``,
``accelerate_config.py``: ``accelerate_config`` names the launch configuration, ``num_processes``
the world). ``trl/scripts/sft.py`` loads the model in ``dtype`` and hands the quantisation and
PEFT configurations to ``SFTTrainer``. The file does not say which command reads it: SFT's
defaults are assumed (the ``trl sft`` of the example's comment).
"""

from __future__ import annotations

from placeverify.diagnostics import Code, Source
from placeverify.importers import hf_fsdp
from placeverify.importers.common import Keys, Plan, Reader, leftovers
from placeverify.importers.hf_trainer import (
    Adapter,
    Run,
    deepspeed_path,
    model_config,
    title,
    translate,
    whole,
)
from placeverify.importers.origins import Origin, Value
from placeverify.importers.yaml_nodes import Get, load_settings

READ = {"model_name_or_path", "per_device_train_batch_size", "gradient_accumulation_steps",
        "max_length", "max_seq_length", "bf16", "fp16", "gradient_checkpointing", "use_peft",
        "lora_r", "lora_target_modules", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
        "use_bnb_nested_quant", "dtype", "torch_dtype", "optim", "max_grad_norm", "deepspeed",
        "fsdp", "fsdp_config", "accelerate_config", "num_processes", "use_dora",
        "activation_offloading", "lora_modules_to_save", "lora_target_parameters",
        "average_tokens_across_devices"}
IGNORED = {
    "env", "output_dir", "dataset_name", "dataset_config", "dataset_train_split",
    "dataset_test_split", "dataset_streaming", "datasets", "dataset_text_field",
    "dataset_num_proc", "dataset_kwargs", "report_to", "learning_rate", "lr_scheduler_type",
    "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "weight_decay", "adam_beta1",
    "adam_beta2", "adam_epsilon", "num_train_epochs", "max_steps", "logging_steps",
    "logging_strategy", "logging_first_step", "logging_dir", "save_steps", "save_strategy",
    "save_total_limit", "save_only_model", "eval_strategy", "eval_steps", "per_device_eval_batch_size",
    "do_eval", "do_train", "push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo",
    "run_name", "seed", "data_seed", "model_revision", "trust_remote_code", "attn_implementation",
    "lora_alpha", "lora_dropout", "lora_task_type", "use_rslora", "packing", "packing_strategy",
    "padding_free", "pad_to_multiple_of", "eval_packing", "completion_only_loss",
    "assistant_only_loss", "eos_token", "pad_token", "chat_template_path", "truncation_mode",
    "shuffle_dataset", "gradient_checkpointing_kwargs", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_drop_last", "remove_unused_columns", "overwrite_output_dir",
    "ddp_find_unused_parameters", "ddp_timeout", "log_level", "disable_tqdm", "model_init_kwargs",
    "bnb_4bit_quant_storage", "ignore_data_skip", "resume_from_checkpoint", "loss_type",
    "tf32", "neftune_noise_alpha",
}
# keys that change memory or the step in ways not modelled, refused when set
REFUSED = {
    "use_dora": "DoRA's magnitude vectors",
    "activation_offloading": "activation offloading to host memory",
    "lora_modules_to_save": "training whole modules beside the adapters",
    "lora_target_parameters": "LoRA on parameters (experts' weights) rather than modules",
    "accelerate_config": "the accelerate configuration this run is launched with: import that "
                         "file (placeverify check it, with --model and --set model.seq=N "
                         "model.micro_batch=N) to check its placement",
}
TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
WHAT = "a TRL config"


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    data, spans, get = load_settings(reader, source, "TrlParser's yaml.safe_load")
    plan = Plan("trl", source.path)

    for key, what in REFUSED.items():
        value = get(key)
        if value.value not in (None, False, "", [], {}):
            reader.error(f"not modelled: {key} ({what})", value.origin, code=Code.NOT_MODELLED)
    average = get("average_tokens_across_devices")
    if average.value is False:
        reader.error("not modelled: average_tokens_across_devices false (each rank divides its loss "
                     "by its own token count); placeverify checks the Trainer's default, true",
                     average.origin, code=Code.NOT_MODELLED)
    fsdp = hf_fsdp.placement(reader, data, get, "TRL", needs_list=True)
    seq = get("max_length", default=1024, why="SFTConfig's default 1024")
    if data.get("max_length") is None and data.get("max_seq_length") is not None:
        seq = get("max_seq_length")
    fp16 = get("fp16", default=False)
    bf16 = get("bf16", default=fp16.value is not True, why="SFTConfig: true unless fp16")
    mixed = Value("bf16" if bf16.value is True else "fp16" if fp16.value is True else "no",
                  (bf16 if bf16.value is True else fp16).origin)
    run = Run("trl", WHAT, _world(reader, get, world), _model(reader, get, model),
              whole(reader, seq), whole(reader, get("per_device_train_batch_size", default=8)),
              whole(reader, get("gradient_accumulation_steps", default=1)),
              _dtype(reader, get, model), mixed,
              hf_fsdp.checkpointing(reader, get, get("gradient_checkpointing", default=True,
                                                     why="SFTConfig's default true")),
              get("max_grad_norm", default=1.0), get("optim", default="adamw_torch_fused"),
              _adapter(reader, get), deepspeed_path(reader, get("deepspeed")), *fsdp)
    reader.raise_if_errors()
    translate(reader, source, plan, run)
    hf_fsdp.strip_prefix(data, spans)
    leftovers(reader, plan, source, data, spans, ((), Keys(
        READ, IGNORED, {"fsdp_config": hf_fsdp.KEYS},
        unknown=lambda key: f"not modelled: TRL key '{key}'")))
    plan.title = title(plan, source, run, "TRL SFT")
    return plan




def _world(reader: Reader, get: Get, world: int | None) -> Value:
    procs = get("num_processes")
    if procs.value is not None:
        procs = whole(reader, procs)
        if world is not None and world != procs.value:
            reader.error(f"--world {world} contradicts num_processes {procs.value}",
                         procs.origin, code=Code.WORLD_MISMATCH)
        return procs
    if world is None:
        reader.error("world size unknown: a TRL config leaves it to accelerate launch; pass "
                     "--world N (or write num_processes)", None, code=Code.MISSING)
        reader.raise_if_errors()
    return Value(world, Origin("--world (placeverify option)", get("num_processes").origin.source))


def _model(reader: Reader, get: Get, model: str | None) -> str | None:
    return model_config(reader, get("model_name_or_path"), model)


def _dtype(reader: Reader, get: Get, model: str | None) -> Value:
    """ModelConfig.dtype (float32 by default; ``auto`` is the checkpoint's, not read here)."""
    value = get("dtype") if get("dtype").value is not None else get("torch_dtype", default="float32")
    dtype = TORCH_DTYPES.get(str(value.value))
    if dtype is None:
        reader.error(f"{value.origin.key} {value.value!r}: placeverify reads float32, bfloat16 "
                     "or float16 (auto is the checkpoint's dtype: write it)", value.origin,
                     code=Code.NOT_STATIC)
        dtype = "fp32"
    return Value(dtype, value.origin)


def _adapter(reader: Reader, get: Get) -> Adapter | None:
    peft = get("use_peft", default=False)
    four, eight = get("load_in_4bit", default=False), get("load_in_8bit", default=False)
    if peft.value is not True:
        for v in (four, eight):
            if v.value is True:
                reader.error(f"{v.origin.key} without use_peft: a quantised model is not trained "
                             "whole (transformers refuses it)", v.origin, code=Code.CONFLICT)
        return None
    base: Value | None = None
    kind = Value("lora", peft.origin)
    if four.value is True:
        quant = get("bnb_4bit_quant_type", default="nf4")
        if quant.value != "nf4":
            reader.error(f"not modelled: bnb_4bit_quant_type {quant.value}", quant.origin,
                         code=Code.NOT_MODELLED)
        nested = get("use_bnb_nested_quant", default=False)
        base = Value("nf4_dq" if nested.value is True else "nf4", Origin(
            f"load_in_4bit, {nested.origin.key} {nested.value}", four.origin.source,
            four.origin.span))
        kind = Value("qlora", peft.origin)
    elif eight.value is True:
        base = Value("int8", Origin("load_in_8bit: LLM.int8", eight.origin.source,
                                    eight.origin.span))
    targets = get("lora_target_modules")
    return Adapter(kind, whole(reader, get("lora_r", default=16)),
                   targets if targets.value is not None else None, None, base)

