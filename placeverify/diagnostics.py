"""Source spans, diagnostics and exit codes.

Every message placeverify prints about a file points at its text, in the format mypy made familiar:
``path:line:col: error: message  [code]`` followed by the source line and a caret under the span.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from placeverify.errors import PlaceverifyError

MAX_ERRORS = 50  # per file; past this the rest are counted, not printed


class ExitCode(IntEnum):
    """Process exit codes of the ``placeverify`` command (documented in README and ``--help``)."""

    OK = 0  # every condition proved (or nothing to verify)
    REFUTED = 1  # a condition refuted; for replay: the verifier's verdict was not confirmed
    INPUT_ERROR = 2  # malformed or inconsistent input, or a usage error
    UNKNOWN = 3  # some condition neither proved nor refuted (solver limit, unmodelled case)
    READ_ERROR = 4  # a file is missing, unreadable or not a regular file
    BACKEND_ERROR = 5  # replay/measure could not run (torch missing, a rank crashed or hung);
    # check --plot: matplotlib missing
    DOES_NOT_FIT = 6  # with --require-fit: a strategy's predicted total exceeds device_memory
    INTERNAL_ERROR = 70  # a bug in placeverify itself
    HANGUP = 129  # stopped by SIGHUP (128 + 1), after cleaning up
    INTERRUPTED = 130  # stopped by SIGINT (128 + 2, Ctrl-C), after cleaning up
    TERMINATED = 143  # stopped by SIGTERM (128 + 15), after cleaning up


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
    TOO_DEEP = "too-deep"
    TOO_MANY = "too-many-errors"
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
    NOT_STATIC = "not-static"  # an imported script's value that only running it would give
    # warnings
    COST = "cost"
    RNG = "rng"
    FIT = "fit"
    NOT_MODELLED = "not-modelled"  # an imported key placeverify does not model


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


def normalise_newlines(text: str) -> str:
    """``text`` with every line end written ``'\n'``: ``'\r\n'`` (Windows) and a lone ``'\r'``
    (classic Mac OS) are line ends too, as editors and Python's universal newlines read them.

    Without this a lone ``'\r'`` is whitespace to the grammar, a ``#`` comment runs on over the
    following lines to the next ``'\n'``, and every statement it swallows is silently dropped.
    A form feed or U+2028 does not end a line (Lark does not count them either).
    """
    return text.replace("\r\n", "\n").replace("\r", "\n")


@dataclass(frozen=True, slots=True)
class Source:
    """A file's path (as the user named it) and its decoded text, its line ends normalised
    (:func:`normalise_newlines`): the parser, the line and column of every span and the caret
    lines all count lines in this one text."""

    path: str
    text: str
    # Lines as the parser counts them, computed once: a file may get thousands of messages.
    lines: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", normalise_newlines(self.text))
        object.__setattr__(self, "lines", tuple(self.text.split("\n")))

    def line_text(self, line: int) -> str:
        if 1 <= line <= len(self.lines):
            return self.lines[line - 1]
        return ""

    def end_span(self) -> Span:
        """The position just past the last non-blank line (for 'missing ...' errors)."""
        lines = list(self.lines)
        while len(lines) > 1 and not lines[-1].strip():
            lines.pop()
        return Span.point(len(lines), len(lines[-1]) + 1)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    severity: Severity
    message: str
    code: Code
    span: Span | None = None
    notes: tuple[str, ...] = ()
    # The text the span is in, when it is not the one the diagnostic is reported with: an
    # override (``--set``, :mod:`placeverify.lower.overrides`) or the file under its overrides.
    source: Source | None = None

    def render(self, source: Source | None, *, pretty: bool = True) -> str:
        """``path:line:col: severity: message  [code]``, then the line and a caret when pretty."""
        source = self.source or source
        path = source.path if source is not None else "<input>"
        where = f"{path}:{self.span.line}:{self.span.column}" if self.span else path
        out = [f"{where}: {self.severity.value}: {self.message}  [{self.code.value}]"]
        if pretty and self.span is not None and source is not None:
            out.extend(_excerpt(source, self.span))
        out.extend(f"{where}: note: {note}" for note in self.notes)
        return "\n".join(out)

    def to_json(self, source: Source | None) -> dict[str, object]:
        source = self.source or source
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


def _cell(char: str) -> tuple[str, int]:
    """How a character of a source line is shown, and how many terminal cells it takes."""
    if char == "\t":
        return "    ", 4
    category = unicodedata.category(char)
    if category[0] == "C":  # control, format, unassigned: show a placeholder, never the raw byte
        return "\N{REPLACEMENT CHARACTER}", 1
    if category in ("Mn", "Me"):  # combining marks sit on the previous character
        return char, 0
    return char, 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _excerpt(source: Source, span: Span) -> list[str]:
    """The source line of a span and a caret line under the span (aligned in terminal cells)."""
    line = source.line_text(span.line)
    column = max(1, span.column)
    end = span.end_column if span.end_line == span.line else len(line) + 1
    end = max(end, column + 1)
    first = 0
    if len(line) > 160:  # keep the caret line readable on long (or minified) lines
        first = max(0, column - 80)
    shown_chars = line[first:first + 160]
    text_parts: list[str] = ["…"] if first else []
    pad = 1 if first else 0
    width = 0
    for index, char in enumerate(shown_chars, start=first + 1):
        shown, cells = _cell(char)
        text_parts.append(shown)
        if index < column:
            pad += cells
        elif index < end:
            width += cells
    if first + 160 < len(line):
        text_parts.append("…")
    gutter = f"{span.line:>4} | "
    caret = " " * (len(gutter) - 2) + "| " + " " * pad + "^" * max(1, width)
    return [f"{gutter}{''.join(text_parts)}".rstrip(), caret]


@dataclass
class PlaceError(PlaceverifyError):
    """Raised with one or more error diagnostics about a source; the CLI renders them."""

    diagnostics: list[Diagnostic]
    source: Source | None = None
    exit_code: ExitCode = ExitCode.INPUT_ERROR

    def __post_init__(self) -> None:
        self.diagnostics = capped(self.diagnostics)

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


def capped(diagnostics: list[Diagnostic], limit: int = MAX_ERRORS) -> list[Diagnostic]:
    """At most ``limit`` diagnostics, then one note that counts the rest."""
    if len(diagnostics) <= limit:
        return diagnostics
    rest = len(diagnostics) - limit
    return [*diagnostics[:limit], Diagnostic(
        Severity.NOTE, f"{rest:,} more error{'s' if rest != 1 else ''} not shown (placeverify lists "
        f"the first {limit})", Code.TOO_MANY)]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or the list of valid names."""
    options: Sequence[str] = sorted(set(candidates))
    # difflib's ratio is loose on short words ('tp' would match 'step'); they need one edit
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6) if len(word) > 3 else []
    if not close:
        close = [c for c in options if c.lower() == word.lower()]
    if not close:  # short names: one typo ('dq' for 'dp') is below difflib's ratio
        near = [c for c in options if _one_edit(word.lower(), c.lower())]
        close = near[:1] if len(near) == 1 else []
    if not close:  # a name spelt out in full ('sequence' for 'seq'), below difflib's ratio too
        spelt = [c for c in options if len(c) >= 3 and word.lower().startswith(c.lower())]
        close = spelt[:1] if len(spelt) == 1 else []
    if close:
        return f"; did you mean '{close[0]}'?"
    if options and len(options) <= 12:
        return "; expected one of " + ", ".join(f"'{c}'" for c in options)
    return ""


def _one_edit(a: str, b: str) -> bool:
    """Whether a and b differ by one substitution, insertion, deletion or adjacent swap."""
    if a == b or abs(len(a) - len(b)) > 1 or min(len(a), len(b)) < 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))
