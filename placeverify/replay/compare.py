"""Turn the ranks' answers into one verdict: does the real run diverge?

**Tolerance.** A correct distributed run differs from the single-device reference only by
rounding: the same sums are associated differently (per-rank partial sums, then a reduction).
With unit roundoff ``u`` (2^-53 in float64, 2^-24 in float32):

1. an inner product of width ``W`` computed in two orders differs by about ``sqrt(W)·u`` relative
   to its size — the statistical rule of thumb for rounding errors (Higham, *Accuracy and
   Stability of Numerical Algorithms*, 2nd ed., §2.8), rather than the worst case ``W·u`` of
   Theorem 3.1 (the replay models have ``W <= 256``: 16·u);
2. forward and backward through the replay model chain at most 16 such rounding stages (two
   layers of attention and MLP, the loss, their backward), so a gradient element differs by at
   most ``2^8·u`` relative to the largest state;
3. SGD with momentum ``mu = 0.9`` and learning rate ``eta = 0.05`` (:mod:`placeverify.replay.
   reference`) carries a gradient difference into the parameters and the momentum with weight
   ``eta / (1 - mu) = 0.5`` per step, and the differences of ``T`` steps add up;
4. a safety factor of 8 covers the rule of thumb and the feedback of a perturbed parameter into
   later gradients over a few steps.

Hence ``tolerance = 2^8 · 0.5 · 8 · T · u · max(1, |largest reference state|) = 2^10 · T · u · s``:
about 3.4e-13·s after 3 steps in float64 (correct runs measure 1e-16 to 2e-15) and 1.8e-4·s in
float32 (REFERENCE §5 saw 1e-8 to 1e-6), while the bugs the verifier reports move the parameters
by more than 1e-3 after one step. Float64 is the default because it separates the two by more
than nine orders of magnitude.

**Sensitivity.** The rule above assumes the training damps rounding differences (or lets them
grow no faster than the steps add up). Over many steps a replay model's own training can amplify
them — its states grow, and rounding differences grow faster than the steps add up — so rank 0
trains the reference a second time with every gradient disturbed by one rounding unit per step
(:func:`placeverify.replay.reference.sensitivity`): how far that moves a state, ``S``, is the
run's own amplification of rounding. A correct distributed run rounds by at most the ``2^8``
units of step 2 per gradient element, with the safety factor 8 of step 4, so the tolerance is
the larger of the rule above and ``2^11 · S`` (the two agree where the training damps rounding:
``S`` is then about ``0.5 · T · u · s``, step 3). A bug moves the states by more than ``10^-3``
of their size and is amplified by the same dynamics, so the comparison still separates the two
while the tolerance stays small beside the states. It decides nothing — the replay's verdict is
*unknown* (exit 3), never "not confirmed" — only when a state overflows (``S`` is nan) or the
tolerance reaches ``2^-10`` of the largest state: rounding has grown to the size of a bug.

**Across ranks** there is no tolerance: state consistency is about bitwise identical replicas
(the same collective gives every rank the same bits), so any difference between two ranks that
hold copies of one state — the same key in :meth:`placeverify.replay.buffers.RankState.states` —
is a divergence.
"""

from __future__ import annotations

import base64
import math
from array import array
from dataclasses import dataclass, field
from typing import Any

UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24}
TOLERANCE_FACTOR = 2 ** 10
SENSITIVITY_FACTOR = 2 ** 11  # rounding units per gradient element (2^8) × the safety factor 8
UNDECIDED = 2.0 ** -10  # a tolerance this share of the largest state is the size of a bug


