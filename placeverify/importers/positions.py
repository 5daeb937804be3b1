"""Where each key of a JSON or TOML file is written: the loaders give values, not positions.

``json`` and ``tomllib`` (standard library) load the values (a syntax error is reported at the
line and column the loader names); the scanners here only find the text of every key, so that a
diagnostic points at it. YAML is :mod:`placeverify.importers.yaml_nodes` (PyYAML's parse gives
both). Nothing is ever evaluated.
"""

from __future__ import annotations

import bisect
import json
import json.decoder
import re
import tomllib
from typing import Any

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span

scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]  # (str, end) -> (str, end)

Path = tuple[str, ...]
MAX_DEPTH = 64


class _Lines:
    def __init__(self, text: str) -> None:
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def span(self, start: int, end: int) -> Span:
        line = bisect.bisect_right(self.starts, start) - 1
        end_line = bisect.bisect_right(self.starts, max(start, end - 1)) - 1
        return Span(line + 1, start - self.starts[line] + 1, end_line + 1,
                    end - self.starts[end_line] + 1)


def syntax_error(source: Source, message: str, span: Span | None) -> PlaceError:
    return PlaceError([Diagnostic(Severity.ERROR, message, Code.SYNTAX, span)], source)


def too_deep(source: Source, *, comments: bool) -> PlaceError:
    """The error for a document nested too deeply for the loader (which recursed out): at the
    first ``[`` or ``{`` nested deeper than :data:`MAX_DEPTH` levels, as the JSON key scanner
    counts them, outside strings (and ``#`` comments, with ``comments``)."""
    text, depth, quote, i = source.text, 0, "", 0
    at: int | None = None
    while i < len(text) and at is None:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1  # an escaped character
            elif c == quote:
                quote = ""
        elif c == '"' or (c == "'" and comments):
            quote = c
        elif c == "#" and comments:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif c in "[{":
            depth += 1
            at = i if depth > MAX_DEPTH + 1 else None
        elif c in "]}":
            depth -= 1
        i += 1
    span = _Lines(text).span(at, at + 1) if at is not None else Span.point(1, 1)
    return syntax_error(source, f"nested deeper than {MAX_DEPTH} levels", span)


# ---- JSON -----------------------------------------------------------------------------------

_JSON_ATOM = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null|NaN|-?Infinity")


def load_json(source: Source) -> tuple[Any, dict[Path, Span]]:
    """The document and the span of every object key (path of keys; list items are skipped)."""
    try:
        data = json.loads(source.text)
    except json.JSONDecodeError as error:
        raise syntax_error(source, f"not valid JSON: {error.msg}",
                           Span.point(error.lineno, error.colno)) from None
    except RecursionError:
        raise too_deep(source, comments=False) from None
    spans: dict[Path, Span] = {}
    lines = _Lines(source.text)
    text = source.text

    def ws(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def value(i: int, path: Path, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise syntax_error(source, f"nested deeper than {MAX_DEPTH} levels", lines.span(i, i + 1))
        i = ws(i)
        c = text[i]
        if c == "{":
            i = ws(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                i = ws(i)
                key, end = scanstring(text, i + 1)
                spans.setdefault((*path, key), lines.span(i, end))
                i = ws(end) + 1  # ':'
                i = ws(value(i, (*path, key), depth + 1))
                if text[i] == "}":
                    return i + 1
                i += 1  # ','
        if c == "[":
            i = ws(i + 1)
            if text[i] == "]":
                return i + 1
            while True:
                i = ws(value(i, path, depth + 1))
                if text[i] == "]":
                    return i + 1
                i += 1
        if c == '"':
            return int(scanstring(text, i + 1)[1])
        match = _JSON_ATOM.match(text, i)
        assert match is not None, "json.loads accepted what the scanner cannot read"
        return int(match.end())

    value(0, (), 0)
    return data, spans


# ---- TOML -----------------------------------------------------------------------------------

# tomllib's message ends with where it stopped: "(at line 3, column 30)" or "(at end of document)"
_TOML_AT = re.compile(r"\s*\((?:at line (\d+), column (\d+)|at (end of document))\)$")


def load_toml(source: Source) -> tuple[dict[str, Any], dict[Path, Span]]:
    """The document and the span of every table header and key (:func:`toml_key_spans`)."""
    try:
        data = tomllib.loads(source.text)
    except tomllib.TOMLDecodeError as error:
        message, span = _toml_error(source, error)
        raise syntax_error(source, f"not valid TOML: {message}", span) from None
    except RecursionError:
        raise too_deep(source, comments=True) from None
    return data, toml_key_spans(source)


def _toml_error(source: Source, error: tomllib.TOMLDecodeError) -> tuple[str, Span | None]:
    """The message of a TOML syntax error and where it is. Python 3.14 gives the bare message
    and the position as attributes (``msg``, ``pos``, ``lineno``, ``colno``); before, only the
    message says it. Past the last character, the error points just after the last text."""
    text = str(error)
    found = _TOML_AT.search(text)
    message = getattr(error, "msg", None)
    if not isinstance(message, str):
        message = text[:found.start()] if found is not None else text
    pos, line, column = (getattr(error, name, None) for name in ("pos", "lineno", "colno"))
    if (isinstance(pos, int) and pos >= len(source.text)) or (
            found is not None and found.group(3) is not None):
        return message, source.end_span()
    if isinstance(line, int) and isinstance(column, int):
        return message, Span.point(line, column)
    if found is not None:
        return message, Span.point(int(found.group(1)), int(found.group(2)))
    return message, None


_TOML_HEADER = re.compile(r"\s*\[\s*([A-Za-z0-9_.\- \"']+?)\s*\]\s*(#.*)?$")
_TOML_KEY = re.compile(r"\s*([A-Za-z0-9_\-]+(?:\s*\.\s*[A-Za-z0-9_\-]+)*|\"[^\"]*\")\s*=")


def toml_key_spans(source: Source) -> dict[Path, Span]:
    """The span of every ``[table]`` header and ``key =`` of a TOML file, by dotted path."""
    spans: dict[Path, Span] = {}
    table: Path = ()
    in_multiline: str | None = None
    for number, line in enumerate(source.lines, start=1):
        if in_multiline is not None:
            if line.count(in_multiline) % 2 == 1:
                in_multiline = None
            continue
        header = _TOML_HEADER.match(line)
        if header is not None and not line.lstrip().startswith("[["):
            table = tuple(p.strip().strip("\"'") for p in header.group(1).split("."))
            start = line.index("[") + 1
            spans.setdefault(table, Span(number, start, number, line.index("]") + 2))
            continue
        key = _TOML_KEY.match(line)
        if key is not None:
            parts = tuple(p.strip().strip('"') for p in key.group(1).split("."))
            start = key.start(1) + 1
            spans.setdefault((*table, *parts), Span(number, start, number, key.end(1) + 1))
            rest = line[key.end():]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2 == 1:
                    in_multiline = quote
    return spans

