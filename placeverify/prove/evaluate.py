"""Exact evaluation of a tensor identity on small sizes, with pseudo-random tensors and functions.

When an identity cannot be proved for every size, both sides are evaluated exactly (fractions)
for every size from 0 to 3 that meets its bound; tensors, elementwise functions and free scalars
take pseudo-random rational values fixed by a hash of their name and arguments. A difference is a
counterexample; none proves nothing.
"""

from __future__ import annotations

import hashlib
import itertools
from fractions import Fraction
from typing import Any

from placeverify.prove.syntax import Let, TApp, TElem, Term, TName, TNeg, TNum, TSum
from placeverify.prove.terms import ARITHMETIC, expand, free_vars, index_names_of


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


def search(left: Term, right: Term, lets: dict[str, Let],
            bounds: dict[str, int]) -> dict[str, Any] | None:
    """Sizes (0 to 3, within the bounds) at which the two sides differ, with both values; or None."""
    lhs, rhs = expand(left, lets), expand(right, lets)
    names = sorted((free_vars(lhs) | free_vars(rhs)) & (index_names_of(lhs) | index_names_of(rhs)
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
