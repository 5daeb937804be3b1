"""A torchtitan config registry: a ``config_registry.py`` whose functions build a
``Trainer.Config`` (torchtitan's configuration since it moved off TOML). torchtitan runs one with
``--module NAME --config FUNCTION`` (``torchtitan/config/manager.py``); placeverify reads the same
function with ``--config FUNCTION`` as data (:mod:`placeverify.importers.python_literals`), never
importing or running the file, and translates each key to the TOML job config key of the same
meaning, which :mod:`placeverify.importers.torchtitan` then reads.

Keys, defaults and rules at pytorch/torchtitan b5bcd76 (``torchtitan/config/configs.py``,
``torchtitan/trainer.py``): ``TrainingConfig`` num_tokens_per_microbatch_per_dp_rank 16384 (token
slots of one forward on a data-parallel rank: max_context_length-long sequences, so the
micro-batch is their quotient), num_tokens_per_train_step -1 (global; default one accumulation
step, trainer.py:413-425), max_context_length 2048, max_norm 1.0, dtype float32,
mixed_precision_param bfloat16, mixed_precision_reduce float32, enable_cpu_offload;
``ParallelismConfig`` the TOML's parallel degrees, num_pp_microbatches 1 (micro-batches of one
accumulation step under pipelining, ignored without); ``CompileConfig``
enable_async_tensor_parallel; ``Trainer.Config.activation_checkpoint`` SelectiveAC.Config by
default (trainer.py:108-110; per-op: the op-level policy), FullAC.Config, or None; ``model_spec =
model_registry(FLAVOR)`` of the model folder the file sits in (``torchtitan/models/NAME/``).
Expert parallelism borrows its ranks from dp_shard x cp x tp (configs.py, expert_parallel_degree:
efsdp = dp_shard * cp * tp / ep): only the case where that is the shard degree alone (cp = tp = 1)
is the TOML's and is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from placeverify.diagnostics import Code, Source, Span
from placeverify.importers.common import IGNORED_HEADER, Plan, Reader
from placeverify.importers.origins import Origin
from placeverify.importers.python_literals import Call, Lit, Module, Node, Opaque, changed_at

# TrainingConfig / ParallelismConfig / CompileConfig keys read under the TOML name they share
SAME = {
    "training": {"max_norm", "mixed_precision_param", "mixed_precision_reduce",
                 "enable_cpu_offload"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "context_parallel_degree", "expert_parallel_degree",
                    "pipeline_parallel_layers_per_stage", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers"},
    "compile": {"enable_async_tensor_parallel"},
}
# read by the translation itself
TRANSLATED = {
    "training": {"num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step",
                 "max_context_length", "dtype"},
    "parallelism": {"num_pp_microbatches", "enable_sequence_parallel"},
    "compile": set(),
}
# keys without effect on placement, memory or communication as placeverify models them
IGNORED = {
    "training": {"steps", "gc_freq", "gc_debug", "disable_cuda_graphs"},
    "parallelism": {"spmd_backend", "enable_fsdp_symm_mem", "context_parallel_load_balancer",
                    "context_parallel_ptrr_mask_key", "pipeline_parallel_schedule_csv"},
    "compile": {"enable", "components", "backend"},
}
TRAINER_IGNORED = {"loss", "optimizer", "lr_scheduler", "dataloader", "metrics", "checkpoint",
                   "validator", "hf_assets_path", "profiler", "tokenizer", "comm", "debug",
                   "dump_folder", "override"}
SECTIONS = {"training", "parallelism", "compile"}


def is_registry(source: Source) -> bool:
    """Whether a file is a torchtitan config registry: Python that builds a Trainer.Config."""
    return Path(source.path).suffix == ".py" and "Trainer.Config" in source.text


class Translation:
    """A registry function's Trainer.Config as the TOML job config's tables: ``data`` and the
    ``spans`` of its keys, and ``names``: each key as the registry writes it."""

    def __init__(self, reader: Reader, source: Source, function: str | None) -> None:
        self.reader, self.source = reader, source
        self.data: dict[str, dict[str, Any]] = {"training": {}, "parallelism": {}, "model": {},
                                                "activation_checkpoint": {}}
        self.spans: dict[tuple[str, ...], Span | None] = {}
        self.names: dict[tuple[str, str], str] = {}
        self.ignored: list[str] = []
        module = Module(source)
        self.function = self._choose(module, function)
        node = module.call(self.function)
        if not isinstance(node, Call) or not node.callee.endswith("Config"):
            why = node.why if isinstance(node, Opaque) else "it does not return a Trainer.Config"
            reader.error(f"cannot read {self.function}(): {why}", self._origin(
                self.function, node.span), code=Code.NOT_MODELLED)
            reader.raise_if_errors()
            return
        self.trainer = node
        self._translate(node)
        reader.raise_if_errors()

    def _origin(self, name: str, span: Span | None) -> Origin:
        return Origin(name, self.source, span)

    def _choose(self, module: Module, function: str | None) -> str:
        configs = sorted(n for n, d in module.functions.items()
                         if not n.startswith("_") and not d.args.args)
        if function is not None and function in module.functions:
            return function
        listed = ", ".join(configs) if configs else "none"
        if function is not None:
            self.reader.error(f"no function {function}() in this config registry; it has: "
                              f"{listed}", None, code=Code.MISSING)
        elif len(configs) == 1:
            return configs[0]
        else:
            self.reader.error(f"this config registry builds {len(configs)} configurations "
                              f"({listed}); give one with --config NAME, as torchtitan's "
                              "--config takes it", None, code=Code.MISSING)
        self.reader.raise_if_errors()
        raise AssertionError("unreachable: an error was raised")

    def _translate(self, trainer: Call) -> None:
        at = changed_at(trainer)
        if at is not None:
            self.reader.error(f"not modelled: {self.function}()'s configuration may be changed "
                              "here in a way the file does not spell out (a call handed it, or "
                              "a branch or loop); placeverify reads assignments and literals",
                              self._origin(self.function, at), code=Code.NOT_MODELLED)
            return
        sections = {name: self._section(trainer, name) for name in SECTIONS}
        for key in trainer.kwargs:
            if key in TRAINER_IGNORED:
                self.ignored.append(key)
            elif key not in (*SECTIONS, "activation_checkpoint", "model_spec"):
                self.reader.warning(f"not modelled: Trainer.Config {key}",
                                    self._origin(key, self._span(trainer, key)))
        for table, section in sections.items():
            if section is not None:
                self._copy(table, section)
        self._tokens(sections["training"], sections["parallelism"])
        self._checkpointing(trainer)
        self._model(trainer)

    def _span(self, call: Call, key: str) -> Span:
        node = call.kwargs[key]
        return call.assigned.get(key, node.span)

    def _section(self, trainer: Call, name: str) -> Call | None:
        node = trainer.get(name)
        if node is None:
            return None
        if not isinstance(node, Call):
            self._unreadable(f"{name}", node)
            return None
        return node

    def _unreadable(self, name: str, node: Node) -> None:
        if isinstance(node, Opaque):
            why = node.why
        elif isinstance(node, Call):
            why = f"{node.callee}(...) is a call, not a value written out"
        else:
            why = f"{node.value!r} is not a configuration"
        self.reader.error(f"cannot read {name}: {why}", self._origin(name, node.span),
                          code=Code.NOT_MODELLED)

    def literal(self, table: str, call: Call | None, key: str) -> Lit | None:
        """The literal value of ``key`` in a section, None when not written; an error at its text
        when it is not a literal."""
        if call is None or key not in call.kwargs:
            return None
        node = call.kwargs[key]
        if isinstance(node, Lit):
            return Lit(node.value, self._span(call, key))
        self._unreadable(f"{table}.{key}", node)
        return None

    def _put(self, table: str, key: str, value: Any, span: Span | None, name: str) -> None:
        self.data[table][key] = value
        self.spans[(table, key)] = span
        self.names[(table, key)] = name

    def _copy(self, table: str, section: Call) -> None:
        target = "parallelism" if table == "compile" else table
        for key in section.kwargs:
            if key in SAME[table]:
                v = self.literal(table, section, key)
                if v is not None:
                    self._put(target, key, v.value, v.span, f"{table}.{key}")
            elif key in IGNORED[table]:
                self.ignored.append(f"{table}.{key}")
            elif key not in TRANSLATED[table]:
                self.reader.warning(f"not modelled: {table}.{key}",
                                    self._origin(f"{table}.{key}", self._span(section, key)))

    def _tokens(self, training: Call | None, parallelism: Call | None) -> None:
        """Token counts as sequences: seq = max_context_length, the micro-batch the sequences of
        one forward, the local batch those of an accumulation step's micro-batches, the global
        batch num_tokens_per_train_step's (trainer.py:296-310, 405-425)."""
        ctx = self.literal("training", training, "max_context_length")
        tokens = self.literal("training", training, "num_tokens_per_microbatch_per_dp_rank")
        step = self.literal("training", training, "num_tokens_per_train_step")
        pp_m = self.literal("parallelism", parallelism, "num_pp_microbatches")
        dtype = self.literal("training", training, "dtype")
        sp = self.literal("parallelism", parallelism, "enable_sequence_parallel")
        if dtype is not None and dtype.value != "float32":
            self.reader.error(f"not modelled: training.dtype {dtype.value!r} (parameters, "
                              "gradients and optimizer state all in that dtype, no fp32 master); "
                              "placeverify reads float32 with the mixed_precision_* policy",
                              self._origin("training.dtype", dtype.span), code=Code.NOT_MODELLED)
        if sp is not None and sp.value is not True:
            self.reader.error("not modelled: tensor parallelism without sequence parallelism "
                              "(enable_sequence_parallel false)", self._origin(
                                  "parallelism.enable_sequence_parallel", sp.span),
                              code=Code.NOT_MODELLED)
        length = ctx.value if ctx is not None else 2048
        count = tokens.value if tokens is not None else 16384
        ctx_name = "training.max_context_length" + ("" if ctx else " (default)")
        tokens_name = "training.num_tokens_per_microbatch_per_dp_rank" + (
            "" if tokens else " (default)")
        where = tokens.span if tokens is not None else (ctx.span if ctx is not None else None)
        if not _whole(length) or not _whole(count) or count % length:
            self.reader.error(f"not modelled: {count} token slots per micro-batch in sequences of "
                              f"{length} (num_tokens_per_microbatch_per_dp_rank must be a "
                              "multiple of max_context_length for placeverify's batch of "
                              "sequences)", self._origin(tokens_name, where),
                              code=Code.NOT_MODELLED)
            return
        micro = count // length
        self._put("training", "seq_len", length, ctx.span if ctx is not None else where, ctx_name)
        pp = self.data["parallelism"].get("pipeline_parallel_degree", 1)
        m = pp_m.value if pp_m is not None and pp != 1 else 1
        if not _whole(m) or m < 1:
            assert pp_m is not None
            self.reader.error(f"parallelism.num_pp_microbatches must be a whole number >= 1, "
                              f"not {m!r}", self._origin("parallelism.num_pp_microbatches",
                                                         pp_m.span))
            return
        local = f"{tokens_name} / {ctx_name.removeprefix('training.')}"
        self._put("training", "local_batch_size", micro * m, where,
                  local + (" x parallelism.num_pp_microbatches" if m > 1 else ""))
        self._put("parallelism", "pipeline_parallel_microbatch_size", micro, where, local)
        if step is not None and step.value != -1:
            if not _whole(step.value) or step.value % length:
                self.reader.error(f"training.num_tokens_per_train_step {step.value} is not a "
                                  f"whole number of {length}-token sequences", self._origin(
                                      "training.num_tokens_per_train_step", step.span))
                return
            self._put("training", "global_batch_size", step.value // length, step.span,
                      f"training.num_tokens_per_train_step / {ctx_name.removeprefix('training.')}")

    def _checkpointing(self, trainer: Call) -> None:
        node = trainer.get("activation_checkpoint")
        name = "activation_checkpoint"
        if node is None:
            self._put(name, "mode", "selective", None, f"{name} (default: SelectiveAC)")
            self._put(name, "selective_ac_option", "op", None, f"{name} (default: SelectiveAC, "
                      "per op)")
            return
        span = self._span(trainer, name)
        if isinstance(node, Lit) and node.value is None:
            self._put(name, "mode", "none", span, f"{name} None")
        elif isinstance(node, Call) and node.callee.endswith("FullAC.Config"):
            self._put(name, "mode", "full", span, f"{name} FullAC")
        elif isinstance(node, Call) and node.callee.endswith("SelectiveAC.Config"):
            self._put(name, "mode", "selective", span, f"{name} SelectiveAC")
            self._put(name, "selective_ac_option", "op", span, f"{name} SelectiveAC (per op)")
        elif isinstance(node, Call):
            self.reader.error(f"not modelled: activation checkpointing {node.callee}",
                              self._origin(name, span), code=Code.NOT_MODELLED)
        else:
            self._unreadable(name, node)

    def _model(self, trainer: Call) -> None:
        node = trainer.get("model_spec")
        folder = Path(self.source.path).resolve().parent.name
        if node is None:
            self.reader.error(f"{self.function}() gives no model_spec", self._origin(
                self.function, trainer.span), code=Code.MISSING)
            return
        span = self._span(trainer, "model_spec")
        if not isinstance(node, Call) or node.callee.split(".")[-1] != "model_registry":
            self._unreadable("model_spec", node if not isinstance(node, Call) else Opaque(
                f"{node.callee}(...) is not model_registry(FLAVOR)", node.span))
            return
        flavor = node.args[0] if node.args else node.kwargs.get("flavor")
        if not isinstance(flavor, Lit) or not isinstance(flavor.value, str):
            self._unreadable("model_registry's flavor", flavor or Opaque("no flavor", span))
            return
        converters = node.kwargs.get("converters")
        if converters is not None and not (isinstance(converters, Lit) and not converters.value):
            self.reader.error("not modelled: model converters (quantisation, LoRA) change the "
                              "model's parameters and their dtypes", self._origin(
                                  "model_registry converters", converters.span),
                              code=Code.NOT_MODELLED)
        self._put("model", "name", folder, span, f"the model folder ({folder})")
        self._put("model", "flavor", flavor.value, flavor.span, f"model_registry({flavor.value!r})")

    def header(self, plan: Plan) -> None:
        plan.header.append(f"torchtitan config registry: {self.function}()")
        if self.ignored:
            plan.header.append(IGNORED_HEADER + " ".join(self.ignored))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
