"""Gradient integrity of a strategy with named loss terms, judged term by term.

The consumed gradient is linear in every term's gradients (:mod:`placeverify.semantics.terms`),
so it is the single-device gradient of the summed loss exactly when, for each term and each
parameter group the term reaches, the term's projection consumes that term's single-device
gradient. Each (term, group) pair is one obligation of :func:`~.coefficients.group_obligation`, its
claim naming the term; a ``max`` reduction of gradients makes them unknown (not modelled).
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.evidence import Counterexample
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import op_label
from placeverify.ir.step import Backward
from placeverify.ir.strategy import Strategy
from placeverify.semantics.terms import nonlinear, projection, term_views
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.checks.coefficients import clip_input_obligations, group_obligation, merged_clips

Judged = tuple[Obligation, Counterexample | None, Strategy]


def term_obligations(strategy: Strategy, timeout_ms: int) -> list[Judged]:
    """One obligation per loss term and parameter group it reaches (and the clip inputs), each
    with the projection it was judged on."""
    blocker = nonlinear(strategy)
    out: list[Judged] = []
    clips: list[tuple[ParamGroup, tuple[Obligation, Counterexample | None]]] = []
    main_proved: dict[ParamGroup, bool] = {}
    for term in term_views(strategy):
        projected = projection(strategy, term)
        for group in strategy.model.groups_present():
            if not term.reaches_group(group):
                continue  # nothing of this term reaches the group, on one device or on many
            if blocker is not None:
                claim = (f"the optimizer consumes the single-device gradient of the global batch "
                         f"({term.loss.kind.value}) for the {group.value} parameters, loss term "
                         f"{term.label}")
                out.append((Obligation(
                    Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, blocker.span,
                    ObligationKind.COEFFICIENT,
                    reason=f"not modelled: '{op_label(blocker)}' with several loss terms (a "
                           "maximum of gradients is not the sum of the terms' maxima)"),
                            None, strategy))
                continue
            obligation, found = group_obligation(projected, group, timeout_ms)
            if not term.name:
                main_proved[group] = obligation.verdict is Verdict.PROVED
            elif (obligation.verdict is Verdict.REFUTED and main_proved.get(group)
                  and obligation.kind is ObligationKind.COEFFICIENT):
                # the statements around the backwards act on every term alike and the main
                # loss passes them: the term's own backward is where it goes wrong
                own = [op for op in strategy.step.ops()
                       if isinstance(op, Backward) and op.term == term.name]
                if own:
                    obligation = replace(obligation, span=own[0].span)
            out.append((replace(obligation, claim=f"{obligation.claim}, loss term {term.label}"),
                        found, projected))
            for clip in clip_input_obligations(projected, group, timeout_ms):
                clips.append((group, clip))
    merged = merged_clips(clips)
    return out + [(o, f, strategy) for o, f in merged]
