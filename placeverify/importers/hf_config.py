"""A Hugging Face ``config.json``: the model's dimensions, for any importer (``--model``).

Keys and defaults are those of the transformers config classes (huggingface/transformers):
``models/llama/configuration_llama.py`` (LlamaConfig: hidden_size, intermediate_size,
num_hidden_layers, num_attention_heads, num_key_value_heads defaulting to num_attention_heads,
head_dim defaulting to hidden_size // num_attention_heads, attention_bias, mlp_bias,
attention_dropout, tie_word_embeddings default False, max_position_embeddings),
``models/mistral/configuration_mistral.py`` (the same keys), ``models/qwen2/`` (the same keys;
``Qwen2Attention`` gives the q, k and v projections biases and o none, the MLP none),
``models/qwen3/`` (the same keys, head_dim given; ``Qwen3Attention`` normalises Q and K per head
with RMSNorms over head_dim, q_norm and k_norm), ``models/qwen3_moe/`` (Qwen3's attention; every
layer a sparse block when decoder_sparse_step is 1 and mlp_only_layers empty: num_experts SwiGLU
experts of moe_intermediate_size, num_experts_per_tok of them per token, a hidden x num_experts
router, no shared expert),
``models/phi3/`` (Phi3Config: the same keys with tie_word_embeddings default False and
resid_pdrop; ``Phi3Attention`` fuses q, k and v in one qkv_proj of heads x head_dim + 2 x
kv_heads x head_dim outputs without bias, ``Phi3MLP`` gate and up in one gate_up_proj of
2 x intermediate_size: the same parameters as Llama's separate projections; partial_rotary_factor
rotates part of each head and holds no parameters),
``models/gemma2/`` and ``models/gemma3/`` (Gemma2Config, Gemma3TextConfig: the Llama keys with
head_dim given, tie_word_embeddings default True and a GeGLU MLP of gate, up and down;
``Gemma2DecoderLayer`` / ``Gemma3DecoderLayer`` have four RMSNorms over hidden: input,
post_attention, pre_feedforward and post_feedforward; ``Gemma3Attention`` adds q_norm and k_norm
over head_dim; the embedding scale and the logit soft-capping hold no parameters; the multimodal
``gemma3``, with its vision tower, is refused),
``models/mixtral/configuration_mixtral.py`` (num_local_experts, num_experts_per_tok; every layer
is a sparse MoE block whose experts are SwiGLU MLPs of width intermediate_size) and
``models/gpt2/configuration_gpt2.py`` (n_embd, n_layer, n_head, n_inner defaulting to 4 * n_embd,
n_positions, tie_word_embeddings default True, learned
positions, LayerNorm, biases, resid_pdrop / attn_pdrop), and ``deepseek_v3`` (multi-head latent
attention, shared experts, dense layers before the MoE ones) and ``llama4_text`` (shared expert,
interleaved dense and MoE layers), whose rules, cited line by line, are in
:mod:`placeverify.importers.hf_layer_kinds`. Other architectures are refused by name: their
layers (partial biases, other attention) change the parameter count in ways ``model
transformer`` does not describe; the keys of :data:`REFUSED` are refused in every other model
type.
"""

from __future__ import annotations

from typing import Any

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source
from placeverify.importers.common import Line, Plan, Reader
from placeverify.importers.hf_layer_kinds import (
    MODELLED_KEYS,
    deepseek_v3_lines,
    llama4_text_lines,
    refuse_multimodal_llama4,
)
from placeverify.importers.origins import Origin, Value
from placeverify.importers.positions import load_json, syntax_error
from placeverify.syntax.source import read_source

LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma2",
              "gemma3_text")
GEMMA = ("gemma2", "gemma3_text")
MOE = {"mixtral": ("num_local_experts", None), "qwen3_moe": ("num_experts", "moe_intermediate_size")}
SUPPORTED = (*LLAMA_LIKE, "gpt2", "deepseek_v3", "llama4_text")

