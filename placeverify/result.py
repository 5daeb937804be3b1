"""What ``check`` returns: the strategy, its costs and, when verified, its verification (built by
:mod:`placeverify.api`, rendered by :mod:`placeverify.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from placeverify.cost import Costs
from placeverify.ir.strategy import Strategy
from placeverify.verdicts import Verdict, Verification

if TYPE_CHECKING:
    from placeverify.cost.time import StepTime  # loaded only for a timed mesh (start-up time)
    from placeverify.importers.common import Imported  # only configuration files are imported
    from placeverify.verify.every_size import EverySize  # only with check --every-size


@dataclass(frozen=True, slots=True)
class CheckResult:
    strategy: Strategy
    costs: Costs
    verification: Verification | None = None
    formulas: Costs | None = None  # the same costs in the symbolic domain
    time: StepTime | None = None  # when the mesh names a device or gives links
    imported: Imported | None = None  # a configuration's import: its keys' places, its warnings
    every_size: EverySize | None = None  # check --every-size: the conditions for every size

    def overall(self) -> Verdict | None:
        """The verdict the exit code follows: the worst of the file's sizes and, with
        ``--every-size``, of every size; None when not verified."""
        if self.verification is None:
            return None
        if self.every_size is None:
            return self.verification.overall()
        return Verdict.worst([self.verification.overall(), self.every_size.overall()])
