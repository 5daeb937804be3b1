"""Checking a rule's claims, for every size it quantifies over.

- **Conditions** (``prove gradient_integrity, ...``) about the rule's strategy. Gradient integrity
  is proved in Z3 with each quantified axis size as an unbounded real >= 2 and the micro-batch
  count likewise (plus the cases size = 1), token counts unbounded: real values are a sound
  relaxation of integers. State consistency, composition safety and the update obligations
  depend on a size only through whether it is 1, 2 or at least 3 (the analyses compare sizes with
  1 and, for reduction order, group sizes with 3, and nothing else), so running them at 1, 2 and 3
  covers every size. A loop with per-micro-batch collectives is unrolled, so with a quantified
  micro-batch count it is checked for m = 1..8 only, and the result says "bounded".
- **Costs** (``prove memory total = ...``): the strategy's closed forms (SymPy) minus the claim
  must simplify to 0: a symbolic identity in every symbol.
- **Identities** (``prove identity ...``): :mod:`placeverify.prove.tensor`.

A refutation always carries a concrete counterexample (a confirmed trace, values where two
closed forms differ, or an exact evaluation).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import z3

from placeverify.cost import analyse
from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity
from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.lower import canonical, lower
from placeverify.lower.resize import resize
from placeverify.prove.claims import ClaimKind, ClaimSense
from placeverify.prove.syntax import Claim, Rule, TApp, TBin, TElem, Term, TName, TNeg, TNum, TSum
from placeverify.prove.tensor import prove_identity
from placeverify.semantics.groups import group_view
from placeverify.semantics.participation import selective
from placeverify.semantics.schedule import Unmodelled
from placeverify.semantics.terms import nonlinear, projection, term_views
from placeverify.syntax import ast
from placeverify.verdicts import Condition, ObligationKind, Verdict
from placeverify.verify import budget, verify
from placeverify.verify.z3 import solve
from placeverify.verify.z3.integrity import encode, loop_is_uniform, mismatch_formula
from placeverify.verify.z3.search import search
from placeverify.verify.z3.solve import SolverStatus

REPRESENTATIVES = (1, 2, 3)  # sizes standing for 1, 2 and every size >= 3
BOUNDED_MICROBATCHES = 8


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claim: Claim
    verdict: Verdict
    method: str
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def as_stated(self) -> bool | None:
        """True if the claim came out as the rule states, False if opposite, None if unknown."""
        if self.verdict is Verdict.UNKNOWN:
            return None
        return (self.verdict is Verdict.PROVED) == (self.claim.expect is ClaimSense.PROVE)


@dataclass(frozen=True, slots=True)
class RuleResult:
    rule: Rule
    claims: tuple[ClaimResult, ...]
    seconds: float

    @property
    def verdict(self) -> Verdict:
        """The rule's own verdict over its claims' verdicts (:meth:`Verdict.worst`: refuted if
        any claim was refuted, else unknown if any is unknown, else proved). Whether the rule
        holds as stated is :attr:`holds`."""
        return Verdict.worst(c.verdict for c in self.claims)

    @property
    def holds(self) -> bool | None:
        states = [c.as_stated for c in self.claims]
        if False in states:
            return False
        if None in states:
            return None
        return True


def check_rule(rule: Rule, timeout_ms: int, budget_s: float | None = None) -> RuleResult:
    """Every claim of a rule; ``budget_s`` bounds them all (``None``: no bound), and a claim
    the budget leaves undecided is *unknown* ("time budget")."""
    started = time.perf_counter()
    strategy = _strategy(rule)
    if budget_s is None:
        return RuleResult(rule, _claims(rule, strategy, timeout_ms), time.perf_counter() - started)
    with budget.active(budget.Budget.start(budget_s, timeout_ms)):
        return RuleResult(rule, _claims(rule, strategy, timeout_ms), time.perf_counter() - started)


def _claims(rule: Rule, strategy: Strategy | None, timeout_ms: int) -> tuple[ClaimResult, ...]:
    results = []
    for claim in rule.claims:
        t0 = time.perf_counter()
        try:
            result = _claim(rule, strategy, claim, timeout_ms)
        except budget.BudgetExhausted as err:
            result = ClaimResult(claim, Verdict.UNKNOWN, budget.TIME_BUDGET, str(err), None)
        results.append(replace(result, seconds=time.perf_counter() - t0))
    return tuple(results)


def _claim(rule: Rule, strategy: Strategy | None, claim: Claim, timeout_ms: int) -> ClaimResult:
    budget.checkpoint()
    bounds = {b.name: b for b in rule.bounds}
    if claim.kind is ClaimKind.IDENTITY:
        assert claim.left is not None and claim.right is not None
        minimums = {b.name: (b.minimum if b.minimum is not None else 0) for b in rule.bounds}
        outcome = prove_identity(claim.left, claim.right, rule.lets, minimums, timeout_ms)
        return ClaimResult(claim, Verdict(outcome.verdict), outcome.method, outcome.detail,
                           outcome.counterexample)
    if strategy is None:
        raise PlaceError([Diagnostic(Severity.ERROR, f"'{claim.kind}' claims are about a "
                                     "strategy; give its model, mesh and placements",
                                     Code.RULE, claim.span)], rule.source)
    if claim.kind is ClaimKind.CONDITIONS:
        return _conditions(rule, strategy, claim, bounds, timeout_ms)
    return _cost(rule, strategy, claim)


def _strategy(rule: Rule) -> Strategy | None:
    if not rule.statements:
        return None
    statements = tuple(rule.statements)
    span = statements[0].span.cover(statements[-1].span)
    return lower(ast.File(statements, span), rule.source)


# ---- conditions ------------------------------------------------------------------------------


def _quantified(rule: Rule, strategy: Strategy, bounds: dict[str, Any]) -> tuple[list[str], bool]:
    axes = [a for a in strategy.mesh.names if a in bounds]
    unknown = [b for b in bounds if b not in strategy.mesh.names and b != "microbatches"]
    if unknown and not any(c.kind is ClaimKind.IDENTITY for c in rule.claims):
        raise PlaceError([Diagnostic(
            Severity.ERROR, f"'for every {unknown[0]}': not a mesh axis of this strategy "
            f"(axes: {', '.join(strategy.mesh.names)}) nor 'microbatches'", Code.RULE,
            bounds[unknown[0]].span)], rule.source)
    return axes, "microbatches" in bounds


def with_microbatches(strategy: Strategy, m: int) -> Strategy:
    """The strategy with another micro-batch count (pipelines included)."""
    placements = tuple(replace(p, microbatches=m) if p.microbatches is not None else p
                       for p in strategy.placements)
    changed = replace(strategy, config=replace(strategy.config, placements=placements, microbatches=m))
    if strategy.step.canonical:
        return replace(changed, step=canonical.derive(changed.config))
    return replace(changed, step=replace(strategy.step, microbatches=m))


def _conditions(rule: Rule, strategy: Strategy, claim: Claim, bounds: dict[str, Any],
                timeout_ms: int) -> ClaimResult:
    axes, quantified_m = _quantified(rule, strategy, bounds)
    wanted = {Condition(c) for c in claim.conditions}
    verdicts: dict[Condition, Verdict] = {c: Verdict.PROVED for c in wanted}
    methods: list[str] = []
    counterexample: dict[str, Any] | None = None
    detail = ""

    def refute(condition: Condition, why: str, evidence: dict[str, Any] | None) -> None:
        nonlocal counterexample, detail
        if verdicts[condition] is not Verdict.REFUTED:
            verdicts[condition] = Verdict.REFUTED
            if counterexample is None:
                counterexample, detail = evidence, why

    if Condition.GRADIENT_INTEGRITY in wanted:
        verdict, method, why, evidence = _integrity_for_every_size(strategy, axes, quantified_m,
                                                                   timeout_ms)
        methods.append(method)
        if verdict is Verdict.REFUTED:
            refute(Condition.GRADIENT_INTEGRITY, why, evidence)
        elif verdict is Verdict.UNKNOWN:
            verdicts[Condition.GRADIENT_INTEGRITY] = Verdict.UNKNOWN
            detail = detail or why
    # every condition's size-structural obligations, at the representative sizes
    ms = REPRESENTATIVES if quantified_m else (strategy.microbatches,)
    for sizes in itertools.product(REPRESENTATIVES, repeat=len(axes)):
        for m in ms:
            case = resize(with_microbatches(strategy, m), dict(zip(axes, sizes, strict=True)))
            verification = verify(case, timeout_ms)
            for o in verification.obligations:
                if o.condition not in wanted or (o.condition is Condition.GRADIENT_INTEGRITY
                                                 and o.kind is ObligationKind.COEFFICIENT):
                    continue
                if o.verdict is Verdict.REFUTED:
                    mesh = ", ".join(f"{a} = {n}" for a, n in zip(axes, sizes, strict=True))
                    refute(o.condition, f"{o.claim}: {o.reason}",
                           {"mesh": dict(zip(axes, sizes, strict=True)), "microbatches": m,
                            "obligation": o.claim, "reason": o.reason,
                            "values": o.counterexample, "where": mesh})
                elif o.verdict is Verdict.UNKNOWN and verdicts[o.condition] is Verdict.PROVED:
                    verdicts[o.condition] = Verdict.UNKNOWN
    if wanted - {Condition.GRADIENT_INTEGRITY}:
        quantified = ", ".join([*axes, *(["microbatches"] if quantified_m else [])]) or "no size"
        methods.append(f"{', '.join(c.label for c in sorted(wanted - {Condition.GRADIENT_INTEGRITY}))}"
                       f" and the update rules: checked at sizes 1, 2 and 3 of {quantified}, which "
                       "stand for every size (these analyses only compare sizes with 1, 2 and 3)")
    overall = Verdict.worst(verdicts.values())
    summary = "; ".join(f"{c.label}: {v.value}" for c, v in sorted(verdicts.items()))
    return ClaimResult(claim, overall, "; ".join(methods), detail or summary, counterexample)


def _integrity_for_every_size(strategy: Strategy, axes: list[str], quantified_m: bool,
                              timeout_ms: int) -> tuple[Verdict, str, str, dict[str, Any] | None]:
    if strategy.config.unused and selective(strategy):  # semantics/participation.py
        return (Verdict.UNKNOWN, "z3", "not modelled: 'only = used' reductions of 'unused' groups "
                "over unbounded sizes (check judges them pattern by pattern)", None)
    if strategy.step.windows:  # several optimizer steps (semantics/steps.py): check judges them
        return (Verdict.UNKNOWN, "z3", "not modelled: several optimizer steps ('microbatches = "
                "[...]') for every size; `placeverify check` judges them at the file's sizes", None)
    if strategy.config.empty:  # semantics/empty.py
        return (Verdict.UNKNOWN, "z3", "not modelled: micro-batches without tokens over unbounded "
                "sizes (check judges them pattern by pattern)", None)
    bounded = quantified_m and not loop_is_uniform(with_microbatches(strategy, 3))
    m_cases: list[Any] = (["one", "many"] if quantified_m and not bounded else
                          list(range(1, BOUNDED_MICROBATCHES + 1)) if bounded else
                          [strategy.microbatches])
    unknown = ""
    for sizes in itertools.product(("one", "many"), repeat=len(axes)):
        for m_case in m_cases:
            m_rep = 1 if m_case == "one" else 3 if m_case == "many" else int(m_case)
            representative = {a: 1 if s == "one" else 3 for a, s in zip(axes, sizes, strict=True)}
            case = resize(with_microbatches(strategy, m_rep), representative)
            symbolic: dict[str, Any] = {a.name: a.size for a in case.mesh.axes}
            assumptions = []
            for axis, s in zip(axes, sizes, strict=True):
                if s == "many":
                    symbolic[axis] = z3.Real(axis)
                    assumptions.append(symbolic[axis] >= 2)
            m_sym: Any = m_rep
            if m_case == "many":
                m_sym = z3.Real("microbatches")
                assumptions.append(m_sym >= 2)
            for judged, group in _judged(case):  # each loss term's projection, where it reaches
                view = group_view(judged, group)
                try:
                    encoded = encode(judged, view, symbolic, m_sym, f"{group.value}_", integer=False)
                except Unmodelled as err:
                    return Verdict.UNKNOWN, "z3", f"not modelled: {err}", None
                if encoded.mixing:
                    return (Verdict.REFUTED, "placement relations",
                            f"a reduction mixes different {group.value} parameters", None)
                outcome = solve.check(z3.And(*assumptions, mismatch_formula(encoded)), timeout_ms)
                if outcome.status is SolverStatus.UNSAT:
                    continue
                found = search(judged, view, timeout_ms)
                if found is not None:
                    _, bad = found.run.mismatches()[0]
                    evidence = {"mesh": found.sizes, "microbatches": found.microbatches,
                                "group": group.value,
                                "tokens": {f"{k}": n for k, n in found.instance.tokens.items()},
                                "consumed": str(bad.consumed), "reference": str(found.run.reference)}
                    return (Verdict.REFUTED, "z3 model confirmed by the exact interpreter",
                            f"{group.value} gradient on {found.sizes}, {found.microbatches} "
                            f"micro-batch(es): consumed {bad.consumed}, single-device "
                            f"{found.run.reference}", evidence)
                unknown = ("the solver timed out" if outcome.status is SolverStatus.UNKNOWN else
                           "a real-valued model exists but no integer counterexample was found")
    quantified = [f"{a} >= 2 (and {a} = 1)" for a in axes]
    if quantified_m:
        quantified.append("microbatches = 1.." + str(BOUNDED_MICROBATCHES) + " (bounded)" if bounded
                          else "microbatches >= 2 (and 1)")
    method = ("gradient integrity: Z3 over unbounded sizes " + ", ".join(quantified)
              if quantified else "gradient integrity: Z3 at the rule's sizes")
    if unknown:
        return Verdict.UNKNOWN, method, unknown, None
    return Verdict.PROVED, method + ", token and sample counts unbounded", "", None


def _judged(strategy: Strategy) -> list[tuple[Strategy, ParamGroup]]:
    """(strategy, group) pairs to encode: with named loss terms, each term's projection on the
    groups it reaches (:mod:`placeverify.semantics.terms`); otherwise every group."""
    if not strategy.terms:
        return [(strategy, g) for g in strategy.model.groups_present()]
    blocker = nonlinear(strategy)
    if blocker is not None:  # several terms under a max: one encoding refuses it (unknown)
        return [(strategy, g) for g in strategy.model.groups_present()]
    return [(projection(strategy, t), g) for t in term_views(strategy)
            for g in strategy.model.groups_present() if t.reaches_group(g)]


# ---- costs --------------------------------------------------------------------------------------


def _sympy_of(term: Term, symbols: dict[str, Any]) -> Any:
    import sympy

    if isinstance(term, TNum):
        return sympy.Rational(str(term.value))
    if isinstance(term, TName):
        if term.name not in symbols:
            symbols[term.name] = sympy.Symbol(term.name, positive=True)
        return symbols[term.name]
    if isinstance(term, TNeg):
        return -_sympy_of(term.value, symbols)
    if isinstance(term, TBin):
        left, right = _sympy_of(term.left, symbols), _sympy_of(term.right, symbols)
        return {"+": left + right, "-": left - right, "*": left * right, "/": left / right,
                "^": left ** right}[term.op]
    if isinstance(term, TApp) and term.name in ("min", "max") and len(term.args) == 2:
        args = [_sympy_of(a, symbols) for a in term.args]
        return sympy.Min(*args) if term.name == "min" else sympy.Max(*args)
    kind = "sum" if isinstance(term, TSum) else "tensor element" if isinstance(term, TElem) else "function"
    raise ValueError(f"a cost formula has numbers, symbols, + - * / ^, min and max; not a {kind}")


def _cost(rule: Rule, strategy: Strategy, claim: Claim) -> ClaimResult:
    import sympy  # loaded only for rules that state a cost

    costs = analyse(strategy, symbolic=True)
    domain: Any = costs.domain
    if claim.kind is ClaimKind.MEMORY:
        device = costs.device_bytes()
        table = {**device, "host": costs.host_bytes(),
                 "states": device["params"] + device["optimizer"] + device["gradients"]}
    else:
        table = {"total": costs.network_bytes(), "state": costs.state_bytes(),
                 "pcie": costs.pcie_bytes(),
                 **{s: costs.traffic(s) for s in ("gradients", "params", "activations", "scalar")}}
    if claim.key not in table:
        raise PlaceError([Diagnostic(Severity.ERROR, f"unknown {claim.kind} quantity "
                                     f"'{claim.key}'; one of {', '.join(table)}", Code.RULE,
                                     claim.span)], rule.source)
    symbols = {str(s): s for s in domain.values}
    assert claim.right is not None
    try:
        stated = _sympy_of(claim.right, symbols)
    except ValueError as err:
        raise PlaceError([Diagnostic(Severity.ERROR, str(err), Code.RULE, claim.span)],
                         rule.source) from None
    derived = table[claim.key]
    difference = sympy.simplify(sympy.sympify(derived) - stated)
    method = ("SymPy: the closed form derived from the placement minus the stated one "
              "simplifies to 0 (an identity in every symbol)")
    if difference == 0:
        return ClaimResult(claim, Verdict.PROVED, method, f"derived: {domain.show(derived)}")
    witness = _differ(derived, stated, domain.values)
    return ClaimResult(claim, Verdict.REFUTED, "SymPy: the closed forms differ",
                       f"derived {domain.show(derived)}; stated {sympy.simplify(stated)}",
                       witness)


def _differ(derived: Any, stated: Any, values: dict[Any, Fraction]) -> dict[str, Any]:
    """Symbol values where the two closed forms differ: the rule's own values if they do,
    otherwise small integers for the symbols that matter."""
    import sympy

    def at(point: dict[Any, Any]) -> tuple[Any, Any]:
        return (sympy.nsimplify(sympy.sympify(derived).subs(point)),
                sympy.nsimplify(sympy.sympify(stated).subs(point)))

    base = {s: sympy.Rational(v.numerator, v.denominator) for s, v in values.items()}
    a, b = at(base)
    if a != b:
        return {"values": {str(s): str(v) for s, v in base.items()}, "derived": str(a),
                "stated": str(b)}
    free = sorted((sympy.sympify(derived) - stated).free_symbols, key=str)
    for combo in itertools.product(range(1, 5), repeat=len(free)):
        point = {**base, **dict(zip(free, combo, strict=True))}
        a, b = at(point)
        if a != b:
            return {"values": {str(s): str(v) for s, v in point.items() if s in free},
                    "derived": str(a), "stated": str(b)}
    return {"values": {}, "derived": str(derived), "stated": str(stated)}
