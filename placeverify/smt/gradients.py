"""The gradient-integrity obligation of each parameter group: proof, or a confirmed counterexample.

1. At the declared mesh, counts are real variables (a sound relaxation): *unsat* proves the
   consumed gradient equals the single-device gradient for every token count, sample count and
   micro-batch composition.
2. Otherwise the smallest mesh (axes of size 1 to 3, fewest devices first) and micro-batch count
   with an integer counterexample is searched for; its model is turned into per-atom counts and
   run through the exact interpreter, and only a confirmed divergence is reported as *refuted*.
3. A solver timeout, a real-only model, or an unmodelled construct gives *unknown*.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Backward, Clip, Collective, Free, Scale, TermKind
from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import GroupView, group_view
from placeverify.semantics.interpreter import (
    AtomKey,
    Instance,
    Run,
    atoms,
    extra_coords,
    run,
    uniform_instance,
)
from placeverify.semantics.schedule import Unmodelled
from placeverify.smt import solve
from placeverify.smt.counts import SetDesc
from placeverify.smt.integrity import Encoded, Key, encode, mismatch_formula
from placeverify.verdicts import Condition, Obligation, Verdict

MAX_SEARCH_SIZE = 3
MAX_INTERPRETED_ATOMS = 1024


@dataclass(frozen=True, slots=True)
class Counterexample:
    group: ParamGroup
    sizes: dict[str, int]
    microbatches: int
    instance: Instance
    run: Run
    key: Key | None
    observe: int | None = None  # None: what the update consumed; i: what this group's clip i saw


def integrity_obligations(strategy: Strategy,
                          timeout_ms: int) -> list[tuple[Obligation, Counterexample | None]]:
    out = []
    clips: list[tuple[ParamGroup, tuple[Obligation, Counterexample | None]]] = []
    for group in strategy.model.groups_present():
        out.append(group_obligation(strategy, group, timeout_ms))
        clips.extend((group, found) for found in clip_input_obligations(strategy, group, timeout_ms))
    return out + _merged(clips)


def _merged(results: list[tuple[ParamGroup, tuple[Obligation, Counterexample | None]]]
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
    accumulation; its norm (judged in :mod:`placeverify.smt.update`) is only right then."""
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
    except Unmodelled as err:
        return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN,
                            err.span or clips[0].span, "clip-input", reason=f"not modelled: {err}"),
                 None)]
    if encoded.mixing:
        return []  # the group's integrity obligation is refuted for mixing shards already
    seconds = 0.0
    misplaced = [s.op for s in encoded.clips if s.after_update or not s.after_last_backward]
    for index, seen in enumerate(encoded.clips):
        if any(seen.op is op for op in misplaced):
            continue  # refuted for where it stands (placeverify.smt.update): no input is right
        outcome = solve.check(mismatch_formula(encoded, seen.value.values), timeout_ms)
        seconds += outcome.seconds
        if outcome.status == "unsat":
            continue
        found = search(strategy, view, timeout_ms, observe=index)
        if found is None:
            why = ("the solver timed out" if outcome.status == "unknown"
                   else "a real-valued counterexample exists but no integer one was confirmed "
                        "on small meshes")
            return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN,
                                seen.op.span, "clip-input", reason=why, seconds=seconds,
                                method=method), None)]
        return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED,
                            seen.op.span, "clip-input",
                            reason=describe(strategy, view, found),
                            counterexample=summary(view, found), seconds=seconds, method=method,
                            fix="clip after the last gradient reduction and scale (the loss "
                                "normalisation and any loss-scale unscaling), once, after the "
                                "last micro-batch"),
                 found)]
    return [(Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, clips[0].span,
                        "clip-input", seconds=seconds, method=method), None)]


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
    except Unmodelled as err:
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, span, "coefficient",
                          reason=f"not modelled: {err}"), None
    if encoded.mixing:
        op = encoded.mixing[0]
        return Obligation(
            Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED, getattr(op, "span", span),
            "mixes-shards", reason=f"'{_text(op)}' sums gradients of different {group.value} "
            "parameters: ranks of that group hold different shards",
            method="placement relations"), None
    outcome = solve.check(mismatch_formula(encoded), timeout_ms)
    method = "z3 (nonlinear real arithmetic over count variables)"
    if outcome.status == "unsat":
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.PROVED, span, "coefficient",
                          seconds=outcome.seconds, method=method), None
    found = search(strategy, view, timeout_ms)
    if found is None:
        why = ("the solver timed out" if outcome.status == "unknown"
               else "a real-valued counterexample exists but no integer one was confirmed on "
                    "small meshes")
        return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.UNKNOWN, span, "coefficient",
                          reason=why, seconds=outcome.seconds, method=method), None
    reason = describe(strategy, view, found)
    return Obligation(Condition.GRADIENT_INTEGRITY, claim, Verdict.REFUTED,
                      cause_span(strategy, view, found) or span, "coefficient",
                      reason=reason, counterexample=summary(view, found),
                      seconds=outcome.seconds, method=method), found


