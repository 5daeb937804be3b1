"""Reading a launch script as text: words with positions, never running a shell.

A Megatron-LM launch script is bash. This module tokenises it with :mod:`shlex`, joins line
continuations, records plain ``NAME=value`` and ``NAME=( ... )`` assignments and expands
``$NAME``, ``${NAME}``, ``${NAME[@]}`` and ``${NAME:-literal}`` from them; arithmetic
``$(( ... ))`` over integers and such variables is computed by a small parser here. Command
substitution (``$( ... )``, backticks) and process substitution are errors at their text: only
running the script would give their value. A variable the script does not assign (a positional
parameter, the environment) stays *unresolved*: a word that needs it is an error only where its
value decides placement.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span

_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*)"
                  r"|([0-9#@*?$!]))")
_ARITH = re.compile(r"\$\(\((.*?)\)\)")


@dataclass(frozen=True, slots=True)
class Word:
    """One word of a command, after expansion; ``unresolved`` names what could not be expanded."""

    text: str
    span: Span | None
    unresolved: str | None = None


@dataclass(frozen=True, slots=True)
class Command:
    words: tuple[Word, ...]
    line: int


def _error(source: Source, message: str, span: Span, code: Code = Code.NOT_STATIC) -> PlaceError:
    return PlaceError([Diagnostic(Severity.ERROR, message, code, span)], source)


def _position(source: Source, offset: int) -> tuple[int, int]:
    line = source.text.count("\n", 0, offset) + 1
    return line, offset - (source.text.rfind("\n", 0, offset) + 1) + 1


def refuse_substitutions(source: Source) -> None:
    """Command or process substitution anywhere outside comments and single quotes is an error."""
    text = source.text
    i, quote, word_start = 0, "", True
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = ""
        elif c == "\\":
            i += 2
            word_start = False
            continue
        elif c == "'" and quote != '"':
            quote = "'"
        elif c == '"':
            quote = "" if quote == '"' else '"'
        elif c == "#" and not quote and word_start:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif c == "`" or (c == "$" and text.startswith("(", i + 1) and not text.startswith("((", i + 1)) \
                or (c in "<>" and text.startswith("(", i + 1) and not quote):
            line, column = _position(source, i)
            what = "backticks" if c == "`" else ("command substitution" if c == "$"
                                                  else "process substitution")
            raise _error(source, f"{what} runs a command: placeverify reads scripts, never runs "
                         "them; write the value itself", Span(line, column, line, column + 2))
        word_start = c in " \t\n;|&(" and not quote
        i += 1


def logical_lines(source: Source) -> list[tuple[str, int]]:
    """The script's statements: continuations joined, ``NAME=( ... )`` arrays kept whole."""
    out: list[tuple[str, int]] = []
    buffer, start, depth = "", 0, 0
    for number, line in enumerate(source.lines, start=1):
        if not buffer:
            start = number
        stripped = _code_part(line)
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        depth += stripped.count("(") - stripped.count(")")
        if depth > 0 and re.match(r"\s*(export\s+)?[A-Za-z_][A-Za-z0-9_]*=\(", buffer):
            buffer += "\n"
            continue
        depth = 0
        if buffer.strip():
            out.append((buffer, start))
        buffer = ""
    if buffer.strip():
        out.append((buffer, start))
    return out