# Keys that do not change placement, memory or communication as placeverify models them.
IGNORED = frozenset({
    "architectures", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "hidden_act",
    "activation_function", "initializer_range", "rms_norm_eps", "layer_norm_epsilon", "rope_theta",
    "rope_scaling", "rope_parameters", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "pretraining_tp", "model_type", "max_position_embeddings", "n_positions", "n_ctx",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "sliding_window",
    "use_sliding_window", "max_window_layers", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
    "task_specific_params", "_name_or_path", "name_or_path", "id2label", "label2id",
    "embd_pdrop", "quantization_config", "partial_rotary_factor",
    "original_max_position_embeddings", "hidden_activation", "query_pre_attn_scalar",
    "final_logit_softcapping", "cache_implementation", "layer_types", "rope_local_base_freq",
    "sliding_window_pattern",
})
# Keys that change the architecture in ways placeverify does not model.
REFUSED = {
    "q_lora_rank": "multi-head latent attention (DeepSeek) is not modelled",
    "kv_lora_rank": "multi-head latent attention (DeepSeek) is not modelled",
    "n_shared_experts": "shared experts are not modelled",
    "first_k_dense_replace": "a mix of dense and MoE layers is not modelled",
    "moe_layer_freq": "a mix of dense and MoE layers is not modelled",
    "decoder_sparse_step": "a mix of dense and MoE layers is not modelled",
}