def _text(op: Any) -> str:
    from placeverify.report.data import op_text

    return op_text(op)


def _consume_span(strategy: Strategy) -> Any:
    for op in strategy.step.post:
        if op.__class__.__name__ == "Update":
            return op.span
    return strategy.step.span


# ---- the search for the smallest confirmed counterexample ------------------------------------


def candidate_meshes(strategy: Strategy, view: GroupView) -> list[tuple[dict[str, int], int]]:
    declared = {a.name: a.size for a in strategy.mesh.axes}
    m_declared = strategy.step.microbatches
    relevant = set(view.coordinates) | set(view.complete) | set(_mentioned_axes(strategy))
    axes = [a for a in declared if a in relevant]
    indexed = any(lo.microbatch is not None for lo in strategy.step.loop)
    ms = [m_declared] if indexed else sorted({m for m in (1, 2, 3, m_declared) if m <= m_declared})
    options = []
    for combo in itertools.product(*(range(1, min(MAX_SEARCH_SIZE, declared[a]) + 1) for a in axes)):
        sizes = {a: 1 for a in declared}
        sizes.update(zip(axes, combo, strict=True))
        for m in ms:
            options.append((sizes, m))
    options.sort(key=lambda o: (math.prod(o[0].values()), o[1], tuple(o[0].values())))
    return options


def _mentioned_axes(strategy: Strategy) -> set[str]:
    out: set[str] = set()
    for op in strategy.step.ops():
        group = getattr(op, "group", None)
        if group is not None:
            out.update(group.axes)
        monomial = op.loss if isinstance(op, Backward) else op.factor if isinstance(op, Scale) else None
        if monomial is not None:
            for term, _ in monomial.factors:
                if term.count is not None:
                    out.update(term.count.axes)
                if term.group is not None:
                    out.update(term.group.axes)
    return out


def search(strategy: Strategy, view: GroupView, timeout_ms: int,
           observe: int | None = None) -> Counterexample | None:
    """The smallest confirmed counterexample: of what the update consumes, or with ``observe``
    of what the clip with that index (in this group's order of clips) sees."""
    deadline = timeout_ms
    for sizes, m in candidate_meshes(strategy, view):
        if len(atoms(view, sizes, m)) * max(1, len(extra_coords(view, sizes))) > MAX_INTERPRETED_ATOMS:
            continue
        try:
            encoded = encode(strategy, view, sizes, m, "c_", integer=True)
        except Unmodelled:
            continue
        if encoded.mixing:
            continue
        if observe is not None and observe >= len(encoded.clips):
            continue
        observed = None if observe is None else encoded.clips[observe].value.values
        outcome = solve.check(mismatch_formula(encoded, observed), deadline)
        if outcome.status != "sat":
            continue
        found = confirm(strategy, view, sizes, m, encoded, outcome.model, observe)
        if found is not None:
            return found
    return None


def confirm(strategy: Strategy, view: GroupView, sizes: dict[str, int], m: int, encoded: Encoded,
            model: Any, observe: int | None = None) -> Counterexample | None:
    """Turn a model into concrete counts and keep it only if the interpreter diverges too."""
    values = encoded.consumed if observe is None else encoded.clips[observe].value.values
    key = next((k for k in values
                if solve.truthy(model, values[k] != encoded.reference[k])), None)
    tokens, samples = realise(view, sizes, m, encoded, model, key)
    tries: list[tuple[dict[AtomKey, int], dict[AtomKey, int]]] = []
    if tokens is not None:
        tries.append((tokens, samples))
    rng = random.Random(0)
    keys = atoms(view, sizes, m)
    for _ in range(64):
        t = {k: rng.randint(1, 4) for k in keys}
        tries.append((t, _unit_samples(view, keys, rng, strategy.loss.uneven_samples)))
    for t, s in tries:
        instance = uniform_instance(strategy, view, sizes, m, t, s)
        result = run(strategy, view, instance)
        if result.mismatches(observe):
            return Counterexample(view.group, sizes, m, instance, result, key, observe)
    return None


