"""Parameter gathers in flight (:mod:`placeverify.semantics.param_flights`): does every forward
read the parameters the previous update wrote, on every rank?

For each asynchronous parameter gather, each parameter group it gathers and each axis it spans
where the optimizer state is sharded (ranks update different shards) and the parameters are held
whole (ZeRO-1/2; parameters sharded and gathered before use, FSDP's or ZeRO-3's, are gathered by
the forward itself), one obligation. Z3 states it
as :mod:`placeverify.verify.checks.consistency` states a sharded update: the update is an
uninterpreted function ``upd(theta, g, omega)``; a rank's forward reads an element another rank
owns as ``upd(theta0, g, omega0)`` once the gather has completed, and as ``theta0`` while it is in
flight; the reference reads ``upd(theta0, g, omega0)``. Z3 is asked for a model where the two
differ. A refutation is shown on the exact domain's run (:func:`~placeverify.semantics.
param_flights.simulate`), and the agreement domain (:func:`~placeverify.semantics.param_flights.
identical_along`) must say the same: the three disagreeing is reported as *unknown*, never
proved.
"""

from __future__ import annotations

from collections.abc import Iterator

import z3

from placeverify.evidence import Cause, Divergence, small_mesh
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Mode, State
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import partitions
from placeverify.semantics.param_flights import (
    ParamFlight,
    identical_along,
    param_flights,
    simulate,
)
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.check import Check, Context, Finding
from placeverify.verify.z3 import solve
from placeverify.verify.z3.solve import SolverStatus

METHOD = "z3 (uninterpreted update, real arithmetic); exact two-step run; agreement"


def findings(strategy: Strategy, ctx: Context) -> Iterator[Finding]:
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    for flight in param_flights(strategy.step):
        for group in strategy.model.groups_present():
            if not flight.start.target.applies_to(group):
                continue
            for axis in flight.start.group.axes:
                if sizes.get(axis, 1) < 2 or not partitions(strategy, axis, State.OPTIMIZER,
                                                             group):
                    continue  # one rank, or every rank updates all of it: nothing stale
                if strategy.placement(axis).mode_of(State.PARAMS, group) in (Mode.S_STAR,
                                                                             Mode.O):
                    continue  # sharded and gathered before use (FSDP, ZeRO-3): the forward
                    # gathers them from their owners itself, as the consistency check has it
                yield _obligation(strategy, flight, group, axis, sizes, ctx.timeout_ms)


CHECK = Check(Condition.STATE_CONSISTENCY, "parameter gathers in flight", findings)


def _obligation(strategy: Strategy, flight: ParamFlight, group: ParamGroup, axis: str,
                sizes: dict[str, int], timeout_ms: int) -> Finding:
    start, wait, name = flight.start, flight.wait, group.value
    claim = (f"every forward reads the {name} parameters the previous update wrote, on every "
             f"rank along {axis} ('{start.label()}' completes at line {wait.span.line})")
    theta0, omega0, g = z3.Real("theta0"), z3.Real("omega0"), z3.Real("g")
    upd = z3.Function("upd", z3.RealSort(), z3.RealSort(), z3.RealSort(), z3.RealSort())
    fresh = upd(theta0, g, omega0)
    read = theta0 if flight.reads else fresh  # another rank's shard, in the late outcome
    outcome = solve.check(read != fresh, timeout_ms)
    m = strategy.step.microbatches
    exact = simulate(flight, 2, m)
    live = {a: n > 1 for a, n in sizes.items()}
    agree = [axis in identical_along(flight, (axis,), live, k) for k in range(m)]
    if outcome.status is SolverStatus.UNKNOWN:
        return Finding(Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.UNKNOWN, start.span,
                                  ObligationKind.STALE_SHARD, reason="the solver timed out",
                                  method=METHOD))
    refuted = outcome.status is SolverStatus.SAT
    if refuted != bool(exact.mismatches()) or refuted == all(agree):
        return Finding(Obligation(
            Condition.STATE_CONSISTENCY, claim, Verdict.UNKNOWN, start.span,
            ObligationKind.STALE_SHARD, reason="the domains disagree on the forwards in flight "
            "(a bug in placeverify)", method=METHOD))
    if not refuted:
        return Finding(Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.PROVED, wait.span,
                                  ObligationKind.STALE_SHARD, seconds=outcome.seconds,
                                  method=METHOD))
    op, k = flight.reads[0]
    bad = exact.mismatches()[0]
    other = 1 - bad.rank
    values = {"theta0": [str(v) for v in exact.initial],
              "updated": [str(v) for v in exact.reference],
              "devices": [{"coords": {axis: r.rank}, "microbatch": r.microbatch,
                           "parameters read": [str(v) for v in r.values],
                           "note": "its own shard updated, the other's from before the update"}
                          for r in exact.reads if r.microbatch == k]}
    when = "the next step's" if flight.wraps else "the step's"
    reason = (f"'{start.label()}' completes only at its wait (line {wait.span.line}), after "
              f"{when} forward of micro-batch {k} (the 'backward' at line {op.span.line}): there "
              f"rank {bad.rank} along {axis} reads the element rank {other} owns as "
              f"{bad.values[other]}, from before the update, instead of "
              f"{exact.reference[other]} (exact two-step run; Z3: theta0 against "
              "upd(theta0, g, omega0))")
    from placeverify.verify.fixes import PARAM_GATHER  # deferred, as every fix is

    fix = PARAM_GATHER.text(target=start.target.label(), line=op.span.line,
                            collective=start.label(), wait=wait.span.line)
    return Finding(Obligation(Condition.STATE_CONSISTENCY, claim, Verdict.REFUTED, op.span,
                              ObligationKind.STALE_SHARD, reason=reason, counterexample=values,
                              fix=fix, seconds=outcome.seconds, method=METHOD),
                   Divergence(axis, group, Cause.STALE_SHARD, small_mesh(strategy, axis, 2),
                              m, values=values))
