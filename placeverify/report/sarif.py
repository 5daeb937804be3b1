"""``--output-format sarif``: the findings of a run as one SARIF 2.1.0 log (OASIS, "Static Analysis
Results Interchange Format Version 2.1.0"), the format GitHub code scanning uploads.

One run; ``tool.driver.rules`` are :data:`placeverify.report.findings.RULES` in that order (each
result names its ``ruleId`` and ``ruleIndex``). A result's location is the statement its
obligation or diagnostic points at; regions count columns in Unicode code points
(``run.columnKind``), ``endColumn`` exclusive as in SARIF §3.30. A region is always given (GitHub
needs ``startLine``): a finding without a span points at line 1. ``partialFingerprints``
(``placeverify/v1``) hash the rule, the file path and what the finding says (an obligation's kind
and claim, a diagnostic's code and message) — never a line number or a timing — so an alert
survives edits that move it; identical findings in one file are numbered. A refutation with a
counterexample trace carries it as ``codeFlows[0].threadFlows[0].locations``: one location per
trace row at its statement's line, the devices' values in its message, then the optimizer's
input against the single-device gradient.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import quote

from placeverify import __version__
from placeverify.diagnostics import ExitCode, Span
from placeverify.report.findings import RULE_IDS, RULES, Finding
from placeverify.report.locate import Locator
from placeverify.trace import Trace

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
FINGERPRINT = "placeverify/v1"
MAX_DEVICES = 8  # devices whose values a trace row's message lists
MAX_VALUES_TEXT = 2000


def sarif_log(findings: list[Finding], exit_code: ExitCode) -> dict[str, Any]:
    """The SARIF log of a run's findings (``exit_code``: the process's)."""
    seen: Counter[str] = Counter()
    results = []
    for finding in findings:
        key = _fingerprint(finding)
        seen[key] += 1
        results.append(_result(finding, key if seen[key] == 1 else f"{key}:{seen[key]}"))
    return {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {
                "name": "placeverify",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [{
                    "id": r.id, "name": r.name,
                    "shortDescription": {"text": r.short},
                    "fullDescription": {"text": r.full},
                    "help": {"text": r.full},
                    "defaultConfiguration": {"level": r.level},
                } for r in RULES],
            }},
            "columnKind": "unicodeCodePoints",
            "invocations": [{"executionSuccessful": exit_code is not ExitCode.INTERNAL_ERROR,
                             "exitCode": int(exit_code)}],
            "results": results,
        }],
    }


def render_sarif(findings: list[Finding], exit_code: ExitCode) -> str:
    return json.dumps(sarif_log(findings, exit_code), indent=2, ensure_ascii=False)


def artifact_uri(path: str) -> str:
    """A file path as a SARIF ``uri``: relative paths (to the working directory, the repository
    root in CI) as URI references with '/' separators; paths outside it as ``file:`` URIs."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.relative_to(Path.cwd())
        except ValueError:
            return p.as_uri()
    return quote(p.as_posix(), safe="/")


def _fingerprint(finding: Finding) -> str:
    text = "\0".join((finding.rule, Path(finding.path).as_posix(), finding.identity))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _region(span: Span | None) -> dict[str, int]:
    if span is None:
        return {"startLine": 1}
    line = max(1, span.line)
    column = max(1, span.column)
    end_line = max(line, span.end_line)
    end_column = max(1, span.end_column)
    if end_line == line:
        end_column = max(end_column, column + 1)
    return {"startLine": line, "startColumn": column, "endLine": end_line, "endColumn": end_column}


def _location(path: str, span: Span | None) -> dict[str, Any]:
    return {"physicalLocation": {"artifactLocation": {"uri": artifact_uri(path)},
                                 "region": _region(span)}}


def _result(finding: Finding, fingerprint: str) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.rule,
        "ruleIndex": RULE_IDS.index(finding.rule),
        "level": finding.level,
        "message": {"text": finding.message},
        "locations": [_location(finding.path, finding.span)],
        "partialFingerprints": {FINGERPRINT: fingerprint},
    }
    if finding.trace is not None:
        flow = code_flow(finding.trace, finding.path, finding.span, finding.locator)
        if flow:
            result["codeFlows"] = [{"message": {"text": "counterexample"},
                                    "threadFlows": [{"locations": flow}]}]
    if finding.properties:
        result["properties"] = dict(finding.properties)
    return result


def code_flow(trace: Trace, path: str, span: Span | None,
              locator: Locator | None = None) -> list[dict[str, Any]]:
    """The counterexample as thread-flow locations: one per trace row, at its statement's line,
    then what the optimizer consumes against the single-device gradient (at the claim's line).
    For an imported configuration (``locator``) a row's line is its key's, in that key's file."""
    out: list[dict[str, Any]] = []

    def add(line: int | None, text: str) -> None:
        line = line or trace.line
        if locator is not None and line:
            file, at = locator.line(line)
        else:
            file, at = path, line or (span.line if span else 1)
        location = _location(file, None)
        location["physicalLocation"]["region"] = {"startLine": at}
        location["message"] = {"text": text}
        out.append({"location": location, "executionOrder": len(out) + 1})

    mesh = ", ".join(f"{a} = {n}" for a, n in trace.mesh.items())
    devices = trace.devices[:MAX_DEVICES]
    more = len(trace.devices) - len(devices)
    if devices:
        for index, step in enumerate(devices[0].steps):
            values = []
            for device in devices:
                row = device.steps[index] if index < len(device.steps) else None
                if row is None:
                    continue
                value = (_num(row.shard) + " (shard)") if row.shard is not None else _num(row.grads)
                values.append(f"{_coords(device.coords)}: {value}")
            mb = "" if step.microbatch is None else f" (micro-batch {step.microbatch})"
            tail = f"; {more} more devices" if more > 0 else ""
            add(step.line, f"{step.op}{mb}: gradient " + "; ".join(values) + tail)
        consumed = "; ".join(f"{_coords(d.coords)}: {_num(d.consumed)}" for d in devices)
        add(None, f"optimizer consumes {consumed}; single-device gradient "
                        f"{_num(trace.reference)} (mesh {mesh}, microbatches {trace.microbatches})")
    elif trace.values:
        text = json.dumps(trace.values, ensure_ascii=False, sort_keys=True)
        if len(text) > MAX_VALUES_TEXT:
            text = text[:MAX_VALUES_TEXT] + " ..."
        add(None, f"counterexample on mesh {mesh}, microbatches {trace.microbatches}: {text}")
    return out


def _num(text: str | None) -> str:
    if text is None:
        return "-"
    try:
        value = Fraction(text)
    except ValueError:
        return text  # an exact sum of square roots, written as the trace holds it
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _coords(coords: dict[str, int]) -> str:
    return ", ".join(f"{a} {c}" for a, c in coords.items()) or "device 0"
