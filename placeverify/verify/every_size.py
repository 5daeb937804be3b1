"""The three conditions for every size of some axes and of the micro-batch count.

``placeverify check`` proves a step at the sizes its file declares: the sizes are constants in
the encodings, so two wrong factors that cancel at those sizes (``1 / |edp|`` written where
``1 / |ep|`` is meant, at ``ep = edp``) are proved there. This module judges a strategy for every
size of the *quantified* axes and, when quantified, of the micro-batch count; ``placeverify
prove`` uses it for a rule's ``for every dp, ...`` and ``check --every-size`` for every axis of
the file.

- **Gradient integrity** is encoded in Z3 with each quantified axis size an unbounded real >= 2,
  and separately = 1, and the micro-batch count likewise; token and sample counts are unbounded.
  Real values are a sound relaxation of integers: no real model, no integer one. A loop whose
  micro-batches differ (per-micro-batch collectives, ``on microbatch last``) is unrolled, so with a
  quantified micro-batch count it is judged for m = 1..8 only, and said so ("bounded").
- **State consistency, composition safety and the update obligations** depend on a size only
  through whether it is 1, 2 or at least 3 (the analyses compare sizes with 1 and, for the
  reduction order, group sizes with 3): they run at sizes 1, 2 and 3 of every quantified axis and
  micro-batch count, which stand for every size.
- **The smallest failure.** The representative sizes are tried fewest devices first, then fewest
  micro-batches; a real model of an integrity mismatch is confirmed at integer sizes, fewest
  devices first, up to :data:`WIDEST` per axis, by the exact interpreter. Each refutation carries
  the sizes where it fails and what fails there.
- **Not modelled for every size** (unknown, with the reason): several optimizer steps,
  ``only = used`` reductions and empty micro-batches; ``check`` judges them at the file's sizes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import z3

from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.lower.resize import resize
from placeverify.semantics.asynchrony import worlds
from placeverify.semantics.groups import group_view
from placeverify.semantics.participation import selective
from placeverify.semantics.schedule import Unmodelled
from placeverify.semantics.terms import nonlinear, projection, term_views
from placeverify.verdicts import CONDITIONS, Condition, ObligationKind, Verdict, Verification
from placeverify.verify.budget import TIME_BUDGET, Budget, BudgetExhausted, active, checkpoint
from placeverify.verify.size_space import (
    BOUNDED_MICROBATCHES,
    MICROBATCHES,
    REPRESENTATIVES,
    WIDEST,
    EverySize,
    Sizes,
    at,
    coverage,
    quantified,
    smallest_first,
    with_microbatches,
)
from placeverify.verify.z3 import solve
from placeverify.verify.z3.integrity import encode, loop_is_uniform, mismatch_formula
from placeverify.verify.z3.search import search
from placeverify.verify.z3.solve import SolverStatus

__all__ = ["EverySize", "Sizes", "conditions", "for_check", "integrity", "quantified",
           "with_microbatches"]

def for_check(strategy: Strategy, sizes: tuple[list[str], bool], timeout_ms: int,
              budget_s: float | None, at_file: Verification | None = None) -> EverySize:
    """``check --every-size``: every condition for every size of the :func:`quantified` axes
    (and micro-batch count), within ``budget_s`` (what it leaves undecided is unknown, "time
    budget"); the verification at the smallest failing sizes is kept, with its trace. Every size
    includes the file's: a condition refuted there (``at_file``) is refuted for every size."""
    axes, quantified_m = sizes
    with nullcontext() if budget_s is None else active(Budget.start(budget_s, timeout_ms)):
        sized = conditions(strategy, axes, quantified_m, set(CONDITIONS), timeout_ms,
                           keep_failing=True, partial=True)
    return sized if at_file is None else _with_file_sizes(sized, at_file)


def _with_file_sizes(sized: EverySize, at_file: Verification) -> EverySize:
    verdicts, reasons = dict(sized.verdicts), dict(sized.reasons)
    for condition in CONDITIONS:
        if at_file.verdict(condition) is Verdict.REFUTED and \
                verdicts[condition] is not Verdict.REFUTED:
            verdicts[condition] = Verdict.REFUTED
            judged = reasons.get(condition)
            reasons[condition] = "refuted at the file's sizes (above)" + (
                f"; the other sizes: {judged}" if judged else "")
    return replace(sized, verdicts=verdicts, reasons=reasons)


def conditions(strategy: Strategy, axes: list[str], quantified_m: bool,
               wanted: set[Condition], timeout_ms: int, *, keep_failing: bool = False,
               partial: bool = False) -> EverySize:
    """Each ``wanted`` condition for every size of ``axes`` (and of the micro-batch count with
    ``quantified_m``). With ``keep_failing`` the verification at the smallest failing sizes is
    kept (its trace is the counterexample a replay runs). When the active budget runs out, a
    :class:`BudgetExhausted` propagates (the caller says what was left undecided), or with
    ``partial`` what is decided is kept and the rest is unknown ("time budget")."""
    judging = _Judging(strategy, axes, quantified_m, wanted, keep_failing)
    try:
        judging.integrity(timeout_ms)
        judging.structure(timeout_ms)
    except BudgetExhausted:
        if not partial:
            raise
        judging.out_of_time()
    return judging.result()


class _Judging:
    """The verdicts so far, refuted smallest sizes first."""

    def __init__(self, strategy: Strategy, axes: list[str], quantified_m: bool,
                 wanted: set[Condition], keep_failing: bool) -> None:
        self.strategy, self.axes, self.quantified_m = strategy, axes, quantified_m
        self.wanted, self.keep_failing = wanted, keep_failing
        self.started = time.perf_counter()
        self.verdicts: dict[Condition, Verdict] = {c: Verdict.PROVED for c in wanted}
        self.reasons: dict[Condition, str] = {}
        self.failures: dict[Condition, Sizes] = {}
        self.methods: list[str] = []
        self.first: dict[str, Any] = {}
        self.decided: set[Condition] = set()  # every case judged (not cut short by the budget)
        self.bounded = False

    def refute(self, condition: Condition, why: str, evidence: dict[str, Any] | None,
               failing: Sizes | None, verification: Verification | None) -> None:
        if self.verdicts[condition] is not Verdict.REFUTED:
            self.verdicts[condition] = Verdict.REFUTED
            self.reasons[condition] = why
            if failing is not None:
                self.failures[condition] = failing
            if not self.first:
                self.first.update(detail=why, counterexample=evidence, failing=failing,
                                  at_failing=verification)

    def undecided(self, condition: Condition, why: str) -> None:
        if self.verdicts[condition] is Verdict.PROVED:
            self.verdicts[condition] = Verdict.UNKNOWN
            self.reasons.setdefault(condition, why)

    def integrity(self, timeout_ms: int) -> None:
        if Condition.GRADIENT_INTEGRITY not in self.wanted:
            return
        from placeverify.verify import verify  # the package's entry point (a cycle at import)

        s = self.strategy
        self.bounded = self.quantified_m and _not_modelled(s) is None and not _uniform(s)
        verdict, method, why, evidence, failing = integrity(s, self.axes, self.quantified_m,
                                                            timeout_ms)
        self.methods.append(method)
        if verdict is Verdict.REFUTED:
            kept = (verify(at(s, failing), timeout_ms)
                    if self.keep_failing and failing is not None else None)
            self.refute(Condition.GRADIENT_INTEGRITY, why, evidence, failing, kept)
        elif verdict is Verdict.UNKNOWN:
            self.undecided(Condition.GRADIENT_INTEGRITY, why)
        self.decided.add(Condition.GRADIENT_INTEGRITY)

    def structure(self, timeout_ms: int) -> None:
        """Every condition's size-structural obligations, at the representative sizes."""
        from placeverify.verify import verify  # the package's entry point (a cycle at import)

        ms = REPRESENTATIVES if self.quantified_m else (self.strategy.microbatches,)
        for point in smallest_first(self.axes, REPRESENTATIVES, ms):
            verification = verify(at(self.strategy, point), timeout_ms)
            for o in verification.obligations:
                if o.condition not in self.wanted or (o.condition is Condition.GRADIENT_INTEGRITY
                                                      and o.kind is ObligationKind.COEFFICIENT):
                    continue
                if o.verdict is Verdict.REFUTED:
                    self.refute(o.condition, f"{o.claim}: {o.reason}",
                                {**point.to_json(), "obligation": o.claim, "reason": o.reason,
                                 "values": o.counterexample, "where": ", ".join(
                                     f"{a} = {n}" for a, n in point.mesh.items())},
                                point, verification if self.keep_failing else None)
                elif o.verdict is Verdict.UNKNOWN:
                    self.undecided(o.condition, f"{o.claim}: {o.reason}" if o.reason else o.claim)
        self.decided |= self.wanted
        structural = self.wanted - {Condition.GRADIENT_INTEGRITY}
        if structural:
            quantified = ", ".join([*self.axes, *([MICROBATCHES] if self.quantified_m else [])]) \
                or "no size"
            self.methods.append(
                f"{', '.join(c.label for c in sorted(structural))} and the update rules: checked "
                f"at sizes 1, 2 and 3 of {quantified}, which stand for every size (these analyses "
                "only compare sizes with 1, 2 and 3)")

    def out_of_time(self) -> None:
        for condition in self.wanted - self.decided:
            self.undecided(condition, TIME_BUDGET)

    def result(self) -> EverySize:
        covers = {c: coverage(self.strategy, self.axes, self.quantified_m,
                              self.bounded and c is Condition.GRADIENT_INTEGRITY)
                  for c in self.wanted}
        detail = self.first.get("detail") or (
            self.reasons.get(Condition.GRADIENT_INTEGRITY, "")
            if self.verdicts.get(Condition.GRADIENT_INTEGRITY) is Verdict.UNKNOWN else "")
        return EverySize(tuple(self.axes), self.quantified_m, self.verdicts, covers,
                         tuple(self.methods), detail, self.first.get("counterexample"),
                         self.first.get("failing"), self.first.get("at_failing"),
                         time.perf_counter() - self.started, self.reasons, self.failures)


def _uniform(strategy: Strategy) -> bool:
    try:
        return all(loop_is_uniform(o) for o in outcomes(with_microbatches(strategy, 3)))
    except Unmodelled:
        return False  # judged at m = 1..8, where the encoding says what it does not model


def outcomes(strategy: Strategy) -> list[Strategy]:
    """The synchronous steps a strategy is judged on: itself, or both extreme outcomes of its
    asynchronous collectives (:mod:`placeverify.semantics.asynchrony`, as ``check`` judges
    them at the file's sizes: proved only when both are)."""
    both = worlds(strategy)
    return [strategy] if both is None else [w.strategy for w in both]


def integrity(strategy: Strategy, axes: list[str], quantified_m: bool, timeout_ms: int
              ) -> tuple[Verdict, str, str, dict[str, Any] | None, Sizes | None]:
    """Gradient integrity for every size: (verdict, method, why, evidence, smallest failing
    sizes)."""
    blocked = _not_modelled(strategy)
    if blocked is not None:
        return Verdict.UNKNOWN, "gradient integrity: not judged for every size", blocked, None, None
    bounded = quantified_m and not _uniform(strategy)
    m_cases: list[Any] = (["one", "many"] if quantified_m and not bounded else
                          list(range(1, BOUNDED_MICROBATCHES + 1)) if bounded else
                          [strategy.microbatches])
    unknown = ""
    for kinds in itertools.product(("one", "many"), repeat=len(axes)):
        for m_case in m_cases:
            outcome = _relaxed(strategy, axes, kinds, m_case, timeout_ms)
            if isinstance(outcome, tuple):
                return outcome
            if outcome is None:
                continue
            unknown = outcome
    if unknown == _INTEGER_MISSING:  # a real model: look for an integer one at wider sizes
        found = _wider(strategy, axes, quantified_m, bounded, timeout_ms)
        if found is not None:
            return found
    quantified = [f"{a} >= 2 (and {a} = 1)" for a in axes]
    if quantified_m:
        quantified.append(f"{MICROBATCHES} = 1..{BOUNDED_MICROBATCHES} (bounded)" if bounded
                          else f"{MICROBATCHES} >= 2 (and 1)")
    method = ("gradient integrity: Z3 over unbounded sizes " + ", ".join(quantified)
              if quantified else "gradient integrity: Z3 at the rule's sizes")
    if unknown:
        return Verdict.UNKNOWN, method, unknown, None, None
    return Verdict.PROVED, method + ", token and sample counts unbounded", "", None, None


_INTEGER_MISSING = "a real-valued model exists but no integer counterexample was found"


def _not_modelled(strategy: Strategy) -> str | None:
    if strategy.config.unused and selective(strategy):  # semantics/participation.py
        return ("not modelled: 'only = used' reductions of 'unused' groups over unbounded sizes "
                "(check judges them pattern by pattern)")
    if strategy.step.windows:  # several optimizer steps (semantics/steps.py): check judges them
        return ("not modelled: several optimizer steps ('microbatches = [...]') for every size; "
                "`placeverify check` judges them at the file's sizes")
    if strategy.config.empty:  # semantics/empty.py
        return ("not modelled: micro-batches without tokens over unbounded sizes (check judges "
                "them pattern by pattern)")
    return None


def _relaxed(strategy: Strategy, axes: list[str], kinds: tuple[str, ...], m_case: Any,
             timeout_ms: int) -> tuple[Verdict, str, str, dict[str, Any] | None, Sizes | None] | str | None:
    """One case of the relaxation (each axis 1 or an unbounded real >= 2): None when Z3 proves
    it, the answer when it is decided otherwise, or why it is left undecided."""
    m_rep = 1 if m_case == "one" else 3 if m_case == "many" else int(m_case)
    representative = {a: 1 if k == "one" else 3 for a, k in zip(axes, kinds, strict=True)}
    case = resize(with_microbatches(strategy, m_rep), representative)
    symbolic: dict[str, Any] = {a.name: a.size for a in case.mesh.axes}
    assumptions = []
    for axis, kind in zip(axes, kinds, strict=True):
        if kind == "many":
            symbolic[axis] = z3.Real(axis)
            assumptions.append(symbolic[axis] >= 2)
    m_sym: Any = m_rep
    if m_case == "many":
        m_sym = z3.Real(MICROBATCHES)
        assumptions.append(m_sym >= 2)
    undecided = None
    try:
        judging = [pair for o in outcomes(case) for pair in judged_groups(o)]
    except Unmodelled as err:
        return Verdict.UNKNOWN, "z3", f"not modelled: {err}", None, None
    for judged, group in judging:  # each outcome's loss terms' projections, where they reach
        view = group_view(judged, group)
        try:
            encoded = encode(judged, view, symbolic, m_sym, f"{group.value}_", integer=False)
        except Unmodelled as err:
            return Verdict.UNKNOWN, "z3", f"not modelled: {err}", None, None
        if encoded.mixing:
            return (Verdict.REFUTED, "placement relations",
                    f"a reduction mixes different {group.value} parameters", None, None)
        outcome = solve.check(z3.And(*assumptions, mismatch_formula(encoded)), timeout_ms)
        if outcome.status is SolverStatus.UNSAT:
            continue
        refuted = _confirmed(judged, group, timeout_ms)
        if refuted is not None:
            return refuted
        undecided = ("the solver timed out" if outcome.status is SolverStatus.UNKNOWN else
                     _INTEGER_MISSING)
    return undecided


def _confirmed(judged: Strategy, group: ParamGroup, timeout_ms: int,
               meshes: list[tuple[dict[str, int], int]] | None = None
               ) -> tuple[Verdict, str, str, dict[str, Any] | None, Sizes | None] | None:
    """The smallest integer counterexample the exact interpreter confirms (at ``meshes``, or at
    every mesh up to the strategy's own), as a refutation."""
    found = search(judged, group_view(judged, group), timeout_ms, meshes=meshes)
    if found is None:
        return None
    _, bad = found.run.mismatches()[0]
    evidence = {"mesh": found.sizes, "microbatches": found.microbatches, "group": group.value,
                "tokens": {f"{k}": n for k, n in found.instance.tokens.items()},
                "consumed": str(bad.consumed), "reference": str(found.run.reference)}
    sizes = Sizes(dict(found.sizes), found.microbatches)
    return (Verdict.REFUTED, "z3 model confirmed by the exact interpreter",
            f"{group.value} gradient at {sizes.show()}: consumed {bad.consumed}, single-device "
            f"{found.run.reference}", evidence, sizes)


def _wider(strategy: Strategy, axes: list[str], quantified_m: bool, bounded: bool,
           timeout_ms: int) -> tuple[Verdict, str, str, dict[str, Any] | None, Sizes | None] | None:
    """A confirmed integer counterexample at sizes above 3 (up to :data:`WIDEST` per axis),
    fewest devices first."""
    ms = (range(1, BOUNDED_MICROBATCHES + 1) if bounded else REPRESENTATIVES) if quantified_m \
        else (strategy.microbatches,)
    for point in _beyond_representatives(axes, ms):
        checkpoint()
        case = at(strategy, point)
        mesh = {a.name: a.size for a in case.mesh.axes}
        for judged, group in [pair for o in outcomes(case) for pair in judged_groups(o)]:
            refuted = _confirmed(judged, group, timeout_ms, meshes=[(mesh, point.microbatches)])
            if refuted is not None:
                return refuted
    return None


def _beyond_representatives(axes: list[str], ms: Iterable[int]) -> Iterator[Sizes]:
    for point in smallest_first(axes, range(1, WIDEST + 1), ms):
        if any(n > max(REPRESENTATIVES) for n in point.mesh.values()):
            yield point


def judged_groups(strategy: Strategy) -> list[tuple[Strategy, ParamGroup]]:
    """(strategy, group) pairs to encode: with named loss terms, each term's projection on the
    groups it reaches (:mod:`placeverify.semantics.terms`); otherwise every group."""
    if not strategy.terms:
        return [(strategy, g) for g in strategy.model.groups_present()]
    blocker = nonlinear(strategy)
    if blocker is not None:  # several terms under a max: one encoding refuses it (unknown)
        return [(strategy, g) for g in strategy.model.groups_present()]
    return [(projection(strategy, t), g) for t in term_views(strategy)
            for g in strategy.model.groups_present() if t.reaches_group(g)]
