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
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import z3

from placeverify.prove.lemmas import partition_lemma
from placeverify.prove.syntax import Let, TApp, TBin, TElem, Term, TName, TNeg, TNum, TSum

Poly = dict[tuple[str, ...], int]  # monomial (sorted variable names) -> coefficient

ARITHMETIC: dict[str, Any] = {"+": operator.add, "-": operator.sub, "*": operator.mul,
                              "/": operator.truediv}


@dataclass(frozen=True, slots=True)
class IdentityResult:
    verdict: str  # proved | refuted | unknown
    method: str
    detail: str
    counterexample: dict[str, Any] | None
    seconds: float


_fresh = itertools.count()


def fresh(base: str) -> str:
    return f"{base}__{next(_fresh)}"


# ---- traversal and substitution -----------------------------------------------------------------


def free_vars(term: Term) -> set[str]:
    if isinstance(term, TNum):
        return set()
    if isinstance(term, TName):
        return {term.name}
    if isinstance(term, TElem):
        return set().union(*(free_vars(i) for i in term.indices))
    if isinstance(term, TApp):
        return set().union(*(free_vars(a) for a in term.args))
    if isinstance(term, TSum):
        return free_vars(term.bound) | (free_vars(term.body) - {term.var})
    if isinstance(term, TBin):
        return free_vars(term.left) | free_vars(term.right)
    return free_vars(term.value)


def substitute(term: Term, mapping: dict[str, Term]) -> Term:
    if not mapping:
        return term
    if isinstance(term, TNum):
        return term
    if isinstance(term, TName):
        return mapping.get(term.name, term)
    if isinstance(term, TElem):
        return TElem(term.name, tuple(substitute(i, mapping) for i in term.indices))
    if isinstance(term, TApp):
        return TApp(term.name, tuple(substitute(a, mapping) for a in term.args))
    if isinstance(term, TSum):
        inner = {k: v for k, v in mapping.items() if k != term.var}
        var, body = term.var, term.body
        if any(var in free_vars(v) for v in inner.values()):
            renamed = fresh(var)
            body = substitute(body, {var: TName(renamed)})
            var = renamed
        return TSum(var, substitute(term.bound, mapping), substitute(body, inner))
    if isinstance(term, TBin):
        return TBin(term.op, substitute(term.left, mapping), substitute(term.right, mapping))
    return TNeg(substitute(term.value, mapping))


def expand(term: Term, lets: dict[str, Let], depth: int = 0) -> Term:
    """Replace defined tensors by their definitions (recursively)."""
    if depth > 50:
        raise ValueError("let definitions refer to each other in a cycle")
    if isinstance(term, TElem) and term.name in lets:
        let = lets[term.name]
        if len(let.params) != len(term.indices):
            raise ValueError(f"'{term.name}' takes {len(let.params)} indices, got "
                             f"{len(term.indices)}")
        indices = [expand(i, lets, depth) for i in term.indices]
        return expand(substitute(let.body, dict(zip(let.params, indices, strict=True))), lets,
                      depth + 1)
    if isinstance(term, TElem):
        return TElem(term.name, tuple(expand(i, lets, depth) for i in term.indices))
    if isinstance(term, TApp):
        return TApp(term.name, tuple(expand(a, lets, depth) for a in term.args))
    if isinstance(term, TSum):
        return TSum(term.var, expand(term.bound, lets, depth), expand(term.body, lets, depth))
    if isinstance(term, TBin):
        return TBin(term.op, expand(term.left, lets, depth), expand(term.right, lets, depth))
    if isinstance(term, TNeg):
        return TNeg(expand(term.value, lets, depth))
    return term


# ---- index polynomials ---------------------------------------------------------------------------


def poly(term: Term) -> Poly | None:
    """The term as a polynomial with integer coefficients, or None if it is not one."""
    if isinstance(term, TNum):
        return {(): int(term.value)} if isinstance(term.value, int) else None
    if isinstance(term, TName):
        return {(term.name,): 1}
    if isinstance(term, TNeg):
        inner = poly(term.value)
        return None if inner is None else {m: -c for m, c in inner.items()}
    if isinstance(term, TBin) and term.op in "+-*":
        left, right = poly(term.left), poly(term.right)
        if left is None or right is None:
            return None
        if term.op == "*":
            out: Poly = {}
            for (m1, c1), (m2, c2) in itertools.product(left.items(), right.items()):
                key = tuple(sorted(m1 + m2))
                out[key] = out.get(key, 0) + c1 * c2
            return {m: c for m, c in out.items() if c}
        sign = 1 if term.op == "+" else -1
        out = dict(left)
        for m, c in right.items():
            out[m] = out.get(m, 0) + sign * c
        return {m: c for m, c in out.items() if c}
    return None


def poly_term(p: Poly) -> Term:
    terms: list[Term] = []
    for monomial, coeff in sorted(p.items()):
        factors: list[Term] = [TName(v) for v in monomial]
        if coeff != 1 or not factors:
            factors.insert(0, TNum(coeff))
        term = factors[0]
        for f in factors[1:]:
            term = TBin("*", term, f)
        terms.append(term)
    if not terms:
        return TNum(0)
    out = terms[0]
    for t in terms[1:]:
        out = TBin("+", out, t)
    return out