def tolerance(dtype: str, steps: int, scale: float, sensitivity: float = 0.0) -> float:
    """How far a correct run may differ from the reference after ``steps`` steps: the rounding
    rule, or the run's own measured amplification of rounding (``sensitivity``) when larger."""
    rule = TOLERANCE_FACTOR * steps * UNIT_ROUNDOFF[dtype] * max(1.0, scale)
    measured = SENSITIVITY_FACTOR * sensitivity if sensitivity == sensitivity else 0.0
    return max(rule, measured)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One distributed run compared with the reference."""

    world: int
    sizes: dict[str, int]
    vs_reference: dict[str, float]  # per state kind: params, optimizer
    across_ranks: dict[str, float]
    tolerance: float
    worst: dict[str, str]  # which state differs most (vs reference, across ranks)
    skipped: list[int]
    backend: str
    seconds: float
    scale: float
    notes: list[str] = field(default_factory=list)
    # how far one rounding unit per step moves the reference (reference.sensitivity); nan when a
    # reference state overflowed
    sensitivity: float = 0.0
    steps: int = 0  # steps replayed (0: not said)

    @property
    def updated(self) -> bool:
        """Did a replayed step update the states? A skip on the overflow flag skips the step with
        the injected overflow, the only one of a one-step replay, which so updates nothing: no
        run can diverge, or show that it matches."""
        return self.steps == 0 or len(self.skipped) < self.steps

    @property
    def unstable(self) -> bool:
        """Have the training's own dynamics amplified rounding to the size of a bug (a state
        overflowed, or the tolerance reaches :data:`UNDECIDED` of the largest state)? Then a
        correct run and a wrong one may differ from the reference alike: the comparison decides
        nothing."""
        return not (self.sensitivity == self.sensitivity
                    and self.tolerance < UNDECIDED * max(1.0, self.scale))

    @property
    def max_vs_reference(self) -> float:
        return max(self.vs_reference.values(), default=0.0)

    @property
    def max_across_ranks(self) -> float:
        return max(self.across_ranks.values(), default=0.0)

    @property
    def diverges(self) -> bool:
        return not (self.max_vs_reference <= self.tolerance) or self.max_across_ranks != 0.0


def _decode(text: str, dtype: str) -> array:  # type: ignore[type-arg]
    values = array("d" if dtype == "float64" else "f")
    values.frombytes(base64.b64decode(text))
    return values


def _max_diff(a: array, b: array) -> float:  # type: ignore[type-arg]
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        d = abs(x - y)
        if d != d or d == math.inf:
            return math.inf
        if d > worst:
            worst = d
    return worst


def outcome(results: list[dict[str, Any]], sizes: dict[str, int], steps: int,
            seconds: float) -> Outcome:
    dtype = results[0]["dtype"]
    vs: dict[str, float] = {"params": 0.0, "optimizer": 0.0}
    worst: dict[str, str] = {}
    scale = 0.0
    for r in results:
        scale = max(scale, float(r.get("reference_scale", 0.0)))
        for kind, value in r["vs_reference"].items():
            value = float(value)
            if value > vs.get(kind, 0.0) or (value != value):
                vs[kind] = math.inf if value != value else value
                worst["vs_reference"] = f"rank {r['rank']}: {r['worst'].get(kind, kind)}"
    copies: dict[str, list[tuple[int, str, str]]] = {}
    for r in results:
        for key, (kind, data) in r["states"].items():
            copies.setdefault(key, []).append((r["rank"], kind, data))
    across: dict[str, float] = {"params": 0.0, "optimizer": 0.0}
    largest = 0.0
    for key, held in copies.items():
        if len(held) < 2:
            continue
        first = _decode(held[0][2], dtype)
        for rank, kind, data in held[1:]:
            if data == held[0][2]:
                continue
            d = _max_diff(first, _decode(data, dtype))
            if d > across[kind]:
                across[kind] = d
            if d > largest:
                largest = d
                worst["across_ranks"] = f"{key} (rank {held[0][0]} vs rank {rank})"
    skipped = sorted({s for r in results for s in r.get("skipped", [])})
    sensitivities = [float(r.get("reference_sensitivity", 0.0)) for r in results]
    sensitivity = math.nan if any(x != x for x in sensitivities) else max(sensitivities)
    return Outcome(len(results), dict(sizes), vs, across, tolerance(dtype, steps, scale, sensitivity),
                   worst, skipped, str(results[0].get("backend", "gloo")), seconds, scale,
                   sensitivity=sensitivity, steps=steps)
