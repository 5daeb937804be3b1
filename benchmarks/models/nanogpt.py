"""A nanoGPT-style decoder written for ``benchmarks/peak_memory.py`` apart from
:mod:`placeverify.measure.models`: the layout of Karpathy's nanoGPT (``wte``, ``wpe``, blocks of
``ln_1``, ``attn``, ``ln_2``, ``mlp``, then ``ln_f`` and ``lm_head``) with the attention written
out and masked by ``masked_fill``, LayerNorm with biases, learned positions, an untied head and
no dropout (nanoGPT's default ``dropout = 0.0``). Q, K and V are three projections (nanoGPT fuses
them in one ``c_attn``) so that DTensor's ``ColwiseParallel`` splits whole heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from placeverify.ir.model import Transformer


class CausalSelfAttention(nn.Module):
    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        h = arch.hidden
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(h, h) for _ in range(3))
        self.c_proj = nn.Linear(h, h)
        self.head_dim = arch.head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        heads = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        keys = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        values = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        att = (heads @ keys.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ values).transpose(1, 2).contiguous().view(b, t, -1)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        self.c_fc = nn.Linear(arch.hidden, arch.ffn)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(arch.ffn, arch.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(arch.hidden)
        self.attn = CausalSelfAttention(arch)
        self.ln_2 = nn.LayerNorm(arch.hidden)
        self.mlp = MLP(arch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, arch: Transformer) -> None:
        super().__init__()
        self.wte = nn.Embedding(arch.vocab, arch.hidden)
        self.wpe = nn.Embedding(arch.position_rows, arch.hidden)
        self.h = nn.ModuleList(Block(arch) for _ in range(arch.layers))
        self.ln_f = nn.LayerNorm(arch.hidden)
        self.lm_head = nn.Linear(arch.hidden, arch.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))
