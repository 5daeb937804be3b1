"""The search itself: enumerate, screen, evaluate the finalists exactly, verify what is shown.

See :mod:`placeverify.search` for the data flow. Three rules keep it honest:

- every figure printed, ranked by or written is the full model's (``check``'s) on the layout's
  ``.place`` text; the screen only picks the finalists;
- a layout is shown only when its canonical step is proved on all three conditions and its
  predicted peak plus the reserve fits the device; a layout refuted or left unknown is counted
  and named, never shown as a result;
- a layout the language rejects when its text is lowered is counted and its first error said,
  never silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from placeverify.cost import Costs
from placeverify.diagnostics import PlaceError
from placeverify.ir.strategy import Strategy
from placeverify.search.problem import Problem
from placeverify.search.render import place_text
from placeverify.search.screen import Estimate, Screen, Setting
from placeverify.search.space import Layout, Space, layouts

MEMORY_MARGIN = 0.10  # a screened peak this far above the capacity still reaches the full model
BEST_BY_TIME = 160  # finalists taken by screened step time
NEAR_FRONTIER = 0.10  # and those within this much of the screened memory/time frontier
MAX_NEAR_FRONTIER = 160
FRONTIER_SLACK = 1.5  # the frontier shown: layouts at most this many times the fastest's time


@dataclass(frozen=True, slots=True)
class Evaluated:
    """A finalist under the full model."""

    layout: Layout
    text: str
    strategy: Strategy
    costs: Costs
    peak_bytes: int  # predicted peak of the fullest rank, without the reserve
    needed_bytes: int  # with the reserve: what "fits" compares with the device
    fits: bool
    step_seconds: float
    tokens_per_second: float
    mfu: float | None
    screen: Estimate

    @property
    def label(self) -> str:
        return self.layout.label()


@dataclass
class SearchResult:
    problem: Problem
    space: Space
    candidates: int = 0  # legal layouts screened
    screened_fitting: int = 0
    finalists: int = 0
    evaluated: list[Evaluated] = field(default_factory=list)  # fitting, fastest first
    not_fitting: int = 0  # finalists the full model says do not fit
    top: list[Evaluated] = field(default_factory=list)  # proved, fastest first
    frontier: list[Evaluated] = field(default_factory=list)  # proved, by peak memory
    verdicts: dict[str, str] = field(default_factory=dict)  # label -> overall verdict
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (label, first error)
    seconds: dict[str, float] = field(default_factory=dict)  # screen, evaluate, verify, total
    screen_deviation: tuple[float, float] = (0.0, 0.0)  # largest |screen/full - 1|: peak, time

    @property
    def rate(self) -> float:
        """Layouts screened per second."""
        return self.candidates / max(self.seconds.get("screen", 0.0), 1e-9)

    @property
    def dropped(self) -> list[tuple[str, str]]:
        """Layouts not shown because their verdict was not 'proved': (label, verdict)."""
        return [(k, v) for k, v in self.verdicts.items() if v != "proved"]


Report = Callable[[str], None]


def search(problem: Problem, space: Space | None = None, *, top: int = 5, budget_s: float = 10.0,
           slack: float = FRONTIER_SLACK, report: Report = lambda _text: None) -> SearchResult:
    """Search the layouts of a problem (module docstring). The frontier shown is the part of
    it no slower than ``slack`` times the fastest layout (the rest trades more time for less
    memory than anyone would launch)."""
    started = time.perf_counter()
    space = space or Space()
    result = SearchResult(problem, space)
    screen = Screen(Setting(problem.arch, problem.precision, problem.device,
                            problem.compute_dtype, float(problem.pcie_bandwidth)))
    capacity = problem.device_memory - problem.reserve
    report(f"screening the layouts of {problem.devices} devices")
    scored: list[tuple[Layout, Estimate]] = []
    for lay in layouts(problem.arch, problem.devices, problem.global_batch,
                       problem.device.gpus_per_node, space):
        result.candidates += 1
        est = screen.estimate(lay)
        if est.peak_bytes <= capacity * (1 + MEMORY_MARGIN):
            scored.append((lay, est))
    result.screened_fitting = len(scored)
    result.seconds["screen"] = time.perf_counter() - started

    chosen = finalists(scored)
    result.finalists = len(chosen)
    report(f"evaluating {len(chosen)} finalists with the full model")
    mark = time.perf_counter()
    peak_dev = time_dev = 0.0
    for lay, est in chosen:
        evaluated = evaluate(problem, lay, est, result)
        if evaluated is None:
            continue
        peak_dev = max(peak_dev, abs(est.peak_bytes / max(evaluated.peak_bytes, 1) - 1))
        time_dev = max(time_dev, abs(est.step_seconds / evaluated.step_seconds - 1))
        if evaluated.fits:
            result.evaluated.append(evaluated)
        else:
            result.not_fitting += 1
    result.screen_deviation = (peak_dev, time_dev)
    result.evaluated.sort(key=lambda e: (e.step_seconds, e.needed_bytes, e.label))
    result.seconds["evaluate"] = time.perf_counter() - mark

    mark = time.perf_counter()
    report("verifying the layouts shown")
    _verify_shown(result, top, budget_s, slack, report)
    result.seconds["verify"] = time.perf_counter() - mark
    result.seconds["total"] = time.perf_counter() - started
    return result


def finalists(scored: list[tuple[Layout, Estimate]]) -> list[tuple[Layout, Estimate]]:
    """The best layouts by screened time; every layout on the screened memory/time frontier;
    and, up to a bound, those nearest to it (within ``NEAR_FRONTIER`` of the best time at no
    more memory), nearest first."""
    by_time = sorted(scored, key=lambda x: (x[1].step_seconds, x[1].peak_bytes))
    chosen = {x[0]: x for x in by_time[:BEST_BY_TIME]}
    near: list[tuple[float, Layout, Estimate]] = []
    best = float("inf")
    for lay, est in sorted(scored, key=lambda x: (x[1].peak_bytes, x[1].step_seconds)):
        behind = est.step_seconds / best  # < 1: on the screened frontier
        if behind < 1 + NEAR_FRONTIER:
            near.append((behind, lay, est))
        best = min(best, est.step_seconds)
    near.sort(key=lambda x: x[0])
    for index, (behind, lay, est) in enumerate(near):
        if behind >= 1 and index >= MAX_NEAR_FRONTIER:
            break
        chosen.setdefault(lay, (lay, est))
    return list(chosen.values())


def evaluate(problem: Problem, lay: Layout, est: Estimate,
             result: SearchResult | None = None) -> Evaluated | None:
    """The full model's figures for one layout (None, recorded in ``result``, when the language
    rejects its text)."""
    from placeverify.api import costs, load_text
    from placeverify.cost.time import step_time

    text = place_text(problem, lay)
    try:
        strategy = load_text(text, f"<search: {lay.label()}>")
    except PlaceError as error:
        if result is not None:
            result.rejected.append((lay.label(), error.diagnostics[0].message))
        return None
    exact = costs(strategy)
    st = step_time(strategy, exact)
    if st is None or st.step_seconds is None:
        if result is not None:
            result.rejected.append((lay.label(), "no step time: " + "; ".join(st.notes if st else ())))
        return None
    peak = exact.peak.bytes if exact.peak is not None else exact.device_bytes()["total"]
    return Evaluated(lay, text, strategy, exact, round(float(peak)), exact.needed_bytes(),
                     bool(exact.fits()), st.step_seconds, st.tokens_per_second or 0.0, st.mfu,
                     est)


def pareto(items: list[Evaluated]) -> list[Evaluated]:
    """Layouts no other layout beats on both peak memory and step time, by peak ascending."""
    out: list[Evaluated] = []
    best = float("inf")
    for e in sorted(items, key=lambda e: (e.needed_bytes, e.step_seconds, e.label)):
        if e.step_seconds < best:
            out.append(e)
            best = e.step_seconds
    return out


def _verify_shown(result: SearchResult, top: int, budget_s: float, slack: float,
                  report: Report) -> None:
    """Verify layouts in the order they would be shown until ``top`` fastest and the whole
    frontier are proved; what is not proved is dropped (and counted)."""
    from placeverify.api import verify

    def proved(e: Evaluated) -> bool:
        if e.label not in result.verdicts:
            verification = verify(e.strategy, budget_s=budget_s)
            result.verdicts[e.label] = verification.overall().value
            report(f"verified {e.label}: {result.verdicts[e.label]}")
        return result.verdicts[e.label] == "proved"

    for e in result.evaluated:
        if len(result.top) >= top:
            break
        if proved(e):
            result.top.append(e)
    fastest = result.evaluated[0].step_seconds if result.evaluated else 0.0
    pool = [e for e in result.evaluated if e.step_seconds <= slack * fastest]
    while True:
        frontier = pareto(pool)
        bad = [e for e in frontier if not proved(e)]
        if not bad:
            result.frontier = frontier
            return
        pool = [e for e in pool if e not in bad]
