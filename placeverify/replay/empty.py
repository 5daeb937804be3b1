"""The torch replay of micro-batches without tokens (:mod:`placeverify.semantics.empty`).

A run realises one pattern (``RunSpec.empty``): the atoms of those micro-batches get 0 tokens, so
every label of theirs is ignored, as a micro-batch made of padding rows; a backward whose factor
divides by the micro-batch's own count computes 0/0 = NaN there (and the run's gradients are
NaN), one normalised by a count over the step adds the zero gradient it computes. The
single-device reference is the loss over the global batch, whose count leaves those atoms out.
The pattern replayed is the first one under which the file is refuted, so the run shows the
divergence the verdict claims; for a file proved under every pattern, micro-batch 0 empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from placeverify.ir.strategy import Strategy
from placeverify.semantics.empty import patterns, with_empty
from placeverify.semantics.schedule import Unmodelled

if TYPE_CHECKING:
    from placeverify.trace import Trace


def trace_empty(trace: Trace) -> list[int]:
    """The micro-batches without tokens a trace refutes (its ``values.empty``), checked: a
    malformed list is a ValueError (the replay refuses the trace)."""
    raw = trace.values.get("empty")
    if not (isinstance(raw, list) and all(isinstance(k, int) and 0 <= k < trace.microbatches
                                          for k in raw)):
        raise ValueError(f"the trace's empty micro-batches {raw!r} are not a list of micro-batches")
    return sorted(raw)


def chosen_empty(strategy: Strategy, timeout_ms: int) -> list[int]:
    """The pattern to replay (module docstring), as a run spec names it."""
    from placeverify.api import verify

    try:
        found = [p for p in patterns(strategy) if p]
    except Unmodelled:
        return []
    for pattern in found:
        if verify(with_empty(strategy, pattern), timeout_ms).first_refuted() is not None:
            return sorted(pattern)
    return sorted(found[0]) if found else []
