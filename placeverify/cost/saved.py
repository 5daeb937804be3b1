"""The tensors a transformer layer saves for backward: their types, the layer's symbols, what a
norm saves, and what multi-head latent attention saves (the list of a whole layer is
:func:`placeverify.cost.activations.saved_tensors`).

Multi-head latent attention (:mod:`placeverify.ir.latent`) saves, as Korthikanti et al. count a
layer (arXiv 2205.05198 §4.1: each matmul saves its input, the attention core its Q, K and V):
the input of its down projections (``q_a_proj`` and ``kv_a_proj_with_mqa`` read the same hidden
state, one saved tensor), what each latent norm saves (``q_a_layernorm`` over the query rank,
``kv_a_layernorm`` over the key/value rank), the up projections' inputs (the normalised latents),
Q and K of heads × qk_head_dim (the key's rotary part, one per token, is broadcast to every head
before the core: ``k_rot.expand`` in transformers' ``DeepseekV3Attention.forward``, and
concatenated, so the core saves heads-wide keys), V of heads × v_head_dim and the output
projection's input of heads × v_head_dim. The latents and their norms are whole on every
tensor-parallel rank, split by it under sequence parallelism as the layer's input is (DeepSeek's
``wq_a`` and ``wkv_a`` are not tensor-parallel); the heads-wide tensors are split by tp. Not
counted, as for grouped-query attention: what the rotary embedding's multiplications save, and
the value padding to qk_head_dim that transformers' flash-attention-2 path adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placeverify.cost.domain import Domain, Num
from placeverify.ir.model import Transformer
from placeverify.ir.profiles import LayerKernels


class Split(StrEnum):
    REPLICATED = "replicated"  # replicated over tp; split by tp under sequence parallelism
    TENSOR = "tensor"  # split by tp (heads or ffn columns)
    WHOLE = "whole"  # whole on every tensor-parallel rank (a row-parallel matmul's partial sum)


@dataclass(frozen=True, slots=True)
class Saved:
    """One tensor saved for backward, in bytes per layer per micro-batch without parallelism."""

    name: str
    bytes: Num
    split: Split
    core: bool = False  # part of the attention core that selective recomputation drops


@dataclass(frozen=True, slots=True)
class LayerShape:
    """The symbols of a layer's activation formulas, in one domain."""

    s: Num
    b: Num
    h: Num
    a: Num
    kv: Num
    f: Num
    e: Num
    k: Num  # MLP widths of f per token: MoE top-k (and shared experts), 1 for a dense MLP
    head: Num | None = None  # the width of a head when it is not h / a (Transformer.head_size)
    # multi-head latent attention: (query rank, key/value rank, qk_head_dim, v_head_dim)
    latent: tuple[Num, Num, Num, Num] | None = None


def layer_shape(d: Domain, arch: Transformer, activation_bytes: Num,
                moe: bool | None = None) -> LayerShape:
    """The symbols of one layer: an MoE layer's (``moe`` True), a dense one's (False), or the
    mean over the model's layers (None; the MLP's tensors are linear in its width per token, so
    the mean layer's bytes are the mean of the layers' bytes)."""
    h, a, kv = d.sym("h", arch.hidden), d.sym("a", arch.heads), d.sym("a_kv", arch.kv_heads)
    f, k = _mlp_symbols(d, arch, moe)
    latent = None
    if arch.latent is not None:
        lat = arch.latent
        latent = (d.sym("r_q", lat.q_rank) if lat.q_rank else d.const(0),
                  d.sym("r_kv", lat.kv_rank), d.sym("d_qk", lat.qk_dim), d.sym("d_v", lat.v_dim))
    return LayerShape(
        s=d.sym("s", arch.seq), b=d.sym("b", arch.micro_batch), h=h, a=a, kv=kv, f=f,
        e=activation_bytes, k=k, head=d.sym("d_head", arch.head_dim) if arch.head_size else None,
        latent=latent)


def _mlp_symbols(d: Domain, arch: Transformer, moe: bool | None) -> tuple[Num, Num]:
    """(f, k): the MLP saves tensors of f·k per token. A dense MLP f = ffn, k = 1; an MoE
    layer f = expert_ffn and k = top_k plus the shared experts (an MLP of shared_experts ×
    expert_ffn beside the routed ones); the mean layer weighs them by the layers of each kind."""
    if not arch.moe or moe is False:
        return d.sym("f_dense" if arch.moe else "f", arch.ffn), d.const(1)
    f = d.sym("f", arch.expert_ffn or arch.ffn)
    k = d.sym("k", arch.top_k)
    if arch.shared_experts:
        k = k + d.sym("n_shared", arch.shared_experts)
    if moe or not arch.mixed_layers:
        return f, k
    share = d.sym("L_moe", arch.moe_layers) / d.sym("L", arch.layers)
    return f, share * k + (1 - share) * d.sym("f_dense", arch.ffn) / f


def norm_saved(arch: Transformer, x: LayerShape, where: str, kernels: LayerKernels,
               elements: Num | None = None, rows: Num | None = None,
               rep: Split = Split.REPLICATED) -> list[Saved]:
    """What a norm saves: its input (Korthikanti et al.); an eager RMSNorm
    (:data:`placeverify.ir.profiles.LAYER_KERNELS`, transformers' ``LlamaRMSNorm``) its fp32 copy
    instead, the normalised input in the activation dtype and the fp32 reciprocal RMS per row.
    A layer norm normalises s·b rows of h (``elements``); a Q or K norm s·b·heads rows of
    head_dim, split over tp with the heads (``rep``)."""
    sbh = x.s * x.b * x.h if elements is None else elements
    per_row = x.s * x.b if rows is None else rows
    if arch.norm == "layernorm" and kernels.layernorm_stats:
        return [Saved(f"{where} norm input", x.e * sbh, rep),
                Saved(f"{where} norm mean and rstd (fp32)", 2 * 4 * per_row, rep)]
    if not (kernels.eager_rmsnorm and arch.norm == "rmsnorm"):
        return [Saved(f"{where} norm input", x.e * sbh, rep)]
    return [Saved(f"{where} norm input (fp32 copy)", 4 * sbh, rep),
            Saved(f"{where} norm normalised input", x.e * sbh, rep),
            Saved(f"{where} norm reciprocal RMS (fp32)", 4 * per_row, rep)]


def latent_saved(arch: Transformer, x: LayerShape, kernels: LayerKernels) -> list[Saved]:
    """What multi-head latent attention saves between the layer's first norm and its core (the
    module docstring)."""
    assert x.latent is not None and arch.latent is not None
    r_q, r_kv, d_qk, d_v = x.latent
    sb = x.s * x.b
    rep, tp = Split.REPLICATED, Split.TENSOR
    out = [Saved("latent down-projection input", x.e * sb * x.h, rep)]
    if arch.latent.q_rank:
        out += [*norm_saved(arch, x, "query latent", kernels, sb * r_q),
                Saved("query up-projection input", x.e * sb * r_q, rep)]
    out += [*norm_saved(arch, x, "key/value latent", kernels, sb * r_kv),
            Saved("key/value up-projection input", x.e * sb * r_kv, rep),
            Saved("Q", x.e * sb * x.a * d_qk, tp),
            Saved("K", x.e * sb * x.a * d_qk, tp),
            Saved("V", x.e * sb * x.a * d_v, tp),
            Saved("output projection input", x.e * sb * x.a * d_v, tp)]
    return out
