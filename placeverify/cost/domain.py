"""Two number domains for one set of cost formulas.

The cost code is written once against :class:`Domain`. :class:`Exact` evaluates it with exact
rationals (what ``check`` prints and returns, with no SymPy import on the hot path);
:class:`Symbolic` evaluates the same code with SymPy symbols to give closed forms
(``--formulas``). ``Symbolic.values`` maps each symbol to its value, so substituting it into a
closed form must give the exact number, and a test checks that it does for every example.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

Num = Any  # Fraction in the exact domain, a SymPy expression in the symbolic one


class Domain:
    symbolic = False

    def sym(self, name: str, value: int | Fraction) -> Num:
        raise NotImplementedError

    def const(self, value: int | Fraction) -> Num:
        raise NotImplementedError

    def min(self, a: Num, b: Num) -> Num:
        raise NotImplementedError

    def max(self, a: Num, b: Num) -> Num:
        raise NotImplementedError


class Exact(Domain):
    def sym(self, name: str, value: int | Fraction) -> Fraction:
        return Fraction(value)

    def const(self, value: int | Fraction) -> Fraction:
        return Fraction(value)

    def min(self, a: Num, b: Num) -> Fraction:
        return min(Fraction(a), Fraction(b))

    def max(self, a: Num, b: Num) -> Fraction:
        return max(Fraction(a), Fraction(b))


class Symbolic(Domain):
    symbolic = True

    def __init__(self) -> None:
        import sympy

        self._sympy = sympy
        self.values: dict[Any, Fraction] = {}
        self._symbols: dict[str, Any] = {}

    def sym(self, name: str, value: int | Fraction) -> Any:
        symbol = self._symbols.get(name)
        if symbol is None:
            symbol = self._sympy.Symbol(name, positive=True)
            self._symbols[name] = symbol
            self.values[symbol] = Fraction(value)
        return symbol

    def const(self, value: int | Fraction) -> Any:
        value = Fraction(value)
        return self._sympy.Rational(value.numerator, value.denominator)

    def min(self, a: Num, b: Num) -> Any:
        return self._sympy.Min(a, b)

    def max(self, a: Num, b: Num) -> Any:
        return self._sympy.Max(a, b)

    def evaluate(self, expr: Any) -> Fraction:
        """The exact value of a closed form under this domain's symbol values."""
        sympy = self._sympy
        value = sympy.nsimplify(sympy.sympify(expr).subs(
            {s: sympy.Rational(v.numerator, v.denominator) for s, v in self.values.items()}))
        rational = sympy.Rational(value)
        return Fraction(int(rational.p), int(rational.q))

    def show(self, expr: Any) -> str:
        sympy = self._sympy
        return str(sympy.factor_terms(sympy.simplify(expr)))
