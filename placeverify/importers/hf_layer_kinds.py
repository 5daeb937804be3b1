"""Hugging Face configs whose layers are not Llama's: ``deepseek_v3`` and ``llama4_text``.

Read for :class:`placeverify.importers.hf_config.HFModel`. The rules, from transformers 5.23.0
(huggingface/transformers, ``src/transformers/models/``):

``deepseek_v3/modeling_deepseek_v3.py``:

- ``DeepseekV3Attention.__init__`` (lines 370-403): ``q_proj`` hidden -> heads x qk_head_dim
  without bias when ``q_lora_rank`` is None, else ``q_a_proj`` hidden -> q_lora_rank (bias =
  attention_bias), ``q_a_layernorm`` (an RMSNorm over q_lora_rank) and ``q_b_proj`` q_lora_rank ->
  heads x qk_head_dim without bias; ``kv_a_proj_with_mqa`` hidden -> kv_lora_rank +
  qk_rope_head_dim (bias = attention_bias); ``kv_a_layernorm`` over kv_lora_rank; ``kv_b_proj``
  kv_lora_rank -> heads x (qk_nope_head_dim + v_head_dim) without bias; ``o_proj`` heads x
  v_head_dim -> hidden (bias = attention_bias). ``configuration_deepseek_v3.py`` line 123:
  qk_head_dim = qk_nope_head_dim + qk_rope_head_dim; line 124 sets ``head_dim`` to
  qk_rope_head_dim, so ``head_dim`` is not a head's width here and is not read.
- ``DeepseekV3DecoderLayer.__init__`` (line 492): layer i is a ``DeepseekV3MoE`` when
  i >= first_k_dense_replace, else a ``DeepseekV3MLP`` of intermediate_size (gate, up, down, no
  bias); ``moe_layer_freq`` is not read (DeepSeek's own code makes layer i sparse only when also
  i % moe_layer_freq == 0: the two agree at 1, and another value is refused).
- ``DeepseekV3NaiveMoe`` (lines 167-171): n_routed_experts (``num_local_experts`` through the
  config's attribute_map, line 78) experts of ``gate_up_proj`` 2 x moe_intermediate_size x hidden
  and ``down_proj`` hidden x moe_intermediate_size; ``DeepseekV3MoE`` (line 211):
  ``shared_experts`` one ``DeepseekV3MLP`` of moe_intermediate_size x n_shared_experts;
  ``DeepseekV3TopkRouter`` (lines 126, 131): a weight of n_routed_experts x hidden and
  ``e_score_correction_bias``, a buffer (``nn.Buffer``), not a parameter.
- ``DeepseekV3Model`` (line 551): ``_keys_to_ignore_on_load_unexpected = [r"model\\.layers\\.61.*"]``:
  the multi-token prediction module of DeepSeek's checkpoint (``num_nextn_predict_layers``) is
  not part of the model, so it is not counted (a warning at that key).
- ``DeepseekV3Config``: tie_word_embeddings default False; the model's norms are RMSNorms.

``llama4/modeling_llama4.py`` (``Llama4TextConfig``, ``model_type`` ``llama4_text``):

- ``Llama4TextAttention.__init__`` (lines 308-332): Llama's q, k, v, o projections of head_dim
  with bias = attention_bias; its ``qk_norm`` is ``Llama4TextL2Norm`` (lines 105-117), which has
  no weight: no parameters. The no-RoPE layers (``no_rope_layers``) and chunked attention
  (``attention_chunk_size``) hold no parameters either.
- ``Llama4TextDecoderLayer.__init__`` (lines 399-403): layer i is a ``Llama4TextMoe`` when i is
  in ``config.moe_layers``, which defaults to range(interleave_moe_layer_step - 1, layers,
  interleave_moe_layer_step) (``configuration_llama4.py`` lines 176-185), else a
  ``Llama4TextMLP`` of intermediate_size_mlp.
- ``Llama4TextMoe`` (lines 155-163): ``Llama4TextExperts`` (lines 54-62: num_local_experts experts
  of ``gate_up_proj`` hidden x 2 x intermediate_size and ``down_proj`` intermediate_size x
  hidden), ``Llama4Router`` (line 140: a Linear hidden -> num_local_experts without bias) and
  one ``shared_expert``, a ``Llama4TextMLP`` of intermediate_size. Its forward runs every expert
  on every token, each scaled by its router score (zero outside the top k); placeverify costs the
  top_k experts a routed implementation runs.
- The multimodal ``llama4`` (``Llama4Config``, its ``vision_config`` beside ``text_config``) is
  refused by name.
"""

