"""The replay model, twice: plain on one device (the reference) and split across ranks.

The plain model is the oracle (picotron's tests compare each split layer with the plain layer the
same way): a pre-norm decoder block — LayerNorm, causal multi-head attention, LayerNorm, MLP (or a
top-k mixture of experts with renormalised gate weights, as in Mixtral), residual connections —
with a word embedding and an output layer (tied to the embedding or not), or, for a model given
only by its parameter count, a residual MLP with an output layer. The loss per position is the
cross entropy of the logits. No positional encoding: causal attention already tells positions
apart, and positions are not what a placement changes.

The split model computes the same function with Megatron-LM's layouts (``megatron/core/
tensor_parallel``: ``VocabParallelEmbedding``, ``ColumnParallelLinear``, ``RowParallelLinear``
and the mappings in :mod:`placeverify.replay.comm`), sequence parallelism as in Korthikanti et
al. (arXiv 2205.05198, §4.2.2), context parallelism by all-gathering K and V (Llama 3, arXiv
2407.21783, §3.3.2), and expert parallelism by all-to-all dispatch and combine (GShard, arXiv
2006.16668).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from placeverify.replay import comm
from placeverify.replay.data import Atom, Dropout, draw_nonce
from placeverify.replay.distributed import Handle
from placeverify.replay.layout import Layout, ModelConfig, ParamSpec, global_specs, tp_slice

NORM_EPS = 1e-5


def init_params(specs: list[ParamSpec], seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The single-device model's initial parameters, drawn in spec order from one generator."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for spec in global_specs(specs):
        if spec.init == "norm_weight":
            value = 1 + 0.1 * torch.randn(spec.shape, generator=g, dtype=dtype)
        elif spec.init == "norm_bias":
            value = 0.1 * torch.randn(spec.shape, generator=g, dtype=dtype)
        elif spec.init == "embedding":
            value = torch.randn(spec.shape, generator=g, dtype=dtype)
        else:
            value = torch.randn(spec.shape, generator=g, dtype=dtype) / math.sqrt(spec.shape[-1])
        out[spec.name] = value
    return out


def local_value(full: torch.Tensor, spec: ParamSpec, layout: Layout,
                coords: dict[str, int]) -> torch.Tensor:
    part = tp_slice(spec, layout, coords)
    if part is None:
        return full
    dim, start, stop = part
    return full.narrow(dim, start, stop - start)


def weight(p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A linear's weight, with its LoRA adapter merged in when it has one: x·(W + B·A)ᵀ is
    PEFT's x·Wᵀ + (x·Aᵀ)·Bᵀ (scaling 1, no dropout), with the same gradients for A and B."""
    a = p.get(name + ".lora_A")
    return p[name] if a is None else p[name] + p[name + ".lora_B"] @ a


def _norm(x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], p[name + ".weight"], p[name + ".bias"], NORM_EPS)


def _act(x: torch.Tensor, p: dict[str, torch.Tensor], prefix: str, gated: bool) -> torch.Tensor:
    up = x @ weight(p, prefix + "fc1").t()
    if gated:
        return F.silu(x @ weight(p, prefix + "gate").t()) * up
    return F.gelu(up)


def _attention_probs(q: torch.Tensor, k: torch.Tensor, q_offset: int) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    q_pos = torch.arange(q.shape[-2]) + q_offset
    k_pos = torch.arange(k.shape[-2])
    future = (k_pos[None, :] > q_pos[:, None]).to(scores.device)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


# ---- the single-device reference ------------------------------------------------------------------


class ReferenceMasks:
    """The dropout masks of one reference forward: ``mask(site, layer)`` for the whole batch."""

    def __init__(self, masks: dict[tuple[str, int], torch.Tensor]) -> None:
        self.masks = masks

    def get(self, site: str, layer: int) -> torch.Tensor | None:
        return self.masks.get((site, layer))


def reference_losses(p: dict[str, torch.Tensor], config: ModelConfig, ids: torch.Tensor,
                     labels: torch.Tensor, features: torch.Tensor | None,
                     masks: ReferenceMasks) -> torch.Tensor:
    """Per-position losses (batch, seq) of the plain model on whole sequences."""
    h = p["embed"][ids] if config.transformer else features
    assert h is not None
    b, s = labels.shape
    nh, dh = config.heads, config.head_dim
    for i in range(config.layers):
        pre = f"layers.{i}."
        if config.transformer:
            a = _norm(h, p, pre + "ln1")
            q, k, v = ((a @ weight(p, pre + f"attn.{x}").t()).view(b, s, nh, dh).transpose(1, 2)
                       for x in "qkv")
            probs = _attention_probs(q, k, 0)
            drop = masks.get("attn", i)
            if drop is not None:
                probs = probs * drop
            o = (probs @ v).transpose(1, 2).reshape(b, s, nh * dh) @ weight(p, pre + "attn.o").t()
            drop = masks.get("hid_attn", i)
            h = h + (o * drop if drop is not None else o)
            a = _norm(h, p, pre + "ln2")
        else:
            a = h
        if config.experts:
            y = _reference_moe(p, config, pre, a)
        else:
            y = _act(a, p, pre + "mlp.", config.gated) @ weight(p, pre + "mlp.fc2").t()
        drop = masks.get("hid_mlp", i)
        h = h + (y * drop if drop is not None else y)
    if config.transformer:
        h = _norm(h, p, "ln_f")
    logits = h @ (p["embed"] if config.tied else p["head"]).t()
    return F.cross_entropy(logits.reshape(-1, config.vocab), labels.reshape(-1),
                           reduction="none").view(b, s)


