"""How many optimizer steps a refutation needs before a replay can show it.

Some refutations are about what one optimizer step leaves to the next: gradients never zeroed
(``examples/bugs/grads-not-zeroed``), a token count of the whole generation batch
(``generation-batch-token-count``), both written as several steps (``microbatches = [1, 1]``),
and a state-consistency refutation such as a parameter gathered before its update
(``param-gather-after-forward``), whose stale copy is read by the next step's forward. A
one-step replay of these matches the reference and said "not confirmed", which was the replay's
shortfall, not the verifier's. So a replay runs at least the steps its refutation needs, and says
so when that is more than were asked for.
"""

from __future__ import annotations

from placeverify.obligations import Condition


def steps_needed(windows: int, condition: Condition | None) -> int:
    """Two for a step written over several optimizer steps (``windows``) or a refuted state
    consistency (the state reaches the next step), else one."""
    if windows > 1 or condition is Condition.STATE_CONSISTENCY:
        return 2
    return 1


def at_least(steps: int, windows: int, condition: Condition | None, notes: list[str]) -> int:
    """``steps``, raised to :func:`steps_needed` with a note when that is more."""
    needed = steps_needed(windows, condition)
    if steps >= needed:
        return steps
    notes.append(f"{steps} step{'s' if steps != 1 else ''} asked for: the refutation shows from "
                 f"optimizer step {needed} (a state one step leaves to the next), so "
                 f"{needed} are replayed")
    return needed
