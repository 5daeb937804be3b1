"""Which sizes each verdict covers, in the human report: the file's sizes, and with ``check
--every-size`` every size (:mod:`placeverify.verify.every_size`), its smallest failure and the
counterexample there."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from placeverify.ir.strategy import Strategy
from placeverify.report.styles import VERDICT_STYLE
from placeverify.result import CheckResult
from placeverify.verdicts import CONDITIONS, Verdict


def declared_sizes(s: Strategy) -> str:
    """The file's sizes: ``dp = 2, ep = 2, 1 micro-batch``."""
    mesh = ", ".join(f"{a.name} = {a.size}" for a in s.mesh.axes)
    if s.step.windows:
        steps = f"{len(s.step.windows)} optimizer steps of {', '.join(map(str, s.step.windows))}" \
                " micro-batches"
    else:
        m = s.step.microbatches
        steps = f"{m} micro-batch{'es' if m != 1 else ''}"
    return f"{mesh}, {steps}" if mesh else steps


def render_every_size_verdicts(result: CheckResult, console: Console) -> None:
    """The verdicts table with a column per coverage: the file's sizes, every size."""
    verification, sized = result.verification, result.every_size
    assert verification is not None and sized is not None
    console.print(Text(f"{'verdicts':<24} {'file sizes':<12} every size", style="bold"))
    for condition in CONDITIONS:
        here, every = verification.verdict(condition), sized.verdicts[condition]
        line = Text(f"  {condition.label:<22} ")
        line.append(f"{here.value:<13}", style=VERDICT_STYLE[here])
        line.append(every.value, style=VERDICT_STYLE[every])
        console.print(line)
    console.print(Text(f"  file sizes: {declared_sizes(result.strategy)}", style="dim"))
    covers = sorted(set(sized.covers.values()))
    if len(covers) == 1:
        console.print(Text(f"  every size: {covers[0]}", style="dim"))
    else:
        for condition in CONDITIONS:
            console.print(Text(f"  every size ({condition.label}): {sized.covers[condition]}",
                               style="dim"))


def render_every_size(result: CheckResult, console: Console) -> None:
    """What is not proved for every size: each condition's reason, the smallest sizes of the
    first refutation and, when the file's sizes gave no counterexample, the trace there."""
    verification, sized = result.verification, result.every_size
    assert verification is not None and sized is not None
    for condition in CONDITIONS:
        verdict = sized.verdicts[condition]
        if verdict is Verdict.PROVED:
            continue
        console.print()
        console.print(Text(f"for every size: {verdict.value}: {condition.label}",
                           style=VERDICT_STYLE[verdict]))
        if condition in sized.failures:
            console.print(Text(f"  smallest sizes where it fails: {sized.failures[condition].show()}",
                               style="bold"))
        if sized.reasons.get(condition):
            console.print(f"  {sized.reasons[condition]}")
    failing = sized.at_failing
    if verification.trace is None and failing is not None and failing.trace is not None:
        console.print()
        from placeverify.report.trace_text import render_trace  # deferred: refutations only

        render_trace(failing.trace, console)
    for method in sized.methods:
        console.print(Text(f"  how: {method}", style="dim"))
