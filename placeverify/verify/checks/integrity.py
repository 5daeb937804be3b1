"""The gradient-integrity family: the obligations of :mod:`.coefficients`, judged term by term
for several loss terms (:mod:`.loss_terms`), with a fix where a refutation matches a known bug
pattern (:mod:`placeverify.verify.fixes`) and a detached loss gather blamed where it is the cause
(:mod:`.loss_gather`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from placeverify.ir.step import Backward
from placeverify.ir.strategy import Strategy
from placeverify.verdicts import Condition, Verdict
from placeverify.verify.check import Check, Context, Finding
from placeverify.verify.checks.coefficients import integrity_obligations

# The fix table, the loss terms and the loss gathers are imported where a file needs them: a
# file whose obligations are proved never loads the fixes (check start-up time).


def findings(strategy: Strategy, ctx: Context) -> Iterator[Finding]:
    if strategy.terms:  # several loss terms: judged term by term (semantics/terms.py)
        from placeverify.verify.checks.loss_terms import term_obligations

        judged = term_obligations(strategy, ctx.timeout_ms)
    else:
        judged = [(o, f, strategy) for o, f in integrity_obligations(strategy, ctx.timeout_ms)]
    groups = strategy.model.groups_present()
    for index, (obligation, found, seen_by) in enumerate(judged):
        if found is not None and found.observe is None and obligation.fix is None:
            from placeverify.verify.fix_matchers import FixCase
            from placeverify.verify.fixes import suggest

            fix = suggest(FixCase(seen_by, found))
            obligation = replace(obligation, fix=fix)
        if not strategy.terms and index < len(groups) and obligation.verdict is Verdict.REFUTED \
                and any(isinstance(op, Backward) and op.gather for op in strategy.step.ops()):
            from placeverify.verify.checks.loss_gather import blame_gather

            obligation = blame_gather(strategy, groups[index], obligation, ctx.timeout_ms)
        yield Finding(obligation, found)


CHECK = Check(Condition.GRADIENT_INTEGRITY, "gradient integrity", findings)
