"""Dropout random streams: which ranks must share a stream and which must not.

Single-device training over the global batch draws one mask element per activation element:
different tokens (and different heads, layers, hidden units) get independent draws, and there is
only one copy of each. A distributed run matches it iff, along every mesh axis,

- ranks that hold *copies* of the same activations (a tensor-parallel axis without sequence
  parallelism, for the hidden dropout after the row-parallel all-reduce: the *replicated* region)
  draw the *same* masks, else the copies diverge (Megatron-DeepSpeed#276);
- ranks that hold *different* activations (other samples along data and expert axes, other
  positions along context and sequence-parallel axes, other heads in the attention dropout over a
  tensor axis, other layers along a pipeline axis: the *sharded* region) draw *different* masks,
  else two different elements reuse one draw (transformers#31412 for data parallelism,
  PaddleFleetX#1005 for sequence parallelism).

A ``seed dropout(region) same|differ over G`` statement sets the policy of ``region`` along every
axis of G; the last statement naming an (axis, region) wins. Only a tensor axis without sequence
parallelism has a replicated region: on any other axis both region words name its one, sharded,
region. Without a statement the policy is the correct one (Megatron-LM's
``model_parallel_cuda_manual_seed``: a default stream shared across tensor ranks, a tracker stream
that differs).
"""

from __future__ import annotations

from placeverify.ir.step import Region, Seed
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import dropout_regions as regions
from placeverify.roles.queries import region_named

__all__ = ["declared", "must_differ", "region_named", "regions"]


def must_differ(strategy: Strategy, axis: str, region: Region) -> bool:
    """The policy single-device training implies: copies share, different elements differ."""
    return region is Region.SHARDED


def declared(strategy: Strategy, axis: str, region: Region) -> tuple[bool, Seed | None]:
    """(differ, the statement that says so) for ``region`` along ``axis``: the last seed statement
    naming it, else the correct default."""
    found: Seed | None = None
    for seed in strategy.step.seeds:
        if axis in seed.group.axes and region_named(strategy, axis, seed.region) is region:
            found = seed
    if found is None:
        return must_differ(strategy, axis, region), None
    return not found.same, found
