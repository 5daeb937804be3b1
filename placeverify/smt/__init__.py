"""Z3 obligations: gradient integrity, state consistency and composition safety.

``verify(strategy)`` returns plain data (:class:`placeverify.verdicts.Verification`); no Z3
object leaves this package. The first refutation with concrete evidence becomes a counterexample
trace (:mod:`placeverify.trace`) the torch replay backend can run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from placeverify.diagnostics import Diagnostic, Span
from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import group_view
from placeverify.semantics.schedule import Unmodelled
from placeverify.smt.composition import composition_obligations
from placeverify.smt.consistency import Divergence, consistency_obligations
from placeverify.smt.fixes import integrity_fix
from placeverify.smt.gradients import Counterexample, integrity_obligations
from placeverify.smt.update import update_obligations
from placeverify.verdicts import Condition, Obligation, Verdict, Verification

Evidence = Counterexample | Divergence | None
T = TypeVar("T")


def _modelled(condition: Condition, family: str, span: Span | None,
              produce: Callable[[], Iterable[T]], unknown: Callable[[Obligation], T]) -> list[T]:
    """A family's obligations, or one *unknown* obligation at the statement a backend does not
    model: an unmodelled statement is never skipped and never proved."""
    try:
        return list(produce())
    except Unmodelled as err:
        return [unknown(Obligation(condition, f"{family}: every statement of the step is modelled",
                                   Verdict.UNKNOWN, err.span or span, "not-modelled",
                                   reason=f"not modelled: {err}"))]


def verify(strategy: Strategy, timeout_ms: int = 10_000) -> Verification:
    obligations: list[Obligation] = []
    evidence: list[tuple[Obligation, Evidence]] = []
    span = strategy.step.span

    def alone(o: Obligation) -> tuple[Obligation, Evidence]:
        return (o, None)

    integrity = _modelled(Condition.GRADIENT_INTEGRITY, "gradient integrity", span,
                          lambda: integrity_obligations(strategy, timeout_ms), alone)
    for obligation, found in integrity:
        if isinstance(found, Counterexample) and found.observe is None:
            fix = integrity_fix(strategy, group_view(strategy, found.group), found)
            obligation = replace(obligation, fix=fix)
        obligations.append(obligation)
        evidence.append((obligation, found))
    update = _modelled(Condition.GRADIENT_INTEGRITY, "what the update applies", span,
                       lambda: update_obligations(strategy, timeout_ms), lambda o: o)
    for obligation in update:
        obligations.append(obligation)
        evidence.append((obligation, None))
    consistency = _modelled(Condition.STATE_CONSISTENCY, "state consistency", span,
                            lambda: consistency_obligations(strategy, timeout_ms), alone)
    for obligation, divergence in consistency:
        if obligation.verdict is Verdict.REFUTED and obligation.fix is None and \
                not isinstance(divergence, Counterexample):
            obligation = replace(obligation, fix=_consistency_fix(strategy, obligation, divergence))
        obligations.append(obligation)
        evidence.append((obligation, divergence))
    warnings: list[Diagnostic] = []

    def composition_family() -> list[Obligation]:
        found, notes = composition_obligations(strategy)
        warnings.extend(notes)
        return found

    composition = _modelled(Condition.COMPOSITION_SAFETY, "composition safety", span,
                            composition_family, lambda o: o)
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
