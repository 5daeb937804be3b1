"""Verdicts, conditions and proof obligations as plain data: what every check returns.

No Z3 object crosses this boundary: counterexamples are JSON-serialisable dictionaries. Below
both :mod:`placeverify.verdicts` (a whole verification, which may carry a counterexample trace)
and :mod:`placeverify.trace` (the trace, which names its condition and kind), so neither imports
the other's module for these types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from placeverify.diagnostics import Span


class Verdict(StrEnum):
    PROVED = "proved"
    REFUTED = "refuted"
    UNKNOWN = "unknown"

    @staticmethod
    def worst(verdicts: Iterable[Verdict]) -> Verdict:
        """The verdict of a conjunction, the one order used everywhere: a refuted part refutes
        the whole whatever else is unknown (its counterexample stands on its own); otherwise an
        unknown part leaves the whole unknown; only all parts proved (or none) prove it."""
        seen = set(verdicts)
        for verdict in (Verdict.REFUTED, Verdict.UNKNOWN):
            if verdict in seen:
                return verdict
        return Verdict.PROVED


class Condition(StrEnum):
    GRADIENT_INTEGRITY = "gradient_integrity"
    STATE_CONSISTENCY = "state_consistency"
    COMPOSITION_SAFETY = "composition_safety"

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")


CONDITIONS = tuple(Condition)


class ObligationKind(StrEnum):
    """A stable name for the kind of check an obligation is (the ``kind`` of the JSON report and
    of the trace)."""

    COEFFICIENT = "coefficient"  # the consumed gradient's coefficients (verify.checks.integrity)
    CLIP_INPUT = "clip-input"  # what a clip statement sees
    MIXES_SHARDS = "mixes-shards"  # a reduction sums different parameters' gradients
    CLIP = "clip"  # clipping uses the global norm (verify.checks.update)
    RECOMPUTE = "recompute"
    OVERFLOW = "overflow"
    SHARD_MISMATCH = "shard-mismatch"
    LOST_UPDATE = "lost-update"
    FROZEN = "frozen"  # a frozen group updated or reduced (verify.checks.frozen)
    REPLICA_AGREEMENT = "replica-agreement"  # verify.checks.consistency
    STALE_SHARD = "stale-shard"
    FP_ORDER = "fp-order"
    RNG = "rng"  # verify.dropout
    REALISABLE = "realisable"  # verify.checks.composition
    REDUCTION_GROUP = "reduction-group"
    ROUTING = "routing"
    ORDERING = "ordering"
    PLACEMENT_STEP = "placement-step"  # verify.placement_step
    NOT_MODELLED = "not-modelled"  # a statement a backend does not model (verify.check)
    TIME_BUDGET = "time-budget"  # the check's time budget ran out first (verify.budget)
    TOO_LARGE = "too-large"  # the encoding would pass its size limit (verify.z3.integrity)
    INTERNAL_ERROR = "internal-error"  # a family failed: a bug in placeverify (verify.check)


@dataclass(frozen=True, slots=True)
class Obligation:
    """One proof obligation: a claim about the strategy, its verdict and its evidence."""

    condition: Condition
    claim: str  # what is proved or refuted, in words
    verdict: Verdict
    span: Span | None  # the text the claim is about (a step line, a placement)
    kind: ObligationKind
    reason: str = ""  # why refuted or unknown
    counterexample: dict[str, Any] | None = None
    fix: str | None = None  # a one-line suggested fix for a known pattern
    seconds: float = 0.0
    method: str = ""  # how it was decided: "z3 (nonlinear real arithmetic)", "z3 (floating point)"
