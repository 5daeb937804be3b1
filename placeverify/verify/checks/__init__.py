"""The verification families, one module each, in the order their obligations are reported.

Each module exports ``CHECK`` (:class:`placeverify.verify.check.Check`); adding a family is a
module here and a line below.
"""

from __future__ import annotations

from placeverify.verify.check import Check
from placeverify.verify.checks import composition, consistency, frozen, integrity, update

CHECKS: tuple[Check, ...] = (integrity.CHECK, update.CHECK, frozen.CHECK, consistency.CHECK,
                             composition.CHECK)
