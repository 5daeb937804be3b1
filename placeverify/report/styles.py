"""How the human reports colour a verdict (proved green, refuted red, unknown yellow)."""

from __future__ import annotations

from placeverify.verdicts import Verdict

VERDICT_STYLE = {Verdict.PROVED: "bold green", Verdict.REFUTED: "bold red",
                 Verdict.UNKNOWN: "bold yellow"}
