"""Which refutations a numeric replay can witness: those about the values a run computes. The
others are about the step's statements, and the replay judges the rest and says so."""

from __future__ import annotations

from placeverify.verdicts import ObligationKind, Verdict, Verification

# Refutations of statements, not of the values a run computes, which no replay can witness: the
# placement's bookkeeping (its modes; memory's layout against the step), and a frozen group reduced
# or updated (in a run that keeps it frozen it has no grad, which torch's optimizers skip).
UNWITNESSED = frozenset({ObligationKind.PLACEMENT_STEP, ObligationKind.REALISABLE,
                         ObligationKind.FROZEN})
# A collective's group against the placement (composition safety) is witnessed through the values
# it leaves, which the other obligations judge: with all of them proved, a reduction over ranks
# holding different parameters changes nothing the run computes (its mixed shard overwritten
# before anything reads it, semantics/buffers.py, GradMachine._settle_mix), so no run can show it.
GROUP_ONLY = frozenset({ObligationKind.REDUCTION_GROUP})


def unwitnessed_notes(known: Verification | None) -> list[str]:
    """A note for each refutation no run can show (UNWITNESSED): the replay judges the rest."""
    return [f"not replayed: the refutation at line {o.span.line if o.span else '?'} ({o.kind.value}"
            ") is about the step's statements, not the values a run computes; the replay judges "
            "the other obligations" for o in (known.obligations if known else ())
            if o.kind in UNWITNESSED and o.verdict is Verdict.REFUTED]
