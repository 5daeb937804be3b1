"""Dropout random streams across ranks: the seed policy of every dropout region along every axis.

Part of the state-consistency family (:mod:`placeverify.verify.checks.consistency`): a
replicated region's masks must agree (state consistency); a sharded region's different elements
must draw different masks (gradient integrity).
"""

from __future__ import annotations

import z3

from placeverify.evidence import Cause, Divergence, small_mesh
from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Region, Seed
from placeverify.ir.strategy import Strategy
from placeverify.semantics import rng
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.z3 import solve
from placeverify.verify.z3.solve import SolverStatus


def rng_obligations(strategy: Strategy, timeout_ms: int) -> list[tuple[Obligation, Divergence | None]]:
    """The seed policy of every dropout region along every axis (:mod:`placeverify.semantics.rng`).

    The random stream is an uninterpreted function ``rng(seed, offset)``; a rank's seed is the
    shared seed, plus its coordinate where the policy differs. Copies (the replicated region) must
    read one stream position; different elements (the sharded region) must never read the same
    one. The tensor axes' replicated region is always judged (its default is what Megatron's
    tracker does); other regions only where a statement sets their policy (the default is right
    by construction)."""
    arch = strategy.model.arch
    out: list[tuple[Obligation, Divergence | None]] = []
    if arch is None or not arch.dropout:
        return out
    for placement in strategy.placements:
        axis = placement.axis
        if strategy.size(axis) < 2:
            continue
        for region in rng.regions(strategy, axis):
            differ, seed = rng.declared(strategy, axis, region)
            always = region is Region.REPLICATED
            if seed is None and not always:
                continue
            out.append(_rng_obligation(strategy, axis, region, differ, seed, timeout_ms))
    return out


def _rng_obligation(strategy: Strategy, axis: str, region: Region, differ: bool, seed: Seed | None,
                    timeout_ms: int) -> tuple[Obligation, Divergence | None]:
    copies = region is Region.REPLICATED
    role = strategy.placement(axis).role.value
    if copies:
        claim = (f"dropout masks agree across {axis} in the replicated activation region "
                 "(hidden dropout after the tensor-parallel all-reduce)")
        condition = Condition.STATE_CONSISTENCY
    else:
        claim = (f"dropout masks of different activation elements across {axis} ({role}) come "
                 "from different random-stream positions, as every element draws its own mask "
                 "in single-device training")
        condition = Condition.GRADIENT_INTEGRITY
    span = seed.span if seed is not None else strategy.placement(axis).span
    stream = z3.Function("rng", z3.IntSort(), z3.IntSort(), z3.RealSort())
    seed0, offset = z3.Int("seed0"), z3.Int("offset")
    rank_x, rank_y = z3.Int("rank_x"), z3.Int("rank_y")
    seed_x = seed0 + rank_x if differ else seed0
    seed_y = seed0 + rank_y if differ else seed0
    ranks = [rank_x != rank_y, rank_x >= 0, rank_y >= 0]
    if copies:  # copies must read one position: can the two masks differ?
        formula = z3.And(*ranks, stream(seed_x, offset) != stream(seed_y, offset))
    else:  # different elements must not read one position: can they coincide?
        formula = z3.And(*ranks, seed_x == seed_y)
    outcome = solve.check(formula, timeout_ms)
    method = "z3 (uninterpreted random stream)"
    if outcome.status is SolverStatus.UNSAT:
        return Obligation(condition, claim, Verdict.PROVED, span, ObligationKind.RNG, seconds=outcome.seconds,
                          method=method), None
    if outcome.status is SolverStatus.UNKNOWN:
        return Obligation(condition, claim, Verdict.UNKNOWN, span, ObligationKind.RNG,
                          reason="the solver timed out", method=method), None
    model = outcome.model
    seed_values = (int(solve.value(model, seed_x)), int(solve.value(model, seed_y)))
    masks = (str(solve.value(model, stream(seed_x, offset))),
             str(solve.value(model, stream(seed_y, offset))))
    note = ("the replicated activation must match on every rank" if copies else
            "a different activation element: it must draw its own mask")
    values = {"devices": [
        {"coords": {axis: r}, "dropout seed": seed_values[r],
         "mask value rng(seed, offset)": masks[r], "note": note} for r in (0, 1)]}
    if copies:
        reason = (f"the dropout seed differs across {axis} ({seed_values[0]} vs "
                  f"{seed_values[1]}) in a region whose activations are replicated over "
                  f"{axis}: the ranks drop different elements, so the replicated activations, and "
                  "the replicated LayerNorm parameters trained on them, diverge")
    else:
        reason = (f"every rank along {axis} uses dropout seed {seed_values[0]}, but the ranks of "
                  f"this {role} axis hold different activation elements (other samples, "
                  "positions, heads or layers): element i of one rank and element i of another "
                  "reuse one mask draw, where single-device training draws them independently")
    divergence = Divergence(axis, ParamGroup.NORMS, Cause.RNG, small_mesh(strategy, axis, 2), 1,
                            values=values)
    from placeverify.verify.fix_matchers import FixCase  # refutations only (start-up time)
    from placeverify.verify.fixes import suggest

    fix = suggest(FixCase(strategy, divergence, {"copies": copies, "region": region.value}))
    return (Obligation(condition, claim, Verdict.REFUTED, span, ObligationKind.RNG, reason=reason,
                       counterexample=values, seconds=outcome.seconds, method=method, fix=fix),
            divergence)
