"""The gradient-integrity obligation of each parameter group: proof, or a confirmed counterexample.

1. At the declared mesh, counts are real variables (a sound relaxation): *unsat* proves the
   consumed gradient equals the single-device gradient for every token count, sample count and
   micro-batch composition.
2. Otherwise the smallest mesh (axes of size 1 to 3, fewest devices first) and micro-batch count
   with an integer counterexample is searched for (:mod:`placeverify.verify.z3.search`); only a
   divergence the exact interpreter confirms is reported as *refuted*, with a fix where it matches
   a known bug pattern (:mod:`placeverify.verify.fixes`).
3. A solver timeout, a real-only model, or an unmodelled construct gives *unknown*.

The same holds for what every clip statement sees (``clip-input``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from placeverify.evidence import Counterexample
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import op_label
from placeverify.ir.step import Clip, Update
from placeverify.ir.strategy import Strategy
from placeverify.semantics.empty import Undefined
from placeverify.semantics.groups import group_view
from placeverify.semantics.schedule import Unmodelled
from placeverify.semantics.skip import update_of
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.budget import TooLarge
from placeverify.verify.z3 import solve
from placeverify.verify.z3.integrity import encode, mismatch_formula
from placeverify.verify.z3.solve import SolverStatus

# The counterexample search, its explanation and the fix table are imported where a proof has
# failed: a file whose obligations are proved never loads them (check start-up time).


def integrity_obligations(strategy: Strategy,
                          timeout_ms: int) -> list[tuple[Obligation, Counterexample | None]]:
    out = []
    clips: list[tuple[ParamGroup, tuple[Obligation, Counterexample | None]]] = []
    for group in strategy.model.groups_present():
        out.append(group_obligation(strategy, group, timeout_ms))
        clips.extend((group, found) for found in clip_input_obligations(strategy, group, timeout_ms))
    return out + merged_clips(clips)


def merged_clips(results: list[tuple[ParamGroup, tuple[Obligation, Counterexample | None]]]
            ) -> list[tuple[Obligation, Counterexample | None]]:
    """One clip-input obligation per clip statement and verdict, naming every group it is
    about (the first group's evidence stands for the others)."""
    kept: dict[tuple[Verdict, Any], tuple[list[ParamGroup], Obligation, Counterexample | None]] = {}
    for group, (obligation, found) in results:
        key = (obligation.verdict, obligation.span)
        if key in kept:
            kept[key][0].append(group)
        else:
            kept[key] = ([group], obligation, found)
    return [(replace(obligation, claim=_clip_claim(groups)), found)
            for groups, obligation, found in kept.values()]


def _clip_claim(groups: list[ParamGroup]) -> str:
    return (f"every clip sees the single-device gradient of the "
            f"{', '.join(g.value for g in groups)} parameters (complete, reduced, normalised and "
            "unscaled)")


def clip_input_obligations(strategy: Strategy, group: ParamGroup,
                           timeout_ms: int) -> list[tuple[Obligation, Counterexample | None]]:
    """Every clip must see the single-device gradient where it stands: reduced over every axis
    where it is partial, normalised as the declared loss, unscaled, and not a partial
    accumulation; its norm (judged in :mod:`placeverify.verify.checks.update`) is only right then."""
    clips = [op for op in strategy.step.ops() if isinstance(op, Clip) and op.target.applies_to(group)]
    if not clips:
        return []
    view = group_view(strategy, group)
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    claim = _clip_claim([group])
    method = "z3 (nonlinear real arithmetic over count variables)"
    try:
        encoded = encode(strategy, view, sizes, strategy.step.microbatches, f"{group.value}_clip_",
                         integer=False)
    except Undefined as err:  # a NaN backward in a micro-batch without tokens (semantics/empty)
        from placeverify.verify.checks.empty import undefined_obligation

        return [(replace(undefined_obligation(err, claim), kind=ObligationKind.CLIP_INPUT,
                         span=clips[0].span), None)]
    except Unmodelled as err:
        return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN,
                            err.span or clips[0].span, ObligationKind.CLIP_INPUT,
                            reason=_unmodelled_reason(err)),
                 None)]
    if encoded.mixing:
        return []  # the group's integrity obligation is refuted for mixing shards already
    seconds = 0.0
    misplaced = [s.op for s in encoded.clips if s.after_update or not s.after_last_backward]
    for index, seen in enumerate(encoded.clips):
        if any(seen.op is op for op in misplaced):
            continue  # refuted for where it stands (placeverify.verify.checks.update): no input is right
        outcome = solve.check(mismatch_formula(encoded, seen.value.values), timeout_ms)
        seconds += outcome.seconds
        if outcome.status is SolverStatus.UNSAT:
            continue
        from placeverify.verify.explain import describe, summary
        from placeverify.verify.fixes import CLIP_INPUT
        from placeverify.verify.z3.search import search

        found = search(strategy, view, timeout_ms, observe=index)
        if found is None:
            why = ("the solver timed out" if outcome.status is SolverStatus.UNKNOWN
                   else "a real-valued counterexample exists but no integer one was confirmed "
                        "on small meshes")
            return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN,
                                seen.op.span, ObligationKind.CLIP_INPUT, reason=why, seconds=seconds,
                                method=method), None)]
        return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED,
                            seen.op.span, ObligationKind.CLIP_INPUT,
                            reason=describe(strategy, view, found),
                            counterexample=summary(view, found), seconds=seconds, method=method,
                            fix=CLIP_INPUT.text()),
                 found)]
    return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, clips[0].span,
                        ObligationKind.CLIP_INPUT, seconds=seconds, method=method), None)]


