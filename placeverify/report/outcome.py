"""One file's outcome in a run of ``check`` or ``compare``: its report or its input errors, and its
exit code. The machine-readable outputs (JSON, SARIF, GitHub annotations) render lists of these.

JSON documents (schemas in ``placeverify/schemas/``, ``docs/ci.md``):

- ``placeverify.check/1``: ``check --json FILE`` with one file argument: the report of
  :func:`placeverify.report.data.check_document`, or, for a file that does not load, the error
  document of :func:`error_document` (``schema``, ``placeverify``, ``file``, ``errors``);
- ``placeverify.check-list/1``: ``check --json`` with several arguments or a folder (even one
  holding a single file): ``schema``, ``placeverify``, ``exit_code`` (the run's), ``results``:
  one ``{file, exit_code, report}`` per file in order, ``report`` a ``placeverify.check/1``
  document (a report or an error document).

The shape depends on the command line only, never on what the files contain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placeverify import __version__
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.report.data import CHECK_SCHEMA, check_document
from placeverify.result import CheckResult

CHECK_LIST_SCHEMA = "placeverify.check-list/1"


@dataclass(frozen=True, slots=True)
class Outcome:
    """A file's outcome: exactly one of ``result`` (it loaded) and ``error`` (it did not)."""

    path: str
    exit_code: ExitCode
    result: CheckResult | None = None
    error: PlaceError | None = None
    replay: dict[str, Any] | None = None  # check --replay's document, when it ran

    def __post_init__(self) -> None:
        assert (self.result is None) != (self.error is None), "an outcome is a result or an error"


def fits(result: CheckResult) -> bool | None:
    """Whether the step's peak (plus the reserve) fits ``device_memory``; None when the mesh
    gives none (:meth:`placeverify.cost.Costs.fits`)."""
    return result.costs.fits()


def error_document(path: str, error: PlaceError) -> dict[str, Any]:
    """The ``placeverify.check/1`` document of a file that does not load: its diagnostics."""
    return {"schema": CHECK_SCHEMA, "placeverify": __version__, "file": path,
            "errors": [d.to_json(error.source) for d in error.diagnostics]}


def report_document(outcome: Outcome) -> dict[str, Any]:
    """The ``placeverify.check/1`` document of one outcome (a report or an error document)."""
    if outcome.error is not None:
        return error_document(outcome.path, outcome.error)
    assert outcome.result is not None
    document = check_document(outcome.result)
    if outcome.replay is not None:
        document["replay"] = outcome.replay
    return document


def check_list_document(outcomes: list[Outcome], exit_code: ExitCode) -> dict[str, Any]:
    """``placeverify.check-list/1``: every file's outcome, in the order checked."""
    return {"schema": CHECK_LIST_SCHEMA, "placeverify": __version__, "exit_code": int(exit_code),
            "results": [{"file": o.path, "exit_code": int(o.exit_code), "report": report_document(o)}
                        for o in outcomes]}
