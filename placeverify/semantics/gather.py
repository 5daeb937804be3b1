"""Collectives inside the loss: what an all-gather (or all-reduce) of embeddings before a backward
does to the gradient, written once for every backend.

``all_gather(differentiable | detached) embeddings over G`` before ``backward L`` says that every
rank of G computes the loss from the whole group's embeddings: a contrastive or Barlow Twins loss
over the group's samples, the same value on every rank. ``all_reduce(sum, ...) embeddings`` is
the same with a statistic of the embeddings summed over G (Barlow Twins' cross-correlation
matrix) in place of the embeddings themselves.

The gradient, worked by hand. Let G have n ranks, rank r holding the samples whose embeddings
are z_r = f(θ, x_r), and let L(z_1, ..., z_n) be the loss single-device training computes on
their union. Its gradient is g = Σ_r J_rᵀ ∂L/∂z_r with J_r = ∂z_r/∂θ; rank r's *share*
s_r = J_rᵀ ∂L/∂z_r is what the written ``backward L`` gives rank r's parameters in this
language (its factor times the gradients of its own samples), so Σ_r s_r = g.

- ``differentiable`` (``torch.distributed.nn.functional.all_gather``, whose backward is a
  reduce-scatter sum of the gathered gradients; ``torch.distributed.nn.functional.all_reduce``,
  whose backward is an all-reduce): each of the n ranks back-propagates its own copy of L, and
  the collective's backward hands rank r the sum of the n copies' ∂L/∂z_r. Rank r's gradient is
  n·s_r; an all-reduce(mean) over G (DDP) then gives (1/n)·Σ_r n·s_r = g, a sum n·g.
- ``detached`` (``torch.distributed.all_gather`` with the rank's own slot put back live, or an
  in-place ``torch.distributed.all_reduce``, which autograd does not see): only rank r's own copy
  of L reaches z_r. Rank r's gradient is s_r; the mean over G gives g/n, the sum g.

So a gather multiplies the backward's contribution by |G| (differentiable) or 1 (detached):
:func:`gathered_loss` is the written loss with that factor, the loss the exact interpreter and
the Z3 encoding back-propagate. The agreement analysis needs nothing (|G| is the same on every
rank). The torch replay does not use this factor: it runs the collective for real
(:mod:`placeverify.replay.gather`), so the factor it measures is torch's autograd's, and the
soundness harness compares the two.
"""

from __future__ import annotations

from placeverify.ir.step import Backward, LossGather, Monomial, Term, TermKind


def gather_factor(gather: LossGather) -> tuple[tuple[Term, int], ...]:
    """The factor a collective inside the loss puts on the rank's share: |G| or nothing."""
    if gather.differentiable:
        return ((Term(TermKind.SIZE, group=gather.group), 1),)
    return ()


def gathered_loss(op: Backward) -> Monomial:
    """The loss ``op`` back-propagates into this rank's parameters, relative to its share: the
    written loss, times |G| after a differentiable collective of the embeddings."""
    if op.gather is None:
        return op.loss
    extra = gather_factor(op.gather)
    if not extra:
        return op.loss
    return Monomial((*op.loss.factors, *extra), op.loss.text, op.loss.span)