class HFModel:
    """A config.json read into model entries (without seq and micro_batch, which training sets)."""

    def __init__(self, main: Reader, source: Source) -> None:
        self.main = main
        self.reader = Reader(source)  # diagnostics about config.json itself
        self.source = source
        data, self.spans = load_json(source)
        if not isinstance(data, dict):
            raise syntax_error(source, "a Hugging Face config.json is a JSON object", None)
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def origin(self, key: str) -> Origin:
        return Origin(key, self.source, self.spans.get((key,)))

    def get(self, key: str, default: Any = None) -> Value | None:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            return None if default is None else Value(default, Origin(f"{key} (default)", self.source))
        return Value(self.data[key], self.origin(key))

    def integer(self, key: str, default: int | None = None, low: int = 1) -> Value | None:
        v = self.get(key, default)
        if v is None:
            self.reader.error(f"config.json has no '{key}'", Origin(key, self.source),
                              code=Code.MISSING)
            return None
        if isinstance(v.value, bool) or not isinstance(v.value, int) or v.value < low:
            self.reader.error(f"'{key}' must be a whole number >= {low}, not {v.value!r}", v.origin)
            return None
        return v

    def entries(self) -> list[Line]:
        """The model block's entries (dimensions), each with its key."""
        kind = self.data.get("model_type")
        self.used.add("model_type")
        if kind == "gemma3":
            self.reader.error(
                "not modelled: model_type gemma3 is Gemma 3 with its vision tower (vision_config) "
                "beside the language model; give the language model's own configuration "
                "(text_config, model_type gemma3_text) with --model", self.origin("model_type"),
                code=Code.NOT_MODELLED)
            self.reader.raise_if_errors()
        if kind == "llama4":
            refuse_multimodal_llama4(self)
            self.reader.raise_if_errors()
        if kind not in SUPPORTED:
            self.reader.error(
                f"model_type {kind!r} is not modelled; placeverify reads "
                + ", ".join(SUPPORTED) + " configurations", self.origin("model_type"),
                "describe other models by hand: model transformer { layers = ..., hidden = ... }",
                code=Code.NOT_MODELLED)
        modelled = MODELLED_KEYS.get(str(kind), frozenset())
        for key, why in REFUSED.items():
            every_layer = key == "decoder_sparse_step" and self.data.get(key) == 1
            if self.data.get(key) not in (None, 0) and not every_layer and key not in modelled:
                self.reader.error(f"not modelled: '{key}': {why}", self.origin(key),
                                  code=Code.NOT_MODELLED)
                self.used.add(key)
        only_dense = self.data.get("mlp_only_layers")
        if only_dense:
            self.reader.error("not modelled: 'mlp_only_layers': a mix of dense and MoE layers is "
                              "not modelled", self.origin("mlp_only_layers"),
                              code=Code.NOT_MODELLED)
        self.used.add("mlp_only_layers")
        lines = (self._gpt2() if kind == "gpt2" else deepseek_v3_lines(self)
                 if kind == "deepseek_v3" else llama4_text_lines(self) if kind == "llama4_text"
                 else self._llama(MOE.get(str(kind))))
        for key in self.data:
            if key not in self.used and key not in IGNORED:
                self.reader.warning(f"not modelled: config.json key '{key}'", self.origin(key))
        self.reader.raise_if_errors()
        self.main.extra.extend(self.reader.warnings())
        return lines

    def line(self, entry: str, v: Value | None, text: str | None = None) -> Line:
        if v is None:
            return Line(f"{entry} = 0")
        return Line(f"{entry} = {text if text is not None else v.value}", v.origin.key, v.origin)

    def _llama(self, moe: tuple[str, str | None] | None) -> list[Line]:
        """A Llama-shaped decoder; ``moe`` names the experts' count and width keys (the width
        None: intermediate_size, as Mixtral's experts are)."""
        layers = self.integer("num_hidden_layers")
        hidden = self.integer("hidden_size")
        heads = self.integer("num_attention_heads")
        kv = self.get("num_key_value_heads") or (
            None if heads is None else Value(heads.value, Origin(
                "num_key_value_heads (default: num_attention_heads)", self.source)))
        ffn = self.integer("intermediate_size")
        vocab = self.integer("vocab_size")
        head_dim = self.get("head_dim")  # None (or null): hidden_size / num_attention_heads
        tied = self.get("tie_word_embeddings", self.data.get("model_type") in GEMMA)
        attention_bias = self.get("attention_bias", False)
        mlp_bias = self.get("mlp_bias", False)
        assert tied is not None and attention_bias is not None and mlp_bias is not None
        if attention_bias.value != mlp_bias.value:
            self.reader.error("not modelled: biases in the attention but not the MLP (or the "
                              "reverse); placeverify's 'bias' is all linear layers or none",
                              attention_bias.origin, code=Code.NOT_MODELLED)
        dropout = self.get("attention_dropout", 0.0)
        assert dropout is not None
        if self.data.get("model_type") == "phi3":
            # Phi3DecoderLayer: resid_attn_dropout and resid_mlp_dropout of resid_pdrop
            resid = self.get("resid_pdrop", 0.0)
            assert resid is not None
            dropout = resid if resid.value and not dropout.value else dropout
        lines = [self.line("layers", layers), self.line("hidden", hidden),
                 self.line("heads", heads), self.line("kv_heads", kv),
                 self.line("ffn", ffn),
                 *([self.line("head_dim", head_dim)] if head_dim is not None
                   and head_dim.value is not None else []),
                 Line("mlp = gated", "GeGLU (Gemma's MLP: gate, up and down projections)"
                      if self.data.get("model_type") in GEMMA
                      else "SwiGLU (LlamaMLP: gate, up and down projections)"),
                 self.line("vocab", vocab),
                 self.line("embeddings", tied, "tied" if tied.value else "untied"),
                 Line("position = rotary", "RoPE (rope_theta)"),
                 Line("norm = rmsnorm", "RMSNorm (rms_norm_eps)"),
                 self.line("bias", attention_bias, "true" if attention_bias.value else "false"),
                 self.line("dropout", dropout, "true" if dropout.value else "false"),
                 Line("attention = flash", "config.json does not say: flash/SDPA assumed")]
        if self.data.get("model_type") in ("qwen3", "qwen3_moe"):
            lines.append(Line("qk_norm = true", "model_type qwen3 (Qwen3Attention: q_norm and "
                              "k_norm, RMSNorms over head_dim)"))
        if self.data.get("model_type") == "gemma3_text":
            lines.append(Line("qk_norm = true", "model_type gemma3_text (Gemma3Attention: q_norm "
                              "and k_norm, RMSNorms over head_dim)"))
        if self.data.get("model_type") in GEMMA:
            lines.append(Line("sandwich_norm = true", f"model_type {self.data['model_type']} "
                              "(post_attention_layernorm and post_feedforward_layernorm beside "
                              "the input and pre-feedforward norms)"))
            softcap = self.get("attn_logit_softcapping")
            if softcap is not None and softcap.value:
                self.reader.warning(
                    "attn_logit_softcapping: PyTorch's SDPA does not cap the attention logits, so "
                    "transformers trains this model with eager or flash_attention_2 attention; "
                    "flash is assumed (under eager attention give --set model.attention=standard: "
                    "the s x s scores are then saved)", softcap.origin)
        if self.data.get("model_type") == "qwen2":
            lines.append(Line("qkv_bias = true", "model_type qwen2 (Qwen2Attention: q, k and v "
                              "projections with biases, o and the MLP without)"))
        if moe is not None:
            count, width = moe
            experts = self.integer(count)
            top_k = self.integer("num_experts_per_tok")
            lines += [self.line("experts", experts), self.line("top_k", top_k)]
            if width is not None:
                lines.append(self.line("expert_ffn", self.integer(width)))
            self.get("norm_topk_prob")  # renormalises the top-k weights: no size changes
        return lines

    def _gpt2(self) -> list[Line]:
        layers = self.integer("n_layer")
        hidden = self.integer("n_embd")
        heads = self.integer("n_head")
        ffn = self.get("n_inner") or (None if hidden is None else Value(
            4 * int(hidden.value), Origin("n_inner (default: 4 * n_embd)", self.source)))
        vocab = self.integer("vocab_size")
        positions = self.integer("n_positions", 1024)
        tied = self.get("tie_word_embeddings", True)
        dropout = self.get("resid_pdrop", 0.1)
        self.get("attn_pdrop")
        assert tied is not None and dropout is not None
        return [self.line("layers", layers), self.line("hidden", hidden),
                self.line("heads", heads), self.line("kv_heads", heads),
                self.line("ffn", ffn), Line("mlp = plain", "GELU MLP (GPT2MLP)"),
                self.line("vocab", vocab),
                self.line("embeddings", tied, "tied" if tied.value else "untied"),
                self.line("position", positions, "learned"),
                self.line("max_position", positions),
                Line("norm = layernorm", "GPT2Block: LayerNorm"),
                Line("bias = true", "GPT2 Conv1D layers have biases"),
                self.line("dropout", dropout, "true" if dropout.value else "false"),
                Line("attention = flash", "config.json does not say: flash/SDPA assumed")]

    def max_position(self) -> Value | None:
        key = "n_positions" if self.data.get("model_type") == "gpt2" else "max_position_embeddings"
        v = self.get(key)
        return v if v is not None and isinstance(v.value, int) and v.value > 0 else None

    def value_of(self, entry: str, lines: list[Line]) -> str | None:
        for line in lines:
            name, _, value = line.text.partition(" = ")
            if name == entry:
                return value
        return None



