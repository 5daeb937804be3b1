"""Syntax diagnostics: the bracket scan and the messages for Lark's parse errors.

Before parsing, :func:`too_deep` refuses brackets nested beyond :data:`MAX_NESTING` (deeper input
would make the parser recurse). After a failed parse, :func:`syntax_diagnostic` turns Lark's
``UnexpectedInput`` into one :class:`~placeverify.diagnostics.Diagnostic` that points at the
offending text, says what the grammar accepts there (read from the parser's own tables, not listed
by hand) and adds a hint for common slips ('name: value', a missing ',', an unclosed bracket).
"""

from __future__ import annotations

import functools
import re

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from placeverify.diagnostics import Code, Diagnostic, Severity, Source, Span, did_you_mean
from placeverify.syntax.grammar import grammar_path, parser
from placeverify.syntax.spans import token_span

MAX_NESTING = 32  # brackets inside brackets; real strategies use 3, and deeper input would recurse

# ---- brackets --------------------------------------------------------------------------------

# Comments and strings hide brackets; a string ends at its closing quote or at the end of the line.
_BRACKET_SCAN = re.compile(r'#[^\r\n]*|"(?:[^"\\\r\n]|\\.)*"?|[(){}\[\]]')
_CLOSER = {"(": ")", "{": "}", "[": "]"}


