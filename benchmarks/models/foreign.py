"""Model code placeverify did not write, for ``benchmarks/peak_memory.py``: Hugging Face
``transformers``' GPT-2 and Llama built from their configs (random weights, nothing downloaded)
and the nanoGPT-style model of :mod:`nanogpt`, each behind the few names the measure worker
uses (``layers`` for FSDP2's units, a DTensor plan, the blocks whose saved tensors are the
layers'). ``transformers`` is the ``models`` extra (pyproject.toml); only this benchmark imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from placeverify.ir.model import Transformer

MODELS = ("nanogpt", "gpt2", "gpt2-gelu_new", "llama")


class Foreign(nn.Module):
    """``inner`` called on token ids, its logits returned; ``layers`` its blocks by index (not
    registered a second time: the worker shards each with ``fully_shard``)."""

    def __init__(self, inner: nn.Module, blocks: nn.ModuleList, logits: Callable[[Any], Any],
                 plan: dict[str, Any] | None) -> None:
        super().__init__()
        self.inner = inner
        self._blocks = list(blocks)
        self._logits = logits
        self.plan = plan  # DTensor styles by module path, None where the model has none

    @property
    def layers(self) -> dict[str, nn.Module]:
        return {str(i): b for i, b in enumerate(self._blocks)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._logits(self.inner(x))


def _colwise_rowwise(prefix: str, blocks: int, colwise: list[str], rowwise: list[str],
                     embed: str, head: str) -> dict[str, Any]:
    """Megatron's split in DTensor styles, as :func:`placeverify.measure.worker.tp_plan`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {embed: RowwiseParallel(input_layouts=Replicate())}
    for i in range(blocks):
        plan.update({f"{prefix}.{i}.{name}": ColwiseParallel() for name in colwise})
        plan.update({f"{prefix}.{i}.{name}": RowwiseParallel() for name in rowwise})
    plan[head] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan


def nanogpt(arch: Transformer) -> Foreign:
    from nanogpt import NanoGPT  # benchmarks/models, on the path of the worker

    model = NanoGPT(arch)
    plan = _colwise_rowwise("inner.h", arch.layers,
                            ["attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.c_fc"],
                            ["attn.c_proj", "mlp.c_proj"], "inner.wte", "inner.lm_head")
    return Foreign(model, model.h, lambda out: out, plan)


def gpt2(arch: Transformer, activation: str = "gelu_pytorch_tanh") -> Foreign:
    """``GPT2LMHeadModel``: its Conv1D projections have no DTensor style (no TP plan)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    drop = 0.1 if arch.dropout else 0.0
    config = GPT2Config(vocab_size=arch.vocab, n_positions=arch.position_rows, n_embd=arch.hidden,
                        n_layer=arch.layers, n_head=arch.heads, n_inner=arch.ffn,
                        activation_function=activation, resid_pdrop=drop, embd_pdrop=drop,
                        attn_pdrop=drop, use_cache=False,
                        tie_word_embeddings=arch.tied_embeddings)
    config._attn_implementation = "eager" if arch.attention == "standard" else "sdpa"
    model = GPT2LMHeadModel(config)
    return Foreign(model, model.transformer.h, lambda out: out.logits, None)


def llama(arch: Transformer) -> Foreign:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=arch.vocab, hidden_size=arch.hidden,
                         intermediate_size=arch.ffn, num_hidden_layers=arch.layers,
                         num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
                         max_position_embeddings=arch.seq, rms_norm_eps=1e-5,
                         tie_word_embeddings=arch.tied_embeddings, use_cache=False,
                         attention_bias=arch.bias, mlp_bias=arch.bias)
    config._attn_implementation = "eager" if arch.attention == "standard" else "sdpa"
    model = LlamaForCausalLM(config)
    plan = _colwise_rowwise("inner.model.layers", arch.layers,
                            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                             "mlp.gate_proj", "mlp.up_proj"],
                            ["self_attn.o_proj", "mlp.down_proj"], "inner.model.embed_tokens",
                            "inner.lm_head")
    return Foreign(model, model.model.layers, lambda out: out.logits, plan)


def build(name: str, arch: Transformer) -> Foreign:
    if name == "nanogpt":
        return nanogpt(arch)
    if name == "gpt2":
        return gpt2(arch)
    if name == "gpt2-gelu_new":
        return gpt2(arch, "gelu_new")
    if name == "llama":
        return llama(arch)
    raise ValueError(f"no foreign model {name!r}; known: {', '.join(MODELS)}")
