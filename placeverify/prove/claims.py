"""The words a rule file's claims are classified by: :class:`placeverify.prove.syntax.Claim`
stores them, and the engine dispatches on them. The values are the words of the rule grammar
(and of ``prove --json``)."""

from __future__ import annotations

from enum import StrEnum


class ClaimKind(StrEnum):
    CONDITIONS = "conditions"  # the verification conditions hold (or fail) for every size
    MEMORY = "memory"  # a per-device memory formula
    COMMUNICATION = "communication"  # a communication-volume formula
    IDENTITY = "identity"  # an identity between tensor expressions


class ClaimSense(StrEnum):
    """Whether a rule states its claim holds or fails."""

    PROVE = "prove"
    REFUTE = "refute"
