"""The parameters of the torch models ``placeverify measure`` runs, tensor by tensor.

The lists below follow :class:`placeverify.measure.models.TinyTransformer` and
:class:`placeverify.measure.models.TinyMlp` name by name, shape by shape and in registration
order, so that each implementation's predictor can shard, bucket and partition them exactly as
torch does. :func:`check_params` ties them to the IR's exact parameter count
(:meth:`placeverify.ir.model.Transformer.params`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placeverify.cost.implementations.spec import Mlp, RunSpec
from placeverify.ir.model import ParamGroup, Transformer


@dataclass(frozen=True, slots=True)
class ParamTensor:
    """One parameter as the torch model registers it (same name, shape and order)."""

    name: str
    shape: tuple[int, ...]
    group: ParamGroup
    unit: str  # the FSDP2 unit: "layers.<i>", or "" for the root
    layer: int | None  # transformer layer (or MLP layer); None outside the layers
    tp_dim: int | None  # the dim tensor parallelism shards; None: replicated over tp
    first_stage: bool = False  # lives on the first pipeline stage (embeddings)
    last_stage: bool = False  # lives on the last pipeline stage (final norm, output layer)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _linear(prefix: str, out_f: int, in_f: int, bias: bool, style: str, layer: int,
            unit: str, group: ParamGroup = ParamGroup.DENSE) -> list[ParamTensor]:
    """nn.Linear's weight [out, in] then bias [out]; colwise shards dim 0, rowwise dim 1."""
    weight_dim = {"colwise": 0, "rowwise": 1}.get(style)
    out = [ParamTensor(f"{prefix}.weight", (out_f, in_f), group, unit, layer, weight_dim)]
    if bias:
        # A row-parallel bias is replicated over tp (Megatron's split, model.py's 'norms' group).
        bias_group = ParamGroup.NORMS if style == "rowwise" else group
        out.append(ParamTensor(f"{prefix}.bias", (out_f,), bias_group, unit, layer,
                               0 if style == "colwise" else None))
    return out


def _norm(prefix: str, arch: Transformer, layer: int | None, unit: str,
          last: bool = False, width: int | None = None) -> list[ParamTensor]:
    h = arch.hidden if width is None else width
    out = [ParamTensor(f"{prefix}.weight", (h,), ParamGroup.NORMS, unit, layer, None,
                       last_stage=last)]
    if arch.norm == "layernorm":
        out.append(ParamTensor(f"{prefix}.bias", (h,), ParamGroup.NORMS, unit, layer, None,
                               last_stage=last))
    return out


def transformer_params(arch: Transformer) -> list[ParamTensor]:
    """The parameters of :class:`placeverify.measure.models.TinyTransformer`, in its order."""
    h, q, kv, f = arch.hidden, arch.q_dim, arch.kv_dim, arch.ffn
    out = [ParamTensor("embed.weight", (arch.vocab, h), ParamGroup.EMBEDDING, "", None, 0,
                       first_stage=True)]
    if arch.position == "learned":
        out.append(ParamTensor("pos.weight", (arch.position_rows, h), ParamGroup.EMBEDDING, "",
                               None, None, first_stage=True))
    for i in range(arch.layers):
        unit = f"layers.{i}"
        out += _norm(f"{unit}.attn_norm", arch, i, unit)
        qkv_bias = arch.bias or arch.qkv_bias
        out += _linear(f"{unit}.attn.q", q, h, qkv_bias, "colwise", i, unit)
        out += _linear(f"{unit}.attn.k", kv, h, qkv_bias, "colwise", i, unit)
        out += _linear(f"{unit}.attn.v", kv, h, qkv_bias, "colwise", i, unit)
        out += _linear(f"{unit}.attn.o", h, q, arch.bias, "rowwise", i, unit)
        if arch.qk_norm:
            out += _norm(f"{unit}.attn.q_norm", arch, i, unit, width=arch.head_dim)
            out += _norm(f"{unit}.attn.k_norm", arch, i, unit, width=arch.head_dim)
        if arch.sandwich_norm:
            out += _norm(f"{unit}.post_attn_norm", arch, i, unit)
        out += _norm(f"{unit}.mlp_norm", arch, i, unit)
        if arch.gated:
            out += _linear(f"{unit}.mlp.gate", f, h, arch.bias, "colwise", i, unit)
        out += _linear(f"{unit}.mlp.up", f, h, arch.bias, "colwise", i, unit)
        out += _linear(f"{unit}.mlp.down", h, f, arch.bias, "rowwise", i, unit)
        if arch.sandwich_norm:
            out += _norm(f"{unit}.post_mlp_norm", arch, i, unit)
    out += _norm("norm", arch, None, "", last=True)
    if not arch.tied_embeddings:
        out.append(ParamTensor("output.weight", (arch.vocab, h), ParamGroup.DENSE, "", None, 0,
                               last_stage=True))
    return out


def mlp_params(mlp: Mlp) -> list[ParamTensor]:
    """The parameters of :class:`placeverify.measure.models.TinyMlp`: even layers colwise under
    tensor parallelism, odd layers rowwise (Megatron's MLP pairing)."""
    out: list[ParamTensor] = []
    for i in range(mlp.depth):
        style = "colwise" if i % 2 == 0 else "rowwise"
        out += _linear(f"layers.{i}", mlp.width, mlp.width, True, style, i, f"layers.{i}")
    return out


def model_params(spec: RunSpec) -> list[ParamTensor]:
    if spec.arch is not None:
        return transformer_params(spec.arch)
    assert spec.mlp is not None
    return mlp_params(spec.mlp)


def check_params(arch: Transformer) -> None:
    """The tensors above must add up to the IR's exact parameter count (model.py)."""
    total = sum(t.numel for t in transformer_params(arch))
    if total != arch.params():
        raise AssertionError(f"tensor list has {total} parameters, the IR {arch.params()}")
