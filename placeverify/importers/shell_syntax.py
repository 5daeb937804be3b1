"""The bash subset of a launch script, parsed into statements with source offsets (never run).

Read as bash reads it (the POSIX shell grammar, with bash's ``[[ ]]``, arrays and ``+=``):
quotes (single, double, ``$'...'``) that may span lines, backslash-newline continuations,
comments (a ``#`` that starts a word), here-documents (their body kept as a word: expanded
as in double quotes unless the delimiter is quoted), redirections (kept on simple commands,
with their targets), ``$NAME``, ``${...}``, ``$(( ))``, and command substitution (``$( )``,
backticks) and process substitution (``<( )``, ``>( )``) kept as parts whose value is unknown.
Statements: simple commands with their assignments (``NAME=word``, ``NAME+=word``,
``NAME=( words )``, ``NAME+=( words )``), pipelines, ``&&``/``||`` lists, ``if``/``elif``/
``else``, ``while``/``until``/``for``/``select`` loops, ``case``, ``{ }`` groups, ``( )``
subshells and function definitions. What this module does not recognise is a syntax error at
its text.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")
_OPERATORS = ("&&", "||", ";;&", ";;", ";&", "|&", "|", "&", ";", "(", ")")
_REDIRECTS = ("&>>", "<<<", "<<-", "<<", ">>", "<&", ">&", "&>", "<>", ">|", "<", ">")
_SPECIAL = "@*#?$!-0123456789"


class ShellSyntaxError(Exception):
    """Text the reader cannot parse, at a source offset."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


# ---- words ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Lit:
    """Literal characters (quote removal done), with the source offset of each."""

    text: str
    offsets: tuple[int, ...]
    quoted: bool


@dataclass(frozen=True, slots=True)
class Param:
    """``$NAME``, ``${NAME}``, ``${NAME[@]}``, ``${#NAME}``, ``${NAME:-word}`` and the like."""

    name: str
    index: str | None  # "@", "*", a literal index, or None
    # ":-", "-", ":=", "=", ":+", "+", ":?", "?", "#", "##", "%", "%%", "#len", or "other"
    op: str | None
    arg: tuple[Part, ...]  # the word after the operator
    quoted: bool
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Substitution:
    """Command substitution (``$( )``, backticks) or process substitution: never run."""

    kind: str  # "command substitution", "backticks", "process substitution"
    quoted: bool
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Arith:
    """``$(( expression ))``: the expression's text and where it starts."""

    expression: str
    quoted: bool
    start: int
    end: int


Part = Lit | Param | Substitution | Arith


@dataclass(frozen=True, slots=True)
class WordTok:
    """One word as written: its parts, where it starts and ends, and for ``NAME=( ... )`` the
    array's items."""

    parts: tuple[Part, ...]
    start: int
    end: int
    items: tuple[WordTok, ...] | None = None

    def literal(self) -> str | None:
        """The word's text when it is one unquoted literal (a reserved word, an operator of a
        test), else None."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Lit) and not self.parts[0].quoted:
            return self.parts[0].text
        return None

    def assignment(self) -> tuple[str, bool, WordTok] | None:
        """(name, append, value) for ``NAME=value`` / ``NAME+=value``."""
        if not self.parts or not isinstance(self.parts[0], Lit) or self.parts[0].quoted:
            return None
        head = self.parts[0]
        match = _ASSIGNMENT.match(head.text)
        if match is None or match.group(2):
            return None
        cut = match.end()
        rest: list[Part] = []
        if cut < len(head.text):
            rest.append(Lit(head.text[cut:], head.offsets[cut:], False))
        rest.extend(self.parts[1:])
        at = head.offsets[cut] if cut < len(head.offsets) else self.end
        return match.group(1), bool(match.group(3)), WordTok(tuple(rest), at, self.end, self.items)


@dataclass(frozen=True, slots=True)
class Tok:
    kind: str  # "word", "op", "redirect", "newline", "eof"
    text: str
    start: int
    end: int
    word: WordTok | None = None


# ---- statements -------------------------------------------------------------------------------

@dataclass(slots=True)
class HereDoc:
    """A here-document: its delimiter, whether ``<<-`` strips leading tabs, whether its body is
    expanded (an unquoted delimiter), and the body, filled in when the lexer reaches it (the line
    after the command)."""

    delimiter: str
    strip: bool
    expand: bool
    body: WordTok | None = None


@dataclass(frozen=True, slots=True)
class Redirect:
    """A redirection of a simple command: its operator (``>``, ``>>``, ``<<``...) and target
    (for ``<<`` / ``<<-``, the here-document)."""

    op: str
    target: WordTok | HereDoc


@dataclass(frozen=True, slots=True)
class Simple:
    assignments: tuple[tuple[str, bool, WordTok], ...]
    words: tuple[WordTok, ...]
    start: int
    end: int
    redirects: tuple[Redirect, ...] = ()


@dataclass(frozen=True, slots=True)
class Test:
    """``[[ ... ]]``: its words and operators, unsplit."""

    words: tuple[WordTok, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class If:
    clauses: tuple[tuple[List, List], ...]  # (condition, body) for if and each elif
    otherwise: List | None
    start: int


@dataclass(frozen=True, slots=True)
class Loop:
    kind: str  # while, until, for, select
    condition: List | None
    body: List
    start: int
    variable: str | None = None  # a for loop's name (None: ``for (( ; ; ))``)
    items: tuple[WordTok, ...] | None = None  # after ``in``; None: no ``in``, the script's "$@"


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm of a ``case``: its patterns, its body, and how it ends (``;;``, ``;&``, ``;;&``)."""

    patterns: tuple[WordTok, ...]
    body: List
    end: str


