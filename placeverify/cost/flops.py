"""Matmul FLOPs of the step-time model (:mod:`placeverify.cost.time`, its "FLOPs" bullet).

Per micro-batch per device, matmuls only (2 FLOPs per multiply-add): the QKV projection with
grouped-query attention ``2bs·h(h + 2·kv·d)``, the attention core ``4b·s·s·h`` (half of it under
the causal kernels of ``attention = flash``), the output projection ``2bsh²``, the MLP
``2·2bsh·f`` or ``3·2bsh·f`` gated (SwiGLU), MoE ``top_k`` expert MLPs plus the router, the output
layer ``2bsh·V``; what ``recompute selective_op`` runs again (torchtitan's op policy), the GEMM
inputs fp8 casts, and the model FLOPs of MFU (PaLM, Chowdhery et al. 2022, App. B). Multi-head
latent attention (:mod:`placeverify.ir.latent`) has its own projections and core
(:func:`attention_flops`); shared experts run beside the top_k routed ones; where dense and MoE
layers differ (``dense_layers``, ``moe_every``) a layer's FLOPs are the mean over the layers.
"""

from __future__ import annotations

from placeverify.ir.model import Model, ParamGroup, Transformer


def moe_share(arch: Transformer) -> float:
    """The share of the layers that are MoE layers (1 in a model of MoE layers only, 0 in a dense
    one): a layer's FLOPs below are the mean over the model's layers."""
    return arch.moe_layers / arch.layers if arch.moe else 0.0


def attention_flops(arch: Transformer, tokens: float, keys: float, t: float, causal_skip: bool
                    ) -> tuple[float, float]:
    """Forward matmul FLOPs of one attention block on one device, times ``t``: (the projections,
    the core). Grouped-query attention: Q, K, V and the output projection; multi-head latent
    attention (:mod:`placeverify.ir.latent`): its up projections and o_proj split by tp, its down
    projections whole on every rank (hence ×t here), and a core of Q·Kᵀ over qk_head_dim and
    the weights times V over v_head_dim per head."""
    skip = 0.5 if causal_skip else 1.0
    if arch.latent is not None:
        lat = arch.latent
        projections = 2 * tokens * (lat.matmul(arch.hidden, arch.heads, True)
                                    + t * lat.matmul(arch.hidden, arch.heads, False))
        core = 2 * tokens * keys * arch.heads * (lat.qk_dim + lat.v_dim) * skip
        return projections, core
    h, q, kv = arch.hidden, arch.q_dim, arch.kv_dim
    return 2 * tokens * (h * (q + 2 * kv) + q * h), 4 * tokens * keys * q * skip


def mlp_flops(arch: Transformer, tokens: float, t: float) -> float:
    """Forward matmul FLOPs of one layer's MLP on one device, times ``t``, the mean over the
    layers: a dense MLP of ffn; an MoE layer's top_k expert MLPs of expert_ffn, its shared
    experts (shared_experts × expert_ffn wide) and its router (whole on every rank, ×t)."""
    h, mats = arch.hidden, 3 if arch.gated else 2
    dense = 2 * tokens * mats * h * arch.ffn
    if not arch.moe:
        return dense
    f_e = arch.expert_ffn or arch.ffn
    moe = 2 * tokens * ((arch.top_k + arch.shared_experts) * mats * h * f_e
                        + h * arch.experts * t)
    share = moe_share(arch)
    return share * moe + (1 - share) * dense if share < 1 else moe


def layer_flops(arch: Transformer, tokens: float, keys: float, t: float, causal_skip: bool
                ) -> tuple[float, float]:
    """Forward matmul FLOPs of one layer on one device: (everything, the attention core); the
    mean over the layers where dense and MoE layers differ.

    ``tokens`` queries per device attend to ``keys`` keys; ``t`` tensor-parallel ranks split
    heads and the MLP."""
    projections, core = attention_flops(arch, tokens, keys, t, causal_skip)
    return (projections + mlp_flops(arch, tokens, t) + core) / t, core / t


def column_flops(arch: Transformer, tokens: float, t: float) -> float:
    """Forward GEMM FLOPs of one layer's column-parallel linear layers on one device, whose
    input- and weight-gradient GEMMs the backward collectives of ``overlap = backward`` run
    beside: the QKV projection (latent attention's up projections) and the MLP's first matmul
    (both halves of a gated one); an MoE layer's experts have no such collectives of their own
    (cost.communication), only its QKV projection counts (the mean over the layers where dense
    and MoE layers differ)."""
    h, kv = arch.hidden, arch.kv_dim
    first = (1 - moe_share(arch)) * (2 if arch.gated else 1) * h * arch.ffn
    qkv = (arch.latent.column_matmul(h, arch.heads) if arch.latent is not None
           else h * (arch.q_dim + 2 * kv))
    return 2 * tokens * (qkv + first) / t


