"""Index-level identities of sharded tensor programs, proved for every shard count.

A claim such as Megatron's row-parallel MLP (Shoeybi et al., arXiv 1909.08053, §3)

    sum(r < t) sum(j < w) gelu(Z[i, r*w + j]) * B[r*w + j, c] = sum(q < t*w) gelu(Z[i, q]) * B[q, c]

says: t ranks each sum their block of w columns, and an all-reduce over the ranks gives the
unsharded product. The engine (1) expands ``let`` definitions, (2) rewrites every double sum
whose body depends on its two indices only through ``r*w + j`` into one sum of t*w terms — the
partition lemma (:mod:`placeverify.prove.lemmas`), proved by induction — and (3) asks Z3 whether
the two sides are then equal for every value of the tensors (uninterpreted functions of their
indices), of the elementwise functions (uninterpreted), and of the sizes (integers >= their
bounds). Sums are uninterpreted in step (3), so equal sums must have alpha-equivalent bodies and
equal bounds. When the claim cannot be proved this way it is evaluated exactly on small sizes with
pseudo-random tensors and functions: a difference is a counterexample (refuted); none is unknown.

The terms live in :mod:`placeverify.prove.terms`, the rewrite in :mod:`placeverify.prove.partition`
and the evaluation in :mod:`placeverify.prove.evaluate`; this module encodes and decides.
"""


from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import z3

from placeverify.prove.evaluate import search
from placeverify.prove.lemmas import partition_lemma
from placeverify.prove.partition import partition
from placeverify.prove.syntax import Let, TApp, TElem, Term, TName, TNeg, TNum, TSum
from placeverify.prove.terms import ARITHMETIC, canonical, expand, free_vars, index_names_of, poly, show
from placeverify.verify import budget


@dataclass(frozen=True, slots=True)
class IdentityResult:
    verdict: str  # proved | refuted | unknown
    method: str
    detail: str
    counterexample: dict[str, Any] | None
    seconds: float


# ---- to Z3 ----------------------------------------------------------------------------------------


class _Z3:
    """Terms as Z3 reals: sizes and indices are integers, tensors, elementwise functions and sums
    uninterpreted functions (a sum of its bound and free variables, named by its canonical text)."""

    def __init__(self, index_names: set[str]) -> None:
        self.index_names = index_names
        self.vars: dict[tuple[str, str], Any] = {}
        self.functions: dict[tuple[str, int, str], Any] = {}

    def var(self, name: str, sort: str) -> Any:
        key = (name, sort)
        if key not in self.vars:
            self.vars[key] = z3.Int(name) if sort == "int" else z3.Real(name)
        return self.vars[key]

    def function(self, kind: str, name: str, arity: int) -> Any:
        key = (name, arity, kind)
        if key not in self.functions:
            domain = [z3.IntSort() if kind in ("tensor", "sum") and (kind == "tensor" or i == 0)
                      else z3.RealSort() for i in range(arity)]
            self.functions[key] = z3.Function(f"{kind}_{name}_{arity}", *domain, z3.RealSort())
        return self.functions[key]

    def index(self, term: Term) -> Any:
        p = poly(term)
        if p is None:
            raise ValueError(f"not an index expression: {show(term)}")
        total: Any = z3.IntVal(0)
        for monomial, coeff in p.items():
            factor: Any = z3.IntVal(coeff)
            for v in monomial:
                factor = factor * self.var(v, "int")
            total = total + factor
        return total

    def real(self, term: Term) -> Any:
        if isinstance(term, TNum):
            return z3.RealVal(str(term.value))
        if isinstance(term, TName):
            if term.name in self.index_names:
                return z3.ToReal(self.var(term.name, "int"))
            return self.var(term.name, "real")
        if isinstance(term, TElem):
            f = self.function("tensor", term.name, len(term.indices))
            return f(*[self.index(i) for i in term.indices])
        if isinstance(term, TApp):
            f = self.function("fn", term.name, len(term.args))
            return f(*[self.real(a) for a in term.args])
        if isinstance(term, TSum):
            key = canonical(term)
            frees = sorted(free_vars(term.body) - {term.var})
            f = self.function("sum", hashlib.sha1(key.encode()).hexdigest()[:12], 1 + len(frees))
            args = [self.index(term.bound)] + [
                z3.ToReal(self.var(v, "int")) if v in self.index_names else self.var(v, "real")
                for v in frees]
            return f(*args)
        if isinstance(term, TNeg):
            return -self.real(term.value)
        left, right = self.real(term.left), self.real(term.right)
        if term.op in ARITHMETIC:
            return ARITHMETIC[term.op](left, right)
        exponent = poly(term.right)
        assert exponent is not None and list(exponent) in ([()], [])
        value: Any = z3.RealVal(1)
        for _ in range(exponent.get((), 0)):
            value = value * left
        return value



# ---- the claim ---------------------------------------------------------------------------------------


def prove_identity(left: Term, right: Term, lets: dict[str, Let], bounds: dict[str, int],
                   timeout_ms: int) -> IdentityResult:
    started = time.perf_counter()
    lhs, rhs = expand(left, lets), expand(right, lets)
    lhs, n_left = partition(lhs)
    rhs, n_right = partition(rhs)
    rewrites = n_left + n_right
    lemma = partition_lemma()
    index_names = index_names_of(lhs) | index_names_of(rhs) | set(bounds)
    encoder = _Z3(index_names)
    solver = z3.Solver()
    solver.set("timeout", budget.query_ms(timeout_ms))
    for name, minimum in bounds.items():
        solver.add(encoder.var(name, "int") >= minimum)
    for name in index_names - set(bounds):
        solver.add(encoder.var(name, "int") >= 0)
    try:
        solver.add(encoder.real(lhs) != encoder.real(rhs))
        status = solver.check()
    except ValueError as err:
        return IdentityResult("unknown", "not modelled", str(err), None,
                              time.perf_counter() - started)
    if status == z3.unsat and (rewrites == 0 or lemma.proved):
        how = (f"for every size: {rewrites} application(s) of the partition lemma (proved by "
               "induction) and Z3 congruence over uninterpreted tensors and functions"
               if rewrites else "for every size: Z3 congruence over uninterpreted tensors and "
                                "functions")
        return IdentityResult("proved", how, "", None, time.perf_counter() - started)
    witness = search(left, right, lets, bounds)
    if witness is not None:
        return IdentityResult("refuted", "exact evaluation on small sizes",
                              f"the two sides differ at {witness['sizes']}: {witness['left']} vs "
                              f"{witness['right']}", witness, time.perf_counter() - started)
    reason = "the solver timed out" if status == z3.unknown else \
        "not provable by the partition lemma and congruence, and no small counterexample found"
    return IdentityResult("unknown", "partition lemma and congruence", reason, None,
                          time.perf_counter() - started)