def group_obligation(strategy: Strategy, group: ParamGroup,
                     timeout_ms: int) -> tuple[Obligation, Counterexample | None]:
    view = group_view(strategy, group)
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    m = strategy.step.microbatches
    claim = (f"the optimizer consumes the single-device gradient of the global batch "
             f"({strategy.loss.kind.value}) for the {group.value} parameters")
    span = _consume_span(strategy)
    try:
        encoded = encode(strategy, view, sizes, m, f"{group.value}_", integer=False)
    except Undefined as err:  # a NaN backward in a micro-batch without tokens (semantics/empty)
        from placeverify.verify.checks.empty import undefined_obligation

        return undefined_obligation(err, claim), None
    except Unmodelled as err:
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, span,
                          ObligationKind.COEFFICIENT,
                          reason=_unmodelled_reason(err)), None
    if encoded.mixing:
        op = encoded.mixing[0]
        return Obligation(
            Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, getattr(op, "span", span),
            ObligationKind.MIXES_SHARDS, reason=f"'{op_label(op)}' sums gradients of different {group.value} "
            "parameters: ranks of that group hold different shards",
            method="placement relations"), None
    outcome = solve.check(mismatch_formula(encoded), timeout_ms)
    method = "z3 (nonlinear real arithmetic over count variables)"
    if outcome.status is SolverStatus.UNSAT:
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span,
                          ObligationKind.COEFFICIENT,
                          seconds=outcome.seconds, method=method), None
    from placeverify.verify.explain import cause_span, describe, summary
    from placeverify.verify.z3.search import search

    found = search(strategy, view, timeout_ms)
    if found is None:
        why = ("the solver timed out" if outcome.status is SolverStatus.UNKNOWN
               else "a real-valued counterexample exists but no integer one was confirmed on "
                    "small meshes")
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, span,
                          ObligationKind.COEFFICIENT,
                          reason=why, seconds=outcome.seconds, method=method), None
    reason = describe(strategy, view, found)
    if update_of(strategy.step) is None:  # judged at the step (semantics/skip)
        from placeverify.verify.checks.decisions import no_update_reason
        from placeverify.verify.fixes import NO_UPDATE

        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, span,
                          ObligationKind.COEFFICIENT,
                          reason=f"{no_update_reason(strategy)}: {reason}",
                          counterexample=summary(view, found), seconds=outcome.seconds,
                          method=method, fix=NO_UPDATE.text()), found
    return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED,
                      cause_span(strategy, view, found) or span, ObligationKind.COEFFICIENT,
                      reason=reason, counterexample=summary(view, found),
                      seconds=outcome.seconds, method=method), found


def _consume_span(strategy: Strategy) -> Any:
    for op in strategy.step.post:
        if isinstance(op, Update):
            return op.span
    return strategy.step.span


def _unmodelled_reason(err: Unmodelled) -> str:
    return str(err) if isinstance(err, TooLarge) else f"not modelled: {err}"
