"""``placeverify prove``: check rule files and report, per rule, its verdict, time and evidence.

Exit codes follow ``check``: 0 when every rule holds as stated (its ``prove`` claims proved, its
``refute`` claims refuted with a counterexample), 1 when a claim comes out opposite to what its
rule states, 3 when a claim is unknown, 2 for a malformed rule, 4 for an unreadable file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from placeverify.console import Progress, print_errors, worst
from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity
from placeverify.prove.engine import RuleResult, check_rule
from placeverify.prove.syntax import parse_rule
from placeverify.syntax.source import read_source
from placeverify.verdicts import Verdict

PROVE_SCHEMA = "placeverify.prove/1"
STYLE = {Verdict.PROVED: "bold green", Verdict.REFUTED: "bold red", Verdict.UNKNOWN: "bold yellow"}


def rule_files(paths: tuple[str, ...] | list[str]) -> list[str]:
    out: list[str] = []
    for item in paths:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*.rule"))
            if not found:
                raise PlaceError([Diagnostic(Severity.ERROR, f"no .rule files under {item}",
                                             Code.READ)], None, ExitCode.READ_ERROR)
            out.extend(found)
        else:
            out.append(item)
    return out


PROVE_QUERY_CAP_MS = 30_000  # one solver query at most, within the rule's budget


def prove_file(path: str, budget_s: float | None = None,
               timeout_ms: int = PROVE_QUERY_CAP_MS) -> RuleResult:
    """A rule file's result; ``budget_s`` bounds the whole file (claims it leaves undecided are
    unknown, "time budget"), ``timeout_ms`` each solver query."""
    return check_rule(parse_rule(read_source(path)), timeout_ms, budget_s)


def result_document(result: RuleResult) -> dict[str, Any]:
    return {
        "file": result.rule.source.path,
        "rule": result.rule.title,
        "verdict": result.verdict.value,
        "holds_as_stated": result.holds,
        "seconds": round(result.seconds, 4),
        "claims": [{"claim": f"{c.claim.expect} {c.claim.text}", "stated": c.claim.expect,
                    "verdict": c.verdict.value, "method": c.method, "detail": c.detail,
                    "counterexample": c.counterexample, "line": c.claim.span.line,
                    "seconds": round(c.seconds, 4)} for c in result.claims],
    }


def expect_text(result: RuleResult) -> str:
    """The golden form of a result (``NAME.rule.expect``): verdicts and proof kinds, no times."""
    lines = [f"rule {result.rule.title}: {result.verdict.value}"]
    for c in result.claims:
        kind = c.method.split(":")[0] if c.method else ""
        evidence = " (counterexample)" if c.counterexample else ""
        lines.append(f"  {c.claim.expect} {c.claim.text}: {c.verdict.value}{evidence} [{kind}]")
    return "\n".join(lines) + "\n"


def render(result: RuleResult, console: Console) -> None:
    verdict = result.verdict
    note = "" if result.holds else "  (NOT as the rule states)" if result.holds is False else ""
    console.print(Text(f"{verdict.value:<8}", style=STYLE[verdict]),
                  Text(f" {result.rule.title}", style="bold"),
                  Text(f"  {result.seconds:.2f} s  {result.rule.source.path}{note}", style="dim"))
    for c in result.claims:
        console.print(Text(f"    {c.claim.expect} {c.claim.text}: ", style="dim"),
                      Text(c.verdict.value, style=STYLE[c.verdict]))
        if c.method:
            console.print(f"      {c.method}", style="dim")
        if c.detail and c.verdict is not Verdict.PROVED:
            console.print(f"      {c.detail}")
        if c.counterexample and c.verdict is Verdict.REFUTED:
            console.print(f"      counterexample: {json.dumps(c.counterexample, default=str)}")


def prove_paths(paths: tuple[str, ...], *, as_json: bool, budget_s: float | None,
                console: Console, progress: Progress | None = None) -> ExitCode:
    codes: list[ExitCode] = []
    documents: list[dict[str, Any]] = []
    total = 0.0
    progress = progress or Progress(quiet=True)
    files = rule_files(paths)
    for index, path in enumerate(files):
        progress.item("prove", index + 1, len(files), path)
        try:
            result = prove_file(path, budget_s)
        except PlaceError as error:
            print_errors(error)
            codes.append(error.exit_code)
            continue
        total += result.seconds
        holds = result.holds
        codes.append(ExitCode.OK if holds else ExitCode.REFUTED if holds is False
                     else ExitCode.UNKNOWN)
        if as_json:
            documents.append(result_document(result))
        else:
            render(result, console)
    progress.done()
    if as_json:
        console.print_json(json.dumps({"schema": PROVE_SCHEMA, "rules": documents,
                                       "seconds": round(total, 3)}, default=str))
    else:
        counts = {v: sum(1 for d in codes if d is c) for v, c in
                  (("hold as stated", ExitCode.OK), ("contradict their statement", ExitCode.REFUTED),
                   ("unknown", ExitCode.UNKNOWN))}
        console.print(f"{len(codes)} rules in {total:.2f} s: " +
                      ", ".join(f"{n} {label}" for label, n in counts.items() if n), style="dim")
    return worst(codes)
