"""The partition rewrite: ``sum(r < t) sum(j < w) F(r*w + j)`` becomes ``sum(q < t*w) F(q)``.

A double sum whose body depends on its two indices only through ``r*w + j`` sums the same t*w
terms as one sum over ``q = r*w + j``: the partition lemma L2 of :mod:`placeverify.prove.lemmas`,
proved by induction. This is how t ranks, each summing its block of w columns, followed by an
all-reduce, equal the unsharded sum (Shoeybi et al., arXiv 1909.08053, §3).
"""

from __future__ import annotations

from placeverify.prove.syntax import TApp, TBin, TElem, Term, TName, TNeg, TSum
from placeverify.prove.terms import Poly, free_vars, fresh, mentions, poly, poly_term


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
    if w is None or mentions(w, {r, j}) or j in free_vars(t):
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
            if p is not None and mentions(p, banned):
                rest = dict(p)
                for m, c in target.items():
                    rest[m] = rest.get(m, 0) - c
                rest = {m: c for m, c in rest.items() if c}
                if mentions(rest, banned):
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