def _mentions(p: Poly, names: set[str]) -> bool:
    return any(v in names for m in p for v in m)


# ---- the partition rewrite ----------------------------------------------------------------------


def partition(term: Term) -> tuple[Term, int]:
    """Rewrite sum(r<t) sum(j<w) F(r*w + j) into sum(q<t*w) F(q) everywhere; count rewrites."""
    if isinstance(term, TSum):
        bound, n1 = partition(term.bound)
        body, n2 = partition(term.body)
        term = TSum(term.var, bound, body)
        rewritten = _partition_once(term)
        if rewritten is not None:
            again, n3 = partition(rewritten)
            return again, n1 + n2 + 1 + n3
        return term, n1 + n2
    if isinstance(term, TElem):
        parts = [partition(i) for i in term.indices]
        return TElem(term.name, tuple(p for p, _ in parts)), sum(n for _, n in parts)
    if isinstance(term, TApp):
        parts = [partition(a) for a in term.args]
        return TApp(term.name, tuple(p for p, _ in parts)), sum(n for _, n in parts)
    if isinstance(term, TBin):
        left, n1 = partition(term.left)
        right, n2 = partition(term.right)
        return TBin(term.op, left, right), n1 + n2
    if isinstance(term, TNeg):
        inner, n = partition(term.value)
        return TNeg(inner), n
    return term, 0


def _partition_once(term: TSum) -> Term | None:
    inner = term.body
    if not isinstance(inner, TSum):
        return None
    r, j = term.var, inner.var
    w = poly(inner.bound)
    t = term.bound
    if w is None or _mentions(w, {r, j}) or j in free_vars(t):
        return None
    # r*w + j as a polynomial
    target: Poly = {}
    for monomial, coeff in w.items():
        key = tuple(sorted((*monomial, r)))
        target[key] = target.get(key, 0) + coeff
    target[(j,)] = target.get((j,), 0) + 1
    q = fresh("q")
    body = _replace_index(inner.body, target, q, {r, j})
    if body is None or free_vars(body) & {r, j}:
        return None
    return TSum(q, TBin("*", t, inner.bound), body)


def _replace_index(term: Term, target: Poly, q: str, banned: set[str]) -> Term | None:
    """Replace r*w + j by q in every index polynomial; None if r or j appear otherwise."""
    if isinstance(term, TElem):
        indices: list[Term] = []
        for index in term.indices:
            p = poly(index)
            if p is not None and _mentions(p, banned):
                rest = dict(p)
                for m, c in target.items():
                    rest[m] = rest.get(m, 0) - c
                rest = {m: c for m, c in rest.items() if c}
                if _mentions(rest, banned):
                    return None
                rest[(q,)] = rest.get((q,), 0) + 1
                indices.append(poly_term(rest))
            else:
                replaced = _replace_index(index, target, q, banned)
                if replaced is None:
                    return None
                indices.append(replaced)
        return TElem(term.name, tuple(indices))
    if isinstance(term, TApp):
        args = [_replace_index(a, target, q, banned) for a in term.args]
        return None if any(a is None for a in args) else TApp(term.name, tuple(args))  # type: ignore[arg-type]
    if isinstance(term, TSum):
        if term.var in banned:
            return None
        bound = _replace_index(term.bound, target, q, banned)
        body = _replace_index(term.body, target, q, banned)
        return None if bound is None or body is None else TSum(term.var, bound, body)
    if isinstance(term, TBin):
        left = _replace_index(term.left, target, q, banned)
        right = _replace_index(term.right, target, q, banned)
        return None if left is None or right is None else TBin(term.op, left, right)
    if isinstance(term, TNeg):
        inner = _replace_index(term.value, target, q, banned)
        return None if inner is None else TNeg(inner)
    if isinstance(term, TName) and term.name in banned:
        return None
    return term


# ---- to Z3 ----------------------------------------------------------------------------------------


class _Z3:
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


def canonical(term: Term, names: dict[str, str] | None = None) -> str:
    """A text of the term with bound variables numbered (alpha-equivalence)."""
    names = dict(names or {})
    if isinstance(term, TNum):
        return str(term.value)
    if isinstance(term, TName):
        return names.get(term.name, term.name)
    if isinstance(term, TElem):
        return f"{term.name}[{','.join(_canonical_index(i, names) for i in term.indices)}]"
    if isinstance(term, TApp):
        return f"{term.name}({','.join(canonical(a, names) for a in term.args)})"
    if isinstance(term, TSum):
        inner = dict(names)
        inner[term.var] = f"@{len(names)}"
        return f"sum({inner[term.var]}<{_canonical_index(term.bound, names)}){canonical(term.body, inner)}"
    if isinstance(term, TNeg):
        return f"-({canonical(term.value, names)})"
    return f"({canonical(term.left, names)}{term.op}{canonical(term.right, names)})"


