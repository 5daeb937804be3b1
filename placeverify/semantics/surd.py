"""Exact square roots of whole numbers: the numbers a step reaches with ``|g| ^ 0.5`` factors.

A :class:`Surd` is a finite sum ``q1·√s1 + q2·√s2 + ...`` with rational ``q`` and distinct
square-free whole ``s`` (``s = 1`` is the rational part). Square roots of distinct square-free
numbers are linearly independent over the rationals, so this form is unique: two numbers are
equal exactly when their coefficients are. Sums and products stay in the form
(``√a·√b = k·√c`` with ``a·b = k²·c``, ``c`` square-free); the inverse of ``x + y·√p`` (``x``,
``y`` free of the prime ``p``) is ``(x − y·√p) / (x² − p·y²)``, and the sign of ``x + y·√p`` is
the common sign of ``x`` and ``y``, or, when they differ, the sign of ``x`` times that of
``x² − p·y²``: both by recursion on the primes involved. No floating point takes part in an
equality, a sign or a comparison; ``float()`` exists for the torch replay only.

Every operation returns a :class:`~fractions.Fraction` when its result is rational, so a step
without square roots never sees a :class:`Surd`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Union

Real = Union[Fraction, "Surd"]  # what the exact interpreter computes with


def squarefree(n: int) -> tuple[int, int]:
    """``n = k² · s`` with ``s`` square-free: (k, s), for n >= 1."""
    k, s, p = 1, n, 2
    while p * p <= s:
        while s % (p * p) == 0:
            s //= p * p
            k *= p
        p += 1
    return k, s


def _primes(s: int) -> list[int]:
    out, p = [], 2
    while p * p <= s:
        if s % p == 0:
            out.append(p)
            s //= p
        p += 1
    if s > 1:
        out.append(s)
    return out


def sqrt_of(n: int) -> Real:
    """The square root of a whole number n >= 1, exactly."""
    if n < 1:
        raise ValueError(f"no real square root of {n} here")
    k, s = squarefree(n)
    return Fraction(k) if s == 1 else Surd({s: Fraction(k)})


def _terms(x: Real | int) -> dict[int, Fraction]:
    if isinstance(x, Surd):
        return dict(x.terms)
    value = Fraction(x)
    return {1: value} if value else {}


def _make(terms: Mapping[int, Fraction]) -> Real:
    kept = {s: q for s, q in terms.items() if q}
    if not kept:
        return Fraction(0)
    if set(kept) == {1}:
        return kept[1]
    return Surd(kept)


class Surd:
    """A number ``Σ q_s·√s`` (see the module docstring); immutable and hashable."""

    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[int, Fraction]) -> None:
        self.terms: dict[int, Fraction] = {s: Fraction(q) for s, q in sorted(terms.items()) if q}

    # ---- arithmetic ----------------------------------------------------------------------------

    def __add__(self, other: Real | int) -> Real:
        out = _terms(self)
        for s, q in _terms(other).items():
            out[s] = out.get(s, Fraction(0)) + q
        return _make(out)

    __radd__ = __add__

    def __neg__(self) -> Real:
        return _make({s: -q for s, q in self.terms.items()})

    def __sub__(self, other: Real | int) -> Real:
        return self + (-other if isinstance(other, Surd) else -Fraction(other))

    def __rsub__(self, other: Real | int) -> Real:
        return -self + other

    def __mul__(self, other: Real | int) -> Real:
        out: dict[int, Fraction] = {}
        for s1, q1 in self.terms.items():
            for s2, q2 in _terms(other).items():
                g = math.gcd(s1, s2)
                s = (s1 // g) * (s2 // g)  # square-free: the shared primes left as g²
                out[s] = out.get(s, Fraction(0)) + q1 * q2 * g
        return _make(out)

    __rmul__ = __mul__

    def __truediv__(self, other: Real | int) -> Real:
        return self * inverse(other)

    def __rtruediv__(self, other: Real | int) -> Real:
        return inverse(self) * other

    # ---- order ------------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Surd):
            return self.terms == other.terms
        if isinstance(other, Fraction | int):
            return False  # a Surd is never rational (rational results are Fractions)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.terms.items()))

    def __lt__(self, other: Real | int) -> bool:
        return sign(self - other) < 0

    def __le__(self, other: Real | int) -> bool:
        return sign(self - other) <= 0

    def __gt__(self, other: Real | int) -> bool:
        return sign(self - other) > 0

    def __ge__(self, other: Real | int) -> bool:
        return sign(self - other) >= 0

    # ---- conversions ------------------------------------------------------------------------------

    def __float__(self) -> float:
        return sum(float(q) * math.sqrt(s) for s, q in self.terms.items())

    def __str__(self) -> str:
        parts = [str(q) if s == 1 else f"sqrt({s})" if q == 1 else f"-sqrt({s})" if q == -1
                 else f"{q}*sqrt({s})" for s, q in self.terms.items()]
        return " + ".join(parts).replace("+ -", "- ")

    def __repr__(self) -> str:
        return f"Surd({self.terms!r})"


def _split(x: Real, p: int) -> tuple[Real, Real]:
    """``x = a + b·√p`` with a and b free of the prime p."""
    a: dict[int, Fraction] = {}
    b: dict[int, Fraction] = {}
    for s, q in _terms(x).items():
        if s % p:
            a[s] = q
        else:
            b[s // p] = q
    return _make(a), _make(b)


def _largest_prime(x: Real) -> int | None:
    primes = [p for s in _terms(x) for p in _primes(s)]
    return max(primes) if primes else None


def sign(x: Real | int) -> int:
    """-1, 0 or 1, exactly."""
    if not isinstance(x, Surd):
        value = Fraction(x)
        return (value > 0) - (value < 0)
    p = _largest_prime(x)
    assert p is not None  # a Surd has an irrational part
    a, b = _split(x, p)
    sa, sb = sign(a), sign(b)
    if sa == 0 or sa == sb:
        return sb
    if sb == 0:
        return sa
    return sa * sign(a * a - p * (b * b))


def inverse(x: Real | int) -> Real:
    """1 / x, exactly (x != 0)."""
    if not isinstance(x, Surd):
        return 1 / Fraction(x)
    p = _largest_prime(x)
    assert p is not None
    a, b = _split(x, p)
    conjugate = a - b * Surd({p: Fraction(1)})
    norm = a * a - p * (b * b)  # free of p
    return conjugate * inverse(norm)


def text(x: Real | None) -> str | None:
    """A number as a trace writes it: ``p/q``, or ``q*sqrt(s) + ...`` with square roots."""
    return None if x is None else str(x)