def _unit_samples(view: GroupView, keys: list[AtomKey], rng: random.Random,
                  uneven: bool) -> dict[AtomKey, int]:
    """Samples per micro-batch unit (shared by the atoms of one unit along context axes)."""
    sample_index = [i for i, a in enumerate(view.batch) if a in view.samples]
    per_unit: dict[tuple[tuple[int, ...], int], int] = {}
    out = {}
    for b, k in keys:
        unit = (tuple(b[i] for i in sample_index), k)
        if unit not in per_unit:
            per_unit[unit] = rng.randint(1, 4) if uneven else 2
        out[(b, k)] = per_unit[unit]
    return out


def realise(view: GroupView, sizes: dict[str, int], m: int, encoded: Encoded, model: Any,
            key: Key | None) -> tuple[dict[AtomKey, int] | None, dict[AtomKey, int]]:
    """Per-atom counts with the model's set sums (x at coordinate 0, the atom at 1)."""
    keys = atoms(view, sizes, m)
    alpha_k = key.k if key is not None and isinstance(key.k, int) else 0
    counts = encoded.counts
    q = int(solve.value(model, counts.q)) if counts.q is not None else 1
    samples = {k: max(1, q) for k in keys}
    token_sets = [(d, v) for d, v in counts.sets.items() if d.kind == "tokens"]
    token_sets.sort(key=lambda item: item[0].atoms(sizes, m))
    assigned: dict[AtomKey, int] = {}
    for desc, var in token_sets:
        target = int(solve.value(model, var))
        members = [a for a in keys if _member(desc, a, view, alpha_k)]
        have = sum(assigned[a] for a in members if a in assigned)
        free = [a for a in members if a not in assigned]
        if not free:
            if have != target:
                return None, samples
            continue
        need = target - have
        if need < len(free):
            return None, samples
        for a in free[:-1]:
            assigned[a] = 1
        assigned[free[-1]] = need - (len(free) - 1)
    for a in keys:
        assigned.setdefault(a, 1)
    return assigned, samples


def _member(desc: SetDesc, atom: AtomKey, view: GroupView, alpha_k: int) -> bool:
    b, k = atom
    if desc.k is not None:
        want = alpha_k if desc.k == "g" else desc.k
        if k != want:
            return False
    for axis, label in desc.fixed:
        i = view.batch.index(axis)
        if b[i] != (0 if label == "x" else 1):
            return False
    return True


# ---- words for the report ----------------------------------------------------------------------


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


def show(value: Fraction | None) -> str:
    if value is None:
        return "nothing"
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
        ratios.add(consumed / result.reference)
    return ratios.pop() if len(ratios) == 1 else None


def has_local_count(strategy: Strategy) -> bool:
    """Does the loss divide by a count of this micro-batch on this device alone?"""
    for op in strategy.step.ops():
        if isinstance(op, Backward):
            for term, exponent in op.loss.factors:
                if (term.kind is TermKind.COUNT and term.count is not None and exponent < 0
                        and not term.count.axes and term.count.scope.value == "microbatch"):
                    return True
    return False


def reductions_of(strategy: Strategy, group: ParamGroup) -> list[Collective]:
    return [op for op in strategy.step.ops()
            if isinstance(op, Collective) and op.target.kind.value == "grads"
            and op.target.applies_to(group)]


def cause_span(strategy: Strategy, view: GroupView, found: Counterexample) -> Any:
    """The statement a coefficient refutation is most likely caused by.

    A per-micro-batch local normalisation points at the backward; a wrong constant factor (the
    ratio to the reference does not depend on the counts) at the last scale, else the last
    reduction, of this group's gradient; a missing reduction at the update that consumes it.
    """
    from placeverify.ir.strategy import LossKind

    if strategy.loss.kind is LossKind.TOKEN_MEAN and has_local_count(strategy) \
            and found.microbatches > 1:
        return strategy.step.backward().span
    overwriting = [lo.op for lo in strategy.step.loop
                   if isinstance(lo.op, Collective) and lo.op.kind.value == "reduce_scatter"
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
