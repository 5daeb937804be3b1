"""Token and sample counts as solver variables, with the constraints any real batch satisfies.

A count is a sum over a *set* of atoms: those that agree with an anchor device on every batch
axis the count is not reduced over, in one micro-batch or the whole step. The encoding anchors
sets at the atom under study (``a``) or at the consuming device (``x``); they coincide on axes
where the two share a coordinate. For every pair of sets the variables obey what holds for any
assignment of at least one token per atom: a set holds at least as many tokens as atoms; a
superset exceeds a subset by at least the atoms it adds; two disjoint subsets of a set fit inside
it. These are necessary conditions, so an unsatisfiable query is a proof for every real batch;
a satisfying model is turned into concrete per-atom counts and confirmed by the exact
interpreter before it is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import z3

from placeverify.ir.step import CountKind
from placeverify.semantics.groups import GroupView
from placeverify.semantics.schedule import MicroBatch
from placeverify.verify.budget import checkpoint


class Label(StrEnum):
    """Where a set of atoms is anchored on an axis."""

    CONSUMER = "x"  # the consuming device's coordinate
    ATOM = "a"  # the atom's (different) coordinate


# a concrete micro-batch, GENERIC (the atom's generic one, semantics.schedule), None (the step)
KSpec = MicroBatch | None
Size = Any  # an int, or a solver term for an unbounded size (placeverify prove: "for every")


def product(values: Any) -> Any:
    """The product of sizes, an int when all are ints and a solver term otherwise."""
    out: Any = 1
    for v in values:
        out = out * v
    return out


def more_than_one(n: Size) -> bool:
    """Can an axis of this size hold two different coordinates? Symbolic sizes are proved in
    two cases, n = 1 (a plain 1 here) and n >= 2 (a symbol here), so a symbol means yes."""
    return n > 1 if isinstance(n, int) else True


@dataclass(frozen=True, slots=True)
class SetDesc:
    kind: CountKind  # tokens (per atom) or samples (per micro-batch unit)
    free: frozenset[str]  # batch axes summed over
    fixed: tuple[tuple[str, Label], ...]  # the other axes of the family and their anchor
    k: KSpec

    def atoms(self, sizes: dict[str, Size], m: Size) -> Any:
        return product(sizes[a] for a in self.free) * (m if self.k is None else 1)

    def label(self, axis: str) -> Label:
        return dict(self.fixed)[axis]

    def within(self, other: SetDesc) -> bool:
        if not self.free <= other.free:
            return False
        if other.k is not None and self.k != other.k:
            return False
        mine = dict(self.fixed)
        return all(mine[a] == lab for a, lab in other.fixed)

    def disjoint(self, other: SetDesc) -> bool:
        mine = dict(self.fixed)
        for axis, lab in other.fixed:
            if axis in mine and mine[axis] != lab:
                return True
        return self.k is not None and other.k is not None and self.k != other.k


class CountVars:
    """Creates count variables on demand and states the constraints between them."""

    def __init__(self, view: GroupView, sizes: dict[str, Size], m: Size, prefix: str,
                 integer: bool, equal_samples: bool) -> None:
        self.view = view
        self.sizes = sizes
        self.m = m
        self.prefix = prefix
        self.integer = integer
        self.sets: dict[SetDesc, Any] = {}
        self._relabels: dict[tuple[str, Label, Label], tuple[int, list[tuple[Any, Any]]]] = {}
        self.q = self._new(f"{prefix}q") if equal_samples else None

    def _new(self, name: str) -> Any:
        return z3.Int(name) if self.integer else z3.Real(name)

    def _real(self, v: Any) -> Any:
        return z3.ToReal(v) if self.integer else v

    def get(self, kind: CountKind, free: tuple[str, ...], step_scope: bool, anchor: dict[str, Label],
            k: KSpec) -> Any:
        """The count of ``kind`` over ``free`` axes, anchored as given; a real-valued term."""
        view = self.view
        family = view.batch if kind is CountKind.TOKENS else view.samples
        replicated = product(self.sizes[a] for a in free if a not in family)
        # Canonical form: an axis of one rank is neither summed over nor told apart, and with one
        # micro-batch "this micro-batch" is the whole step, so equal sets share a variable.
        free_family = frozenset(a for a in free if a in family and more_than_one(self.sizes[a]))
        fixed = tuple((a, anchor[a]) for a in family
                      if a not in free_family and more_than_one(self.sizes[a]))
        desc = SetDesc(kind, free_family, fixed,
                       None if step_scope or not more_than_one(self.m) else k)
        if kind is CountKind.SAMPLES and self.q is not None:
            units = desc.atoms(self.sizes, self.m)
            return self._real(self.q) * units * replicated
        var = self.sets.get(desc)
        if var is None:
            var = self._new(f"{self.prefix}{kind}{len(self.sets)}")
            self.sets[desc] = var
        return self._real(var) * replicated

    def relabel(self, expr: Any, axis: str, old: Label, new: Label) -> Any:
        """The same expression seen from a rank whose coordinate on ``axis`` the atom's is.

        When a reduction carries an atom's coefficient from one rank's frame to another's, a set
        anchored at coordinate ``old`` on ``axis`` is, in the new frame, anchored at ``new``.
        """
        if z3.is_rational_value(expr):
            return expr  # a constant (most often the zero of a freed or untouched micro-batch)
        cached = self._relabels.get((axis, old, new))
        if cached is not None and cached[0] == len(self.sets):
            return z3.substitute(expr, *cached[1]) if cached[1] else expr
        pairs = []
        for desc, var in list(self.sets.items()):
            labels = dict(desc.fixed)
            if labels.get(axis) != old:
                continue
            moved = tuple((a, new if a == axis else lab) for a, lab in desc.fixed)
            target = SetDesc(desc.kind, desc.free, moved, desc.k)
            other = self.sets.get(target)
            if other is None:
                other = self._new(f"{self.prefix}{desc.kind}{len(self.sets)}")
                self.sets[target] = other
            pairs.append((var, other))
        self._relabels[(axis, old, new)] = (len(self.sets), pairs)
        return z3.substitute(expr, *pairs) if pairs else expr

    def constraints(self) -> list[Any]:
        """Each set's count is at least its atoms, and nested and disjoint sets' counts differ
        by at least the atoms between them: quadratic and cubic in the sets (257 sets of a
        128-micro-batch loop give 33,154 constraints, 2 s), so the budget is checked per set and pair."""
        out: list[Any] = []
        if self.q is not None:
            out.append(self.q >= 1)
        items = list(self.sets.items())
        for desc, var in items:
            out.append(var >= desc.atoms(self.sizes, self.m))
        for d1, v1 in items:
            checkpoint()
            for d2, v2 in items:
                if d1 is d2 or d1.kind is not d2.kind:
                    continue
                if d1.within(d2) and d1 != d2:
                    out.append(v2 - v1 >= d2.atoms(self.sizes, self.m) - d1.atoms(self.sizes, self.m))
        for d3, v3 in items:
            checkpoint()
            inside = [(d, v) for d, v in items if d != d3 and d.kind is d3.kind and d.within(d3)]
            for i, (d1, v1) in enumerate(inside):
                checkpoint()
                for d2, v2 in inside[i + 1:]:
                    if d1.disjoint(d2):
                        out.append(v3 - v1 - v2 >= d3.atoms(self.sizes, self.m)
                                   - d1.atoms(self.sizes, self.m) - d2.atoms(self.sizes, self.m))
        return out
