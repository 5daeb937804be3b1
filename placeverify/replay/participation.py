"""The torch replay of a participation pattern (:mod:`placeverify.semantics.participation`).

A run realises one pattern (``RunSpec.idle``): a backward in a micro-batch that leaves a group
unused adds nothing to that group's gradient on any rank, and an ``only = used`` collective leaves
the group's buffer as it is there (:mod:`placeverify.replay.step`,
:mod:`placeverify.replay.collectives`); the single-device reference leaves that micro-batch's
sequences out of the group's gradient (:func:`placeverify.replay.idle.idle_grads`). This module
chooses the pattern and imports no torch (the replay's parent process runs it). A file refuted with
every group used is replayed so (an idle micro-batch can hide a divergence: a zero gradient updates
nothing); otherwise the pattern replayed is the first one under which Z3 refutes the file, so the
run shows the divergence the verdict claims; for a file proved under every pattern, the one with
the most idle micro-batches.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.semantics.participation import Pattern, patterns, with_pattern
from placeverify.semantics.schedule import Unmodelled

if TYPE_CHECKING:
    from placeverify.trace import Trace


def realised(strategy: Strategy, idle: list[tuple[str, list[int]]]) -> Strategy:
    """The strategy under the pattern a run spec names."""
    groups = {g.value: g for g in ParamGroup}
    return with_pattern(strategy, Pattern(tuple((groups[g], frozenset(ks)) for g, ks in idle)))


def trace_idle(trace: Trace) -> list[tuple[str, list[int]]]:
    """The pattern a trace refutes (its ``values.participation``: [group, [micro-batches]]
    pairs), checked: a malformed one is a ValueError (the replay refuses the trace)."""
    raw = trace.values.get("participation")
    names = {g.value for g in ParamGroup}
    out: list[tuple[str, list[int]]] = []
    if not isinstance(raw, list):
        raise ValueError("the trace's participation pattern is not a list")
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and item[0] in names
                and isinstance(item[1], list)
                and all(isinstance(k, int) and 0 <= k < trace.microbatches for k in item[1])):
            raise ValueError(f"the trace's participation pattern has a bad entry {item!r}: "
                             "expected [group, [micro-batch, ...]]")
        out.append((str(item[0]), [int(k) for k in item[1]]))
    return out


def chosen_idle(strategy: Strategy, timeout_ms: int) -> list[tuple[str, list[int]]]:
    """The pattern to replay (module docstring), as a run spec names it."""
    from placeverify.api import verify

    try:
        every = patterns(strategy)
    except Unmodelled:
        return []
    found = [p for p in every if any(ks for _g, ks in p.idle)]
    refuted = verify(strategy, timeout_ms).first_refuted() is not None
    used = replace(strategy, config=replace(strategy.config, unused=frozenset()))  # all used
    if refuted and verify(used, timeout_ms).first_refuted() is not None:
        return []  # refuted with every group used: the run shows it without idling any
    pick: Pattern | None = None
    for pattern in found:
        if verify(with_pattern(strategy, pattern), timeout_ms).first_refuted() is not None:
            pick = pattern
            break
    if pick is None and not refuted and found:
        pick = max(found, key=lambda p: sum(len(ks) for _g, ks in p.idle))
    if pick is None:
        return []
    return [(g.value, sorted(ks)) for g, ks in pick.idle if ks]
