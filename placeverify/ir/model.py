"""Models: a bare parameter count or a transformer architecture, and the counts derived from it.

Parameter counts are exact integers derived from the architecture (attention with grouped-query
heads, plain or gated MLP, optional mixture of experts, learned or rotary positions, LayerNorm or
RMSNorm, tied or untied embeddings). Parameters fall in four groups that parallelism treats
differently (Megatron-LM's split):

- ``dense``: attention and MLP weight matrices (and their column-parallel biases), and an untied
  output layer: sharded by tensor parallelism;
- ``norms``: every parameter replicated across tensor-parallel ranks: LayerNorm/RMSNorm weights
  and biases, row-parallel biases and the MoE router. Under sequence parallelism each rank sees
  only its part of the sequence, so their gradients are partial over ``tp``;
- ``embedding``: the word (and learned position) embeddings; with tied embeddings the same
  tensor is the output layer, held by the first and the last pipeline stage;
- ``experts``: the MoE experts' MLP weights, sharded by expert parallelism;
- ``adapters``: low-rank adapters added for fine-tuning (LoRA, QLoRA), trained while the groups
  they adapt are frozen (``docs/language/model.md``).

A fine-tune freezes groups: a frozen group keeps its parameters (Θ, in their stored dtype, or
quantised: :data:`BASE_DTYPES`) and has no gradient, no optimizer state, no reduction and no
update. :meth:`Model.groups_present` names the trained groups only; what is frozen is
:attr:`Model.frozen`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placeverify.ir.latent import Latent


class ParamGroup(StrEnum):
    DENSE = "dense"
    NORMS = "norms"
    EMBEDDING = "embedding"
    EXPERTS = "experts"
    ADAPTERS = "adapters"


BASE_GROUPS = (ParamGroup.DENSE, ParamGroup.NORMS, ParamGroup.EMBEDDING, ParamGroup.EXPERTS)

# The linear layers of a transformer layer a LoRA adapter may target, by the short names PEFT's
# Llama target_modules use without their "_proj" suffix (q_proj ... down_proj).
LORA_MODULES = ("q", "k", "v", "o", "gate", "up", "down")

# A quantised base: bytes per weight element as stored and per output row, and the scales per
# element (bitsandbytes). NF4 (``bitsandbytes/functional.py`` ``quantize_4bit``: blocksize 64,
# two 4-bit codes per byte, one fp32 ``absmax`` per block); ``nf4_dq`` double quantisation
# (``compress_statistics``: the absmax quantised with ``quantize_blockwise(absmax,
# blocksize=256)``, one byte per block plus one fp32 absmax per 256 blocks); ``int8``
# (LLM.int8, ``Linear8bitLt``: int8 weights and one fp32 scale per output row, ``SCB``).
BASE_DTYPES = ("nf4", "nf4_dq", "int8")


@dataclass(frozen=True, slots=True)
class Adapter:
    """Low-rank adapters on named linear layers of every transformer layer (PEFT's LoRA:
    ``peft/tuners/lora/layer.py`` ``LoraLayer.update_layer`` adds ``lora_A = nn.Linear(in, r,
    bias=False)`` and ``lora_B = nn.Linear(r, out, bias=False)`` to each targeted linear: r·in +
    out·r trained parameters). QLoRA is LoRA over a quantised frozen base."""

    kind: str  # lora | qlora
    rank: int
    targets: tuple[str, ...]  # LORA_MODULES names

@dataclass(frozen=True, slots=True)
class Transformer:
    """A decoder-only transformer (GPT / Llama family)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    gated: bool  # SwiGLU-style MLP: gate, up and down matrices
    vocab: int
    seq: int
    micro_batch: int
    tied_embeddings: bool = False
    vocab_divisible_by: int = 1  # Megatron pads the vocabulary to a multiple of this times tp
    position: str = "rotary"  # or "learned"
    max_position: int = 0  # rows of a learned position table; 0 means seq
    norm: str = "rmsnorm"  # or "layernorm" (weight and bias)
    bias: bool = False  # biases in the linear layers
    dropout: bool = False
    attention: str = "standard"  # or "flash" (no s^2 scores kept for backward)
    experts: int = 0  # 0: dense MLP in every layer
    top_k: int = 0
    expert_ffn: int = 0  # 0 means ffn
    # the width of one attention head; 0 means hidden / heads. Another width (Megatron-LM's
    # --kv-channels, Hugging Face's head_dim) makes Q, K, V and the attention output heads x
    # head_dim wide, not hidden.
    head_size: int = 0
    # biases on the Q, K and V projections only (Qwen2's attention), beside ``bias`` (all linears)
    qkv_bias: bool = False
    # a norm over each head of Q and of K (Qwen3's q_norm / k_norm, Megatron-LM --qk-layernorm),
    # of the model's norm kind, head_dim wide and shared by the heads
    qk_norm: bool = False
    # norms after attention and after the MLP too, beside the two before them: four per layer
    # (Gemma 2 and 3: post_attention_layernorm and post_feedforward_layernorm normalise each
    # sub-block's output before the residual add), of the model's norm kind over hidden
    sandwich_norm: bool = False
    # a plain MLP's activation as the model's code computes it: "gelu", one kernel that saves
    # its input (torch's nn.GELU, either approximation); "gelu_new", the tanh GELU written out
    # as elementwise operations (the name transformers gives it, ``NewGELUActivation``)
    activation: str = "gelu"
    # multi-head latent attention (DeepSeek's MLA, placeverify.ir.latent) in place of
    # grouped-query attention's q, k, v and o projections; None: grouped-query attention
    latent: Latent | None = None
    # a shared expert MLP beside the routed ones in every MoE layer, shared_experts x expert_ffn
    # wide (DeepSeek's n_shared_experts: one DeepseekV3MLP of moe_intermediate_size x
    # n_shared_experts; Llama 4's shared_expert of intermediate_size)
    shared_experts: int = 0
    # the first dense_layers layers have a dense MLP of width ffn (DeepSeek's first_k_dense_replace)
    dense_layers: int = 0
    # of the others, layer i (from 0) is an MoE layer when (i + 1) % moe_every == 0 and a dense
    # one otherwise (Llama 4's interleave_moe_layer_step: moe_layers = range(step - 1, L, step))
    moe_every: int = 1

    # ---- shapes ----
    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """The width of Q and of the attention output (hidden unless head_size says otherwise)."""
        return self.head_dim * self.heads if self.head_size else self.hidden

    @property
    def kv_dim(self) -> int:
        return self.head_dim * self.kv_heads

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (from 0) is an MoE layer (:attr:`dense_layers`,
        :attr:`moe_every`)."""
        return self.moe and index >= self.dense_layers and (index + 1) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:
        """How many layers are MoE layers (the others have a dense MLP of width ffn): the i from
        dense_layers to layers - 1 with i + 1 a multiple of moe_every."""
        if not self.moe:
            return 0
        return max(0, self.layers // self.moe_every - self.dense_layers // self.moe_every)

    @property
    def mixed_layers(self) -> bool:
        """Dense and MoE layers in one model: their parameters and activations differ."""
        return 0 < self.moe_layers < self.layers

    @property
    def position_rows(self) -> int:
        return (self.max_position or self.seq) if self.position == "learned" else 0

    def padded_vocab(self, tp: int = 1) -> int:
        """Vocabulary rows after Megatron's padding to a multiple of ``vocab_divisible_by * tp``."""
        multiple = self.vocab_divisible_by * tp if self.vocab_divisible_by > 1 else 1
        return -(-self.vocab // multiple) * multiple

    # ---- parameter counts per layer ----
    def norm_params(self, width: int | None = None) -> int:
        """One normalisation layer over ``width`` (default hidden): LayerNorm has a weight and a
        bias, RMSNorm a weight."""
        w = self.hidden if width is None else width
        return 2 * w if self.norm == "layernorm" else w

    def attention_params(self) -> tuple[int, int]:
        """(sharded by tp, replicated over tp) of one attention block."""
        if self.latent is not None:
            return self.latent.params(self.hidden, self.heads, self.norm_params(1), self.bias)
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        weights = h * q + 2 * h * kv + q * h  # q, k, v, o
        column_bias = (q + 2 * kv) if self.bias or self.qkv_bias else 0
        row_bias = h if self.bias else 0
        return weights + column_bias, row_bias

    def mlp_params(self, ffn: int | None = None) -> tuple[int, int]:
        """(sharded by tp, replicated over tp) of one MLP of width ``ffn``."""
        f = self.ffn if ffn is None else ffn
        h = self.hidden
        matrices = (3 if self.gated else 2) * h * f
        column_bias = ((2 if self.gated else 1) * f) if self.bias else 0
        row_bias = h if self.bias else 0
        return matrices + column_bias, row_bias

    def layer_params(self, moe: bool | None = None) -> dict[ParamGroup, int]:
        """Parameters of one transformer layer by group: an MoE layer's (``moe`` True) or a dense
        one's; by default an MoE layer's in an MoE model (its largest layer)."""
        moe = self.moe if moe is None else moe and self.moe
        attn_sharded, attn_replicated = self.attention_params()
        norms = (4 if self.sandwich_norm else 2) * self.norm_params() + attn_replicated
        if self.qk_norm:
            norms += 2 * self.norm_params(self.head_dim)  # q_norm, k_norm: replicated over tp
        groups = {ParamGroup.DENSE: attn_sharded, ParamGroup.NORMS: norms,
                  ParamGroup.EMBEDDING: 0, ParamGroup.EXPERTS: 0}
        if moe:
            expert_sharded, expert_replicated = self.mlp_params(self.expert_ffn or self.ffn)
            groups[ParamGroup.EXPERTS] = self.experts * (expert_sharded + expert_replicated)
            groups[ParamGroup.NORMS] += self.hidden * self.experts  # router
            if self.shared_experts:  # one MLP, split by tp as a dense MLP is
                shared_sharded, shared_replicated = self.mlp_params(
                    self.shared_experts * (self.expert_ffn or self.ffn))
                groups[ParamGroup.DENSE] += shared_sharded
                groups[ParamGroup.NORMS] += shared_replicated
        else:
            mlp_sharded, mlp_replicated = self.mlp_params()
            groups[ParamGroup.DENSE] += mlp_sharded
            groups[ParamGroup.NORMS] += mlp_replicated
        return groups

    def linears(self) -> dict[str, tuple[int, int]]:
        """One layer's linear weights (dense MLP) as (in, out) by LoRA module name (the plain MLP
        has no ``gate``)."""
        h, q, kv, f = self.hidden, self.q_dim, self.kv_dim, self.ffn
        shapes = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "up": (h, f),
                  "down": (f, h)}
        if self.gated:
            shapes["gate"] = (h, f)
        return shapes

    def adapter_params(self, adapter: Adapter) -> int:
        """Adapter parameters of the whole model: r·(in + out) per targeted linear per layer."""
        shapes = self.linears()
        return self.layers * sum(adapter.rank * (shapes[t][0] + shapes[t][1])
                                 for t in adapter.targets)

    def quantised_elements(self) -> int:
        """Weights of the layers' linear matrices (a quantised base stores these quantised; the
        embedding, the output layer, norms and biases stay in the compute dtype: transformers'
        ``get_keys_to_not_convert`` keeps the output layer unquantised)."""
        return self.layers * sum(i * o for i, o in self.linears().values())

    def quantised_bytes(self, base: str) -> tuple[int, int]:
        """(packed weight bytes, scale bytes) of the layers' linear matrices stored as ``base``
        (:data:`BASE_DTYPES`): the packed weights are what a gather moves."""
        packed = scales = 0
        for i, o in self.linears().values():
            n = i * o
            blocks = -(-n // 64)
            if base == "int8":
                packed, scales = packed + n, scales + 4 * o
            elif base == "nf4":
                packed, scales = packed + -(-n // 2), scales + 4 * blocks
            else:  # nf4_dq: 8-bit absmax per block, fp32 per 256 blocks, one fp32 offset
                packed, scales = packed + -(-n // 2), scales + blocks + 4 * -(-blocks // 256) + 4
        return packed * self.layers, scales * self.layers

    def embedding_params(self) -> int:
        """Word embeddings plus a learned position table (unpadded vocabulary)."""
        return self.vocab * self.hidden + self.position_rows * self.hidden

    def output_params(self) -> int:
        """An untied output layer (0 when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def layers_params(self) -> dict[ParamGroup, int]:
        """Parameters of all the transformer layers by group (MoE and dense layers summed)."""
        moe, dense = self.layer_params(True), self.layer_params(False)
        n = self.moe_layers
        return {g: moe[g] * n + dense[g] * (self.layers - n) for g in moe}

    def group_params(self) -> dict[ParamGroup, int]:
        """Whole-model parameters by group."""
        groups = self.layers_params()
        groups[ParamGroup.NORMS] += self.norm_params()  # final norm
        groups[ParamGroup.EMBEDDING] += self.embedding_params()
        groups[ParamGroup.DENSE] += self.output_params()
        return groups

    def params(self) -> int:
        return sum(self.group_params().values())

    def largest_unit_params(self) -> int:
        """The largest reconstruction unit for S* (FSDP's wrapping unit): a layer or an embedding."""
        layer = max(sum(self.layer_params(True).values()), sum(self.layer_params(False).values()))
        return max(layer, self.embedding_params(), self.output_params())

    def largest_layer_matrix(self) -> int:
        """Elements of a layer's largest weight matrix: an attention projection, the dense MLP's,
        an expert's or the shared experts'."""
        f = (self.expert_ffn or self.ffn) * max(1, self.shared_experts) if self.moe else 0
        if self.moe_layers < self.layers:
            f = max(f, self.ffn)
        attention = (max(i * o for i, o, _ in self.latent.linears(self.hidden, self.heads).values())
                     if self.latent is not None else self.hidden * self.q_dim)
        return max(attention, self.hidden * f)


@dataclass(frozen=True, slots=True)
class Model:
    """A model: its name, its parameter count, and its architecture when known."""

    name: str
    params: int
    arch: Transformer | None = None
    # a bare parameter count's largest single tensor (``largest_tensor = N``), when the user
    # gives it: what a per-tensor optimizer loop's temporaries are sized by
    largest_tensor: int | None = None
    frozen: frozenset[ParamGroup] = frozenset()  # groups with no gradient, state or update
    adapter: Adapter | None = None
    base_dtype: str | None = None  # a quantised frozen base (BASE_DTYPES); None: as stored

    def group_params(self) -> dict[ParamGroup, int]:
        """Parameters by group, frozen ones included (adapters, when there are, last)."""
        if self.arch is None:
            return {ParamGroup.DENSE: self.params, ParamGroup.NORMS: 0, ParamGroup.EMBEDDING: 0,
                    ParamGroup.EXPERTS: 0}
        groups = self.arch.group_params()
        if self.adapter is not None:
            groups[ParamGroup.ADAPTERS] = self.arch.adapter_params(self.adapter)
        return groups

    def groups_held(self) -> tuple[ParamGroup, ...]:
        """Every group with parameters, frozen or trained."""
        return tuple(g for g, n in self.group_params().items() if n > 0)

    def groups_present(self) -> tuple[ParamGroup, ...]:
        """The trained groups: those with a gradient, optimizer state, reduction and update."""
        return tuple(g for g in self.groups_held() if g not in self.frozen)

    def frozen_groups(self) -> tuple[ParamGroup, ...]:
        return tuple(g for g in self.groups_held() if g in self.frozen)

    def trained_params(self) -> int:
        return sum(n for g, n in self.group_params().items() if g not in self.frozen)


# ---- bundled models (public configurations) --------------------------------------------------

# GPT-3 175B (Brown et al., arXiv 2005.14165, Table 2.1): 96 layers, d_model 12288, 96 heads,
# 2048 context, GPT-2 vocabulary, learned positions, LayerNorm, biases, tied embeddings.
# Megatron-LM pads the vocabulary to a multiple of 128 * tp.
GPT3_175B = Transformer(
    layers=96, hidden=12288, heads=96, kv_heads=96, ffn=4 * 12288, gated=False, vocab=50257,
    seq=2048, micro_batch=1, tied_embeddings=True, vocab_divisible_by=128, position="learned",
    max_position=2048, norm="layernorm", bias=True, dropout=True, attention="standard")

# Llama 3 (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783, Table 3), untied embeddings,
# RMSNorm, SwiGLU, grouped-query attention with 8 KV heads, 128256-token vocabulary.
LLAMA3_8B = Transformer(
    layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, gated=True, vocab=128256, seq=8192,
    micro_batch=1, tied_embeddings=False, position="rotary", norm="rmsnorm", bias=False,
    dropout=False, attention="flash")
LLAMA3_70B = Transformer(
    layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, gated=True, vocab=128256, seq=8192,
    micro_batch=1, tied_embeddings=False, position="rotary", norm="rmsnorm", bias=False,
    dropout=False, attention="flash")
LLAMA3_405B = Transformer(
    layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, gated=True, vocab=128256,
    seq=8192, micro_batch=1, tied_embeddings=False, position="rotary", norm="rmsnorm", bias=False,
    dropout=False, attention="flash")

# Mixtral 8x7B (Mistral AI, arXiv 2401.04088): Llama-style layers with 8 experts, top-2 routing.
MIXTRAL_8X7B = Transformer(
    layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, gated=True, vocab=32000, seq=4096,
    micro_batch=1, tied_embeddings=False, position="rotary", norm="rmsnorm", bias=False,
    dropout=False, attention="flash", experts=8, top_k=2)

ARCHITECTURES: dict[str, Transformer] = {
    "gpt3_175b": GPT3_175B,
    "llama3_8b": LLAMA3_8B,
    "llama3_70b": LLAMA3_70B,
    "llama3_405b": LLAMA3_405B,
    "mixtral_8x7b": MIXTRAL_8X7B,
}

# Bare parameter counts: the ZeRO paper's 7.5B model (Rajbhandari et al., arXiv 1910.02054, Fig. 1).
BARE_MODELS: dict[str, int] = {
    "zero_7_5b": 7_500_000_000,
}

MODEL_PRESETS = sorted([*ARCHITECTURES, *BARE_MODELS])
