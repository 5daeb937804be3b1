"""The torch replay backend: run a strategy's step on real ``torch.distributed`` processes.

The contract with the rest of placeverify (the same shape as a solver backend beside a concrete
one, see angr/claripy) is small:

- input: a ``.place`` source text, a mesh (axis sizes), a micro-batch count and per-atom token
  and sample counts (:mod:`placeverify.replay.plan` builds these from a counterexample trace or
  from a strategy), all plain JSON;
- semantics: the step IR executed statement by statement exactly as documented in
  :mod:`placeverify.semantics.interpreter`, but on real tensors, with real collectives over real
  process groups, a real model split by the placement, and a real optimizer;
- output: per training state, the largest difference from a single-device reference on the
  global batch and the largest difference between ranks that should hold identical copies, plain
  JSON again.

This package is the only place (with ``placeverify.measure``) that imports torch, and only in the
worker processes: :mod:`placeverify.replay.plan`, :mod:`placeverify.backend.runtime` and
:mod:`placeverify.replay.cli` run in the placeverify process and never import it.
"""
