"""A frozen group receives no update (``docs/language/model.md``, ``frozen = [...]``).

A frozen parameter has no gradient: nothing reduces, scales, clips or frees one, and the
optimizer holds no state for it, so a step that names a frozen group in a gradient statement or
in ``update params[...]`` describes a run in which the frozen weights change (a base model
trained where the fine-tune meant to keep it) or a reduction of a gradient that does not exist.
Decided by rules over the statements as written: each is refuted where it stands; with frozen
groups and none named, the obligation is proved. The trained groups, adapters included, are
judged by the other families like any group.
"""

from __future__ import annotations

from collections.abc import Iterator

from placeverify.ir.model import ParamGroup
from placeverify.ir.render import op_label
from placeverify.ir.step import Clip, Collective, Free, Op, Scale, Target, TargetKind, Update
from placeverify.ir.strategy import Strategy
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.check import Check, Context, Finding

METHOD = "rules over the step's statements and the model's frozen groups"
CLAIM = "no statement of the step updates or reduces a frozen group"


def _named(op: Op) -> frozenset[ParamGroup]:
    """The groups a statement names explicitly as gradient, optimizer or update targets."""
    target: Target | None = None
    if isinstance(op, Update) or (isinstance(op, (Collective, Scale, Clip, Free))
                                  and op.target.kind in (TargetKind.GRADS, TargetKind.OPTIMIZER)):
        target = op.target
    if target is None or target.groups is None:
        return frozenset()
    return target.groups


def findings(strategy: Strategy, ctx: Context) -> Iterator[Finding]:
    frozen = frozenset(strategy.model.frozen_groups())
    if not frozen:
        return
    refuted = False
    for op in strategy.step.ops():
        named = _named(op) & frozen
        if not named:
            continue
        refuted = True
        names = ", ".join(sorted(g.value for g in named))
        what = "updates" if isinstance(op, Update) else "reduces or changes the gradient of"
        trained = ", ".join(g.value for g in strategy.model.groups_present())
        from placeverify.verify.fixes import FROZEN_GROUP

        yield Finding(Obligation(
            Condition.GRADIENT_INTEGRITY, CLAIM, Verdict.REFUTED, op.span, ObligationKind.FROZEN,
            reason=f"'{op_label(op)}' {what} the frozen group{'s' if len(named) > 1 else ''} "
                   f"{names}: a frozen parameter has no gradient and no optimizer state, and "
                   f"the single-device fine-tune leaves it as it is (trained: {trained})",
            fix=FROZEN_GROUP.text(groups=names), method=METHOD))
    if not refuted:
        yield Finding(Obligation(Condition.GRADIENT_INTEGRITY, CLAIM, Verdict.PROVED,
                                 strategy.model_span, ObligationKind.FROZEN, method=METHOD))


CHECK = Check(Condition.GRADIENT_INTEGRITY, "frozen groups", findings)
