"""An axolotl YAML configuration (axolotl-ai-cloud/axolotl), read as axolotl reads it.

Keys and defaults: ``src/axolotl/utils/schemas/`` (``config.py``: ``sequence_len`` 512,
``gradient_checkpointing`` true | false | offload; ``training.py``: ``micro_batch_size`` 1,
``gradient_accumulation_steps`` 1, ``batch_size``, ``optimizer`` adamw_torch_fused,
``max_grad_norm`` unset: the Trainer's 1.0; ``peft.py``: ``adapter``, ``lora_r``,
``lora_target_modules``, ``lora_target_linear``, ``load_in_4bit``, ``load_in_8bit``; ``fsdp.py``:
``fsdp_config`` keys with or without their ``fsdp_`` prefix), ``utils/config/__init__.py``
(``normalize_config``: the accumulation is ``batch_size // micro_batch_size`` when not given;
``resolve_dtype``: ``bf16: auto`` is bf16 where the device supports it, the model is loaded in
bf16 with ``bf16``, in fp16 with ``fp16`` or ``load_in_8bit``, else fp32), ``loaders/model.py``
(QLoRA's ``BitsAndBytesConfig``: nf4 with ``bnb_4bit_use_double_quant``) and
``loaders/adapter.py`` (``lora_target_linear`` adds every linear but the output layer,
``find_all_linear_names``). The run is transformers' Trainer's
(:mod:`placeverify.importers.hf_trainer`); the world is the launcher's (``--world``).
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

READ = {"base_model", "base_model_config", "sequence_len", "micro_batch_size",
        "gradient_accumulation_steps", "batch_size", "bf16", "fp16", "bfloat16", "float16",
        "adapter", "lora_r", "lora_target_modules", "lora_target_linear", "load_in_4bit",
        "load_in_8bit", "optimizer", "gradient_checkpointing", "deepspeed", "fsdp",
        "fsdp_config", "fsdp_version", "max_grad_norm", "rl", "context_parallel_size",
        "tensor_parallel_size", "expert_parallel_size", "dp_shard_size", "dp_replicate_size",
        "activation_offloading", "unfrozen_parameters", "lora_modules_to_save",
        "lora_target_parameters", "peft_use_dora", "relora", "qat", "fp8",
        "gptq", "lisa_n_layers"}
# Read without effect on placement, memory or communication as placeverify models them.
IGNORED = {
    "output_dir", "datasets", "test_datasets", "learning_rate", "lr_scheduler", "logging_steps",
    "num_epochs", "warmup_ratio", "warmup_steps", "saves_per_epoch", "save_steps",
    "val_set_size", "evals_per_epoch", "eval_steps", "eval_strategy", "evaluation_strategy",
    "lora_alpha", "lora_dropout", "dataset_prepared_path", "special_tokens", "tokens",
    "resume_from_checkpoint", "auto_resume_from_checkpoints", "lora_model_dir", "chat_template",
    "chat_template_jinja", "tokenizer_type", "tokenizer_config", "tokenizer_use_fast",
    "tokenizer_legacy", "tokenizer_use_mistral_common", "processor_type", "model_type",
    "gradient_checkpointing_kwargs", "strict", "pad_to_sequence_len", "trust_remote_code",
    "remove_unused_columns", "eot_tokens", "skip_prepare_dataset", "max_steps", "seed",
    "ddp_find_unused_parameters", "push_dataset_to_hub", "hub_model_id", "train_on_inputs",
    "group_by_length", "save_total_limit", "save_strategy", "save_only_model",
    "save_safetensors", "early_stopping_patience", "eval_batch_size", "eval_sample_packing",
    "eval_table_size", "eval_max_new_tokens", "eval_causal_lm_metrics", "do_causal_lm_eval",
    "adam_beta1", "adam_beta2", "adam_epsilon", "adam_eps", "weight_decay", "cosine_min_lr_ratio",
    "cosine_constant_lr_ratio", "eta_min", "lr_quadratic_warmup", "loss_watchdog_threshold",
    "loss_watchdog_patience", "debug", "shuffle_merged_datasets", "dataset_exact_deduplication",
    "min_sample_len", "sample_packing", "sample_packing_eff_est", "pretrain_multipack_attn",
    "sample_packing_sequentially", "max_packed_sequence_len", "local_rank", "low_cpu_mem_usage",
    "revision_of_model", "hf_use_auth_token", "use_tensorboard", "use_wandb", "wandb_project",
    "wandb_entity", "wandb_watch", "wandb_name", "wandb_run_id", "wandb_log_model",
    "trackio_project_name", "trackio_run_name", "trackio_space_id", "use_swanlab",
    "swanlab_project", "swanlab_experiment_name", "swanlab_description", "swanlab_mode",
    "swanlab_log_completions", "swanlab_completion_log_interval", "swanlab_completion_max_buffer",
    "swanlab_workspace", "swanlab_log_model", "use_otel_metrics", "otel_metrics_host",
    "otel_metrics_port", "project_name", "streaming", "streaming_multipack_buffer_size",
    "pretraining_dataset", "tf32", "flash_attention", "sdp_attention", "attn_implementation",
    "device_map", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "curriculum_sampling", "total_num_tokens", "lora_fan_in_fan_out", "base_model_ignore_patterns",
    "gpu_memory_limit", "ddp", "torch_dtype",
}
# what each of these would change, refused at its key when set
REFUSED = {
    "rl": "a preference or reinforcement-learning trainer (a reference or reward model, pairs "
          "of sequences)",
    "context_parallel_size": "axolotl's context parallelism (ring attention)",
    "tensor_parallel_size": "axolotl's tensor parallelism (transformers' tp_plan)",
    "expert_parallel_size": "expert parallelism",
    "dp_shard_size": "axolotl's N-D parallelism mesh (dp_shard_size)",
    "dp_replicate_size": "axolotl's N-D parallelism mesh (dp_replicate_size)",
    "activation_offloading": "activation offloading to host memory",
    "unfrozen_parameters": "training only the parameters these patterns name",
    "lora_modules_to_save": "training whole modules beside the adapters",
    "lora_target_parameters": "LoRA on parameters (experts' weights) rather than modules",
    "peft_use_dora": "DoRA's magnitude vectors",
    "relora": "ReLoRA's merges and restarts",
    "qat": "quantisation-aware training",
    "fp8": "fp8 training",
    "gptq": "a GPTQ-quantised base",
    "lisa_n_layers": "LISA's layer sampling",
}
WHAT = "an axolotl config"


def read(reader: Reader, source: Source, model: str | None, world: int | None) -> Plan:
    data, spans, get = load_settings(reader, source, "axolotl's yaml.safe_load")
    plan = Plan("axolotl", source.path)
    _refused(reader, get)
    fsdp = hf_fsdp.placement(reader, data, get, "axolotl", needs_list=False)
    run = Run("axolotl", WHAT, _world(reader, world, source), _model(reader, get, model),
              whole(reader, get("sequence_len", default=512)), *_batch(reader, get),
              *_dtypes(reader, get),
              hf_fsdp.checkpointing(reader, get, get("gradient_checkpointing", default=False)),
              get("max_grad_norm", default=1.0), get("optimizer", default="adamw_torch_fused"),
              _adapter(reader, get), deepspeed_path(reader, get("deepspeed")), fsdp[0], fsdp[1])
    reader.raise_if_errors()
    translate(reader, source, plan, run)
    keys = Keys(READ, IGNORED, {"fsdp_config": hf_fsdp.KEYS},
                unknown=lambda key: f"not modelled: axolotl key '{key}'")
    hf_fsdp.strip_prefix(data, spans)
    leftovers(reader, plan, source, data, spans, ((), keys))
    plan.title = title(plan, source, run, "axolotl")
    return plan


def _world(reader: Reader, world: int | None, source: Source) -> Value:
    if world is None:
        reader.error("world size unknown: an axolotl config leaves it to the launcher "
                     "(accelerate launch, torchrun); pass --world N", None, code=Code.MISSING)
        reader.raise_if_errors()
    return Value(world, Origin("--world (placeverify option)", source))


def _model(reader: Reader, get: Get, model: str | None) -> str | None:
    """The model's config.json: --model, else a local folder base_model names that holds one."""
    return model_config(reader, get("base_model_config") if get("base_model_config").value
                        else get("base_model"), model)


