"""``placeverify compare``'s loop: check each file, collect its comparison row and exit code.

The report (:mod:`placeverify.report.compare`) only renders; this module runs the checks and
prints the errors of the files that fail to load, as ``check`` does; the document lists them
under ``errors`` (``{file, exit_code, errors}``, the diagnostics as ``check --json`` gives them).
"""

from __future__ import annotations

from typing import Any

from placeverify.api import DEFAULT_BUDGET_S, check
from placeverify.console import Progress, print_errors, verdict_exit, worst
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.importers import Options
from placeverify.lower.overrides import Settings
from placeverify.report.compare import compare_document, compare_row
from placeverify.report.outcome import Outcome, fits


def compare_files(paths: list[str], with_verdicts: bool, imports: Options | None = None, *,
                  require_fit: bool = False, budget_s: float | None = DEFAULT_BUDGET_S,
                  settings: Settings | None = None,
                  progress: Progress | None = None) -> tuple[dict[str, Any], list[Outcome]]:
    """The comparison document (rows of the files that load, errors of the others) and each
    file's outcome with its exit code; ``settings`` (``--set``) override every file."""
    rows: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    progress = progress or Progress(quiet=True)
    for index, path in enumerate(paths):
        progress.item("compare", index + 1, len(paths), path)
        try:
            result = check(path, verify_conditions=with_verdicts, imports=imports,
                           budget_s=budget_s, settings=settings)
        except PlaceError as error:
            print_errors(error)
            outcomes.append(Outcome(path, error.exit_code, error=error))
            continue
        rows.append(compare_row(path, result))
        code = (ExitCode.OK if result.verification is None
                else verdict_exit(result.verification.overall()))
        if require_fit and fits(result) is False:
            code = worst([code, ExitCode.DOES_NOT_FIT])
        outcomes.append(Outcome(path, code, result=result))
    progress.done()
    document = compare_document(rows)
    if settings:
        document["overrides"] = [s.text for s in settings.items]
    document["errors"] = [{"file": o.path, "exit_code": int(o.exit_code),
                           "errors": [d.to_json(o.error.source) for d in o.error.diagnostics]}
                          for o in outcomes if o.error is not None]
    return document, outcomes
