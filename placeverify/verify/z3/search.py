"""The search for the smallest confirmed integrity counterexample.

The smallest mesh (axes of size 1 to 3, fewest devices first) and micro-batch count with an
integer counterexample is searched for; its model is turned into per-atom counts and run through
the exact interpreter (:mod:`placeverify.semantics.interpreter`), and only a confirmed divergence
is kept (:class:`placeverify.evidence.Counterexample`).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from placeverify.evidence import Counterexample, Key
from placeverify.ir.step import Backward, Scale
from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import GroupView
from placeverify.semantics.interpreter import AtomKey, atoms, extra_coords, run, uniform_instance
from placeverify.semantics.schedule import GENERIC, Unmodelled
from placeverify.trace import MAX_ATOM_COUNT
from placeverify.verify.budget import checkpoint
from placeverify.verify.z3 import solve
from placeverify.verify.z3.counts import Label, SetDesc
from placeverify.verify.z3.integrity import Encoded, encode, mismatch_formula
from placeverify.verify.z3.solve import SolverStatus

MAX_SEARCH_SIZE = 3
MAX_INTERPRETED_ATOMS = 1024


def candidate_meshes(strategy: Strategy, view: GroupView) -> list[tuple[dict[str, int], int]]:
    declared = {a.name: a.size for a in strategy.mesh.axes}
    m_declared = strategy.step.microbatches
    relevant = set(view.coordinates) | set(view.complete) | set(_mentioned_axes(strategy))
    axes = [a for a in declared if a in relevant]
    # a window of several optimizer steps keeps its count (semantics/steps.py)
    indexed = any(lo.microbatch is not None for lo in strategy.step.loop) or \
        bool(strategy.step.windows)
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


def search(strategy: Strategy, view: GroupView, timeout_ms: int, observe: int | None = None,
           meshes: list[tuple[dict[str, int], int]] | None = None) -> Counterexample | None:
    """The smallest confirmed counterexample: of what the update consumes, or with ``observe``
    of what the clip with that index (in this group's order of clips) sees; at ``meshes``
    (sizes, micro-batch count) in their order, or by default at :func:`candidate_meshes`."""
    deadline = timeout_ms
    for sizes, m in candidate_meshes(strategy, view) if meshes is None else meshes:
        checkpoint()
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
        if outcome.status is not SolverStatus.SAT:
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
    if tokens is not None and max(tokens.values(), default=1) <= MAX_ATOM_COUNT:
        tries.append((tokens, samples))  # a solver's count past what a trace holds is not shown
    rng = random.Random(0)
    keys = atoms(view, sizes, m)
    for _ in range(64):
        t = {k: rng.randint(1, 4) for k in keys}
        tries.append((t, _unit_samples(view, keys, rng, strategy.loss.uneven_samples)))
    for t, s in tries:
        checkpoint()
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
        want = alpha_k if desc.k == GENERIC else desc.k
        if k != want:
            return False
    for axis, label in desc.fixed:
        i = view.batch.index(axis)
        if b[i] != (0 if label is Label.CONSUMER else 1):
            return False
    return True