def attach_model(plan: Plan, reader: Reader, model_path: str | None, seq: Value | None,
                 micro_batch: Value | None, own: list[Line] | None = None,
                 what: str = "this file") -> HFModel | None:
    """Fill the plan's model block from ``--model config.json``, else from the framework's own
    entries (``own``); say what is missing when neither describes the model. The sequence
    length is the framework's (``seq``) or ``--set model.seq=N``'s, never a guess: the config's
    ``max_position_embeddings`` is the longest sequence the model takes, not the one training
    uses, and it decides whether the run fits."""
    hf: HFModel | None = None
    if model_path is not None:
        hf = HFModel(reader, read_source(model_path))
        plan.model = hf.entries()
        plan.model_origin = Origin("--model", hf.source, None)
    elif own is not None:
        plan.model = list(own)
    else:
        reader.error(f"no model: {what} does not describe the model; give its Hugging Face "
                     "config with --model config.json", None, code=Code.MISSING)
        return None
    if seq is None and SEQ_KEY in reader.given:
        # the override writes the value into this line (placeverify.lower.edit)
        seq = Value(SEQ_PLACEHOLDER, Origin(f"given by --set {SEQ_KEY}", reader.source, None))
    if seq is None:
        position = hf.max_position() if hf is not None else None
        reader.error(no_seq_message(what, position), position.origin if position else None,
                     f"give the training sequence length with --set {SEQ_KEY}=N",
                     code=Code.MISSING)
    else:
        plan.model.append(Line(f"seq = {seq.value}", seq.origin.key, seq.origin))
    if micro_batch is not None:
        plan.model.append(Line(f"micro_batch = {micro_batch.value}", micro_batch.origin.key,
                               micro_batch.origin))
    return hf


SEQ_KEY = "model.seq"
SEQ_PLACEHOLDER = 2048  # replaced by the --set model.seq override before anything reads it


def no_seq_message(what: str, position: Value | None) -> str:
    """Why there is no sequence length, and (where the config has one) why the model's longest
    is not taken for it."""
    message = f"no sequence length: {what} does not give the training sequence length"
    if position is not None:
        message += (f"; {position.origin.key} ({position.value}) is the longest the model takes, "
                    "not what training uses, and is not assumed (it decides whether the run "
                    "fits)")
    return message


def model_statement(model_path: str, seq: int | None) -> tuple[str, list[tuple[Diagnostic, Source]]]:
    """The ``model transformer { ... }`` statement of a Hugging Face config.json, and the
    warnings about it: ``search --model config.json`` without a FILE. The sequence length is
    ``seq`` (``--seq``); without it the config's ``max_position_embeddings`` is not assumed: an
    error, at that key where the config has it."""
    source = read_source(model_path)
    reader = Reader(source)
    hf = HFModel(reader, source)
    lines = hf.entries()
    if seq is None:
        position = hf.max_position()
        span = position.origin.span if position is not None else None
        raise PlaceError([Diagnostic(
            Severity.ERROR, no_seq_message("a Hugging Face config.json", position), Code.MISSING, span,
            ("give the training sequence length with --seq N",))], source)
    entries = ", ".join([*(line.text for line in lines), f"seq = {seq}"])
    return f"model transformer {{ {entries} }}", reader.warnings()