def _code_part(line: str) -> str:
    """A line without its comment (a '#' that starts a word outside quotes)."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;("):
            return line[:i].rstrip()
    return line.rstrip()


class Script:
    """The commands of a script, with its plain assignments expanded into their words."""

    def __init__(self, source: Source) -> None:
        self.source = source
        refuse_substitutions(source)
        self.scalars: dict[str, str | None] = {}  # None: assigned, but not statically known
        self.arrays: dict[str, list[Word]] = {}
        self.commands: list[Command] = []
        self._cursor = 0  # offset from which the next word's text is searched
        for text, line in logical_lines(source):
            self._statement(text, line)

    def _statement(self, text: str, line: int) -> None:
        self._cursor = max(self._cursor, self._offset_of_line(line))
        try:
            raw = shlex.split(text, comments=False, posix=True)
        except ValueError as error:
            raise _error(self.source, f"cannot read this line: {error}", Span.point(line, 1),
                         Code.SYNTAX) from None
        words = raw
        while words and words[0] in ("export", "declare", "local", "readonly"):
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[1:]
        array = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=\((.*)\)\s*;?\s*$", text, re.S)
        if array is not None:
            inner = shlex.split(array.group(2), comments=True, posix=True)
            self.arrays[array.group(1)] = [w for item in inner for w in self._words(item)]
            return
        assignments = [w for w in words if _ASSIGN.match(w)] if words and _ASSIGN.match(words[0]) else []
        if assignments and len(assignments) == len(words):
            for w in words:
                match = _ASSIGN.match(w)
                assert match is not None
                value = self._expand_scalar(match.group(2))
                self.scalars[match.group(1)] = value
                self.arrays.pop(match.group(1), None)
            return
        while words and _ASSIGN.match(words[0]):  # VAR=value command ...: a per-command variable
            words = words[1:]
        out = [word for w in words for word in self._words(w)]
        if out:
            self.commands.append(Command(tuple(out), line))

    def _offset_of_line(self, line: int) -> int:
        offset = 0
        for _ in range(line - 1):
            offset = self.source.text.find("\n", offset) + 1
        return offset

    def _locate(self, raw: str, expanded: str) -> Span | None:
        """The span of a word's text in the source, searched forward from the last word."""
        text = self.source.text
        for needle in (raw, expanded, raw.split("=", 1)[0]):
            if not needle:
                continue
            at = text.find(needle, self._cursor)
            if at >= 0 and text.count("\n", self._cursor, at) <= 40:
                line, column = _position(self.source, at)
                self._cursor = at + len(needle)
                return Span(line, column, line, column + len(needle.split("\n")[0]))
        return None

    def _expand_scalar(self, value: str) -> str | None:
        text, unresolved = self._expand_text(value)
        return None if unresolved is not None else text

    def _words(self, raw: str) -> list[Word]:
        """A word's expansion: an array's words (with their own positions) for ``${A[@]}``."""
        whole = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}", raw)
        if whole is not None and whole.group(1) in self.arrays:
            self._locate(raw, raw)
            return list(self.arrays[whole.group(1)])
        text, unresolved = self._expand_text(raw)
        return [Word(text, self._locate(raw, text), unresolved)]

    def _expand_text(self, word: str) -> tuple[str, str | None]:
        unresolved: list[str] = []

        def arith(match: re.Match[str]) -> str:
            value = _arithmetic(self._substitute(match.group(1), unresolved))
            if value is None:
                unresolved.append(f"$(({match.group(1)}))")
                return match.group(0)
            return str(value)

        text = _ARITH.sub(arith, word)
        text = self._substitute(text, unresolved)
        return text, unresolved[0] if unresolved else None

    def _substitute(self, text: str, unresolved: list[str]) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(4)
            default = match.group(3)
            if name is None:
                unresolved.append("$" + (match.group(5) or ""))
                return match.group(0)
            if name in self.arrays:
                items = [w.text for w in self.arrays[name]]
                return " ".join(items) if match.group(2) else (items or [""])[0]
            value = self.scalars.get(name)
            if value is not None:
                return value
            if default is not None and name not in self.scalars:
                return default
            unresolved.append("$" + name)
            return match.group(0)

        return _VAR.sub(one, text)


def _arithmetic(expression: str) -> int | None:
    """Integer + - * / % and parentheses; None for anything else (never evaluated by Python)."""
    tokens: list[str] = re.findall(r"\d+|[-+*/%()]|\S", expression)
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        position += 1
        return tokens[position - 1]

    def atom() -> int | None:
        token = peek()
        if token is None:
            return None
        if token == "(":
            take()
            value = sum_()
            return value if value is not None and peek() == ")" and take() else None
        if token == "-":
            take()
            value = atom()
            return None if value is None else -value
        if token.isdigit():
            return int(take())
        return None

    def product() -> int | None:
        value = atom()
        while value is not None and peek() in ("*", "/", "%"):
            op, right = take(), atom()
            if right is None or (op != "*" and right == 0):
                return None
            value = value * right if op == "*" else (value // right if op == "/" else value % right)
        return value

    def sum_() -> int | None:
        value = product()
        while value is not None and peek() in ("+", "-"):
            op, right = take(), product()
            if right is None:
                return None
            value = value + right if op == "+" else value - right
        return value

    result = sum_()
    return result if position == len(tokens) else None

