"""Text -> parse tree -> AST.

One cached Lark LALR parser is built from ``grammar/placement.lark`` (shipped inside the wheel as
``placeverify/grammar``). Reading is defensive: a file is decoded as UTF-8 text of bounded size,
and every Lark error becomes a :class:`~placeverify.diagnostics.Diagnostic` that points at the
offending text and says what was expected.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from placeverify.diagnostics import (
    Code,
    Diagnostic,
    ExitCode,
    PlaceError,
    Severity,
    Source,
    Span,
    did_you_mean,
)
from placeverify.syntax import ast, parser_cache

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a strategy is a page of text; larger input is refused at once

GRAMMAR_NAME = "placement.lark"


def grammar_path() -> Path:
    """The grammar file: inside the installed package, or ``grammar/`` of a source checkout."""
    packaged = resources.files("placeverify").joinpath("grammar", GRAMMAR_NAME)
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "grammar" / GRAMMAR_NAME


PARSER_OPTIONS: dict[str, Any] = {"parser": "lalr", "lexer": "contextual",
                                  "propagate_positions": True, "maybe_placeholders": True}


@functools.cache
def parser() -> Lark:
    """The one LALR parser, built once per process or loaded from the parser cache.

    Building the LALR tables takes tens of milliseconds, a large share of a whole ``check``.
    The built parser is cached as JSON (never pickle) under the user's cache folder, keyed by a
    hash of the grammar text, Lark's version and the options; a missing, stale or unreadable
    cache is simply rebuilt. ``PLACEVERIFY_CACHE_DIR`` moves it; ``PLACEVERIFY_NO_CACHE=1``
    turns it off.
    """
    text = grammar_path().read_text(encoding="utf-8")
    return parser_cache.load_or_build(text, PARSER_OPTIONS, "placement")


# ---- reading ---------------------------------------------------------------------------------


def read_source(path: str | Path) -> Source:
    """Read a file as a :class:`Source`, refusing missing, unreadable, huge or binary files."""
    name = str(path)
    p = Path(path)
    try:
        if not p.exists():
            raise _read_error(name, "no such file")
        if p.is_dir():
            raise _read_error(name, "is a directory, not a .place file")
        if not p.is_file():  # a FIFO, socket or device: reading could block or never end
            raise _read_error(name, "not a regular file")
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PlaceError([Diagnostic(
                Severity.ERROR,
                f"file is {size:,} bytes; placeverify reads at most {MAX_FILE_BYTES:,} bytes",
                Code.TOO_LARGE)], Source(name, ""))
        with p.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except PermissionError:
        raise _read_error(name, "permission denied") from None
    except OSError as err:
        raise _read_error(name, err.strerror or "cannot be read") from None
    if len(data) > MAX_FILE_BYTES:  # grew while we looked
        raise PlaceError([Diagnostic(Severity.ERROR, f"file is larger than {MAX_FILE_BYTES:,} bytes",
                                     Code.TOO_LARGE)], Source(name, ""))
    return Source(name, decode_text(name, data))


def _read_error(name: str, why: str) -> PlaceError:
    return PlaceError([Diagnostic(Severity.ERROR, f"cannot read file: {why}", Code.READ)],
                      Source(name, ""), ExitCode.READ_ERROR)


def decode_text(name: str, data: bytes) -> str:
    """Decode UTF-8 (a BOM is allowed); NUL bytes or invalid UTF-8 mean 'not a text file'."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    bad = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = err.start if bad < 0 else min(bad, err.start)
        text = data[:bad].decode("utf-8", errors="replace")
    if bad >= 0:
        prefix = data[:bad].decode("utf-8", errors="replace")
        line = prefix.count("\n") + 1
        column = len(prefix) - (prefix.rfind("\n") + 1) + 1
        shown = Source(name, prefix)
        notes: tuple[str, ...] = ()
        if data[bad] == 0:
            message = "not a text file: it contains a NUL byte (0x00)"
        else:
            message = f"not a text file: byte 0x{data[bad]:02x} is not valid UTF-8"
            notes = ("a .place file is UTF-8 text; save it as UTF-8",)
        raise PlaceError([Diagnostic(Severity.ERROR, message, Code.NOT_TEXT,
                                     Span.point(line, column), notes)], shown)
    return text


# ---- parsing ---------------------------------------------------------------------------------

MAX_NESTING = 32  # brackets inside brackets; real strategies use 3, and deeper input would recurse
MAX_NUMBER_DIGITS = 100
MAX_NUMBER_EXPONENT = 100  # number literals lie within 1e-100 .. 1e100 (in magnitude)


