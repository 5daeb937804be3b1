"""Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 §2.1): its widths and parameters.

The layer as transformers builds it (``models/deepseek_v3/modeling_deepseek_v3.py``,
``DeepseekV3Attention.__init__``):

- with a query rank r_q: ``q_a_proj`` hidden -> r_q (bias = attention_bias), ``q_a_layernorm``
  (an RMSNorm over r_q), ``q_b_proj`` r_q -> heads·(nope + rope), no bias; without one
  (``q_lora_rank`` None) a plain ``q_proj`` hidden -> heads·(nope + rope), no bias;
- ``kv_a_proj_with_mqa`` hidden -> r_kv + rope (bias = attention_bias): the latent and one
  rotary key shared by every head; ``kv_a_layernorm`` (an RMSNorm over r_kv);
  ``kv_b_proj`` r_kv -> heads·(nope + v), no bias: every head's key part and value;
- ``o_proj`` heads·v -> hidden (bias = attention_bias).

How tensor parallelism splits them follows DeepSeek's own model code (deepseek-ai/DeepSeek-V3,
``inference/model.py`` ``MLA.__init__``): the down projections ``wq_a`` and ``wkv_a`` are plain
``Linear`` layers, whole on every tensor-parallel rank, as are the two latent norms; ``wq_b`` /
``wq`` and ``wkv_b`` are ``ColumnParallelLinear`` (split by heads) and ``wo`` is
``RowParallelLinear``. So the down projections, the latent norms and the row-parallel and
down-projection biases belong to the ``norms`` group (replicated over tp), the up projections and
``o_proj`` to ``dense``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Latent:
    """The widths of multi-head latent attention (the Hugging Face config's names in comments)."""

    kv_rank: int  # kv_lora_rank: the compressed key/value latent
    q_rank: int  # q_lora_rank; 0: a plain q_proj (the config's None)
    rope_dim: int  # qk_rope_head_dim: the rotary part of each query and key head
    nope_dim: int  # qk_nope_head_dim: the part of each head without positions
    v_dim: int  # v_head_dim

    @property
    def qk_dim(self) -> int:
        """One query or key head's width (``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim``)."""
        return self.nope_dim + self.rope_dim

    def linears(self, hidden: int, heads: int) -> dict[str, tuple[int, int, bool]]:
        """The layer's linear weights as (in, out, split by tp) by transformers' module name."""
        out: dict[str, tuple[int, int, bool]] = {}
        if self.q_rank:
            out["q_a_proj"] = (hidden, self.q_rank, False)
            out["q_b_proj"] = (self.q_rank, heads * self.qk_dim, True)
        else:
            out["q_proj"] = (hidden, heads * self.qk_dim, True)
        out["kv_a_proj_with_mqa"] = (hidden, self.kv_rank + self.rope_dim, False)
        out["kv_b_proj"] = (self.kv_rank, heads * (self.nope_dim + self.v_dim), True)
        out["o_proj"] = (heads * self.v_dim, hidden, True)
        return out

    def params(self, hidden: int, heads: int, norm: int, bias: bool) -> tuple[int, int]:
        """(split by tp, replicated over tp) parameters of one attention block. ``norm`` is the
        parameters of one norm per element of its width (1 for RMSNorm, 2 for LayerNorm: the
        latent norms are the model's kind); ``bias``: attention_bias (q_a_proj,
        kv_a_proj_with_mqa and o_proj; the up projections and q_proj have none)."""
        split = replicated = 0
        for i, o, by_tp in self.linears(hidden, heads).values():
            if by_tp:
                split += i * o
            else:
                replicated += i * o
        replicated += norm * (self.kv_rank + self.q_rank)  # kv_a_layernorm, q_a_layernorm
        if bias:
            replicated += (self.q_rank + self.kv_rank + self.rope_dim) + hidden
        return split, replicated

    def matmul(self, hidden: int, heads: int, by_tp: bool) -> int:
        """Multiply-adds per token of the block's projections split by tp (``by_tp``) or whole on
        every tensor-parallel rank (twice this is their forward FLOPs)."""
        return sum(i * o for i, o, split in self.linears(hidden, heads).values()
                   if split == by_tp)

    def column_matmul(self, hidden: int, heads: int) -> int:
        """Multiply-adds per token of the column-parallel projections (q_b_proj or q_proj,
        kv_b_proj: split by heads over tp, before the attention core)."""
        return sum(i * o for name, (i, o, split) in self.linears(hidden, heads).items()
                   if split and name != "o_proj")