from __future__ import annotations

from typing import Any, Protocol

from placeverify.diagnostics import Code
from placeverify.importers.common import Line, Reader
from placeverify.importers.origins import Origin, Value


class HFModel(Protocol):
    """What these readers use of :class:`placeverify.importers.hf_config.HFModel`."""

    reader: Reader
    data: dict[str, Any]
    used: set[str]

    def origin(self, key: str) -> Origin: ...

    def get(self, key: str, default: Any = None) -> Value | None: ...

    def integer(self, key: str, default: int | None = None, low: int = 1) -> Value | None: ...

    def line(self, entry: str, v: Value | None, text: str | None = None) -> Line: ...

# keys of these configs that do not change placement, memory or communication as modelled
DEEPSEEK_IGNORED = frozenset({
    "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "scoring_func",
    "topk_method", "aux_loss_alpha", "seq_aux", "ep_size", "rope_interleave", "head_dim",
    "num_key_value_heads",
})
LLAMA4_IGNORED = frozenset({
    "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size", "attn_temperature_tuning",
    "floor_scale", "attn_scale", "use_qk_norm", "interleave_moe_layer_step", "moe_layers",
    "for_llm_compressor",
})
# the model types of this module and the REFUSED keys (hf_config) each of them models
MODELLED_KEYS = {"deepseek_v3": frozenset({"q_lora_rank", "kv_lora_rank", "n_shared_experts",
                                           "first_k_dense_replace", "moe_layer_freq"}),
                 "llama4_text": frozenset()}


def common_lines(hf: HFModel, ffn_key: str, tied_default: bool) -> list[Line]:
    """The entries both configs write as Llama's do."""
    attention_bias = hf.get("attention_bias", False)
    dropout = hf.get("attention_dropout", 0.0)
    tied = hf.get("tie_word_embeddings", tied_default)
    assert attention_bias is not None and dropout is not None and tied is not None
    if attention_bias.value:
        hf.reader.error("not modelled: biases in the attention but not the MLP; placeverify's "
                        "'bias' is all linear layers or none", attention_bias.origin,
                        code=Code.NOT_MODELLED)
    return [hf.line("layers", hf.integer("num_hidden_layers")),
            hf.line("hidden", hf.integer("hidden_size")),
            hf.line("heads", hf.integer("num_attention_heads")),
            hf.line("ffn", hf.integer(ffn_key)),
            Line("mlp = gated", "SwiGLU (gate, up and down projections)"),
            hf.line("vocab", hf.integer("vocab_size")),
            hf.line("embeddings", tied, "tied" if tied.value else "untied"),
            Line("position = rotary", "RoPE (rope_theta)"),
            Line("norm = rmsnorm", "RMSNorm (rms_norm_eps)"),
            Line("bias = false", "attention_bias false; the MLPs have none"),
            hf.line("dropout", dropout, "true" if dropout.value else "false"),
            Line("attention = flash", "config.json does not say: flash/SDPA assumed")]


