"""``--output-format github``: the findings of a run as GitHub Actions workflow commands.

``::error file=F,line=L,col=C,endLine=L2,endColumn=C2,title=T::message`` for each error finding,
``::warning ...`` for each warning, ``::notice ...`` for each note (GitHub's "Workflow commands for
GitHub Actions"). GitHub shows at most 10 annotations of each kind per step and drops the rest
silently, so at most :data:`MAX_PER_KIND` of each are printed (notes one fewer, to leave room) and
one ``::notice`` counts what was left out; a plain summary line ends the output. Values are
escaped as the runner unescapes them: in the message ``%`` -> ``%25``, CR -> ``%0D``,
LF -> ``%0A``; in properties also ``:`` -> ``%3A`` and ``,`` -> ``%2C``. An annotation never fails
a job; the exit code does.
"""

from __future__ import annotations

from collections import Counter

from placeverify.diagnostics import ExitCode
from placeverify.report.findings import Finding
from placeverify.report.outcome import Outcome, fits
from placeverify.verdicts import Verdict

MAX_PER_KIND = 10
COMMAND = {"error": "error", "warning": "warning", "note": "notice"}


def escape_data(text: str) -> str:
    """A workflow command's message, escaped."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value, escaped."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(finding: Finding) -> str:
    """One workflow command for a finding."""
    props = [("file", finding.path)]
    span = finding.span
    if span is not None:
        props += [("line", str(span.line)), ("col", str(span.column)),
                  ("endLine", str(span.end_line)), ("endColumn", str(span.end_column))]
    props.append(("title", f"placeverify: {finding.title}"))
    text = ",".join(f"{k}={escape_property(v)}" for k, v in props)
    return f"::{COMMAND[finding.level]} {text}::{escape_data(finding.message)}"


def render_github(findings: list[Finding], outcomes: list[Outcome], exit_code: ExitCode) -> str:
    """The annotations (capped per kind), a notice for the rest, and a plain summary line."""
    lines: list[str] = []
    shown: Counter[str] = Counter()
    left: Counter[str] = Counter()
    cap = {"error": MAX_PER_KIND, "warning": MAX_PER_KIND, "note": MAX_PER_KIND - 1}
    for finding in findings:
        if shown[finding.level] < cap[finding.level]:
            shown[finding.level] += 1
            lines.append(annotation(finding))
        else:
            left[finding.level] += 1
    if left:
        parts = [f"{left[k]} {name}{'s' if left[k] != 1 else ''}"
                 for k, name in (("error", "error"), ("warning", "warning"), ("note", "note")) if left[k]]
        lines.append(f"::notice title=placeverify::{escape_data(_join(parts))} not shown as "
                     f"annotations (GitHub shows {MAX_PER_KIND} of each kind per step); "
                     "run with --output-format sarif or --json for all of them")
    lines.append(summary(outcomes, exit_code))
    return "\n".join(lines)


def summary(outcomes: list[Outcome], exit_code: ExitCode) -> str:
    """One plain line: how many files, and how many of them each outcome had."""
    counts: Counter[str] = Counter()
    no_fit = 0
    for o in outcomes:
        if o.result is None:
            counts["input error"] += 1
            continue
        overall = o.result.overall()  # with --every-size, the worse of both passes
        counts["not verified" if overall is None else overall.value] += 1
        no_fit += fits(o.result) is False
    order = [Verdict.REFUTED.value, Verdict.UNKNOWN.value, Verdict.PROVED.value, "not verified",
             "input error"]
    parts = [f"{counts[k]} {k}" + ("s" if k == "input error" and counts[k] != 1 else "")
             for k in order if counts[k]]
    files = f"{len(outcomes)} file{'s' if len(outcomes) != 1 else ''}"
    fit = f"; {no_fit} {'does' if no_fit == 1 else 'do'} not fit" if no_fit else ""
    return f"placeverify: {files}: {', '.join(parts) or 'nothing checked'}{fit}; exit {int(exit_code)}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
