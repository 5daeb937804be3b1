"""The evidence behind a refutation, as plain data (no solver objects): what the trace and the
replay backend are built from.

- :class:`Counterexample`: a gradient-integrity refutation confirmed by the exact interpreter
  (:mod:`placeverify.semantics.interpreter`) on the smallest mesh found
  (:mod:`placeverify.verify.z3.search`);
- :class:`Divergence`: a state-consistency refutation, two ranks along one axis whose replicated
  state differs after the step (:mod:`placeverify.verify.checks.consistency`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy

if TYPE_CHECKING:  # only a refutation runs the interpreter (check start-up time)
    from placeverify.semantics.interpreter import Instance, Run


class Cause(StrEnum):
    """Why two replicas diverge (:class:`Divergence`)."""

    GRADIENT = "gradient"  # they consume different gradients
    BITWISE = "bitwise"  # the same sum in rank-dependent float32 orders
    SKIP = "skip"  # one skips the step on overflow, the other updates
    CLIP = "clip"  # different clip factors
    STALE_SHARD = "stale-shard"  # a sharded update never gathered back
    RNG = "rng"  # different dropout masks in a replicated region


@dataclass(frozen=True, slots=True)
class Key:
    """A coefficient class of the integrity encoding (:mod:`placeverify.verify.z3.integrity`)."""

    cls: tuple[str, ...]  # per coordinate axis of the view: SAME or DIFF
    k: int | str  # the atom's micro-batch ("g": any one, when all are alike)


@dataclass(frozen=True, slots=True)
class Counterexample:
    group: ParamGroup
    sizes: dict[str, int]
    microbatches: int
    instance: Instance
    run: Run
    key: Key | None
    observe: int | None = None  # None: what the update consumed; i: what this group's clip i saw


@dataclass(frozen=True, slots=True)
class Divergence:
    """Evidence for a refuted consistency obligation, for the trace."""

    axis: str
    group: ParamGroup
    cause: Cause
    sizes: dict[str, int]
    microbatches: int
    run: Run | None = None
    values: dict[str, Any] | None = None
    instance: Instance | None = None


Evidence = Counterexample | Divergence


def small_mesh(strategy: Strategy, axis: str, n: int) -> dict[str, int]:
    """The mesh a divergence along ``axis`` is shown on: ``n`` ranks there, one elsewhere."""
    sizes = {a.name: 1 for a in strategy.mesh.axes}
    sizes[axis] = n
    return sizes