@dataclass(frozen=True, slots=True)
class Case:
    subject: WordTok
    arms: tuple[Arm, ...]
    start: int


@dataclass(frozen=True, slots=True)
class Group:
    body: List
    subshell: bool
    start: int


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    body: Node
    start: int


Node = Simple | Test | If | Loop | Case | Group | Function


@dataclass(frozen=True, slots=True)
class Pipeline:
    nodes: tuple[Node, ...]
    negated: bool
    background: bool
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class AndOr:
    """``p1 && p2 || p3``: the first pipeline and each (operator, pipeline) after it."""

    first: Pipeline
    rest: tuple[tuple[str, Pipeline], ...]


@dataclass(frozen=True, slots=True)
class List:
    items: tuple[AndOr, ...] = field(default_factory=tuple)


# ---- lexer ------------------------------------------------------------------------------------

class Lexer:
    """Tokens of a script, each with its source offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.heredocs: list[HereDoc] = []  # pending: their bodies start after the next newline
        self.test_depth = 0  # inside [[ ]]: < > ( ) are words' characters, not operators

    def error(self, message: str, offset: int) -> ShellSyntaxError:
        return ShellSyntaxError(message, offset)

    def next(self) -> Tok:
        text = self.text
        while True:
            while self.i < len(text) and text[self.i] in " \t\r":
                self.i += 1
            if text.startswith("\\\n", self.i):
                self.i += 2
                continue
            if self.i < len(text) and text[self.i] == "#":
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
                continue
            break
        start = self.i
        if self.i >= len(text):
            return Tok("eof", "", start, start)
        c = text[self.i]
        if c == "\n":
            self.i += 1
            if self.heredocs:
                self._read_heredocs()
            return Tok("newline", "\n", start, self.i)
        for op in _REDIRECTS:
            if text.startswith(op, self.i) and not text.startswith(op + "(", self.i) \
                    and not (op in ("<", ">") and text.startswith("(", self.i + 1)):
                self.i += len(op)
                return Tok("redirect", op, start, self.i)
        for op in _OPERATORS:
            if text.startswith(op, self.i):
                self.i += len(op)
                return Tok("op", op, start, self.i)
        word = self.word()
        # a file-descriptor number right before a redirection (2>&1) belongs to it
        if self.i < len(text) and text[self.i] in "<>" and re.fullmatch(r"\d+", word.literal() or "x") \
                and not text.startswith("(", self.i + 1):
            tok = self.next()
            return Tok("redirect", tok.text, start, tok.end)
        return Tok("word", text[start:self.i], start, self.i, word)

    def _read_heredocs(self) -> None:
        for doc in self.heredocs:
            start = end = self.i
            while self.i < len(self.text):
                stop = self.text.find("\n", self.i)
                stop = len(self.text) if stop < 0 else stop
                line = self.text[self.i:stop]
                end = self.i
                self.i = min(stop + 1, len(self.text))
                if (line.lstrip("\t") if doc.strip else line) == doc.delimiter:
                    break
                end = self.i
            doc.body = self._heredoc_body(doc, start, end)
        self.heredocs = []

    def _heredoc_body(self, doc: HereDoc, start: int, end: int) -> WordTok:
        """The body between ``start`` and ``end``: with a quoted delimiter literal, else read as
        between double quotes; ``<<-`` drops the tabs that start each line."""
        resume, self.i = self.i, start
        if doc.expand:
            parts = self._double_quoted(end, doc.strip)
        else:
            kept: list[int] = []
            line_start = True
            for i in range(start, end):
                if not (doc.strip and line_start and self.text[i] == "\t"):
                    kept.append(i)
                    line_start = self.text[i] == "\n"
            parts = [Lit("".join(self.text[i] for i in kept), tuple(kept), True)] if kept else []
        self.i = resume
        return WordTok(tuple(parts), start, end)

    def word(self) -> WordTok:
        start = self.i
        parts = self._parts(stop=" \t\r\n;&|()<>", quoted=False)
        if not parts and self.i == start:
            raise self.error(f"unexpected '{self.text[self.i]}'", self.i)
        tok = WordTok(tuple(parts), start, self.i)
        if self.i < len(self.text) and self.text[self.i] == "(" and \
                re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=", tok.literal() or ""):
            self.i += 1
            items = self._array_items(start)
            tok = WordTok(tok.parts, start, self.i, items)
        return tok

    def _array_items(self, start: int) -> tuple[WordTok, ...]:
        items: list[WordTok] = []
        text = self.text
        while True:
            while self.i < len(text) and text[self.i] in " \t\r\n":
                self.i += 1
            if text.startswith("\\\n", self.i):
                self.i += 2
                continue
            if self.i >= len(text):
                raise self.error("this array's '(' is never closed", start)
            c = text[self.i]
            if c == "#":
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
            elif c == ")":
                self.i += 1
                return tuple(items)
            elif c in ";&|<>(":
                raise self.error(f"'{c}' inside an array's ( ): only words are read there", self.i)
            else:
                items.append(self.word())

    def _parts(self, stop: str, quoted: bool, close: str = "") -> list[Part]:
        """Parts until an unquoted character of ``stop`` (or, with ``close``, that character)."""
        text = self.text
        parts: list[Part] = []
        chars: list[str] = []
        offsets: list[int] = []

        def flush() -> None:
            if chars:
                parts.append(Lit("".join(chars), tuple(offsets), quoted))
                chars.clear()
                offsets.clear()

        while self.i < len(text):
            c = text[self.i]
            if close and c == close:
                break
            if not close and c in stop:
                if c in "<>" and text.startswith("(", self.i + 1) and self.test_depth == 0:
                    flush()
                    parts.append(self._process_substitution())
                    continue
                break
            if c == "\\":
                if text.startswith("\n", self.i + 1):
                    self.i += 2
                    continue
                if self.i + 1 < len(text):
                    flush()
                    parts.append(Lit(text[self.i + 1], (self.i + 1,), True))
                    self.i += 2
                    continue
                self.i += 1
                continue
            if c == "'":
                flush()
                end = text.find("'", self.i + 1)
                if end < 0:
                    raise self.error("this single quote is never closed", self.i)
                parts.append(Lit(text[self.i + 1:end], tuple(range(self.i + 1, end)), True))
                self.i = end + 1
                continue
            if c == '"':
                flush()
                open_at = self.i
                self.i += 1
                inner = self._double_quoted()
                if self.i >= len(text):
                    raise self.error("this double quote is never closed", open_at)
                self.i += 1
                parts.extend(inner or [Lit("", (), True)])
                continue
            if c == "$":
                flush()
                parts.append(self._dollar(quoted))
                continue
            if c == "`":
                flush()
                parts.append(self._backticks(quoted))
                continue
            chars.append(c)
            offsets.append(self.i)
            self.i += 1
        flush()
        return parts

    def _double_quoted(self, end: int | None = None, strip: bool = False) -> list[Part]:
        """Parts as read between double quotes: ``$`` and backticks expand, a backslash escapes
        ``$ ` " \\`` and the newline. Up to the closing quote; or, for a here-document body, up
        to ``end`` (a ``"`` is then a character, not escaped), ``strip`` dropping the tabs that
        start each line (``<<-``)."""
        text = self.text
        limit = len(text) if end is None else end
        escaped = '$`"\\\n' if end is None else "$`\\\n"
        parts: list[Part] = []
        chars: list[str] = []
        offsets: list[int] = []

        def flush() -> None:
            if chars:
                parts.append(Lit("".join(chars), tuple(offsets), True))
                chars.clear()
                offsets.clear()

        line_start = True
        while self.i < limit and (end is not None or text[self.i] != '"'):
            c = text[self.i]
            if strip and line_start and c == "\t":
                self.i += 1
                continue
            line_start = c == "\n"
            if c == "\\" and self.i + 1 < limit and text[self.i + 1] in escaped:
                if text[self.i + 1] != "\n":
                    chars.append(text[self.i + 1])
                    offsets.append(self.i + 1)
                self.i += 2
                continue
            if c == "$":
                flush()
                parts.append(self._dollar(True))
                continue
            if c == "`":
                flush()
                parts.append(self._backticks(True))
                continue
            chars.append(c)
            offsets.append(self.i)
            self.i += 1
        flush()
        return parts

    def _dollar(self, quoted: bool) -> Part:
        text = self.text
        start = self.i
        if text.startswith("$((", start):
            end = self._matching(start + 1, "(", ")")
            if text[end - 2:end] == "))":
                self.i = end
                return Arith(text[start + 3:end - 2], quoted, start, end)
            self.i = end
            return Substitution("command substitution", quoted, start, end)
        if text.startswith("$(", start):
            end = self._matching(start + 1, "(", ")")
            self.i = end
            return Substitution("command substitution", quoted, start, end)
        if text.startswith("${", start):
            return self._braced(quoted)
        if text.startswith("$'", start) and not quoted:
            end = start + 2
            chars: list[str] = []
            offsets: list[int] = []
            escapes = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}
            while end < len(text) and text[end] != "'":
                if text[end] == "\\" and end + 1 < len(text):
                    chars.append(escapes.get(text[end + 1], "\\" + text[end + 1]))
                    offsets.append(end)
                    end += 2
                    continue
                chars.append(text[end])
                offsets.append(end)
                end += 1
            if end >= len(text):
                raise self.error("this $' quote is never closed", start)
            self.i = end + 1
            joined = "".join(chars)
            return Lit(joined, tuple(offsets[0] for _ in joined) if offsets else (), True)
        match = NAME.match(text, start + 1)
        if match is not None:
            self.i = match.end()
            return Param(match.group(0), None, None, (), quoted, start, self.i)
        if start + 1 < len(text) and text[start + 1] in _SPECIAL:
            self.i = start + 2
            return Param(text[start + 1], None, None, (), quoted, start, self.i)
        self.i = start + 1
        return Lit("$", (start,), quoted)

    def _braced(self, quoted: bool) -> Part:
        text = self.text
        start = self.i
        self.i += 2
        length = text.startswith("#", self.i) and not text.startswith("#}", self.i)
        if length:
            self.i += 1
        match = NAME.match(text, self.i) or re.compile(r"[0-9]+|[@*#?$!-]").match(text, self.i)
        if match is None:
            raise self.error("cannot read this ${...}", start)
        name = match.group(0)
        self.i = match.end()
        index: str | None = None
        if text.startswith("[", self.i):
            close = text.find("]", self.i)
            if close < 0:
                raise self.error("this ${NAME[ is never closed", start)
            index = text[self.i + 1:close]
            self.i = close + 1
        op: str | None = "#len" if length else None
        arg: list[Part] = []
        if text.startswith("}", self.i):
            self.i += 1
            return Param(name, index, op, (), quoted, start, self.i)
        for candidate in (":-", ":=", ":+", ":?", "##", "#", "%%", "%", "-", "=", "+", "?"):
            if not length and text.startswith(candidate, self.i):
                op = candidate
                self.i += len(candidate)
                break
        else:
            op = "other"
        arg = self._parts(stop="", quoted=quoted, close="}") if op != "other" else []
        if op == "other":
            self.i = self._matching(start + 1, "{", "}")
        elif not text.startswith("}", self.i):
            raise self.error("this ${ is never closed", start)
        else:
            self.i += 1
        return Param(name, index, op, tuple(arg), quoted, start, self.i)

    def _backticks(self, quoted: bool) -> Part:
        start = self.i
        end = self.i + 1
        while end < len(self.text) and self.text[end] != "`":
            end += 2 if self.text[end] == "\\" else 1
        if end >= len(self.text):
            raise self.error("this backtick is never closed", start)
        self.i = end + 1
        return Substitution("backticks", quoted, start, self.i)

    def _process_substitution(self) -> Part:
        start = self.i
        self.i = self._matching(start + 1, "(", ")")
        return Substitution("process substitution", False, start, self.i)

    def _matching(self, at: int, open_: str, close: str) -> int:
        """The offset after the ``close`` that matches the ``open_`` at ``at`` (quotes skipped)."""
        text = self.text
        depth, i = 0, at
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == "'":
                end = text.find("'", i + 1)
                if end < 0:
                    break
                i = end + 1
                continue
            if c == '"':
                i += 1
                while i < len(text) and text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
                i += 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise self.error(f"this '{open_}' is never closed", at)


