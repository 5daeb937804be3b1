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

from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source, Span
from placeverify.syntax import ast

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a strategy is a page of text; larger input is refused at once

GRAMMAR_NAME = "placement.lark"


def grammar_path() -> Path:
    """The grammar file: inside the installed package, or ``grammar/`` of a source checkout."""
    packaged = resources.files("placeverify").joinpath("grammar", GRAMMAR_NAME)
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "grammar" / GRAMMAR_NAME


@functools.cache
def parser() -> Lark:
    """The one LALR parser (built once per process)."""
    return Lark(
        grammar_path().read_text(encoding="utf-8"),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
    )


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
        raise PlaceError([Diagnostic(
            Severity.ERROR, f"not a text file: byte 0x{data[bad]:02x} is not UTF-8 text",
            Code.NOT_TEXT, Span.point(line, column))], shown)
    return text


# ---- parsing ---------------------------------------------------------------------------------


def parse_source(source: Source) -> ast.File:
    """Parse a source into an AST, or raise :class:`PlaceError` pointing at the bad text."""
    if not _has_statements(source.text):
        raise PlaceError([Diagnostic(
            Severity.ERROR, "the file has no statements; a strategy needs at least "
            "'model', 'mesh' and 'place'", Code.EMPTY_FILE, Span.point(1, 1))], source)
    try:
        tree = parser().parse(source.text)
    except UnexpectedInput as err:
        raise PlaceError([_syntax_diagnostic(err, source)], source) from None
    result = _ToAst().transform(tree)
    assert isinstance(result, ast.File)
    return result


def parse_text(text: str, path: str = "<text>") -> ast.File:
    return parse_source(Source(path, text))


_COMMENT_OR_SPACE = re.compile(r"(#[^\n]*|\s+)*")


def _has_statements(text: str) -> bool:
    match = _COMMENT_OR_SPACE.match(text)
    return match is None or match.end() < len(text)


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
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COMMA": "','",
    "EQUAL": "'='",
    "VBAR": "'|'",
    "$END": "end of file",
}


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


def _expected(names: set[str]) -> str:
    words = sorted({_describe_terminal(n) for n in names if not n.startswith("__ANON")})
    if not words:
        return ""
    if len(words) > 8:
        keywords = [w for w in words if w.startswith("'")]
        others = [w for w in words if not w.startswith("'")]
        words = others + keywords[:6] + ["..."]
    return "expected " + (words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1])


def _syntax_diagnostic(err: UnexpectedInput, source: Source) -> Diagnostic:
    if isinstance(err, UnexpectedCharacters):
        char = source.text[err.pos_in_stream] if err.pos_in_stream < len(source.text) else ""
        span = Span.point(err.line, err.column)
        hint = _hint_for_character(char, err)
        shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}"
        expected = _expected(set(err.allowed or ()))
        message = f"unexpected character {shown}" + (f"; {expected}" if expected else "")
        return Diagnostic(Severity.ERROR, message, Code.SYNTAX, span, hint)
    if isinstance(err, UnexpectedEOF):
        span = source.end_span()
        expected = _expected(set(err.expected or ()))
        return Diagnostic(Severity.ERROR, "unexpected end of file" + (f"; {expected}" if expected else ""),
                          Code.SYNTAX, span)
    assert isinstance(err, UnexpectedToken)
    token = err.token
    if token.type == "$END":
        expected = _expected(set(err.expected))
        return Diagnostic(Severity.ERROR, "unexpected end of file" + (f"; {expected}" if expected else ""),
                          Code.SYNTAX, source.end_span())
    span = _token_span(token)
    expected = _expected(set(err.expected))
    shown = token.value if len(token.value) <= 40 else token.value[:37] + "..."
    message = f"unexpected {_describe_terminal(token.type)} '{shown}'"
    if token.type in {"NAME", "NUMBER", "QUANTITY", "STRING"}:
        message = f"unexpected {_describe_terminal(token.type)} '{shown}'"
    return Diagnostic(Severity.ERROR, message + (f"; {expected}" if expected else ""), Code.SYNTAX, span,
                      _hint_for_token(token, set(err.expected)))


def _hint_for_character(char: str, err: UnexpectedCharacters) -> tuple[str, ...]:
    if char == ":":
        return ("write 'name = value' (for example 'dp = 8'), not 'name: value'",)
    if char == ";":
        return ("statements need no ';' - put each on its own line",)
    if char in "'`":
        return ('strings use double quotes: strategy "my run"',)
    if char == "-":
        return ("placeverify expressions have no subtraction; scale by a factor instead",)
    return ()


def _hint_for_token(token: Token, expected: set[str]) -> tuple[str, ...]:
    if "__ANON_0" in expected or token.value in {"over"}:
        return ()
    if token.type == "NAME" and any(_describe_terminal(e) == "'over'" for e in expected):
        return ("a placement is written 'place <preset or (Θ, Ω, G, A)> over <axis>'",)
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


def _name(token: Token) -> ast.Name:
    return ast.Name(str(token), _token_span(token))


@v_args(meta=True)
class _ToAst(Transformer[Token, Any]):
    """Builds one AST node per grammar rule; spans come from Lark's propagated positions."""

    # values
    def number_value(self, meta: Any, children: list[Token]) -> ast.NumberValue:
        token = children[0]
        return ast.NumberValue(str(token), number_of(str(token)), _token_span(token))

    def quantity_value(self, meta: Any, children: list[Token]) -> ast.QuantityValue:
        token = children[0]
        match = _QUANTITY.match(str(token))
        assert match is not None, token
        return ast.QuantityValue(number_of(match["number"]), match["unit"], str(token),
                                 _token_span(token))

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
