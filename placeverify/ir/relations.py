"""The three ways a parameter group's gradient can relate to the ranks of a mesh axis.

Which one holds for a group and an axis is the axis's role's to say
(:func:`placeverify.roles.relations.relation`).
"""

from __future__ import annotations

from enum import StrEnum


class Relation(StrEnum):
    PARTIAL = "partial"  # ranks hold parts of the gradient: a sum over the axis completes it
    COMPLETE = "complete"  # ranks hold identical full copies: a sum multiplies by the size
    OWNED = "owned"  # ranks hold different parameters: reducing over the axis mixes them
