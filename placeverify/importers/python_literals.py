"""Python configuration files read as data: a module's functions and the structure they build,
with the position of every value. The file is parsed with Python's ``ast``; nothing in it is
imported, compiled or run.

A function body is followed statement by statement: ``name = value`` (also annotated),
``name.a.b = value`` on a structure the function built or received from another function of the
module, and ``return value``. Docstrings, imports, ``assert`` and ``pass`` have no effect. A value
is a literal (numbers, strings, ``True``/``False``/``None``, lists, tuples, dicts), arithmetic on
numeric literals, a call as written (the callee's dotted name and its arguments, each read the same
way), or a call of another function of the module without arguments, read in its turn (each read
builds a new structure, as each call does). Anything else is :class:`Opaque`: an error at its
text if a reader needs it. A statement that may change a structure in a way not written out (a
call that is handed it, a loop or branch that names it) marks the structure :attr:`Call.changed`,
and a reader must refuse it there rather than read what it held before.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span

MAX_DEPTH = 32  # functions calling functions of the module, before the read gives up


@dataclass
class Lit:
    """A literal value (a number, string, bool, None, or a list/tuple/dict of literals)."""

    value: Any
    span: Span


@dataclass
class Opaque:
    """A value that is not written out as a literal: what it is, and where."""

    why: str
    span: Span


@dataclass
class Call:
    """A call as written: ``callee(*args, **kwargs)``; ``changed`` is where a statement may have
    changed it in a way the file does not spell out."""

    callee: str
    args: list[Node]
    kwargs: dict[str, Node]
    span: Span
    changed: Span | None = None
    assigned: dict[str, Span] = field(default_factory=dict)  # keys set by ``x.key = value``

    def get(self, key: str) -> Node | None:
        return self.kwargs.get(key)


Node = Lit | Opaque | Call
Binary = Callable[[Any, Any], Any]
_ARITHMETIC: dict[type[ast.operator], Binary] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv, ast.Mod: operator.mod,
    ast.Pow: operator.pow}
_NO_EFFECT = (ast.Import, ast.ImportFrom, ast.Assert, ast.Pass)
_BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
           ast.Match, ast.Delete, ast.AugAssign)


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a name or an attribute chain; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


class Module:
    """A parsed Python file: its top-level functions, each readable as data (:meth:`call`)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        try:
            tree = ast.parse(source.text, filename=source.path)
        except SyntaxError as error:
            line, column = error.lineno or 1, error.offset or 1
            raise PlaceError([Diagnostic(Severity.ERROR, f"not valid Python: {error.msg}",
                                         Code.SYNTAX, Span.point(line, max(column, 1)))],
                             source) from None
        except (RecursionError, MemoryError, ValueError):
            raise PlaceError([Diagnostic(Severity.ERROR, "not valid Python, or nested too "
                                         "deeply to read", Code.SYNTAX, None)], source) from None
        self.functions = {d.name: d for d in tree.body if isinstance(d, ast.FunctionDef)}
        self._depth = 0

    def span(self, node: ast.AST) -> Span:
        """The span of a node, in characters (``ast`` counts columns in UTF-8 bytes)."""
        line = getattr(node, "lineno", 1)
        end_line = getattr(node, "end_lineno", None) or line
        return Span(line, self._column(line, getattr(node, "col_offset", 0)), end_line,
                    self._column(end_line, getattr(node, "end_col_offset", None) or 0))

    def _column(self, line: int, offset: int) -> int:
        text = self.source.line_text(line).encode("utf-8")
        return len(text[:offset].decode("utf-8", errors="ignore")) + 1

    def call(self, name: str, at: Span | None = None) -> Node:
        """What the function ``name`` returns, read as data (a fresh structure each time)."""
        if self._depth > 0:
            return self._function(name, at)
        try:
            return self._function(name, at)
        except RecursionError:  # an expression parsed, but nested deeper than a reader recurses
            raise PlaceError([Diagnostic(Severity.ERROR, f"{name}() holds an expression nested "
                                         "too deeply to read", Code.SYNTAX,
                                         self.span(self.functions[name]))], self.source) from None

    def _function(self, name: str, at: Span | None) -> Node:
        function = self.functions[name]
        if function.args.args or function.args.posonlyargs or function.args.kwonlyargs:
            return Opaque(f"{name}() takes arguments", at or self.span(function))
        if self._depth >= MAX_DEPTH:
            return Opaque(f"functions call each other more than {MAX_DEPTH} deep",
                          at or self.span(function))
        self._depth += 1
        try:
            return self._body(function)
        finally:
            self._depth -= 1

    def _body(self, function: ast.FunctionDef) -> Node:
        names: dict[str, Node] = {}
        for statement in function.body:
            if isinstance(statement, ast.Return):
                if statement.value is None:
                    return Lit(None, self.span(statement))
                return self.value(statement.value, names)
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                self._assign(statement, names)
            elif isinstance(statement, ast.Expr):
                self._expression(statement.value, names)
            elif isinstance(statement, _BLOCKS):
                self._block(statement, names)
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[statement.name] = Opaque(f"'{statement.name}' is defined inside the "
                                               "function", self.span(statement))
            elif not isinstance(statement, _NO_EFFECT):
                for node in _named_structures(statement, names):
                    node.changed = node.changed or self.span(statement)
        return Opaque(f"{function.name}() returns nothing", self.span(function))

    def _assign(self, statement: ast.Assign | ast.AnnAssign, names: dict[str, Node]) -> None:
        if statement.value is None:
            return  # a bare annotation
        value = self.value(statement.value, names)
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        for target in targets:
            if isinstance(target, ast.Name):
                names[target.id] = value
            elif isinstance(target, ast.Attribute):
                self._set(target, value, names)
            else:  # unpacking, subscripts: what they bind or change is not followed
                for node in _named_structures(target, names):
                    node.changed = node.changed or self.span(target)
                for element in ast.walk(target):
                    if isinstance(element, ast.Name):
                        names[element.id] = Opaque("assigned by unpacking", self.span(target))

    def _set(self, target: ast.Attribute, value: Node, names: dict[str, Node]) -> None:
        """``base.a.b = value``: sets keyword ``b`` of the call at ``base.a``."""
        holder = self._holder(target.value, names)
        if isinstance(holder, Call):
            holder.kwargs[target.attr] = value
            holder.assigned[target.attr] = self.span(target)
        else:
            for node in _named_structures(target, names):
                node.changed = node.changed or self.span(target)

    def _holder(self, expr: ast.expr, names: dict[str, Node]) -> Node:
        """The structure ``expr`` names, as the target of an assignment: a keyword the call did
        not write (``config.training`` of ``Trainer.Config()``) is its default structure, made
        here, callee ``""`` (the reader knows each default)."""
        if isinstance(expr, ast.Attribute):
            base = self._holder(expr.value, names)
            if isinstance(base, Call) and expr.attr not in base.kwargs:
                base.kwargs[expr.attr] = Call("", [], {}, self.span(expr))
            if isinstance(base, Call):
                return base.kwargs[expr.attr]
            return base
        return self.value(expr, names)

    def _expression(self, expr: ast.expr, names: dict[str, Node]) -> None:
        """A statement that is an expression: a docstring, or a call that may change what it is
        handed."""
        if isinstance(expr, ast.Constant):
            return
        for node in _named_structures(expr, names):
            node.changed = node.changed or self.span(expr)

    def _block(self, statement: ast.stmt, names: dict[str, Node]) -> None:
        """A branch, loop, ``with``, ``try`` or augmented assignment: what it may change is not
        followed; every structure it names is marked changed, every name it binds opaque."""
        span = self.span(statement)
        for node in _named_structures(statement, names):
            node.changed = node.changed or span
        for element in ast.walk(statement):
            if isinstance(element, ast.Name) and isinstance(element.ctx, ast.Store):
                names[element.id] = Opaque(f"set inside a '{_keyword(statement)}' statement", span)

    def value(self, expr: ast.expr, names: dict[str, Node]) -> Node:
        """An expression read as data."""
        span = self.span(expr)
        if isinstance(expr, ast.Constant):
            return Lit(expr.value, span)
        if isinstance(expr, (ast.List, ast.Tuple)):
            items = [self.value(e, names) for e in expr.elts]
            if all(isinstance(i, Lit) for i in items):
                return Lit([i.value for i in items if isinstance(i, Lit)], span)
            return Opaque("a list with values that are not literals", span)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
            inner = self.value(expr.operand, names)
            if isinstance(inner, Lit) and _number(inner.value):
                return Lit(-inner.value if isinstance(expr.op, ast.USub) else inner.value, span)
        if isinstance(expr, ast.BinOp) and type(expr.op) in _ARITHMETIC:
            return self._arithmetic(expr, names, span)
        if isinstance(expr, ast.Name):
            if expr.id in names:
                return names[expr.id]
            return Opaque(f"'{expr.id}' is not a value written in this function", span)
        if isinstance(expr, ast.Attribute):
            holder = self.value(expr.value, names)
            if isinstance(holder, Call) and expr.attr in holder.kwargs:
                return holder.kwargs[expr.attr]
            return Opaque(f"'{ast.unparse(expr)}' is not a value written in this file", span)
        if isinstance(expr, ast.Call):
            return self._call(expr, names, span)
        return Opaque(f"'{_excerpt(expr)}' is computed, not written out", span)

    def _arithmetic(self, expr: ast.BinOp, names: dict[str, Node], span: Span) -> Node:
        left, right = self.value(expr.left, names), self.value(expr.right, names)
        if not (isinstance(left, Lit) and isinstance(right, Lit)
                and _number(left.value) and _number(right.value)):
            return Opaque(f"'{_excerpt(expr)}' is computed from values that are not numbers "
                          "written here", span)
        if isinstance(expr.op, ast.Pow) and (abs(right.value) > 64 or abs(left.value) > 2**64):
            return Opaque(f"'{_excerpt(expr)}' is too large a power to read", span)
        try:
            return Lit(_ARITHMETIC[type(expr.op)](left.value, right.value), span)
        except (ZeroDivisionError, OverflowError, ValueError):
            return Opaque(f"'{_excerpt(expr)}' has no value (division by zero or overflow)", span)

    def _call(self, expr: ast.Call, names: dict[str, Node], span: Span) -> Node:
        callee = dotted(expr.func)
        if callee is None:
            return Opaque(f"'{_excerpt(expr)}' calls something that is not a name", span)
        if callee in self.functions and callee not in names:
            if expr.args or expr.keywords:
                return Opaque(f"{callee}() is called with arguments, which placeverify does "
                              "not follow", span)
            return self.call(callee, span)
        if any(isinstance(a, ast.Starred) for a in expr.args) or any(
                k.arg is None for k in expr.keywords):
            return Opaque(f"'{_excerpt(expr)}' passes unpacked arguments", span)
        return Call(callee, [self.value(a, names) for a in expr.args],
                    {k.arg: self.value(k.value, names) for k in expr.keywords if k.arg}, span)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _named_structures(statement: ast.AST, names: dict[str, Node]) -> list[Call]:
    """The structures (calls read as data) that the names in ``statement`` refer to, with every
    structure inside them."""
    found: list[Call] = []
    for element in ast.walk(statement):
        if isinstance(element, ast.Name) and isinstance(names.get(element.id), Call):
            node = names[element.id]
            assert isinstance(node, Call)
            found.extend(_inside(node))
    return found


def _inside(node: Call) -> list[Call]:
    out = [node]
    for child in [*node.args, *node.kwargs.values()]:
        if isinstance(child, Call):
            out.extend(_inside(child))
    return out


def _keyword(statement: ast.stmt) -> str:
    return {ast.If: "if", ast.For: "for", ast.AsyncFor: "for", ast.While: "while",
            ast.With: "with", ast.AsyncWith: "with", ast.Try: "try", ast.Match: "match",
            ast.Delete: "del", ast.AugAssign: "augmented assignment"}.get(type(statement),
                                                                        "compound")


def _excerpt(expr: ast.expr, limit: int = 60) -> str:
    text = ast.unparse(expr)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def changed_at(node: Call) -> Span | None:
    """Where ``node`` (or a structure it holds) may have been changed unseen, if anywhere."""
    for inner in _inside(node):
        if inner.changed is not None:
            return inner.changed
    return None