def parse_source(source: Source) -> ast.File:
    """Parse a source into an AST, or raise :class:`PlaceError` pointing at the bad text."""
    if not _has_statements(source.text):
        raise PlaceError([Diagnostic(
            Severity.ERROR, "the file has no statements; a strategy needs at least "
            "'model', 'mesh' and 'place'", Code.EMPTY_FILE)], source)
    too_deep = _too_deep(source.text)
    if too_deep is not None:
        raise PlaceError([too_deep], source)
    try:
        tree = parser().parse(source.text)
    except UnexpectedInput as err:
        raise PlaceError([_syntax_diagnostic(err, source)], source) from None
    builder = _ToAst()
    result = builder.transform(tree)
    if builder.errors:
        raise PlaceError(builder.errors, source)
    assert isinstance(result, ast.File)
    return result


def parse_text(text: str, path: str = "<text>") -> ast.File:
    return parse_source(Source(path, text))


_COMMENT_OR_SPACE = re.compile(r"(#[^\n]*|\s+)*")


def _has_statements(text: str) -> bool:
    match = _COMMENT_OR_SPACE.match(text)
    return match is None or match.end() < len(text)


# ---- brackets --------------------------------------------------------------------------------

# Comments and strings hide brackets; a string ends at its closing quote or at the end of the line.
_BRACKET_SCAN = re.compile(r'#[^\n]*|"(?:[^"\\\n]|\\.)*"?|[(){}\[\]]')
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


def _too_deep(text: str) -> Diagnostic | None:
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


def _syntax_diagnostic(err: UnexpectedInput, source: Source) -> Diagnostic:
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
    span = _token_span(token)
    offset = token.start_pos if token.start_pos is not None else 0
    notes = _unclosed_note(text, offset)
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


def _token_span(token: Token) -> Span:
    line = token.line or 1
    column = token.column or 1
    end_line = token.end_line or line
    end_column = token.end_column or column + max(1, len(token.value))
    return Span(line, column, end_line, end_column)


def _meta_span(meta: Any) -> Span:
    if getattr(meta, "empty", True):
        return Span.point(1, 1)
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


# ---- parse tree -> AST -----------------------------------------------------------------------

_QUANTITY = re.compile(r"^(?P<number>[+-]?[\d_.eE+-]+?)[ \t]*(?P<unit>[A-Za-zµ]+(/s)?)$")


def number_of(text: str) -> Fraction:
    return Fraction(text.replace("_", ""))


_NUMBER_PARTS = re.compile(r"^[+-]?(?P<whole>\d*)(?:\.(?P<fraction>\d*))?(?:[eE](?P<exponent>[+-]?\d+))?$")


def number_problem(text: str) -> str | None:
    """Why a number literal is out of range (checked on the text: 1e999999999 is never built)."""
    match = _NUMBER_PARTS.match(text.replace("_", ""))
    if match is None:
        return None
    whole, fraction = match["whole"], match["fraction"] or ""
    if len(whole) + len(fraction) > MAX_NUMBER_DIGITS:
        return f"has more than {MAX_NUMBER_DIGITS} digits"
    exponent_text = (match["exponent"] or "0").lstrip("+-").lstrip("0") or "0"
    if len(exponent_text) > 6:
        return "is out of range"
    exponent = int(match["exponent"] or 0)
    digits = whole.lstrip("0")
    if digits:
        magnitude = exponent + len(digits) - 1
    elif fraction.strip("0"):
        magnitude = exponent - (len(fraction) - len(fraction.lstrip("0"))) - 1
    else:
        return None  # zero
    if abs(magnitude) > MAX_NUMBER_EXPONENT:
        return "is out of range"
    return None


def _name(token: Token) -> ast.Name:
    return ast.Name(str(token), _token_span(token))


