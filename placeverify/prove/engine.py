"""Checking a rule's claims, for every size it quantifies over.

- **Conditions** (``prove gradient_integrity, ...``) about the rule's strategy, for every size of
  the axes and micro-batch count it quantifies: :mod:`placeverify.verify.every_size` (Z3 over
  unbounded real sizes for gradient integrity; sizes 1, 2 and 3, which stand for every size, for
  the other conditions; a loop with per-micro-batch collectives "bounded" to m = 1..8).
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

from placeverify.cost import analyse
from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity
from placeverify.ir.strategy import Strategy
from placeverify.lower import lower
from placeverify.prove.claims import ClaimKind, ClaimSense
from placeverify.prove.syntax import Claim, Rule, TApp, TBin, TElem, Term, TName, TNeg, TNum, TSum
from placeverify.prove.tensor import prove_identity
from placeverify.syntax import ast
from placeverify.verdicts import Condition, Verdict
from placeverify.verify import budget, every_size


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


def _conditions(rule: Rule, strategy: Strategy, claim: Claim, bounds: dict[str, Any],
                timeout_ms: int) -> ClaimResult:
    axes, quantified_m = _quantified(rule, strategy, bounds)
    judged = every_size.conditions(strategy, axes, quantified_m,
                                   {Condition(c) for c in claim.conditions}, timeout_ms)
    summary = "; ".join(f"{c.label}: {v.value}" for c, v in sorted(judged.verdicts.items()))
    return ClaimResult(claim, judged.overall(), "; ".join(judged.methods),
                       judged.detail or summary, judged.counterexample)


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