def _canonical_index(term: Term, names: dict[str, str]) -> str:
    p = poly(term)
    if p is None:
        return canonical(term, names)
    renamed: Poly = {}
    for monomial, coeff in p.items():
        key = tuple(sorted(names.get(v, v) for v in monomial))
        renamed[key] = renamed.get(key, 0) + coeff
    return "+".join(f"{c}*{'*'.join(m)}" for m, c in sorted(renamed.items()) if c)


def show(term: Term) -> str:
    if isinstance(term, TNum):
        return str(term.value)
    if isinstance(term, TName):
        return term.name.split("__")[0]
    if isinstance(term, TElem):
        return f"{term.name}[{', '.join(show(i) for i in term.indices)}]"
    if isinstance(term, TApp):
        return f"{term.name}({', '.join(show(a) for a in term.args)})"
    if isinstance(term, TSum):
        return f"sum({term.var.split('__')[0]} < {show(term.bound)}) {show(term.body)}"
    if isinstance(term, TNeg):
        return f"-{show(term.value)}"
    return f"({show(term.left)} {term.op} {show(term.right)})"


# ---- exact evaluation on small sizes ---------------------------------------------------------------


def _pseudo(*key: Any) -> Fraction:
    digest = hashlib.sha256(repr(key).encode()).digest()
    return Fraction(int.from_bytes(digest[:2], "big") % 19 - 9, 1 + digest[2] % 4)


def evaluate(term: Term, env: dict[str, Fraction]) -> Fraction:
    if isinstance(term, TNum):
        return Fraction(term.value)
    if isinstance(term, TName):
        if term.name not in env:
            env[term.name] = _pseudo("scalar", term.name)
        return env[term.name]
    if isinstance(term, TElem):
        return _pseudo("tensor", term.name, *(evaluate(i, env) for i in term.indices))
    if isinstance(term, TApp):
        return _pseudo("fn", term.name, *(evaluate(a, env) for a in term.args))
    if isinstance(term, TSum):
        bound = evaluate(term.bound, env)
        total = Fraction(0)
        for k in range(max(0, int(bound))):
            inner = dict(env)
            inner[term.var] = Fraction(k)
            total += evaluate(term.body, inner)
        return total
    if isinstance(term, TNeg):
        return -evaluate(term.value, env)
    left, right = evaluate(term.left, env), evaluate(term.right, env)
    if term.op == "/" and not right:
        return Fraction(0)  # a division by zero on a tiny size: both sides see the same rule
    if term.op in ARITHMETIC:
        return Fraction(ARITHMETIC[term.op](left, right))
    return left ** int(right)


# ---- the claim ---------------------------------------------------------------------------------------


def prove_identity(left: Term, right: Term, lets: dict[str, Let], bounds: dict[str, int],
                   timeout_ms: int) -> IdentityResult:
    started = time.perf_counter()
    lhs, rhs = expand(left, lets), expand(right, lets)
    lhs, n_left = partition(lhs)
    rhs, n_right = partition(rhs)
    rewrites = n_left + n_right
    lemma = partition_lemma()
    index_names = _index_names(lhs) | _index_names(rhs) | set(bounds)
    encoder = _Z3(index_names)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
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
    witness = _search(left, right, lets, bounds)
    if witness is not None:
        return IdentityResult("refuted", "exact evaluation on small sizes",
                              f"the two sides differ at {witness['sizes']}: {witness['left']} vs "
                              f"{witness['right']}", witness, time.perf_counter() - started)
    reason = "the solver timed out" if status == z3.unknown else \
        "not provable by the partition lemma and congruence, and no small counterexample found"
    return IdentityResult("unknown", "partition lemma and congruence", reason, None,
                          time.perf_counter() - started)


def _index_names(term: Term) -> set[str]:
    out: set[str] = set()

    def visit(t: Term, in_index: bool) -> None:
        if isinstance(t, TName):
            if in_index:
                out.add(t.name)
        elif isinstance(t, TElem):
            for i in t.indices:
                visit(i, True)
        elif isinstance(t, TApp):
            for a in t.args:
                visit(a, in_index)
        elif isinstance(t, TSum):
            out.add(t.var)
            visit(t.bound, True)
            visit(t.body, in_index)
        elif isinstance(t, TBin):
            visit(t.left, in_index)
            visit(t.right, in_index)
        elif isinstance(t, TNeg):
            visit(t.value, in_index)

    visit(term, False)
    return out


def _search(left: Term, right: Term, lets: dict[str, Let],
            bounds: dict[str, int]) -> dict[str, Any] | None:
    lhs, rhs = expand(left, lets), expand(right, lets)
    names = sorted((free_vars(lhs) | free_vars(rhs)) & (_index_names(lhs) | _index_names(rhs)
                                                          | set(bounds)))
    for values in itertools.product(range(0, 4), repeat=len(names)):
        env = {n: Fraction(v) for n, v in zip(names, values, strict=True)}
        if any(env[n] < bounds.get(n, 0) for n in names):
            continue
        a, b = evaluate(lhs, dict(env)), evaluate(rhs, dict(env))
        if a != b:
            return {"sizes": {n: int(v) for n, v in env.items()}, "left": str(a),
                    "right": str(b)}
    return None
