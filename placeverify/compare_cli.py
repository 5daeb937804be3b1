"""``placeverify compare``'s loop: check each file, collect its comparison row and exit code.

The report (:mod:`placeverify.report.compare`) only renders; this module runs the checks and
prints the errors of the files that fail to load, as ``check`` does.
"""

from __future__ import annotations

from typing import Any

from placeverify.api import DEFAULT_BUDGET_S, check
from placeverify.console import print_errors, verdict_exit
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.importers import Options
from placeverify.report.compare import compare_document, compare_row


def compare_files(paths: list[str], with_verdicts: bool,
                  imports: Options | None = None,
                  budget_s: float | None = DEFAULT_BUDGET_S) -> tuple[dict[str, Any], list[ExitCode]]:
    """The comparison document of the files that load, and one exit code per file."""
    rows: list[dict[str, Any]] = []
    codes: list[ExitCode] = []
    for path in paths:
        try:
            result = check(path, verify_conditions=with_verdicts, imports=imports,
                           budget_s=budget_s)
        except PlaceError as error:
            print_errors(error)
            codes.append(error.exit_code)
            continue
        rows.append(compare_row(path, result))
        codes.append(ExitCode.OK if result.verification is None
                     else verdict_exit(result.verification.overall()))
    return compare_document(rows), codes
