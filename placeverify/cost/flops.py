"""Matmul FLOPs of the step-time model (:mod:`placeverify.cost.time`, its "FLOPs" bullet).

Per micro-batch per device, matmuls only (2 FLOPs per multiply-add): the QKV projection with
grouped-query attention ``2bs·h(h + 2·kv·d)``, the attention core ``4b·s·s·h`` (half of it under
the causal kernels of ``attention = flash``), the output projection ``2bsh²``, the MLP
``2·2bsh·f`` or ``3·2bsh·f`` gated (SwiGLU), MoE ``top_k`` expert MLPs plus the router, the output
layer ``2bsh·V``; what ``recompute selective_op`` runs again (torchtitan's op policy), the GEMM
inputs fp8 casts, and the model FLOPs of MFU (PaLM, Chowdhery et al. 2022, App. B).
"""

from __future__ import annotations

from placeverify.ir.model import Model, ParamGroup, Transformer


def layer_flops(arch: Transformer, tokens: float, keys: float, t: float, causal_skip: bool
                ) -> tuple[float, float]:
    """Forward matmul FLOPs of one layer on one device: (everything, the attention core).

    ``tokens`` queries per device attend to ``keys`` keys; ``t`` tensor-parallel ranks split
    heads and the MLP."""
    h, f, q = arch.hidden, arch.ffn, arch.q_dim
    kv = arch.kv_dim
    dense = 2 * tokens * (h * (q + 2 * kv) + q * h)
    mlp_mats = 3 if arch.gated else 2
    if arch.moe:
        f_e = arch.expert_ffn or f
        dense += 2 * tokens * (arch.top_k * mlp_mats * h * f_e + h * arch.experts * t)
    else:
        dense += 2 * tokens * mlp_mats * h * f
    core = 4 * tokens * keys * q * (0.5 if causal_skip else 1.0)
    return (dense + core) / t, core / t


def column_flops(arch: Transformer, tokens: float, t: float) -> float:
    """Forward GEMM FLOPs of one layer's column-parallel linear layers on one device, whose
    input- and weight-gradient GEMMs the backward collectives of ``overlap = backward`` run
    beside: the QKV projection and the MLP's first matmul (both halves of a gated one); an MoE
    layer's experts have no such collectives of their own (cost.communication), only its QKV
    projection counts."""
    h, kv = arch.hidden, arch.kv_dim
    first = 0 if arch.moe else (2 if arch.gated else 1) * h * arch.ffn
    return 2 * tokens * (h * (arch.q_dim + 2 * kv) + first) / t


def ffn_width(arch: Transformer) -> float:
    """The MLP intermediate's width per token: ``ffn`` (``expert_ffn`` times ``top_k`` under
    MoE), the elements ``ffn_passes`` counts."""
    return float((arch.expert_ffn or arch.ffn) * (arch.top_k if arch.moe else 1))


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
    which casts before its all-gather), of the output projection and of the last MLP matmul."""
    h = arch.hidden
    f = (arch.expert_ffn or arch.ffn) * (arch.top_k if arch.moe else 1)
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
    if arch.moe:
        f_e = arch.expert_ffn or arch.ffn
        experts = 2.0 * arch.top_k * (3 if arch.gated else 2) * arch.hidden * f_e
        router = 2.0 * arch.hidden * arch.experts
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