# ---- parser -----------------------------------------------------------------------------------

_RESERVED_ENDS = {"then", "elif", "else", "fi", "do", "done", "esac", "}"}


class Parser:
    """Statements of a script: a recursive-descent reading of the POSIX shell grammar."""

    def __init__(self, text: str) -> None:
        self.lexer = Lexer(text)
        self.tok = self.lexer.next()

    def advance(self) -> Tok:
        tok = self.tok
        self.tok = self.lexer.next()
        return tok

    def reserved(self) -> str | None:
        if self.tok.kind == "word" and self.tok.word is not None:
            return self.tok.word.literal()
        return None

    def expect(self, word: str) -> Tok:
        if self.reserved() != word:
            raise ShellSyntaxError(f"expected '{word}' here", self.tok.start)
        return self.advance()

    def skip_newlines(self) -> None:
        while self.tok.kind == "newline" or (self.tok.kind == "op" and self.tok.text == ";"):
            self.advance()

    def script(self) -> List:
        body = self.list_(ends=set())
        if self.tok.kind != "eof":
            raise ShellSyntaxError(f"unexpected '{self.tok.text}'", self.tok.start)
        return body

    def list_(self, ends: set[str], case_arm: bool = False) -> List:
        items: list[AndOr] = []
        while True:
            while self.tok.kind == "newline" or (self.tok.kind == "op" and self.tok.text == ";"):
                self.advance()
            if self.tok.kind == "eof" or (self.reserved() in ends) or \
                    (self.tok.kind == "op" and self.tok.text in (")", ";;", ";&", ";;&")):
                return List(tuple(items))
            if case_arm and self.reserved() == "esac":
                return List(tuple(items))
            items.append(self.and_or())

    def and_or(self) -> AndOr:
        first = self.pipeline()
        rest: list[tuple[str, Pipeline]] = []
        while self.tok.kind == "op" and self.tok.text in ("&&", "||"):
            op = self.advance().text
            while self.tok.kind == "newline":
                self.advance()
            rest.append((op, self.pipeline()))
        if self.tok.kind == "op" and self.tok.text == "&":
            self.advance()
            last = rest[-1][1] if rest else first
            background = Pipeline(last.nodes, last.negated, True, last.start, last.end)
            if rest:
                rest[-1] = (rest[-1][0], background)
            else:
                first = background
        return AndOr(first, tuple(rest))

    def pipeline(self) -> Pipeline:
        start = self.tok.start
        negated = False
        if self.reserved() == "!":
            self.advance()
            negated = True
        nodes = [self.command()]
        while self.tok.kind == "op" and self.tok.text in ("|", "|&"):
            self.advance()
            while self.tok.kind == "newline":
                self.advance()
            nodes.append(self.command())
        return Pipeline(tuple(nodes), negated, False, start, self.tok.start)

    def command(self) -> Node:
        word = self.reserved()
        start = self.tok.start
        if word == "if":
            node: Node = self.if_()
        elif word in ("while", "until"):
            self.advance()
            condition = self.list_({"do"})
            self.expect("do")
            body = self.list_({"done"})
            self.expect("done")
            node = Loop(word, condition, body, start)
        elif word in ("for", "select"):
            self.advance()
            variable: str | None = None
            if self.tok.kind == "op" and self.tok.text == "(":  # for (( ; ; ))
                self.lexer.i = self.lexer._matching(self.tok.start, "(", ")")
                self.tok = self.lexer.next()
            else:
                variable = self.advance().text  # the loop variable
            words: list[WordTok] = []
            while self.tok.kind == "word" and self.reserved() != "do":
                assert self.tok.word is not None
                words.append(self.tok.word)
                self.advance()
            self.skip_newlines()
            self.expect("do")
            body = self.list_({"done"})
            self.expect("done")
            items = tuple(words[1:]) if words and words[0].literal() == "in" else None
            node = Loop(word, None, body, start, variable, items)
        elif word == "case":
            node = self.case()
        elif word == "{":
            self.advance()
            body = self.list_({"}"})
            self.expect("}")
            node = Group(body, False, start)
        elif word == "[[":
            node = self.test()
        elif word == "function":
            self.advance()
            name = self.advance().text
            if self.tok.kind == "op" and self.tok.text == "(":
                self.advance()
                self._close_paren()
            self.skip_newlines()
            node = Function(name, self.command(), start)
        elif self.tok.kind == "op" and self.tok.text == "(":
            self.advance()
            body = self.list_(set())
            self._close_paren()
            node = Group(body, True, start)
        elif word in _RESERVED_ENDS or word in ("do", ";;"):
            raise ShellSyntaxError(f"'{word}' without its opening statement", self.tok.start)
        else:
            node = self.simple()
        self._redirects()
        return node

    def _close_paren(self) -> None:
        if not (self.tok.kind == "op" and self.tok.text == ")"):
            raise ShellSyntaxError("expected ')' here", self.tok.start)
        self.advance()

    def _redirects(self) -> list[Redirect]:
        redirects: list[Redirect] = []
        while self.tok.kind == "redirect":
            op = self.advance()
            if self.tok.kind != "word" or self.tok.word is None:
                hint = (" (a <placeholder> left to fill in is a redirection to bash too; write "
                        "the value)" if op.text in ("<", ">") else "")
                raise ShellSyntaxError(f"'{op.text}' needs a target{hint}", self.tok.start)
            target = self.advance()
            assert target.word is not None
            if op.text in ("<<", "<<-"):
                parts = target.word.parts
                delimiter = "".join(p.text for p in parts if isinstance(p, Lit))
                doc = HereDoc(delimiter, op.text == "<<-",
                              not any(isinstance(p, Lit) and p.quoted for p in parts))
                self.lexer.heredocs.append(doc)
                redirects.append(Redirect(op.text, doc))
                if self.tok.kind == "newline":  # read ahead already: the body starts here
                    self.lexer._read_heredocs()
            else:
                redirects.append(Redirect(op.text, target.word))
        return redirects

    def if_(self) -> If:
        start = self.tok.start
        self.advance()
        clauses: list[tuple[List, List]] = []
        condition = self.list_({"then"})
        self.expect("then")
        body = self.list_({"elif", "else", "fi"})
        clauses.append((condition, body))
        otherwise: List | None = None
        while True:
            word = self.reserved()
            if word == "elif":
                self.advance()
                condition = self.list_({"then"})
                self.expect("then")
                clauses.append((condition, self.list_({"elif", "else", "fi"})))
            elif word == "else":
                self.advance()
                otherwise = self.list_({"fi"})
            else:
                self.expect("fi")
                return If(tuple(clauses), otherwise, start)

    def case(self) -> Case:
        start = self.tok.start
        self.advance()
        if self.tok.word is None:
            raise ShellSyntaxError("case needs a word", self.tok.start)
        subject = self.advance().word
        assert subject is not None
        self.skip_newlines()
        self.expect("in")
        arms: list[Arm] = []
        while True:
            self.skip_newlines()
            if self.reserved() == "esac":
                self.advance()
                return Case(subject, tuple(arms), start)
            if self.tok.kind == "op" and self.tok.text == "(":
                self.advance()
            patterns: list[WordTok] = []
            while not (self.tok.kind == "op" and self.tok.text == ")"):  # the patterns
                if self.tok.kind == "word" and self.tok.word is not None:
                    patterns.append(self.tok.word)
                elif not (self.tok.kind == "op" and self.tok.text == "|"):
                    raise ShellSyntaxError("a case pattern needs its ')'", self.tok.start)
                self.advance()
            self.advance()
            body = self.list_({"esac"}, case_arm=True)
            end = ";;"
            if self.tok.kind == "op" and self.tok.text in (";;", ";&", ";;&"):
                end = self.advance().text
            arms.append(Arm(tuple(patterns), body, end))

    def test(self) -> Test:
        start = self.tok.start
        self.lexer.test_depth += 1
        self.advance()
        words: list[WordTok] = []
        while self.reserved() != "]]":
            tok = self.tok
            if tok.kind in ("eof", "newline"):
                self.lexer.test_depth -= 1
                raise ShellSyntaxError("this [[ is never closed with ]]", start)
            if tok.kind == "word" and tok.word is not None:
                words.append(tok.word)
            else:  # && || ( ) ! < >: an operator of the test, as a literal word
                words.append(WordTok((Lit(tok.text, tuple(range(tok.start, tok.end)), False),),
                                     tok.start, tok.end))
            self.advance()
        self.lexer.test_depth -= 1
        end = self.advance().end
        return Test(tuple(words), start, end)

    def simple(self) -> Node:
        start = self.tok.start
        assignments: list[tuple[str, bool, WordTok]] = []
        words: list[WordTok] = []
        redirects: list[Redirect] = []
        end = start
        while True:
            if self.tok.kind == "redirect":
                redirects += self._redirects()
                continue
            if self.tok.kind != "word" or self.tok.word is None:
                break
            word = self.tok.word
            assignment = word.assignment() if not words else None
            if assignment is not None:
                assignments.append(assignment)
            else:
                words.append(word)
            end = self.advance().end
            name = words[0].literal() if len(words) == 1 and not assignments else None
            if name is not None and NAME.fullmatch(name) and self.tok.kind == "op" \
                    and self.tok.text == "(":
                self.advance()  # name() compound: a function definition
                self._close_paren()
                self.skip_newlines()
                return Function(name, self.command(), start)
        if not assignments and not words:
            raise ShellSyntaxError(f"unexpected '{self.tok.text or 'end of file'}'", self.tok.start)
        redirects += self._redirects()
        return Simple(tuple(assignments), tuple(words), start, end, tuple(redirects))


