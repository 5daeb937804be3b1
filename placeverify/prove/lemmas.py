"""Two summation lemmas, proved by induction with Z3 checking each base case and inductive step.

Write S_h(n) = sum_{j < n} h(j), defined by S_h(0) = 0 and S_h(n + 1) = S_h(n) + h(n), for an
arbitrary real function h (uninterpreted in Z3).

- **Split** (L1): for all a, b >= 0, S_h(a + b) = S_h(a) + S_{h(a + .)}(b). Induction on b.
- **Partition** (L2): for all t >= 0 and w >= 1,
  sum_{r < t} S_{h(r w + .)}(w) = S_h(t w). Induction on t, whose step uses L1 at a = t w, b = w.

L2 is what makes a sharded computation equal to the unsharded one: t ranks each summing their
block of w consecutive terms, then a sum over the ranks (an all-reduce), add up exactly the t w
terms. Each step is a quantifier-free query (the recursive definitions are unfolded once at the
points the step needs), so Z3 decides it; an inductive step proved for an arbitrary b (or t),
together with its base case, proves the lemma for every value.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import z3


@dataclass(frozen=True, slots=True)
class Lemma:
    name: str
    statement: str
    base: bool
    step: bool
    seconds: float

    @property
    def proved(self) -> bool:
        return self.base and self.step


def _valid(claim: z3.BoolRef, *facts: z3.BoolRef) -> bool:
    solver = z3.Solver()
    solver.set("timeout", 10_000)
    solver.add(*facts, z3.Not(claim))
    return bool(solver.check() == z3.unsat)


@functools.cache
def split_lemma() -> Lemma:
    started = time.perf_counter()
    h = z3.Function("h", z3.IntSort(), z3.RealSort())
    s = z3.Function("S", z3.IntSort(), z3.RealSort())  # S(n) = sum_{j<n} h(j)
    s_shift = z3.Function("S_a", z3.IntSort(), z3.RealSort())  # sum_{j<n} h(a + j)
    a, b = z3.Ints("a b")
    # base b = 0: S(a) = S(a) + S_a(0), with S_a(0) = 0 by definition
    base = _valid(s(a + 0) == s(a) + s_shift(0), s_shift(0) == 0)
    # step: if S(a + b) = S(a) + S_a(b) then S(a + b + 1) = S(a) + S_a(b + 1)
    step = _valid(s(a + b + 1) == s(a) + s_shift(b + 1),
                  a >= 0, b >= 0,
                  s(a + b) == s(a) + s_shift(b),  # induction hypothesis
                  s(a + b + 1) == s(a + b) + h(a + b),  # definition of S, unfolded at a + b
                  s_shift(b + 1) == s_shift(b) + h(a + b))  # definition of S_a, unfolded at b
    return Lemma("split", "sum_{j<a+b} h(j) = sum_{j<a} h(j) + sum_{j<b} h(a+j)", base, step,
                 time.perf_counter() - started)


@functools.cache
def partition_lemma() -> Lemma:
    started = time.perf_counter()
    split = split_lemma()
    s = z3.Function("S", z3.IntSort(), z3.RealSort())  # S(n) = sum_{j<n} h(j)
    total = z3.Function("T", z3.IntSort(), z3.RealSort())  # T(t) = sum_{r<t} G(r)
    block = z3.Function("G", z3.IntSort(), z3.RealSort())  # G(r) = sum_{j<w} h(r w + j)
    block_sum = z3.Function("S_p", z3.IntSort(), z3.RealSort())  # sum_{j<n} h(p + j), p = t w
    t, w, p = z3.Ints("t w p")
    base = _valid(total(0) == s(0), total(0) == 0, s(0) == 0)
    step = split.proved and _valid(
        total(t + 1) == s(p + w),
        t >= 0, w >= 1, p >= 0,  # p stands for t * w
        total(t) == s(p),  # induction hypothesis: T(t) = S(t w)
        total(t + 1) == total(t) + block(t),  # definition of T, unfolded at t
        block(t) == block_sum(w),  # G(t) is the block starting at t w = p
        s(p + w) == s(p) + block_sum(w))  # the split lemma at a = p, b = w
    return Lemma("partition", "sum_{r<t} sum_{j<w} h(r w + j) = sum_{q<t w} h(q)", base, step,
                 time.perf_counter() - started)