def _reference_moe(p: dict[str, torch.Tensor], config: ModelConfig, pre: str,
                   a: torch.Tensor) -> torch.Tensor:
    x = a.reshape(-1, a.shape[-1])
    weights, chosen = _route(x, p[pre + "router"], config.top_k)
    y = torch.zeros_like(x)
    for slot in range(config.top_k):
        for e in range(config.experts):
            rows = (chosen[:, slot] == e).nonzero().flatten()
            if rows.numel() == 0:
                continue
            q = f"{pre}experts.{e}."
            out = _act(x[rows], p, q, config.gated) @ p[q + "fc2"].t()
            y = y.index_add(0, rows, out * weights[rows, slot:slot + 1])
    return y.view_as(a)


def _route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token and their renormalised softmax weights (Mixtral)."""
    probs = torch.softmax(x @ router.t(), dim=-1)
    weights, chosen = probs.topk(top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), chosen


# ---- the split model on one rank ------------------------------------------------------------------


class StageModel:
    """This rank's part of the model: its pipeline stage, tensor shard, experts and sequence chunk."""

    def __init__(self, config: ModelConfig, layout: Layout, coords: dict[str, int],
                 params: dict[str, torch.Tensor], tp: Handle | None, cp: Handle | None,
                 ep: Handle | None, dropout: Dropout) -> None:
        self.c = config
        self.layout = layout
        self.coords = coords
        self.p = params
        self.tp, self.cp, self.ep = tp, cp, ep
        self.dropout = dropout
        self.stage = coords[layout.pp] if layout.pp else 0
        per_stage = config.layers // layout.pp_size
        self.layer_ids = list(range(self.stage * per_stage, (self.stage + 1) * per_stage))
        self.first = self.stage == 0
        self.last = self.stage == layout.pp_size - 1
        self.tp_size = layout.tp_size
        self.tp_index = coords[layout.tp] if layout.tp else 0
        self.q_offset = (coords[layout.cp] if layout.cp else 0) * config.chunk
        self.local_positions = config.chunk // self.tp_size if layout.sp else config.chunk

    # ---- tensor-parallel regions (sequence parallel or not) ----

    def enter(self, a: torch.Tensor) -> torch.Tensor:
        """Into a column-parallel layer: all-gather the sequence (SP) or Megatron's f."""
        return comm.gather_along(a, self.tp, 1) if self.layout.sp else comm.copy_to_region(a, self.tp)

    def leave(self, y: torch.Tensor) -> torch.Tensor:
        """Out of a row-parallel layer: reduce-scatter the sequence (SP) or Megatron's g."""
        return comm.scatter_along(y, self.tp, 1) if self.layout.sp else comm.reduce_from_region(y, self.tp)

    def mask(self, site: str, layer: int, nonce: int, shape: tuple[int, ...]) -> torch.Tensor:
        return self.dropout.mask(site, self.dropout.stream_layer(layer, self.coords), nonce,
                                 self.coords, shape).to(self._device())

    def _device(self) -> torch.device:
        return next(iter(self.p.values())).device

    # ---- stages ----

    def embed(self, atom: Atom) -> torch.Tensor:
        if not self.c.transformer:
            assert atom.features is not None
            x = atom.features.to(self._device())
            if self.layout.sp:
                x = x.chunk(self.tp_size, dim=1)[self.tp_index].contiguous()
            return x
        table = self.p["embed"]
        rows = table.shape[0]
        local = atom.ids.to(table.device) - self.tp_index * rows
        inside = (local >= 0) & (local < rows)
        e = table[local.clamp(0, rows - 1)] * inside.unsqueeze(-1).to(table.dtype)
        return comm.scatter_along(e, self.tp, 1) if self.layout.sp else comm.reduce_from_region(e, self.tp)

    def layers(self, h: torch.Tensor, seed_layer: Callable[[int], None]) -> torch.Tensor:
        for i in self.layer_ids:
            seed_layer(i)  # outside any recomputation: checkpoint may or may not restore it
            if self.c.recompute == "full":
                h = checkpoint(self.block, h, i, use_reentrant=False,
                               preserve_rng_state=self.c.restore_rng)
            else:
                h = self.block(h, i)
        return h

    def block(self, h: torch.Tensor, i: int) -> torch.Tensor:
        c, p, pre = self.c, self.p, f"layers.{i}."
        nonce = draw_nonce() if self.dropout.active else 0
        if c.transformer:
            a = self.enter(_norm(h, p, pre + "ln1"))
            b, s = a.shape[0], a.shape[1]
            nh = c.heads // self.tp_size
            q, k, v = ((a @ weight(p, pre + f"attn.{x}").t()).view(b, s, nh, c.head_dim).transpose(1, 2)
                       for x in "qkv")
            k = comm.gather_along(k, self.cp, 2)
            v = comm.gather_along(v, self.cp, 2)
            attn_nonce = draw_nonce() if self.dropout.active and c.flash else None
            if c.recompute == "selective":
                core = checkpoint(self.core, q, k, v, i, attn_nonce, use_reentrant=False,
                                  preserve_rng_state=c.restore_rng)
            else:
                core = self.core(q, k, v, i, attn_nonce)
            o = core.transpose(1, 2).reshape(b, s, nh * c.head_dim) @ weight(p, pre + "attn.o").t()
            o = self.leave(o)
            if self.dropout.active:
                o = o * self.mask("hid_attn", i, nonce, tuple(o.shape))
            h = h + o
            a = _norm(h, p, pre + "ln2")
        else:
            a = h
        if c.experts:
            y = self.moe(a, pre)
        else:
            y = self.leave(_act(self.enter(a), p, pre + "mlp.", c.gated) @ weight(p, pre + "mlp.fc2").t())
        if self.dropout.active:
            y = y * self.mask("hid_mlp", i, nonce, tuple(y.shape))
        return h + y

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int,
             nonce: int | None) -> torch.Tensor:
        """Softmax attention of the local queries over every key (the recomputed part when
        recomputation is selective)."""
        probs = _attention_probs(q, k, self.q_offset)
        if self.dropout.active:
            if nonce is None:
                nonce = draw_nonce()
            probs = probs * self.mask("attn", i, nonce, tuple(probs.shape))
        return probs @ v

    def moe(self, a: torch.Tensor, pre: str) -> torch.Tensor:
        c, p = self.c, self.p
        sp = self.layout.sp
        x_seq = comm.gather_along(a, self.tp, 1) if sp else a
        x = x_seq.reshape(-1, x_seq.shape[-1])
        weights, chosen = _route(x, p[pre + "router"], c.top_k)
        expert_in = x if sp else comm.copy_to_region(x, self.tp)
        flat = chosen.reshape(-1)
        token = torch.arange(x.shape[0], device=x.device).repeat_interleave(c.top_k)
        order = torch.argsort(flat, stable=True)
        per_rank = c.experts // self.layout.ep_size
        ep_size = self.ep.size if self.ep is not None else 1
        send = [int((flat // per_rank == r).sum()) for r in range(ep_size)]
        receive = comm.exchange_counts(send, self.ep, x.device)
        rows = comm.all_to_all(expert_in[token[order]], self.ep, send, receive)
        ids = comm.all_to_all_ids(flat[order], self.ep, send, receive)
        # zeros that stay in the graph: a rank no token was routed to (no expert runs) still
        # takes part in both all-to-alls' backward, as every rank of the group must
        out = rows * 0
        for e in sorted(set(ids.tolist())):
            mine = (ids == e).nonzero().flatten()
            q = f"{pre}experts.{e}."
            out = out.index_add(0, mine, _act(rows[mine], p, q, c.gated) @ p[q + "fc2"].t())
        if not sp:
            out = comm.reduce_from_region(out, self.tp)  # whole expert outputs before the gate
        back = comm.all_to_all(out, self.ep, receive, send)
        contrib = back[torch.argsort(order)].view(x.shape[0], c.top_k, -1)
        y = (contrib * weights.unsqueeze(-1)).sum(1).view_as(x_seq)
        return comm.scatter_along(y, self.tp, 1) if sp else y

    def head(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-position losses (samples, chunk) on the last stage."""
        c, p = self.c, self.p
        if c.transformer:
            h = _norm(h, p, "ln_f")
        h = self.enter(h)
        logits = comm.gather_split(h @ (p["embed"] if c.tied else p["head"]).t(), self.tp, -1)
        return F.cross_entropy(logits.reshape(-1, c.vocab), labels.to(logits.device).reshape(-1),
                               reduction="none").view(labels.shape)
