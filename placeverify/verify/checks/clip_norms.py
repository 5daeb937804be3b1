"""The norm of a clip that is not the 2-norm's sum of squares: an inf norm, or per-rank norms
combined by their mean, maximum or sum (``clip(norm = inf, reduce = mean) ...``).

The semantics is :mod:`placeverify.semantics.norms`' (each rank's local value, then an all-reduce
over the clip's group). Z3 is asked, over nonnegative real parts (squared 2-norms or inf norms of
each rank's part of each parameter group, on a mesh with two ranks per live axis), for parts where
some rank's norm differs from the global one; square roots are real variables r >= 0 with
r * r = x, maxima are if-then-else terms. *unsat* proves the clip computes the global norm on
every rank; *sat* is reported as refuted only once the exact domain confirms a witness among small
whole instances (:func:`placeverify.semantics.norms.exact_witness`), else unknown. The 2-norm
with ``reduce = sum`` keeps its own encoding (:func:`placeverify.verify.checks.update._clip_norm`):
files without the new options are judged exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

import z3

from placeverify.ir.mesh import Group
from placeverify.ir.model import ParamGroup
from placeverify.ir.render import op_label
from placeverify.ir.step import DEFAULT_NORM_REDUCE, Clip, NormKind, ReduceOp
from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import GroupView
from placeverify.semantics.norms import NormModel, Part, computed, exact_witness, norm_model, true_norm
from placeverify.semantics.surd import Real
from placeverify.verdicts import Condition, Obligation, ObligationKind, Verdict
from placeverify.verify.agreement import Agreement
from placeverify.verify.z3 import solve
from placeverify.verify.z3.solve import SolverStatus

METHOD = "z3 (nonlinear real arithmetic over per-rank norms; roots r*r = x, r >= 0)"

COMBINES = {
    (NormKind.L2, ReduceOp.SUM): "sums the squared 2-norms",
    (NormKind.L2, ReduceOp.MEAN): "averages the per-rank 2-norms",
    (NormKind.L2, ReduceOp.MAX): "takes the largest per-rank 2-norm",
    (NormKind.INF, ReduceOp.SUM): "sums the per-rank inf norms",
    (NormKind.INF, ReduceOp.MEAN): "averages the per-rank inf norms",
    (NormKind.INF, ReduceOp.MAX): "takes the largest per-rank inf norm",
}


def norm_name(norm: NormKind) -> str:
    return "2-norm" if norm is NormKind.L2 else "inf norm"


def claim(max_norm: Fraction, norm: NormKind) -> str:
    """The clip claim; for the 2-norm the words of :mod:`placeverify.verify.checks.update`."""
    if norm is NormKind.L2:
        return (f"clipping scales the update by min(1, {float(max_norm):g} / ||g||) with the "
                "global norm of the single-device gradient")
    return (f"clipping scales the update by min(1, {float(max_norm):g} / ||g||_inf) with the "
            "global inf norm of the single-device gradient")


class _Z3:
    """The Z3 domain of :class:`placeverify.semantics.norms.NormDomain`."""

    def __init__(self) -> None:
        self.facts: list[Any] = []
        self._roots: dict[str, Any] = {}

    def number(self, value: Fraction) -> Any:
        return z3.RealVal(str(value))

    def total(self, values: Sequence[Any]) -> Any:
        return z3.Sum(*values) if len(values) > 1 else values[0]

    def largest(self, values: Sequence[Any]) -> Any:
        out = values[0]
        for v in values[1:]:
            out = z3.If(v > out, v, out)
        return out

    def root(self, value: Any) -> Any:
        key = str(value)
        if key not in self._roots:
            r = z3.Real(f"root_{len(self._roots)}")
            self.facts += [r >= 0, r * r == value]
            self._roots[key] = r
        return self._roots[key]

    def divide(self, value: Any, n: int) -> Any:
        return value / n


def model_of(strategy: Strategy, clip: Clip, groups: Sequence[ParamGroup],
             views: dict[ParamGroup, GroupView], agreed: dict[ParamGroup, Agreement],
             width: int = 2) -> NormModel:
    """The clip's parts: per group, the live axes where ranks hold different elements (owned
    parameters, and the axes a shard the clip reads was scattered over)."""
    sizes = {a.name: a.size for a in strategy.mesh.axes}
    split: dict[ParamGroup, set[str]] = {}
    for group in groups:
        seen = next(s for s in agreed[group].clips if s.op is clip)
        axes = {a for a in views[group].owned if sizes[a] > 1}
        if seen.sharded:
            axes |= {a for a in seen.scattered if sizes[a] > 1}
        split[group] = axes
    return norm_model(clip, split, {a for a, n in sizes.items() if n > 1}, width)


def norm_obligation(strategy: Strategy, clip: Clip, policy: NormKind, groups: Sequence[ParamGroup],
                    views: dict[ParamGroup, GroupView], agreed: dict[ParamGroup, Agreement],
                    timeout_ms: int, width: int = 2) -> Obligation:
    """Does every rank divide max_norm by the global ``policy`` norm of the gradient?
    (``width``: ranks per axis of the model, 2; the tests compare with 3.)"""
    model = model_of(strategy, clip, groups, views, agreed, width)
    said = claim(clip.max_norm, policy)
    domain = _Z3()
    parts: dict[Part, Any] = {p: z3.Real(f"part_{p[0].value}_{'_'.join(map(str, p[1]))}")
                              for p in model.parts()}
    truth = true_norm(model, domain, parts, policy)
    ranks = computed(model, domain, parts)
    formula = z3.And(*[v >= 0 for v in parts.values()], *domain.facts,
                     z3.Or(*[value != truth for value in ranks.values()]))
    outcome = solve.check(formula, timeout_ms)
    if outcome.status is SolverStatus.UNSAT:
        return Obligation(Condition.GRADIENT_INTEGRITY, said, Verdict.PROVED, clip.span,
                          ObligationKind.CLIP, seconds=outcome.seconds, method=METHOD)
    if outcome.status is SolverStatus.UNKNOWN:
        return Obligation(Condition.GRADIENT_INTEGRITY, said, Verdict.UNKNOWN, clip.span,
                          ObligationKind.CLIP, reason="the solver timed out", method=METHOD,
                          seconds=outcome.seconds)
    witness = exact_witness(model, policy)
    if witness is None:
        return Obligation(Condition.GRADIENT_INTEGRITY, said, Verdict.UNKNOWN, clip.span,
                          ObligationKind.CLIP, method=METHOD, seconds=outcome.seconds,
                          reason="Z3 found parts where a rank's norm differs from the global "
                                 "one, but no small whole instance confirmed it exactly")
    rank = witness.wrong()[0]
    true_value, seen_value = witness.true, witness.computed[rank]
    where = ", ".join(f"{a} {c}" for a, c in zip(model.axes, rank, strict=True)) or "every rank"
    shown = "; ".join(f"{g.value}{list(c) if c else ''} {_text(v)}"
                      for (g, c), v in witness.parts.items())
    what = "squared 2-norms" if clip.norm is NormKind.L2 else "inf norms"

    def factor(norm: Real) -> float:
        value = float(norm)
        return min(1.0, float(clip.max_norm) / value) if value > 0 else 1.0

    reason = (f"{'; '.join(notes(model, policy))}. E.g. on a mesh with two ranks per axis whose "
              f"parts have {what} {shown}, the global {norm_name(policy)} is "
              f"{_text(true_value)} but rank ({where}) computes {_text(seen_value)}: the update "
              f"is scaled by {factor(seen_value):.4g} instead of {factor(true_value):.4g}"
              " whenever either exceeds max_norm")
    values = {"mesh": {a: model.width for a in model.axes},
              "true_norm": float(true_value), "computed_norm": float(seen_value),
              "true_norm_exact": _text(true_value), "computed_norm_exact": _text(seen_value),
              "rank": dict(zip(model.axes, rank, strict=True))}
    from placeverify.verify.fixes import CLIP_COMBINE

    return Obligation(Condition.GRADIENT_INTEGRITY, said, Verdict.REFUTED, clip.span,
                      ObligationKind.CLIP, reason=reason, counterexample=values,
                      seconds=outcome.seconds, method=METHOD,
                      fix=CLIP_COMBINE.text(clip=op_label(fixed(strategy, model, policy))))


def fixed(strategy: Strategy, model: NormModel, policy: NormKind) -> Clip:
    """The clip with the policy's norm, its right combination, copies counted once, over its
    group and every axis where ranks hold different elements."""
    axes = set(model.clip.group.axes) | {a for s in model.split.values() for a in s}
    group = Group(tuple(a for a in strategy.mesh.names if a in axes))
    return replace(model.clip, group=group, replicated_once=True, norm=policy,
                   reduce=DEFAULT_NORM_REDUCE[policy], measured=None)


def notes(model: NormModel, policy: NormKind) -> list[str]:
    """Why the clip's combination is not the global norm, from the layout of its parts."""
    clip = model.clip
    group = clip.group.label() if clip.group.axes else "no group"
    out = []
    for g in model.measured:
        split = model.split[g]
        missing = [a for a in split if a not in model.live_group]
        inside = [a for a in split if a in model.live_group]
        copies = [a for a in model.live_group if a not in split]
        if missing:
            out.append(f"{g.value}: the norm is not reduced over {', '.join(missing)}, where ranks "
                       "hold different elements, so each rank sees only its part")
        if inside and (clip.reduce is not ReduceOp.SUM or clip.norm is not NormKind.L2) and \
                (clip.norm, clip.reduce) != (NormKind.INF, ReduceOp.MAX):
            out.append(f"{g.value}: it {COMBINES[(clip.norm, clip.reduce)]} over {group}, where "
                       f"ranks along {', '.join(inside)} hold different elements: the "
                       f"{norm_name(policy)} of the whole is not that combination of its parts' "
                       "norms")
        if copies and clip.reduce is not ReduceOp.MAX:
            counting = "once (rank 0 only)" if clip.replicated_once else "on every rank"
            if (clip.reduce is ReduceOp.MEAN and clip.replicated_once) or \
                    (clip.reduce is ReduceOp.SUM and not clip.replicated_once):
                out.append(f"{g.value}: copies along {', '.join(copies)} are counted {counting} "
                           f"and the clip {COMBINES[(clip.norm, clip.reduce)]}")
    if clip.norm is not policy:
        out.append(f"it computes the {norm_name(clip.norm)} where the declared policy clips by "
                   f"the {norm_name(policy)}")
    return out or [f"it {COMBINES[(clip.norm, clip.reduce)]} over {group}"]


def _text(value: Real) -> str:
    return str(value)