def ffn_width(arch: Transformer) -> float:
    """The MLP intermediate's width per token: ``ffn`` (``expert_ffn`` times ``top_k`` and the
    shared experts under MoE; the mean over the layers where dense and MoE layers differ), the
    elements ``ffn_passes`` counts."""
    if not arch.moe:
        return float(arch.ffn)
    share = moe_share(arch)
    moe = float((arch.expert_ffn or arch.ffn) * (arch.top_k + arch.shared_experts))
    return share * moe + (1 - share) * arch.ffn if share < 1 else moe


def op_policy_flops(arch: Transformer, tokens: float, t: float) -> float:
    """Forward matmul FLOPs ``recompute selective_op`` runs again per layer on one device: the
    matmuls torchtitan's op policy does not save (every second one, ``docs/models/step-time.md``): K, the
    output projection, and the up projection (gated) or the second MLP matmul (plain)."""
    h, q = arch.hidden, arch.q_dim
    kv = arch.kv_dim
    f = (arch.expert_ffn or arch.ffn) * (arch.top_k if arch.moe else 1)
    return 2 * tokens * (h * kv + q * h + h * f) / t


def gemm_inputs(arch: Transformer, tokens: float, t: float, sp: bool) -> float:
    """Elements a layer's forward casts to fp8 on one device: the inputs of the QKV projection
    and the first MLP matmul (the hidden states; the sequence shard under sequence parallelism,
    which casts before its all-gather), of the output projection and of the last MLP matmul
    (latent attention: and its up projections' inputs, the two latents, whole on every rank)."""
    h = arch.hidden
    f = ffn_width(arch)
    if arch.latent is not None:
        lat = arch.latent
        return tokens * (2 * h / (t if sp else 1) + lat.q_rank + lat.kv_rank
                         + (arch.heads * lat.v_dim + f) / t)
    return tokens * (2 * h / (t if sp else 1) + (arch.q_dim + f) / t)


def output_flops(arch: Transformer, tokens: float, t: int) -> float:
    return 2 * tokens * arch.hidden * arch.padded_vocab(t) / t


def model_flops_per_token(arch: Transformer) -> float:
    """Forward + backward model FLOPs per token (PaLM: no recomputation, full s² attention)."""
    layer, _ = layer_flops(arch, 1, arch.seq, 1, False)
    return 3 * (arch.layers * layer + output_flops(arch, 1, 1))


def training_flops_per_token(model: Model) -> float:
    """Forward + backward matmul FLOPs per token of a step that may freeze groups and train
    adapters (full s² attention, no recomputation; with nothing frozen and no adapter
    :func:`model_flops_per_token`). Every matmul runs forward (2 per weight) and its input
    gradient (2 per weight); only a trained weight's gradient matmul runs (2 more): a frozen
    group skips it. The attention core has no weights: 2 forward, 4 backward per element. An
    adapter's A and B are trained (6 per parameter). Not modelled: the input gradients a frozen
    prefix of the model could skip (nothing trained below it)."""
    arch = model.arch
    assert arch is not None
    layer, core = layer_flops(arch, 1, arch.seq, 1, False)
    weights = layer - core
    experts = router = 0.0
    if arch.moe:  # per layer, the mean over the layers (the shared experts are dense weights)
        f_e = arch.expert_ffn or arch.ffn
        share = moe_share(arch)
        experts = share * 2.0 * arch.top_k * (3 if arch.gated else 2) * arch.hidden * f_e
        router = share * 2.0 * arch.hidden * arch.experts
    output = output_flops(arch, 1, 1)

    def trained(group: ParamGroup) -> float:
        return 0.0 if group in model.frozen else 1.0

    grads = arch.layers * ((weights - experts - router) * trained(ParamGroup.DENSE)
                           + experts * trained(ParamGroup.EXPERTS)
                           + router * trained(ParamGroup.NORMS))
    grads += output * trained(ParamGroup.EMBEDDING if arch.tied_embeddings else ParamGroup.DENSE)
    adapters = 0.0 if model.adapter is None else 2.0 * arch.adapter_params(model.adapter)
    return 2 * (arch.layers * weights + output) + 3 * arch.layers * core + grads + 3 * adapters


def fine_tune_shares(model: Model) -> tuple[float, float]:
    """What a fine-tune changes in a step's matmuls, against full training of the same model:
    (the share of the weight-gradient matmuls it runs, the adapters' forward FLOPs per token as a
    share of the weights' forward FLOPs). (1, 0) for full training. From
    :func:`training_flops_per_token`: the weights' forward W, their input gradients W, the
    trained weights' gradients share·W, the adapters 6 per parameter."""
    arch = model.arch
    if arch is None or (not model.frozen and model.adapter is None):
        return 1.0, 0.0
    layer, core = layer_flops(arch, 1, arch.seq, 1, False)
    weights = arch.layers * (layer - core) + output_flops(arch, 1, 1)
    adapters = 0.0 if model.adapter is None else 2.0 * arch.adapter_params(model.adapter)
    grads = training_flops_per_token(model) - 2 * weights - 3 * arch.layers * core - 3 * adapters
    return grads / weights, adapters / weights
