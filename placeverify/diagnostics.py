"""Source spans, diagnostics and exit codes.

Every message placeverify prints about a file points at its text, in the format mypy made familiar:
``path:line:col: error: message  [code]`` followed by the source line and a caret under the span.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class ExitCode(IntEnum):
    """Process exit codes of the ``placeverify`` command (documented in README and ``--help``)."""

    OK = 0  # every condition proved (or nothing to verify)
    REFUTED = 1  # a condition refuted; for replay: the verifier's verdict was not confirmed
    INPUT_ERROR = 2  # malformed or inconsistent input, or a usage error
    UNKNOWN = 3  # some condition neither proved nor refuted (solver limit, unmodelled case)
    READ_ERROR = 4  # a file is missing, unreadable or not a regular file
    BACKEND_ERROR = 5  # replay/measure could not run (torch missing, a rank crashed or hung)
    INTERNAL_ERROR = 70  # a bug in placeverify itself


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


class Code(StrEnum):
    """Stable diagnostic codes, printed in brackets after each message."""

    SYNTAX = "syntax"
    EMPTY_FILE = "empty-file"
    NOT_TEXT = "not-text"
    TOO_LARGE = "too-large"
    UNKNOWN_NAME = "unknown-name"
    DUPLICATE = "duplicate"
    BAD_VALUE = "bad-value"
    NOT_DIVISIBLE = "not-divisible"
    WORLD_MISMATCH = "world-mismatch"
    MISSING = "missing"
    CONFLICT = "conflict"
    READ = "read"
    TRACE = "trace"
    RULE = "rule"
    # warnings
    COST = "cost"
    RNG = "rng"
    FIT = "fit"


@dataclass(frozen=True, slots=True)
class Span:
    """A region of a source file: 1-based line and column of its first and last character."""

    line: int
    column: int
    end_line: int
    end_column: int  # exclusive, as Lark reports it

    @staticmethod
    def point(line: int, column: int) -> Span:
        return Span(line, column, line, column + 1)

    def cover(self, other: Span) -> Span:
        """The smallest span containing both."""
        start = min((self.line, self.column), (other.line, other.column))
        end = max((self.end_line, self.end_column), (other.end_line, other.end_column))
        return Span(start[0], start[1], end[0], end[1])


@dataclass(frozen=True, slots=True)
class Source:
    """A file's path (as the user named it) and its decoded text."""

    path: str
    text: str

    def line_text(self, line: int) -> str:
        lines = self.text.splitlines()
        if 1 <= line <= len(lines):
            return lines[line - 1]
        return ""

    def end_span(self) -> Span:
        """The position just past the last character (for 'missing ...' errors)."""
        lines = self.text.splitlines() or [""]
        return Span.point(len(lines), len(lines[-1]) + 1)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    severity: Severity
    message: str
    code: Code
    span: Span | None = None
    notes: tuple[str, ...] = ()

    def render(self, source: Source | None, *, pretty: bool = True) -> str:
        """``path:line:col: severity: message  [code]``, then the line and a caret when pretty."""
        path = source.path if source is not None else "<input>"
        where = f"{path}:{self.span.line}:{self.span.column}" if self.span else path
        out = [f"{where}: {self.severity.value}: {self.message}  [{self.code.value}]"]
        if pretty and self.span is not None and source is not None:
            out.extend(_excerpt(source, self.span))
        out.extend(f"{where}: note: {note}" for note in self.notes)
        return "\n".join(out)

    def to_json(self, source: Source | None) -> dict[str, object]:
        data: dict[str, object] = {
            "severity": self.severity.value,
            "code": self.code.value,
            "message": self.message,
            "file": source.path if source is not None else None,
        }
        if self.span is not None:
            data.update(line=self.span.line, column=self.span.column,
                        end_line=self.span.end_line, end_column=self.span.end_column)
        if self.notes:
            data["notes"] = list(self.notes)
        return data


def _excerpt(source: Source, span: Span) -> list[str]:
    text = source.line_text(span.line).expandtabs(1)
    if len(text) > 160:  # keep the caret line readable on long (or minified) lines
        start = max(0, span.column - 80)
        text = ("…" if start else "") + text[start:start + 160]
        column = span.column - start + (1 if start else 0)
    else:
        column = span.column
    width = span.end_column - span.column if span.end_line == span.line else len(text) - column + 1
    width = max(1, min(width, max(1, len(text) - column + 1)))
    gutter = f"{span.line:>4} | "
    return [f"{gutter}{text}", " " * (len(gutter) - 2) + "| " + " " * (column - 1) + "^" * width]


@dataclass
class PlaceError(Exception):
    """Raised with one or more error diagnostics about a source; the CLI renders them."""

    diagnostics: list[Diagnostic]
    source: Source | None = None
    exit_code: ExitCode = ExitCode.INPUT_ERROR

    def __str__(self) -> str:
        return "\n".join(d.render(self.source) for d in self.diagnostics)


@dataclass
class Diagnostics:
    """Collects the diagnostics of one lowering pass so several errors are reported at once."""

    source: Source
    items: list[Diagnostic] = field(default_factory=list)

    def error(self, message: str, code: Code, span: Span | None, *notes: str) -> None:
        self.items.append(Diagnostic(Severity.ERROR, message, code, span, tuple(notes)))

    def warning(self, message: str, code: Code, span: Span | None, *notes: str) -> None:
        self.items.append(Diagnostic(Severity.WARNING, message, code, span, tuple(notes)))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.items if d.severity is Severity.WARNING]

    def raise_if_errors(self) -> None:
        if self.errors:
            raise PlaceError(self.errors, self.source)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or the list of valid names."""
    options: Sequence[str] = sorted(set(candidates))
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:
        close = [c for c in options if c.lower() == word.lower()]
    if close:
        return f"; did you mean '{close[0]}'?"
    if options and len(options) <= 12:
        return "; expected one of " + ", ".join(f"'{c}'" for c in options)
    return ""
