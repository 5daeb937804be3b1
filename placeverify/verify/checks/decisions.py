"""What decides whether the optimizer step runs (:mod:`placeverify.semantics.skip`): a step that
never updates, and a skip decided on one rank's flag.

- *No update*: the gradient domains take what the optimizer consumes as nothing; the coefficient
  obligation (:mod:`placeverify.verify.checks.coefficients`) refutes it with Z3 and the exact
  interpreter, and :func:`no_update_reason` says why at the step.
- *A broadcast flag*: after ``broadcast(from = k) overflow over G`` every rank of G decides on the
  flag of G's k-th rank alone. The ranks agree (the family of
  :mod:`placeverify.verify.checks.update` proves that), but single-device training skips when
  *any* rank's gradients overflowed. For each live axis ``a`` of G, the source s and a rank y at
  another coordinate of ``a`` are compared, with propositional overflow bits o_s and o_y: the
  source's flag carries o_y only where y's overflow has reached it before the broadcast — an
  earlier deciding ``all_reduce(max) overflow`` over ``a``, or a gradient already identical along
  ``a`` (reduced: a sum carries a non-finite element to every rank). The source skips on that
  flag (its own check is part of it), and so does every rank deciding on it alone; Z3 is asked
  for bits where the source's skip differs from o_s or o_y.
"""

from __future__ import annotations

from dataclasses import replace

import z3

from placeverify.ir.step import Collective, CollectiveKind, ReduceOp, Update
from placeverify.ir.strategy import Strategy
from placeverify.semantics.buffers import Position
from placeverify.semantics.groups import group_view
from placeverify.semantics.schedule import Phase
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.agreement import agreement
from placeverify.verify.z3 import solve
from placeverify.verify.z3.solve import SolverStatus

METHOD = "z3 (propositional)"


def no_update_reason(strategy: Strategy) -> str:
    """Why a step without ``update params`` is refuted, before the counterexample's numbers."""
    return ("the step never runs 'update params': the optimizer consumes nothing and the "
            "parameters never change, while single-device training applies the gradient of every "
            "step")


def claim(op: Collective) -> str:
    return (f"with the skip decided on rank {op.source}'s flag ('{op.label()}'), every rank skips "
            "the step exactly when some rank's gradients overflowed, as single-device training "
            "does")


def broadcast_obligations(strategy: Strategy, deciding: list[Position],
                          timeout_ms: int) -> list[Obligation]:
    """The obligation of the last deciding flag statement when it is a broadcast (a reduction
    after it decides again, and the ranks' agreement judges that)."""
    if not deciding or deciding[-1].op.kind is not CollectiveKind.BROADCAST:
        return []
    last = deciding[-1]
    op = last.op
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    live = [a for a in op.group.axes if sizes[a] > 1]
    if last.phase is not Phase.POST:
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim(op), Verdict.UNKNOWN, op.span,
                           ObligationKind.NOT_MODELLED,
                           reason="not modelled: a flag broadcast inside the micro-batch loop")]
    reached = _reached(strategy, deciding, live)
    s_bit, y_bit = z3.Bool("overflow_source"), z3.Bool("overflow_other")
    lost = []
    for axis in live:
        source_flag = z3.Or(s_bit, y_bit) if axis in reached else s_bit
        outcome = solve.check(source_flag != z3.Or(s_bit, y_bit), timeout_ms)
        if outcome.status is SolverStatus.UNKNOWN:
            return [Obligation(Condition.GRADIENT_INTEGRITY, claim(op), Verdict.UNKNOWN, op.span,
                               ObligationKind.OVERFLOW, reason="the solver timed out",
                               method=METHOD)]
        if outcome.status is SolverStatus.SAT:
            lost.append((axis, outcome))
    if not lost:
        return [Obligation(Condition.GRADIENT_INTEGRITY, claim(op), Verdict.PROVED, op.span,
                           ObligationKind.OVERFLOW, method=METHOD)]
    axis, outcome = lost[0]
    other = (int(op.source) + 1) % sizes[axis] if len(live) == 1 else None
    where = f"the rank at {axis} = {other}" if other is not None else f"a rank at another {axis}"
    values = {"axis": axis, "source": f"rank {op.source} of {op.group.label()}",
              "overflowed": where, "source_overflowed": bool(solve.truthy(outcome.model, s_bit)),
              "skipped_on_every_rank": False, "single_device_skips": True}
    reason = (f"the ranks of {op.group.label()} take rank {op.source}'s flag: when only {where} "
              f"overflows, rank {op.source}'s flag is clear, so rank {op.source} and every rank "
              "deciding on its flag apply the non-finite gradient (which a sum over the ranks "
              f"carries to every one), while single-device training skips the step (no flag "
              f"reduction over {axis} and no gradient reduction over it runs before the "
              "broadcast)")
    from placeverify.verify.fixes import FLAG_BROADCAST

    return [Obligation(Condition.GRADIENT_INTEGRITY, claim(op), Verdict.REFUTED, op.span,
                       ObligationKind.OVERFLOW, reason=reason, counterexample=values,
                       seconds=outcome.seconds, method=METHOD,
                       fix=FLAG_BROADCAST.text(group=op.group.label()))]


def _reached(strategy: Strategy, deciding: list[Position], live: list[str]) -> set[str]:
    """The axes along which every rank's overflow reaches the broadcast's source before it runs:
    an earlier deciding flag reduction over the axis, or every group's gradient already
    identical along it where the broadcast stands."""
    op = deciding[-1].op
    out = {a for p in deciding[:-1] if p.op.kind is CollectiveKind.ALL_REDUCE
           and p.op.op is ReduceOp.MAX for a in live if p.op.group.covers(a)}
    post = strategy.step.post
    index = next(i for i, o in enumerate(post) if o is op)
    # the step cut at the broadcast, with the optimizer step there: what it would consume is
    # what the source checks
    cut = replace(strategy, step=replace(strategy.step, post=(*post[:index], Update(op.span))))
    for axis in live:
        if all(axis in agreement(cut, group_view(cut, g)).identical
               for g in strategy.model.groups_present()):
            out.add(axis)
    return out
