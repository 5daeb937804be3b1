"""The small real models the measure backend trains: a transformer built from the file's
architecture and a plain MLP for a bare parameter count.

Parameter names, shapes and registration order are exactly those of
:func:`placeverify.cost.implementations.params.transformer_params` and
:func:`placeverify.cost.implementations.params.mlp_params`
(a test checks it), and the parameter counts those of :mod:`placeverify.ir.model`. Attention is
written out (scores, causal mask, softmax, dropout, weighted sum) for ``attention = standard`` and
uses ``F.scaled_dot_product_attention`` for ``attention = flash``; grouped-query attention repeats
K and V across the heads of a group for the standard path (as Hugging Face's ``repeat_kv`` does).
Head counts are taken from the local projection widths, so the same code runs tensor-parallel
(each rank computes its own heads).

No buffers are registered (DDP would broadcast them every forward): rotary tables and the causal
mask are built in forward. A pipeline stage is the same model with the parts of other stages
removed (``None``), as torchtitan splits its models.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from placeverify.cost.implementations.spec import Mlp
from placeverify.ir.model import Transformer


def _norm(arch: Transformer, width: int | None = None) -> nn.Module:
    w = arch.hidden if width is None else width
    if arch.norm == "layernorm":
        return nn.LayerNorm(w)
    return nn.RMSNorm(w, eps=1e-5)


class Attention(nn.Module):
    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        h, q, kv = arch.hidden, arch.q_dim, arch.kv_dim
        qkv_bias = arch.bias or arch.qkv_bias
        self.q = nn.Linear(h, q, bias=qkv_bias)
        self.k = nn.Linear(h, kv, bias=qkv_bias)
        self.v = nn.Linear(h, kv, bias=qkv_bias)
        self.o = nn.Linear(q, h, bias=arch.bias)
        # Q's and K's per-head norms (qk_norm), applied before the rotary embedding, as Qwen3
        self.q_norm = _norm(arch, arch.head_dim) if arch.qk_norm else None
        self.k_norm = _norm(arch, arch.head_dim) if arch.qk_norm else None
        self.head_dim = arch.head_dim
        self.group = arch.heads // arch.kv_heads
        self.flash = arch.attention == "flash"
        self.dropout = 0.1 if arch.dropout else 0.0

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        q, k = self.q(x).view(b, s, -1, d), self.k(x).view(b, s, -1, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, before heads move to dim 1 (Qwen3)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v(x).view(b, s, -1, d).transpose(1, 2)
        if rope is not None:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        p = self.dropout if self.training else 0.0
        if self.flash:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                                 enable_gqa=self.group > 1)
        else:
            if self.group > 1:
                k = k.repeat_interleave(self.group, dim=1)
                v = v.repeat_interleave(self.group, dim=1)
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            assert mask is not None
            probs = torch.softmax(scores + mask, dim=-1)
            if p:
                probs = F.dropout(probs, p)
            out = torch.matmul(probs, v)
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.o(out)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al., arXiv 2104.09864), half-split form."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FeedForward(nn.Module):
    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        h, f = arch.hidden, arch.ffn
        self.gated = arch.gated
        self.gelu_new = arch.activation == "gelu_new"  # the tanh GELU written out
        if arch.gated:
            self.gate = nn.Linear(h, f, bias=arch.bias)
        self.up = nn.Linear(h, f, bias=arch.bias)
        self.down = nn.Linear(f, h, bias=arch.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        if self.gelu_new:
            u = self.up(x)
            inner = math.sqrt(2.0 / math.pi) * (u + 0.044715 * torch.pow(u, 3.0))
            out: torch.Tensor = self.down(0.5 * u * (1.0 + torch.tanh(inner)))
            return out
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        self.attn_norm = _norm(arch)
        self.attn = Attention(arch)
        # sandwich_norm: each sub-block's output normalised before the residual add (Gemma 2)
        self.post_attn_norm = _norm(arch) if arch.sandwich_norm else None
        self.mlp_norm = _norm(arch)
        self.mlp = FeedForward(arch)
        self.post_mlp_norm = _norm(arch) if arch.sandwich_norm else None
        self.dropout = 0.1 if arch.dropout else 0.0

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        a = self.attn(self.attn_norm(x), rope, mask)
        if self.post_attn_norm is not None:
            a = self.post_attn_norm(a)
        if self.dropout and self.training:
            a = F.dropout(a, self.dropout)
        x = x + a
        m = self.mlp(self.mlp_norm(x))
        if self.post_mlp_norm is not None:
            m = self.post_mlp_norm(m)
        if self.dropout and self.training:
            m = F.dropout(m, self.dropout)
        return x + m


class TinyTransformer(nn.Module):
    """A decoder-only transformer with :mod:`placeverify.ir.model`'s parameter layout."""

    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        self.arch = arch
        self.embed: nn.Embedding | None = nn.Embedding(arch.vocab, arch.hidden)
        self.pos: nn.Embedding | None = (nn.Embedding(arch.position_rows, arch.hidden)
                                         if arch.position == "learned" else None)
        self.layers = nn.ModuleDict({str(i): Block(arch) for i in range(arch.layers)})
        self.norm: nn.Module | None = _norm(arch)
        self.output: nn.Linear | None = (None if arch.tied_embeddings
                                         else nn.Linear(arch.hidden, arch.vocab, bias=False))
        self.is_last = True

    def keep_stage(self, layers: range, first: bool, last: bool) -> None:
        """Drop everything a pipeline stage does not hold."""
        if not first:
            self.embed = None
            self.pos = None
        for name in list(self.layers):
            if int(name) not in layers:
                del self.layers[name]
        if not last:
            self.norm = None
            self.output = None
        self.is_last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        arch = self.arch
        if self.embed is not None:
            tokens = x
            x = self.embed(tokens)
            if self.pos is not None:
                x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
            if arch.dropout and self.training:
                x = F.dropout(x, 0.1)
        s = x.shape[1]
        rope = _rope_tables(s, arch.head_dim, x.device) if arch.position == "rotary" else None
        mask = None
        if arch.attention != "flash":
            mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
        for block in self.layers.values():
            x = block(x, rope, mask)
        if not self.is_last:
            return x
        assert self.norm is not None
        x = self.norm(x)
        if self.output is not None:
            return self.output(x)
        assert self.embed is not None
        return F.linear(x, self.embed.weight)


def _rope_tables(seq: int, dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class TinyMlp(nn.Module):
    """``depth`` x (Linear(width, width) then GELU), the model for a bare parameter count."""

    def __init__(self, mlp: Mlp) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): nn.Linear(mlp.width, mlp.width)
                                     for i in range(mlp.depth)})

    def keep_stage(self, layers: range, first: bool, last: bool) -> None:
        for name in list(self.layers):
            if int(name) not in layers:
                del self.layers[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = F.gelu(layer(x))
        return x


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy for the transformer, mean squared error for the MLP."""
    if target.dtype == torch.long:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.mse_loss(output, target)
