"""Where each key of a JSON, TOML or YAML file is written: the loaders give values, not positions.

``json`` and ``tomllib`` (standard library) load the values (a syntax error is reported at the
line and column the loader names); the scanners here only find the text of every key, so that a
diagnostic points at it. accelerate's YAML files (written by
``accelerate config`` with ``yaml.safe_dump``) are block mappings of plain scalars: this module
reads that subset itself, with positions, and refuses anything else (anchors, aliases, tags,
block scalars) with an error at its text. Nothing is ever evaluated.
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


# ---- YAML (the subset accelerate writes) -------------------------------------------------------

_YAML_KEY = re.compile(r"([A-Za-z0-9_.\-]+|'[^']*'|\"[^\"]*\")\s*:(\s+|$)")
_INT = re.compile(r"[-+]?(0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"[-+]?(\d[\d_]*)?\.?\d+([eE][-+]?\d+)?$")


def load_yaml(source: Source) -> tuple[dict[str, Any], dict[Path, Span]]:
    """A YAML block mapping of scalars (and flow lists of scalars), with each key's span."""
    spans: dict[Path, Span] = {}
    root: dict[str, Any] = {}
    # stack of (indent, container, path); a key awaiting its block is (indent, parent, key)
    stack: list[tuple[int, dict[str, Any] | list[Any], Path]] = [(0, root, ())]
    pending: tuple[int, dict[str, Any], str, Path] | None = None
    for number, raw in enumerate(source.lines, start=1):
        line = _strip_comment(raw)
        if not line.strip() or (number == 1 and line.strip() == "---"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if line[indent:indent + 1] == "\t":
            raise syntax_error(source, "tabs are not allowed in YAML indentation",
                               Span.point(number, indent + 1))
        body = line[indent:].rstrip()
        if pending is not None:
            p_indent, parent, key, path = pending
            pending = None
            is_item = body.startswith("- ") or body == "-"
            if indent > p_indent or (indent == p_indent and is_item):
                child: dict[str, Any] | list[Any] = [] if is_item else {}
                parent[key] = child
                stack.append((indent, child, path))
        while len(stack) > 1 and indent < stack[-1][0]:
            stack.pop()
        if indent != stack[-1][0]:
            raise syntax_error(source, "inconsistent indentation", Span.point(number, indent + 1))
        if isinstance(stack[-1][1], list) and not (body.startswith("- ") or body == "-") \
                and len(stack) > 1 and stack[-2][0] == indent:
            stack.pop()  # 'key:' then '- item' lines at the key's indent, then the next key
        _, container, path = stack[-1]
        if body.startswith("- ") or body == "-":
            if not isinstance(container, list):
                raise syntax_error(source, "a list item where a key was expected",
                                   Span.point(number, indent + 1))
            container.append(_scalar(source, body[1:].strip(), number, indent + 3))
            continue
        match = _YAML_KEY.match(body)
        if match is None or not isinstance(container, dict):
            raise syntax_error(source, "not a 'key: value' line (placeverify reads the YAML "
                               "that accelerate writes: mappings of plain values)",
                               Span.point(number, indent + 1))
        key = match.group(1).strip("'\"")
        key_path = (*path, key)
        if key in container:
            raise syntax_error(source, f"duplicate key '{key}'",
                               Span(number, indent + 1, number, indent + 1 + len(match.group(1))))
        spans[key_path] = Span(number, indent + 1, number, indent + 1 + len(match.group(1)))
        rest = body[match.end():].strip()
        if not rest:
            container[key] = None
            pending = (indent, container, key, key_path)
        else:
            container[key] = _scalar(source, rest, number, indent + 1 + match.end())
    return root, spans


def _strip_comment(line: str) -> str:
    quote: str | None = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _scalar(source: Source, text: str, line: int, column: int) -> Any:
    if text[:1] in ("&", "*", "!", "|", ">", "{", "%", "@", "`"):
        if text == "{}":
            return {}
        raise syntax_error(source, f"YAML construct '{text[:1]}' is not read by placeverify "
                           "(anchors, aliases, tags, block scalars and flow mappings are refused)",
                           Span.point(line, column))
    if text.startswith("["):
        if not text.endswith("]"):
            raise syntax_error(source, "a flow list must close on its line", Span.point(line, column))
        inner = text[1:-1].strip()
        return [] if not inner else [_scalar(source, item.strip(), line, column)
                                     for item in inner.split(",")]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("null", "~"):
        return None
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    return text
