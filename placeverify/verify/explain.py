"""Integrity counterexamples in words, and the patterns fixes and spans are chosen by.

``describe``, ``summary`` and their helpers turn a confirmed
:class:`placeverify.evidence.Counterexample` into the reason and counterexample of an obligation;
``ratio_pattern``, ``has_local_count``, ``reductions_of`` and ``cause_span`` recognise what kind
of mistake produced it (REFERENCE §3), for the fix (:mod:`placeverify.verify.fixes`) and for the
statement the report points at.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from placeverify.evidence import Counterexample
from placeverify.ir.model import ParamGroup
from placeverify.ir.step import (
    Backward,
    Collective,
    CollectiveKind,
    CountKind,
    Free,
    Scale,
    Scope,
    TargetKind,
    TermKind,
)
from placeverify.ir.strategy import LossKind, Strategy
from placeverify.semantics.groups import GroupView
from placeverify.semantics.interpreter import Instance, run, uniform_instance
from placeverify.semantics.surd import Real, Surd


def describe(strategy: Strategy, view: GroupView, found: Counterexample) -> str:
    index, bad = found.run.mismatches(found.observe)[0]
    coords = ", ".join(f"{a} {c}" for a, c in bad.coords.items()) or "the only device"
    if found.observe is None:
        what = f"consumes {show(bad.consumed)}"
    else:
        seen = found.run.clips[found.observe]
        line = getattr(seen.op, "span", None)
        what = (f"clips (line {line.line if line else '?'}, micro-batch {seen.k}) a gradient of "
                f"{show(seen.value[index])}")
    return (f"on {mesh_text(found.sizes, found.microbatches)} ({token_text(view, found)}), "
            f"device ({coords}) {what} where the single-device gradient is "
            f"{show(found.run.reference)}")


def mesh_text(sizes: dict[str, int], m: int) -> str:
    parts = [f"{a} = {n}" for a, n in sizes.items()]
    return ", ".join(parts) + f", microbatches = {m}"


def token_text(view: GroupView, found: Counterexample) -> str:
    parts = []
    for (b, k), n in sorted(found.instance.tokens.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        where = ", ".join(f"{a} {c}" for a, c in zip(view.batch, b, strict=True))
        parts.append(f"{'device ' + where + ' ' if where else ''}micro-batch {k}: {n} "
                     f"token{'s' if n != 1 else ''}")
    if len(parts) > 6:
        parts = [*parts[:6], "..."]
    return "; ".join(parts)


def show(value: Real | None) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Surd):
        return f"{value} (≈ {float(value):.6g})"
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator} (≈ {float(value):.6g})"


def summary(view: GroupView, found: Counterexample) -> dict[str, Any]:
    return {
        "group": view.group.value,
        "mesh": dict(found.sizes),
        "microbatches": found.microbatches,
        "tokens": [{"coords": dict(zip(view.batch, b, strict=True)), "microbatch": k, "tokens": n}
                   for (b, k), n in sorted(found.instance.tokens.items())],
        "consumed": {", ".join(f"{a}={c}" for a, c in d.coords.items()) or "device":
                     str(d.consumed) for d in found.run.devices},
        "reference": str(found.run.reference),
        "class": None if found.key is None else {
            axis: rel for axis, rel in zip(view.coordinates, found.key.cls, strict=True)},
    }


def ratio_pattern(strategy: Strategy, view: GroupView, found: Counterexample) -> Fraction | None:
    """consumed / reference if it is the same for two different count assignments, else None."""
    ratios = set()
    varied = {k: 1 + (i % 3) for i, k in enumerate(found.instance.tokens)}
    for index, tokens in enumerate((found.instance.tokens, varied)):
        instance = uniform_instance(strategy, view, found.sizes, found.microbatches, tokens,
                                    found.instance.samples)
        if index:  # other gradient values too, so a missing contribution cannot look constant
            instance = Instance(instance.sizes, instance.microbatches, instance.tokens,
                                instance.samples, {key: g * (i + 2) ** 2 for i, (key, g)
                                                   in enumerate(sorted(instance.grads.items()))})
        result = run(strategy, view, instance)
        consumed = result.devices[0].consumed
        if consumed is None or result.reference == 0:
            return None
        ratio = consumed / result.reference
        if isinstance(ratio, Surd):
            return None  # an irrational ratio: no fix pattern names one
        ratios.add(ratio)
    return ratios.pop() if len(ratios) == 1 else None


def has_local_count(strategy: Strategy) -> bool:
    """Does the loss divide by a count of this micro-batch on this device alone?"""
    for op in strategy.step.ops():
        if isinstance(op, Backward):
            for term, exponent in op.loss.factors:
                if (term.kind is TermKind.COUNT and term.count is not None and exponent < 0
                        and not term.count.axes and term.count.scope is Scope.MICROBATCH):
                    return True
    return False


def wrong_count_kind(strategy: Strategy) -> bool:
    """Does the loss divide only by counts of the other kind than the declared mean's?"""
    wanted = {LossKind.TOKEN_MEAN: CountKind.TOKENS, LossKind.SAMPLE_MEAN: CountKind.SAMPLES}
    kind = wanted.get(strategy.loss.kind)
    kinds = [term.count.kind for op in strategy.step.ops() if isinstance(op, Backward)
             for term, exponent in op.loss.factors
             if term.kind is TermKind.COUNT and term.count is not None and exponent < 0]
    return kind is not None and bool(kinds) and all(k is not kind for k in kinds)


def reductions_of(strategy: Strategy, group: ParamGroup) -> list[Collective]:
    return [op for op in strategy.step.ops()
            if isinstance(op, Collective) and op.target.kind is TargetKind.GRADS
            and op.target.applies_to(group)]


def cause_span(strategy: Strategy, view: GroupView, found: Counterexample) -> Any:
    """The statement a coefficient refutation is most likely caused by.

    A per-micro-batch local normalisation points at the backward; a wrong constant factor (the
    ratio to the reference does not depend on the counts) at the last scale, else the last
    reduction, of this group's gradient; a missing reduction at the update that consumes it.
    """
    if strategy.loss.kind is LossKind.TOKEN_MEAN and has_local_count(strategy) \
            and found.microbatches > 1:
        return strategy.step.backward().span
    if wrong_count_kind(strategy):
        return strategy.step.backward().span  # tokens for a sample loss or samples for a token one
    overwriting = [lo.op for lo in strategy.step.loop
                   if isinstance(lo.op, Collective) and lo.op.kind is CollectiveKind.REDUCE_SCATTER
                   and not lo.op.accumulate and lo.op.target.applies_to(view.group)]
    if overwriting and found.microbatches > 1:
        return overwriting[0].span  # each micro-batch overwrites the shard
    ratio = ratio_pattern(strategy, view, found)
    if ratio == 0:  # nothing reaches the update: the gradient was dropped before it
        freed = [op for op in strategy.step.ops() if isinstance(op, Free)
                 and op.target.applies_to(view.group)]
        return freed[0].span if freed else None
    if ratio is None:
        return None
    ops = list(strategy.step.ops())
    scales = [op for op in ops if isinstance(op, Scale) and op.target.applies_to(view.group)]
    if scales:
        return scales[-1].span
    reductions = [op for op in reductions_of(strategy, view.group)]
    return reductions[-1].span if reductions else None