def parse(text: str) -> List:
    """The statements of a script (raises :class:`ShellSyntaxError`)."""
    return Parser(text).script()


def relocate(tree: List, where: list[int], fallback: int) -> List:
    """``tree`` parsed from a string whose character ``i`` stands at source offset ``where[i]``
    (-1: none): the same statements with every offset moved to the source, so that a command
    read from a string (``bash -c "..."``) points at the text it came from. An offset with no
    source character takes the nearest one before it, or ``fallback``."""
    last = len(where) - 1

    def at(i: int) -> int:
        for k in range(min(i, last), -1, -1):
            if where[k] >= 0:
                return where[k]
        return fallback

    def move(node: object, name: str = "") -> object:
        if isinstance(node, int) and not isinstance(node, bool):
            return at(node - 1) + 1 if name == "end" and node > 0 else at(node)
        if isinstance(node, tuple):
            if name == "offsets":
                return tuple(where[o] if 0 <= o <= last else -1 for o in node)
            return tuple(move(item) for item in node)
        if isinstance(node, HereDoc):
            body = None if node.body is None else move(node.body)
            assert body is None or isinstance(body, WordTok)
            return HereDoc(node.delimiter, node.strip, node.expand, body)
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            return type(node)(**{f.name: move(getattr(node, f.name), f.name)
                                 for f in dataclasses.fields(node)})
        return node

    moved = move(tree)
    assert isinstance(moved, List)
    return moved
