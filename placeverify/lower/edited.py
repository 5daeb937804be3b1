"""A file's text under its ``--set`` overrides, and the way back from a position in it to the
file or the override that wrote it (:mod:`placeverify.lower.overrides` makes the edits).

Edits keep every line of the file at its number (a new statement goes on a new last line), so a
diagnostic inside an override points at it (``--set:N:COL``, N the N-th ``--set``), one
elsewhere at the file in its own columns, with a note naming the overrides.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from placeverify.diagnostics import Diagnostic, PlaceError, Severity, Source, Span
from placeverify.ir.strategy import Override
from placeverify.lower.edit import span_offsets
from placeverify.lower.override_keys import Setting, Settings


@dataclass(frozen=True, slots=True)
class Edit:
    """Text replacing the region [line:column, end_line:end_column) of the text before it, on one
    line (the lines of a multi-line region stay, empty, so no line moves). ``value_at`` and
    ``key_at`` are where the override's value and key stand in ``text`` (-1: not there)."""

    setting: Setting
    line: int
    column: int
    end_line: int
    end_column: int
    text: str
    value_at: int = -1
    key_at: int = -1
    key_len: int = 0


@dataclass
class Edited:
    """A file's text under its overrides, and the way back from a position in it to the file
    or the override that wrote it."""

    original: Source
    settings: Settings
    text: str
    edits: list[Edit] = field(default_factory=list)
    implied: list[Override] = field(default_factory=list)

    @property
    def source(self) -> Source:
        return Source(self.original.path, self.text)

    @property
    def overrides(self) -> tuple[Override, ...]:
        return (*(Override(s.key, s.value) for s in self.settings.items), *self.implied)

    def apply(self, edit: Edit) -> None:
        start, end = span_offsets(self.text, Span(edit.line, edit.column, edit.end_line,
                                                  edit.end_column))
        before, after = self.text[:start], self.text[end:]
        text = edit.text
        if before[-1:].isalnum() and text[:1].isalnum():
            text, edit = " " + text, _shifted(edit, 1)
        if text[-1:].isalnum() and after[:1].isalnum():
            text += " "
        self.text = before + text + "\n" * (edit.end_line - edit.line) + after
        self.edits.append(replace(edit, text=text))

    def append(self, setting: Setting, text: str, value_at: int, key_at: int = -1,
               key_len: int = 0) -> None:
        """A new statement on a new last line."""
        if not self.text.endswith("\n"):
            self.text += "\n"
        line = self.text.count("\n") + 1
        self.apply(Edit(setting, line, 1, line, 1, text, value_at, key_at, key_len))
        self.text += "\n"

    def annotated(self) -> str:
        """The edited text with ``# --set KEY=VALUE`` on every line an override wrote, in place
        of the comment after the edit (an imported file's comment names the key the line came
        from, which the override replaced): what ``placeverify import --set`` prints."""
        last: dict[int, Edit] = {}
        for e in self.edits:  # lines never move: an edit's line is its line in the result
            if e.text and (e.line not in last or e.column >= last[e.line].column):
                last[e.line] = e
        lines = self.text.split("\n")
        for number, e in last.items():
            line = lines[number - 1]
            end = e.column - 1 + len(e.text)
            comment = line.find("#", end)
            code = (line[:comment] if comment >= 0 else line).rstrip()
            lines[number - 1] = f"{code.ljust(43)} # --set {e.setting.text}"
        return "\n".join(lines)

    # ---- the way back ----

    def back(self, line: int, column: int) -> tuple[tuple[int, int], tuple[Edit, int] | None]:
        """A position of the edited text in the original file, and the edit (with the offset in
        its text) when the position is inside one; inside an edit the file position is where
        the edit starts."""
        return _back((line, column), self.edits)

    def diagnostic(self, d: Diagnostic, *, own_source: bool = False) -> Diagnostic:
        """``d`` (a span in the edited text) pointed at the override it starts, ends in or
        contains, or else at the file in the file's columns, with a note naming the overrides;
        ``own_source`` gives a file diagnostic the original file as its source (for warnings,
        which are rendered with the strategy's, edited, source)."""
        file_source = self.original if own_source else None
        if d.span is None:
            return replace(d, source=file_source)
        if d.span == self.source.end_span():
            return replace(d, span=self.original.end_span(), source=file_source)
        start, start_hit = self.back(d.span.line, d.span.column)
        end, end_hit = self.back(d.span.end_line, max(1, d.span.end_column - 1))
        if start_hit is not None:
            return replace(d, span=_setting_span(start_hit, end_hit), source=self.settings.source)
        inside = end_hit[0] if end_hit is not None else next(
            (e for i, e in enumerate(self.edits)
             if e.text and start <= _back((e.line, e.column), self.edits[:i])[0] <= end), None)
        if inside is not None:  # e.g. an entry whose value an override replaced
            return replace(d, span=_setting_span(None, (inside, 0)), source=self.settings.source)
        end_column = end[1] + 1
        if (end[0], end_column) <= start:
            end = (start[0], start[1])
            end_column = start[1] + 1
        notes = d.notes
        if d.severity is Severity.ERROR:
            notes = (*notes, self.settings.note())
        return replace(d, span=Span(start[0], start[1], end[0], end_column), notes=notes,
                       source=file_source)

    def error(self, error: PlaceError) -> PlaceError:
        """A lowering error of the edited text, each diagnostic pointed back."""
        return PlaceError([self.diagnostic(d) for d in error.diagnostics], self.original,
                          error.exit_code)


def _back(pos: tuple[int, int],
          edits: list[Edit]) -> tuple[tuple[int, int], tuple[Edit, int] | None]:
    """``pos`` before ``edits`` (undone last first), and the edit it is inside, if any."""
    hit: tuple[Edit, int] | None = None
    for e in reversed(edits):
        row, col = pos
        width = len(e.text)
        if row == e.line and e.column <= col < e.column + width:
            if hit is None:
                hit = (e, col - e.column)
            pos = (e.line, e.column)
        elif row == e.line and col >= e.column + width:
            pos = (e.end_line, col - e.column - width + e.end_column)
        elif e.line < row < e.end_line:
            pos = (row, 1)
        elif row == e.end_line and e.end_line > e.line:
            pos = (row, col - 1 + e.end_column)
    return pos, hit


def _shifted(edit: Edit, by: int) -> Edit:
    return replace(edit, value_at=edit.value_at + by if edit.value_at >= 0 else -1,
                   key_at=edit.key_at + by if edit.key_at >= 0 else -1)


def _setting_span(start: tuple[Edit, int] | None, end: tuple[Edit, int] | None) -> Span:
    """Where in its override a diagnostic inside an edit points: the part of the value (or the
    key) it covers, else the whole override; the whole value when only its end is inside."""
    if start is None:
        assert end is not None
        edit = end[0]
        return edit.setting.value_span if edit.value_at >= 0 else edit.setting.span
    edit, offset = start
    s = edit.setting
    value_len = len(s.value)
    if edit.value_at >= 0 and edit.value_at <= offset < edit.value_at + value_len:
        first = s.value_span.column + offset - edit.value_at
        last = s.value_span.end_column
        if end is not None and end[0] is edit and edit.value_at <= end[1] < edit.value_at + value_len:
            last = s.value_span.column + end[1] - edit.value_at + 1
        return Span(s.index, first, s.index, max(last, first + 1))
    if edit.key_at >= 0 and edit.key_at <= offset < edit.key_at + edit.key_len:
        return s.key_span
    return s.span