def _batch(reader: Reader, get: Get) -> tuple[Value, Value]:
    """The micro-batch and the accumulation (``batch_size // micro_batch_size`` when only the
    batch size is given, normalize_config)."""
    micro = whole(reader, get("micro_batch_size", default=1))
    acc = get("gradient_accumulation_steps")
    batch = get("batch_size")
    if acc.value is None and batch.value is not None:
        total = whole(reader, batch)
        steps = max(1, int(total.value) // int(micro.value))
        return micro, Value(steps, Origin(f"batch_size {total.value} // micro_batch_size "
                                          f"{micro.value}", batch.origin.source, batch.origin.span))
    return micro, whole(reader, get("gradient_accumulation_steps", default=1))


def _dtypes(reader: Reader, get: Get) -> tuple[Value, Value]:
    """The dtype the model is loaded in and the Trainer's mixed precision (resolve_dtype)."""
    bf16, fp16 = get("bf16", default=False), get("fp16", default=False)
    if bf16.value not in (True, False, "auto"):
        reader.error(f"bf16 is true, false or auto, not {bf16.value!r}", bf16.origin)
    if bf16.value == "auto" and fp16.value is not True:
        reader.warning("bf16: auto is bf16 where the device supports it (Ampere or newer); "
                       "bf16 assumed", bf16.origin, code=Code.MISSING)
    on16 = bf16.value in (True, "auto") and fp16.value is not True
    if on16 or get("bfloat16").value is True:
        key = bf16 if on16 else get("bfloat16")
        return Value("bf16", key.origin), Value("bf16", key.origin)
    if fp16.value is True or get("float16").value is True or get("load_in_8bit").value is True:
        key = fp16 if fp16.value is True else (get("float16") if get("float16").value is True
                                                 else get("load_in_8bit"))
        return Value("fp16", key.origin), Value("fp16" if fp16.value is True else "no", fp16.origin)
    return Value("fp32", bf16.origin), Value("no", bf16.origin)


def _adapter(reader: Reader, get: Get) -> Adapter | None:
    kind = get("adapter")
    if kind.value in (None, ""):
        for key in ("load_in_4bit", "load_in_8bit"):
            if get(key).value is True:
                reader.error(f"{key} without an adapter: a quantised model is not trained whole "
                             "(transformers refuses it)", get(key).origin, code=Code.CONFLICT)
        return None
    if kind.value not in ("lora", "qlora"):
        reader.error(f"not modelled: adapter {kind.value}", kind.origin, code=Code.NOT_MODELLED)
        return None
    four, eight = get("load_in_4bit"), get("load_in_8bit")
    base: Value | None = None
    if kind.value == "qlora":
        if four.value is not True:
            reader.error("adapter qlora without load_in_4bit: true (axolotl quantises the base "
                         "only with both)", kind.origin, code=Code.MISSING)
        base = Value("nf4_dq", Origin("load_in_4bit: nf4, double-quantised (axolotl's "
                                      "BitsAndBytesConfig)", four.origin.source, four.origin.span))
    elif four.value is True:
        reader.error("not modelled: load_in_4bit with adapter lora (axolotl's QLoRA is adapter "
                     "qlora)", four.origin, code=Code.NOT_MODELLED)
    elif eight.value is True:
        base = Value("int8", Origin("load_in_8bit: LLM.int8", eight.origin.source,
                                    eight.origin.span))
    targets = get("lora_target_modules")
    return Adapter(Value(kind.value, kind.origin), whole(reader, get("lora_r", default=8)),
                   targets if targets.value is not None else None,
                   get("lora_target_linear"), base)




def _refused(reader: Reader, get: Get) -> None:
    for key, what in REFUSED.items():
        value = get(key)
        if value.value is True or value.value not in (None, False, 0, 1, "", [], {}):
            reader.error(f"not modelled: {key} ({what})", value.origin, code=Code.NOT_MODELLED)