def _position(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of a character offset (lines end at '\n', as Lark counts them)."""
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1


def _open_brackets(text: str, end: int | None = None) -> list[tuple[str, int]]:
    """The brackets still open at ``end`` (innermost last), as (bracket, offset)."""
    stack: list[tuple[str, int]] = []
    for match in _BRACKET_SCAN.finditer(text, 0, len(text) if end is None else end):
        char = match.group()
        if char in _CLOSER:
            stack.append((char, match.start()))
        elif char in ")}]" and stack and _CLOSER[stack[-1][0]] == char:
            stack.pop()
    return stack


def too_deep(text: str) -> Diagnostic | None:
    """An error at the first bracket nested more than :data:`MAX_NESTING` deep, if any."""
    depth = 0
    for match in _BRACKET_SCAN.finditer(text):
        char = match.group()
        if char in _CLOSER:
            depth += 1
            if depth > MAX_NESTING:
                line, column = _position(text, match.start())
                return Diagnostic(Severity.ERROR, f"brackets are nested more than {MAX_NESTING} deep",
                                  Code.TOO_DEEP, Span.point(line, column),
                                  ("a strategy needs a few levels; is a closing bracket missing?",))
        elif char in ")}]":
            depth = max(0, depth - 1)
    return None


def _unclosed_note(text: str, offset: int) -> tuple[str, ...]:
    """A note naming the bracket open at ``offset`` when nothing in the file ever closes it."""
    stack = _open_brackets(text, offset)
    if not stack:
        return ()
    bracket, at = stack[-1]
    if (bracket, at) not in _open_brackets(text):
        return ()  # it is closed later: the error is something else
    open_line, open_column = _position(text, at)
    return (f"the '{bracket}' at line {open_line}, column {open_column} is never closed",)


# ---- syntax errors ---------------------------------------------------------------------------

_TERMINAL_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "QUANTITY": "a number with a unit",
    "STRING": "a quoted string",
    "SCHEDULE": "'1f1b'",
    "SEED_POLICY": "'same' or 'differ'",
    "MULOP": "'*' or '/'",
    "STAR": "'*'",
    "_TIMES": "'*'",
    "$END": "end of file",
}
# Terminals that stand for several spellings are listed one spelling at a time in "expected ...".
_TERMINAL_CHOICES = {"MULOP": ("'*'", "'/'"), "SEED_POLICY": ("'same'", "'differ'")}
_CATEGORY_ORDER = ("a name", "a number", "a number with a unit", "a quoted string")


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    try:
        pattern = parser().get_terminal(name).pattern
    except KeyError:
        return name.lower()
    if pattern.type == "str":
        return f"'{pattern.value}'"
    return name.lower()


def _keyword(name: str) -> str | None:
    """The word of a keyword terminal ('MODEL' -> 'model'), or None for other terminals."""
    try:
        pattern = parser().get_terminal(name).pattern
    except KeyError:
        return None
    if pattern.type == "str" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pattern.value):
        return str(pattern.value)
    return None


@functools.cache
def _statement_starts() -> frozenset[str]:
    """Terminals that begin a top-level statement (read from the grammar, not listed by hand)."""
    accepted: set[str] = parser().parse_interactive("").accepts()  # type: ignore[no-untyped-call]
    return frozenset(accepted - {"$END"})


@functools.cache
def _step_item_starts() -> frozenset[str]:
    """Terminals that begin an item inside 'step { ... }'."""
    interactive = parser().parse_interactive("step {")
    interactive.exhaust_lexer()
    accepted: set[str] = interactive.accepts()  # type: ignore[no-untyped-call]
    return frozenset(accepted - {"RBRACE"})


@functools.cache
def _statement_words() -> tuple[str, ...]:
    """Statement keywords in the order the grammar lists them."""
    grammar = grammar_path().read_text(encoding="utf-8")
    words = [w for w in (_keyword(t) for t in _statement_starts()) if w]
    return tuple(sorted(words, key=lambda w: (grammar.find(f'"{w}"'), w)))


def _accepted(err: UnexpectedInput) -> set[str]:
    """The terminals the parser accepts where it stopped (exact, unlike err.expected)."""
    interactive = getattr(err, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts())
        except Exception:  # accepts() replays the parser; fall back to Lark's own list
            pass
    return set(getattr(err, "expected", None) or getattr(err, "allowed", None) or ())


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _expected(names: set[str]) -> str:
    """'expected X, Y or Z' for a set of terminal names, in an order a reader can scan."""
    names = {n for n in names if not n.startswith("__ANON")}
    if "LSQB" in names and "NUMBER" in names:
        names.discard("LSQB")  # a list is a value of one option only (layers = [...]): not offered
    tail: list[str] = []
    statements = _statement_starts()
    step_items = _step_item_starts()
    if statements and statements <= names:
        names -= statements
        only = not (names - {"$END"})
        tail.append("a statement (" + ", ".join(_statement_words()) + ")" if only
                    else "a new statement")
    elif step_items and step_items <= names:
        names -= step_items
        tail.append("a step operation (backward, each microbatch, all_reduce, update, ...)"
                    if not names - {"RBRACE"} else "a step operation")
    if "$END" in names:
        names.discard("$END")
        tail.append("end of file")
    literal: set[str] = set()
    for name in names:
        literal.update(_TERMINAL_CHOICES.get(name, (_describe_terminal(name),)))
    categories = [c for c in (*_CATEGORY_ORDER, "'1f1b'") if c in literal]
    words = sorted(literal - set(categories)) + categories + tail
    if not words:
        return ""
    return "expected " + _join(words)


def syntax_diagnostic(err: UnexpectedInput, source: Source) -> Diagnostic:
    """The diagnostic for a Lark parse error in ``source``: where, what was expected, a hint."""
    accepted = _accepted(err)
    text = source.text
    if isinstance(err, UnexpectedCharacters):
        offset = err.pos_in_stream or 0
        char = text[offset] if offset < len(text) else ""
        span = Span.point(err.line, err.column)
        shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}" if char else "nothing"
        if char == '"':
            line_end = text.find("\n", offset)
            width = (line_end if line_end >= 0 else len(text)) - offset
            span = Span(err.line, err.column, err.line, err.column + width)
            return Diagnostic(Severity.ERROR, "unterminated string: a string ends with '\"' on the "
                              "line where it starts", Code.SYNTAX, span)
        expected = _expected(accepted)
        message = f"unexpected character {shown}" + (f"; {expected}" if expected else "")
        notes = _hint_for_character(char, text, offset, accepted) + _unclosed_note(text, offset)
        return Diagnostic(Severity.ERROR, message, Code.SYNTAX, span, notes)
    if isinstance(err, UnexpectedEOF) or (isinstance(err, UnexpectedToken)
                                          and err.token.type == "$END"):
        token = getattr(err, "token", None)
        if token is not None and token.end_line is not None and token.end_column is not None:
            span = Span.point(token.end_line, token.end_column)  # just past the last token
        else:
            span = source.end_span()
        expected = _expected(accepted)
        notes = _unclosed_note(text, len(text))
        return Diagnostic(Severity.ERROR, "unexpected end of file" + (f"; {expected}" if expected else ""),
                          Code.SYNTAX, span, notes)
    assert isinstance(err, UnexpectedToken)
    token = err.token
    span = token_span(token)
    offset = token.start_pos if token.start_pos is not None else 0
    unit = _unknown_unit(text, offset, accepted)
    if unit is not None:
        return unit
    notes = _unclosed_note(text, offset)
    if token.type == "COLON":  # ':' is a token only after a loss term's name: read as before
        expected = _expected(accepted)
        return Diagnostic(Severity.ERROR, "unexpected character ':'" +
                          (f"; {expected}" if expected else ""), Code.SYNTAX, span,
                          _hint_for_character(":", text, offset, accepted) + notes)
    shown = token.value if len(token.value) <= 40 else token.value[:37] + "..."
    keyword = _keyword(token.type)
    if token.type == "NAME" and _statement_starts() <= accepted and _starts_line(text, offset):
        words = _statement_words()
        hint = did_you_mean(shown, words)
        if not hint.startswith("; did you mean"):
            hint = "; expected a statement (" + ", ".join(words) + ")"
        return Diagnostic(Severity.ERROR, f"unknown statement '{shown}'{hint}", Code.SYNTAX, span,
                          notes or _hint_for_statement(token, text))
    if keyword is not None:
        what = f"keyword '{shown}'"
    elif token.type in _TERMINAL_WORDS and token.type not in ("STAR", "_TIMES", "MULOP"):
        what = f"{_describe_terminal(token.type).removeprefix('a ').removeprefix('an ')} '{shown}'"
    else:
        what = f"'{shown}'"
    expected = _expected(accepted)
    if token.type == "NAME":
        keywords = [w for w in (_keyword(t) for t in accepted) if w]
        close = did_you_mean(shown, keywords) if keywords else ""
        if close.startswith("; did you mean"):
            expected = close.removeprefix("; ")
    message = f"unexpected {what}" + (f"; {expected}" if expected else "")
    return Diagnostic(Severity.ERROR, message, Code.SYNTAX, span,
                      notes + _hint_for_token(token, accepted, text, err))


def _starts_line(text: str, offset: int) -> bool:
    line_start = text.rfind("\n", 0, offset) + 1
    return not text[line_start:offset].strip()


def _hint_for_statement(token: Token, text: str) -> tuple[str, ...]:
    after = text[token.end_pos:token.end_pos + 40].lstrip(" \t") if token.end_pos else ""
    if after.startswith("=") and token.value not in _statement_words():
        return ("axes are declared inside 'mesh { ... }' and model sizes inside 'model { ... }'",)
    return ()


def _hint_for_character(char: str, text: str, offset: int, accepted: set[str]) -> tuple[str, ...]:
    if char == ":":
        return ("write 'name = value' (for example 'dp = 8'), not 'name: value'",)
    if char == ";":
        return ("statements need no ';' - put each on its own line",)
    if char in "'`":
        return ('strings use double quotes: strategy "my run"',)
    if char == "-":
        if offset and (text[offset - 1].isalnum() or text[offset - 1] == "_"):
            return ("names are written with '_', not '-' (for example llama3_8b)",)
        if "MULOP" in accepted:
            return ("placeverify expressions have no subtraction; scale by a factor instead",)
    return ()


def _accepted_after(err: UnexpectedToken, terminal: str, value: str) -> set[str]:
    """What the parser would accept had ``terminal`` come first (for 'is a ... missing?')."""
    interactive = getattr(err, "interactive_parser", None)
    if interactive is None:
        return set()
    try:
        cursor = interactive.copy()
        cursor.feed_token(Token(terminal, value))
        return set(cursor.accepts())
    except Exception:  # the terminal itself is not accepted there
        return set()


def _hint_for_token(token: Token, accepted: set[str], text: str,
                    err: UnexpectedToken) -> tuple[str, ...]:
    if token.type == "NUMBER" and token.value.startswith("-") and token.start_pos and \
            (text[token.start_pos - 1].isalnum() or text[token.start_pos - 1] == "_"):
        return ("names are written with '_', not '-' (for example llama3_8b)",)
    if token.type == "NAME" and accepted == {"LPAR", "OVER"}:
        return ("a placement is written 'place <preset or (Θ, Ω, G, A)> over <axis>'",)
    after_comma = _accepted_after(err, "COMMA", ",") if "COMMA" in accepted else set()
    # a keyword where a name could follow the comma ('tokens(dp step)'), unless it starts a line:
    # then it more likely begins the next statement after an unclosed block
    as_name = (_keyword(token.type) is not None and "NAME" in after_comma
               and not _starts_line(text, token.start_pos or 0))
    if token.type in after_comma or as_name:
        return (f"is a ',' missing before '{token.value}'?",)
    return ()


# ---- units the grammar does not know ('100 Gbps', '80 gb', '5 usec') ---------------------------

# The units of the QUANTITY terminal (grammar/placement.lark), each optionally followed by '/s'.
UNITS = ("B", "KB", "MB", "GB", "TB", "PB", "KiB", "MiB", "GiB", "TiB", "PiB", "Gb", "Tb",
         "ns", "us", "µs", "ms", "s")
# Spellings of time units from other tools (C's usec, the Greek mu for the micro sign).
_TIME_SPELLINGS = {"nsec": "ns", "usec": "us", "μs": "µs", "msec": "ms", "sec": "s", "secs": "s",
                   "second": "s", "seconds": "s"}
# A number, then a word the grammar read as a name (the unit it did not know), then only blanks.
_NUMBER_THEN_WORD = re.compile(r"(?<![\w.])[+-]?(?:\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\d+)"
                               r"[ \t]*([^\W\d]\w*)[ \t]*$")


def _unknown_unit(text: str, offset: int, accepted: set[str]) -> Diagnostic | None:
    """``100 Gbps }``: a number followed by a word is a quantity whose unit the grammar does not
    know; the parser read the word as the next entry's key and says "expected '='". Said as an
    unknown unit, with the unit it most likely means."""
    if accepted != {"EQUAL"}:
        return None
    end = len(text[:offset].rstrip())  # the unit may end the line before the unexpected token
    line_start = text.rfind("\n", 0, end) + 1
    found = _NUMBER_THEN_WORD.search(text, line_start, end)
    if found is None:
        return None
    word = found.group(1)
    suggestions = unit_suggestions(word)
    if not suggestions:
        return None
    line = text.count("\n", 0, found.start(1)) + 1
    column = found.start(1) - line_start + 1
    span = Span(line, column, line, column + len(word))
    if len(suggestions) == 1:
        hint = f"did you mean '{suggestions[0]}'?"
    else:
        hint = "did you mean " + " or ".join(f"'{u}' ({_KIND[u[:2]]})" for u in suggestions) + "?"
    return Diagnostic(Severity.ERROR, f"unknown unit '{word}'; {hint}", Code.UNKNOWN_NAME, span,
                      ("units are " + ", ".join(UNITS) + ", and a rate adds '/s' (25 GB/s)",))


_KIND = {"Gb": "bits", "GB": "bytes", "Tb": "bits", "TB": "bytes"}


def unit_suggestions(word: str) -> list[str]:
    """The units ``word`` most likely means: ``Gbps`` -> Gb/s, ``usec`` -> us, ``gb`` -> GB or Gb
    (bytes or bits: both are units); none for a word that is no spelling of a unit."""
    rate = ""
    base = word
    if len(word) > 2 and word.lower().endswith("ps"):  # Gbps, GBps, MBps: per second
        base, rate = word[:-2], "/s"
    if base in _TIME_SPELLINGS:
        return [_TIME_SPELLINGS[base] + rate]
    if base in UNITS and rate:
        return [base + rate]
    matches = [u for u in UNITS if u.lower() == base.lower()]
    if base.lower() in ("gb", "tb") and not rate:
        return sorted(matches, key=lambda u: u[1] != "B")  # bytes first: memory is in bytes
    if base.lower() in ("gb", "tb"):  # Gbps is bits per second (network links)
        return [u + rate for u in sorted(matches, key=lambda u: u[1] == "B")]
    return [u + rate for u in matches]