@v_args(meta=True)
class _ToAst(Transformer[Token, Any]):
    """Builds one AST node per grammar rule; spans come from Lark's propagated positions.

    Number literals out of range are collected in ``errors`` (and stand in as 0) so that one pass
    reports all of them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[Diagnostic] = []

    def _number(self, text: str, span: Span) -> Fraction:
        problem = number_problem(text)
        if problem is not None:
            shown = text if len(text) <= 24 else text[:21] + "..."
            self.errors.append(Diagnostic(
                Severity.ERROR, f"the number {shown} {problem}", Code.BAD_VALUE, span,
                (f"numbers are written with at most {MAX_NUMBER_DIGITS} digits, between "
                 f"1e-{MAX_NUMBER_EXPONENT} and 1e{MAX_NUMBER_EXPONENT} in size",)))
            return Fraction(0)
        return number_of(text)

    # values
    def number_value(self, meta: Any, children: list[Token]) -> ast.NumberValue:
        token = children[0]
        span = _token_span(token)
        return ast.NumberValue(str(token), self._number(str(token), span), span)

    def quantity_value(self, meta: Any, children: list[Token]) -> ast.QuantityValue:
        token = children[0]
        match = _QUANTITY.match(str(token))
        assert match is not None, token
        span = _token_span(token)
        return ast.QuantityValue(self._number(match["number"], span), match["unit"], str(token),
                                 span)

    def string_value(self, meta: Any, children: list[Token]) -> ast.StringValue:
        token = children[0]
        raw = str(token)[1:-1]
        value = re.sub(r"\\(.)", r"\1", raw)
        return ast.StringValue(value, _token_span(token))

    def name_value(self, meta: Any, children: list[Token]) -> ast.NameValue:
        return ast.NameValue(_name(children[0]))

    def starred_value(self, meta: Any, children: list[Token]) -> ast.StarredValue:
        name = _name(children[0])
        return ast.StarredValue(name, name.span.cover(_token_span(children[1])))

    # blocks and calls
    def entry(self, meta: Any, children: list[Any]) -> ast.Entry:
        return ast.Entry(_name(children[0]), children[1], _meta_span(meta))

    def block(self, meta: Any, children: list[Any]) -> ast.Block:
        return ast.Block(tuple(children), _meta_span(meta))

    def keyword_arg(self, meta: Any, children: list[Any]) -> ast.KeywordArg:
        return ast.KeywordArg(_name(children[0]), children[1], _meta_span(meta))

    def positional_arg(self, meta: Any, children: list[Any]) -> ast.PositionalArg:
        return ast.PositionalArg(children[0], _meta_span(meta))

    def args(self, meta: Any, children: list[Any]) -> tuple[ast.Arg, ...]:
        return tuple(children)

    def call(self, meta: Any, children: list[Any]) -> ast.Call:
        return ast.Call(_name(children[0]), children[1] or (), _meta_span(meta))

    # groups
    def axis_ref(self, meta: Any, children: list[Token]) -> ast.AxisRef:
        name = _name(children[0])
        return ast.AxisRef(name, name.span)

    def derived_group(self, meta: Any, children: list[Token]) -> ast.DerivedGroup:
        return ast.DerivedGroup(_name(children[0]), _name(children[1]), _meta_span(meta))

    def axis_tuple(self, meta: Any, children: list[Token]) -> ast.AxisTuple:
        return ast.AxisTuple(tuple(_name(c) for c in children), _meta_span(meta))

    def group(self, meta: Any, children: list[Any]) -> ast.Group:
        return ast.Group(tuple(children), _meta_span(meta))

    def group_list(self, meta: Any, children: list[Any]) -> tuple[ast.Group, ...]:
        return tuple(children)

    # placements
    def preset_placement(self, meta: Any, children: list[Token]) -> ast.PresetPlacement:
        name = _name(children[0])
        return ast.PresetPlacement(name, name.span)

    def call_placement(self, meta: Any, children: list[Any]) -> ast.CallPlacement:
        return ast.CallPlacement(_name(children[0]), children[1] or (), _meta_span(meta))

    def tuple_placement(self, meta: Any, children: list[Any]) -> ast.TuplePlacement:
        return ast.TuplePlacement(children[0] or (), _meta_span(meta))

    # expressions
    def number_factor(self, meta: Any, children: list[Any]) -> ast.NumberFactor:
        return ast.NumberFactor(children[0], children[0].span)

    def name_factor(self, meta: Any, children: list[Token]) -> ast.NameFactor:
        name = _name(children[0])
        return ast.NameFactor(name, name.span)

    def count_factor(self, meta: Any, children: list[Any]) -> ast.CountFactor:
        return ast.CountFactor(_name(children[0]), children[1] or (), _meta_span(meta))

    def size_factor(self, meta: Any, children: list[Any]) -> ast.SizeFactor:
        return ast.SizeFactor(children[0], _meta_span(meta))

    def paren_factor(self, meta: Any, children: list[Any]) -> ast.ParenFactor:
        return ast.ParenFactor(children[0], _meta_span(meta))

    def expr(self, meta: Any, children: list[Any]) -> ast.Expr:
        rest = tuple((str(children[i]), children[i + 1]) for i in range(1, len(children), 2))
        return ast.Expr(children[0], tuple((op.replace("×", "*"), f) for op, f in rest),
                        _meta_span(meta))

    # step
    def target(self, meta: Any, children: list[Any]) -> ast.Target:
        selectors = tuple(_name(c) for c in children[1:] if c is not None)
        return ast.Target(_name(children[0]), selectors, _meta_span(meta))

    def microbatches_stmt(self, meta: Any, children: list[Any]) -> ast.MicrobatchesStmt:
        return ast.MicrobatchesStmt(children[0], _meta_span(meta))

    def backward_stmt(self, meta: Any, children: list[Any]) -> ast.BackwardStmt:
        return ast.BackwardStmt(children[0], _meta_span(meta))

    def each_microbatch(self, meta: Any, children: list[Any]) -> ast.EachMicrobatch:
        return ast.EachMicrobatch(tuple(children), _meta_span(meta))

    def on_microbatch(self, meta: Any, children: list[Any]) -> ast.OnMicrobatch:
        return ast.OnMicrobatch(children[0], tuple(children[1:]), _meta_span(meta))

    def scale_stmt(self, meta: Any, children: list[Any]) -> ast.ScaleStmt:
        return ast.ScaleStmt(children[0], children[1], _meta_span(meta))

    def seed_stmt(self, meta: Any, children: list[Any]) -> ast.SeedStmt:
        return ast.SeedStmt(children[0], _name(children[1]), children[2], _meta_span(meta))

    def op_stmt(self, meta: Any, children: list[Any]) -> ast.OpStmt:
        name, args, target, group = children
        return ast.OpStmt(_name(name), args or (), target, group, _meta_span(meta))

    def clip_op_stmt(self, meta: Any, children: list[Any]) -> ast.OpStmt:
        keyword, args, target, group = children
        return ast.OpStmt(_name(keyword), args or (), target, group, _meta_span(meta))

    def step_stmt(self, meta: Any, children: list[Any]) -> ast.StepStmt:
        return ast.StepStmt(tuple(children), _meta_span(meta))

    # top level
    def strategy_stmt(self, meta: Any, children: list[Token]) -> ast.StrategyStmt:
        token = children[0]
        return ast.StrategyStmt(self.string_value(meta, [token]), _meta_span(meta))

    def model_stmt(self, meta: Any, children: list[Any]) -> ast.ModelStmt:
        name = _name(children[0]) if children[0] is not None else None
        return ast.ModelStmt(name, children[1], _meta_span(meta))

    def precision_stmt(self, meta: Any, children: list[Any]) -> ast.PrecisionStmt:
        name = _name(children[0]) if children[0] is not None else None
        return ast.PrecisionStmt(name, children[1], _meta_span(meta))

    def axis_entry(self, meta: Any, children: list[Any]) -> ast.AxisEntry:
        return ast.AxisEntry(_name(children[0]), children[1], children[2], _meta_span(meta))

    def group_entry(self, meta: Any, children: list[Any]) -> ast.GroupEntry:
        return ast.GroupEntry(_name(children[0]), children[1], _meta_span(meta))

    def mesh_stmt(self, meta: Any, children: list[Any]) -> ast.MeshStmt:
        return ast.MeshStmt(tuple(children), _meta_span(meta))

    def place_stmt(self, meta: Any, children: list[Any]) -> ast.PlaceStmt:
        return ast.PlaceStmt(children[0], children[1], _meta_span(meta))

    def recompute_stmt(self, meta: Any, children: list[Any]) -> ast.RecomputeStmt:
        return ast.RecomputeStmt(children[0], _meta_span(meta))

    def offload_stmt(self, meta: Any, children: list[Any]) -> ast.OffloadStmt:
        *states, device = children
        return ast.OffloadStmt(tuple(_name(s) for s in states),
                               _name(device) if device is not None else None, _meta_span(meta))

    def loss_stmt(self, meta: Any, children: list[Any]) -> ast.LossStmt:
        return ast.LossStmt(children[0], _meta_span(meta))

    def clip_stmt(self, meta: Any, children: list[Any]) -> ast.ClipStmt:
        return ast.ClipStmt(tuple(children[1:]), _meta_span(meta))

    def loss_scale_stmt(self, meta: Any, children: list[Token]) -> ast.LossScaleStmt:
        return ast.LossScaleStmt(_name(children[0]), _meta_span(meta))

    def start(self, meta: Any, children: list[Any]) -> ast.File:
        return ast.File(tuple(children), _meta_span(meta))


def tree_of(text: str) -> Tree[Token]:
    """The raw Lark parse tree (for golden tests of the grammar)."""
    return parser().parse(text)