def deepseek_v3_lines(hf: HFModel) -> list[Line]:
    """A ``deepseek_v3`` config.json's model entries (the module docstring)."""
    hf.used.update(DEEPSEEK_IGNORED)
    lines = common_lines(hf, "intermediate_size", False)
    q_rank = hf.get("q_lora_rank")  # None (or null): a plain q_proj
    if q_rank is not None:
        lines.append(hf.line("q_lora_rank", hf.integer("q_lora_rank")))
    for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        lines.append(hf.line(key, hf.integer(key)))
    layers, dense = hf.get("num_hidden_layers"), hf.integer("first_k_dense_replace", 3, 0)
    freq = hf.get("moe_layer_freq")
    if freq is not None and freq.value != 1:
        hf.reader.error(f"not modelled: moe_layer_freq = {freq.value!r}: transformers' "
                        "DeepseekV3DecoderLayer does not read it (every layer from "
                        "first_k_dense_replace on is MoE), DeepSeek's own code does",
                        freq.origin, code=Code.NOT_MODELLED)
    mtp = hf.get("num_nextn_predict_layers")
    if mtp is not None and mtp.value:
        hf.reader.warning(f"not modelled: num_nextn_predict_layers = {mtp.value}: the "
                          "multi-token prediction module is not in transformers' DeepseekV3 "
                          "model (it drops model.layers.61.* on load), so neither its "
                          "parameters nor its training loss are counted", mtp.origin)
    if layers is not None and dense is not None and isinstance(layers.value, int) \
            and dense.value >= layers.value:
        lines.append(Line("experts = 0", f"first_k_dense_replace ({dense.value}) >= "
                          f"num_hidden_layers: every layer is dense"))
        return lines
    lines += [hf.line("experts", hf.integer("n_routed_experts")),
              hf.line("top_k", hf.integer("num_experts_per_tok")),
              hf.line("expert_ffn", hf.integer("moe_intermediate_size")),
              hf.line("shared_experts", hf.integer("n_shared_experts", 1, 0))]
    if dense is not None and dense.value:
        lines.append(hf.line("dense_layers", dense))
    return lines


def llama4_text_lines(hf: HFModel) -> list[Line]:
    """A ``llama4_text`` config.json's model entries (the module docstring)."""
    hf.used.update(LLAMA4_IGNORED)
    lines = common_lines(hf, "intermediate_size_mlp", False)
    kv = hf.get("num_key_value_heads") or hf.get("num_attention_heads")
    lines.append(hf.line("kv_heads", kv))
    head_dim = hf.get("head_dim", 128)
    lines.append(hf.line("head_dim", head_dim))
    layers = hf.get("num_hidden_layers")
    step = hf.integer("interleave_moe_layer_step", 1)
    listed = hf.data.get("moe_layers")
    if listed is not None and layers is not None and isinstance(layers.value, int) and \
            step is not None and listed != list(range(step.value - 1, layers.value, step.value)):
        hf.reader.error("not modelled: moe_layers other than every interleave_moe_layer_step-th "
                        "layer (range(step - 1, layers, step))", hf.origin("moe_layers"),
                        code=Code.NOT_MODELLED)
    lines += [hf.line("experts", hf.integer("num_local_experts", 16)),
              hf.line("top_k", hf.integer("num_experts_per_tok", 1)),
              hf.line("expert_ffn", hf.integer("intermediate_size", 8192)),
              Line("shared_experts = 1", "Llama4TextMoe's shared_expert (intermediate_size)")]
    if step is not None and step.value > 1:
        lines.append(hf.line("moe_every", step))
    chunk = hf.get("attention_chunk_size")
    if chunk is not None and chunk.value:
        hf.reader.warning(f"attention_chunk_size = {chunk.value}: the chunked layers' attention "
                          "core is costed as full causal attention (an upper bound on its "
                          "FLOPs); it holds no parameters", chunk.origin)
    return lines


def refuse_multimodal_llama4(hf: HFModel) -> None:
    hf.reader.error(
        "not modelled: model_type llama4 is Llama 4 with its vision tower (vision_config) "
        "beside the language model; give the language model's own configuration "
        "(text_config, model_type llama4_text) with --model", hf.origin("model_type"),
        code=Code.NOT_MODELLED)
