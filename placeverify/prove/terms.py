"""The terms of tensor identities: traversal, substitution, index polynomials, printing.

A term (:data:`placeverify.prove.syntax.Term`) is a number, a name, a tensor element ``X[i, k]``,
an elementwise function ``gelu(x)``, a sum ``sum(j < n) body`` or an arithmetic operation. Index
expressions are integer polynomials in the sizes and bound variables (:func:`poly`); bound
variables are renamed apart with :func:`fresh`, and :func:`canonical` prints a term up to the
names of its bound variables (alpha-equivalence).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

from placeverify.prove.syntax import Let, TApp, TBin, TElem, Term, TName, TNeg, TNum, TSum

Poly = dict[tuple[str, ...], int]  # monomial (sorted variable names) -> coefficient

ARITHMETIC: dict[str, Any] = {"+": operator.add, "-": operator.sub, "*": operator.mul,
                              "/": operator.truediv}


_fresh = itertools.count()


def fresh(base: str) -> str:
    """A variable name not used before in this process (``q__7``; :func:`show` drops the tail)."""
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


def mentions(p: Poly, names: set[str]) -> bool:
    """Whether a monomial of ``p`` mentions one of ``names``."""
    return any(v in names for m in p for v in m)


# ---- printing -----------------------------------------------------------------------------------


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


def index_names_of(term: Term) -> set[str]:
    """The names used as indices or sizes (inside ``X[...]`` or a sum bound) and bound variables."""
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
