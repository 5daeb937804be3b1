"""Verdicts as plain data: what the Z3 backend returns and the report prints.

A :class:`Verification` is the obligations of one strategy and, for a refutation, its
counterexample trace. The verdict, condition and obligation types live one layer down in
:mod:`placeverify.obligations` (so that :mod:`placeverify.trace` can name them without importing
this module) and are importable from here as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from placeverify.obligations import CONDITIONS as CONDITIONS
from placeverify.obligations import Condition as Condition
from placeverify.obligations import Obligation as Obligation
from placeverify.obligations import ObligationKind as ObligationKind
from placeverify.obligations import Verdict as Verdict

if TYPE_CHECKING:  # a verification carries the trace of its first refutation
    from placeverify.trace import Trace


@dataclass(frozen=True, slots=True)
class Verification:
    obligations: tuple[Obligation, ...]
    trace: Trace | None = None  # the counterexample trace of the first refutation
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def verdict(self, condition: Condition) -> Verdict:
        return Verdict.worst(o.verdict for o in self.obligations if o.condition is condition)

    def verdicts(self) -> dict[str, str]:
        return {c.value: self.verdict(c).value for c in CONDITIONS}

    def overall(self) -> Verdict:
        return Verdict.worst(self.verdict(c) for c in CONDITIONS)

    def first_refuted(self) -> Obligation | None:
        for o in self.obligations:
            if o.verdict is Verdict.REFUTED:
                return o
        return None
