"""Z3 obligations: gradient integrity, state consistency and composition safety.

``verify(strategy)`` returns plain data (:class:`placeverify.verdicts.Verification`); no Z3
object leaves this package. The first refutation with concrete evidence becomes a counterexample
trace (:mod:`placeverify.trace`) the torch replay backend can run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import group_view
from placeverify.smt.composition import composition_obligations
from placeverify.smt.consistency import Divergence, consistency_obligations
from placeverify.smt.fixes import integrity_fix
from placeverify.smt.gradients import Counterexample, integrity_obligations
from placeverify.smt.update import update_obligations
from placeverify.verdicts import Obligation, Verdict, Verification


def verify(strategy: Strategy, timeout_ms: int = 10_000) -> Verification:
    obligations: list[Obligation] = []
    evidence: list[tuple[Obligation, Counterexample | Divergence | None]] = []
    for obligation, found in integrity_obligations(strategy, timeout_ms):
        if found is not None:
            fix = integrity_fix(strategy, group_view(strategy, found.group), found)
            obligation = replace(obligation, fix=fix)
        obligations.append(obligation)
        evidence.append((obligation, found))
    for obligation in update_obligations(strategy, timeout_ms):
        obligations.append(obligation)
        evidence.append((obligation, None))
    for obligation, divergence in consistency_obligations(strategy, timeout_ms):
        if obligation.verdict is Verdict.REFUTED and obligation.fix is None:
            obligation = replace(obligation, fix=_consistency_fix(strategy, obligation, divergence))
        obligations.append(obligation)
        evidence.append((obligation, divergence))
    composition, warnings = composition_obligations(strategy)
    for obligation in composition:
        obligations.append(obligation)
        evidence.append((obligation, None))
    trace = _trace(strategy, evidence)
    notes = tuple(w.render(strategy.source) for w in warnings)
    return Verification(tuple(obligations), trace, 0.0, notes)


def _consistency_fix(strategy: Strategy, obligation: Obligation,
                     divergence: Divergence | None) -> str | None:
    if divergence is None:
        return None
    axis = divergence.axis
    if divergence.cause == "stale-shard":
        return (f"all_gather params over {axis} after the update: each rank updated only its "
                "optimizer shard (ZeRO-1/2)")
    if divergence.cause == "rng":
        return (f"seed dropout(replicated) same over {axis}: replicated regions need one random "
                "stream across tensor-parallel ranks (Megatron's model-parallel RNG tracker; "
                "Megatron-DeepSpeed#276)")
    if divergence.cause == "bitwise":
        return ("reduce in one fixed order on every rank (a ring or tree all-reduce gives every "
                "rank the same bits)")
    if divergence.cause == "skip":
        return "all_reduce(max) overflow over world"
    if divergence.cause == "clip":
        return "sum the squared gradient norm over every axis where ranks hold different gradients"
    if divergence.cause == "gradient":
        if divergence.group.value == "embedding" and axis in strategy.axes():
            return (f"all_reduce(sum) grads[embedding] over ends({axis}): the first and last stage "
                    "hold copies of the tied embedding (Megatron-LM#656)")
        return f"reduce the gradients over {axis} after the last backward"
    return None


def _trace(strategy: Strategy,
           evidence: list[tuple[Obligation, Counterexample | Divergence | None]]) -> dict[str, Any] | None:
    from placeverify.trace import build

    for obligation, found in evidence:
        if obligation.verdict is Verdict.REFUTED:
            return build(strategy, obligation, found)
    return None
