"""``--set KEY=VALUE``: a strategy with some of its values replaced, then lowered like any file.

Keys name what the language names (README "Overrides"):

==========================  ===================================================================
``model=NAME``              the bundled model (``model=llama3_70b``)
``model.KEY=VALUE``         an entry of the model block: ``seq``, ``micro_batch``, ``layers``, ...
``precision=NAME``          the ``precision`` statement, replaced by a preset
``precision.KEY=VALUE``     an entry of the precision block (``params``, ``grads``, ``optimizer``,
                            ``activations``, ``loss_scale``)
``mesh.AXIS=N``             an axis's size; an axis the mesh lacks is added last (innermost)
``mesh.PROPERTY=VALUE``     ``world``, ``device_memory``, ``host_memory``, ``pcie_bandwidth``,
                            ``device``, ``matmul``
``mesh.AXIS.KEY=VALUE``     an entry of an axis's link block (``bandwidth``, ``latency``)
``place.GROUP=PLACEMENT``   the placement over GROUP as the file writes it (``dp``,
                            ``shard*replica``); a new ``place`` statement when there is none
``microbatches=N``          and ``recompute=``, ``loss=``, ``loss_scale=``, ``clip.max_norm=``,
                            ``offload=STATES|none``: those statements
==========================  ===================================================================

How, soundly: the file is parsed; each value is first parsed on its own as exactly one node of
the kind its key takes (a value, a placement, a call, a name: a value that would end the
statement or start another is refused, so nothing is ever spliced into the text); the text is
then edited at the AST spans of what the key names (never by searching the text), one override
after the other, and the result is parsed and lowered like any file, so every check of the
language applies to the overridden strategy. Edits keep every line of the file at its number
(a new statement goes on a new last line), and :class:`Edited` maps every position back: a
diagnostic inside an override points at it (``--set:N:COL``, N the N-th ``--set``), one
elsewhere at the file in its own columns, with a note naming the overrides. A ``world`` the mesh
writes follows the axes an override resizes, unless ``mesh.world`` is set too (then it is
checked against the product like any ``world``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span, did_you_mean
from placeverify.ir.strategy import Override
from placeverify.lower.edit import span_offsets
from placeverify.lower.mesh import MESH_PROPERTIES, NAMED_PROPERTIES
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_source

SOURCE_PATH = "--set"  # the name diagnostics about an override print
MAX_SETTINGS = 100
MAX_LENGTH = 1000

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What each first part of a key takes after it, as the help and the errors show it.
KEYS: dict[str, str] = {
    "model": "model=NAME or model.KEY=VALUE (a key of the model block, e.g. model.seq=8192)",
    "precision": "precision=NAME or precision.KEY=VALUE (params, grads, optimizer, activations, "
                 "loss_scale)",
    "mesh": "mesh.AXIS=N, mesh.PROPERTY=VALUE (world, device_memory, device, ...) or "
            "mesh.AXIS.bandwidth=VALUE",
    "place": "place.GROUP=PLACEMENT (the group as the place statement writes it: dp, "
             "shard*replica)",
    "microbatches": "microbatches=N",
    "recompute": "recompute=full|selective|selective_op|none",
    "loss": "loss=token_mean|sample_mean|microbatch_mean|sum",
    "loss_scale": "loss_scale=dynamic|static|none",
    "clip": "clip.max_norm=X",
    "offload": "offload=STATES (e.g. offload=optimizer) or offload=none",
}
PARTS: dict[str, tuple[int, ...]] = {  # how many dotted parts each key has
    "model": (1, 2), "precision": (1, 2), "mesh": (2, 3), "microbatches": (1,),
    "recompute": (1,), "loss": (1,), "loss_scale": (1,), "clip": (2,), "offload": (1,),
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One ``--set KEY=VALUE`` as given, with its spans in the overrides' source."""

    index: int  # 1-based: its line in the overrides' source
    key: str  # without blanks: 'mesh.dp', 'place.shard*replica'
    parts: tuple[str, ...]  # ('mesh', 'dp'); ('place', 'shard*replica')
    value: str
    key_span: Span
    value_span: Span

    @property
    def text(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def span(self) -> Span:
        return self.key_span.cover(self.value_span)


@dataclass(frozen=True, slots=True)
class Settings:
    """The ``--set`` options of one command line, and their source (one line each)."""

    items: tuple[Setting, ...]
    source: Source

    def __bool__(self) -> bool:
        return bool(self.items)

    def note(self) -> str:
        return "checked with " + " ".join(f"--set {s.text}" for s in self.items)


def parse_settings(texts: Sequence[str]) -> Settings:
    """The overrides of a command line, or :class:`PlaceError` pointing into the bad ones."""
    # One line per override; a line break inside one is shown as U+FFFD (and refused below).
    source = Source(SOURCE_PATH, "\n".join(re.sub(r"[\r\n]", "\ufffd", t) for t in texts))
    errors: list[Diagnostic] = []
    items: list[Setting] = []

    def error(message: str, code: Code, span: Span, *notes: str) -> None:
        errors.append(Diagnostic(Severity.ERROR, message, code, span, notes))

    if len(texts) > MAX_SETTINGS:
        raise PlaceError([Diagnostic(Severity.ERROR, f"{len(texts)} overrides; placeverify takes "
                                     f"at most {MAX_SETTINGS}", Code.TOO_MANY)], source)
    for index, text in enumerate(texts, start=1):
        whole = Span(index, 1, index, len(text) + 1)
        if len(text) > MAX_LENGTH:
            error(f"an override is at most {MAX_LENGTH} characters", Code.TOO_LARGE, whole)
            continue
        bad = re.search(r"[\x00-\x1f\x7f]", text)
        if bad is not None:
            error("an override is one line of text, without control characters", Code.SYNTAX,
                  Span.point(index, bad.start() + 1))
            continue
        equals = text.find("=")
        if equals < 0:
            error(f"an override is KEY=VALUE, e.g. mesh.dp=16; '{text}' has no '='", Code.SYNTAX,
                  whole)
            continue
        raw_key, raw_value = text[:equals], text[equals + 1:]
        key_start = len(raw_key) - len(raw_key.lstrip()) + 1
        key = raw_key.strip()
        value_start = equals + 1 + len(raw_value) - len(raw_value.lstrip()) + 1
        value = raw_value.strip()
        key_span = Span(index, key_start, index, key_start + max(1, len(key)))
        value_span = Span(index, value_start, index, value_start + max(1, len(value)))
        if not key:
            error("no key before '='", Code.SYNTAX, Span.point(index, equals + 1),
                  "keys: " + ", ".join(KEYS))
            continue
        if not value:
            error(f"no value after '{key}='", Code.SYNTAX, Span.point(index, equals + 1))
            continue
        head, _, rest = key.partition(".")
        if head not in KEYS:
            error(f"unknown override key '{head}'{did_you_mean(head, KEYS)}", Code.UNKNOWN_NAME,
                  Span(index, key_start, index, key_start + len(head)))
            continue
        if head == "place":
            group = re.sub(r"\s+", "", rest).replace("×", "*")
            if not group or not _parses(f"place ddp over {group}", ast.PlaceStmt,
                                        _group, len("place ddp over "), group):
                error(f"'{key}' does not name a group; {KEYS['place']}", Code.SYNTAX, key_span)
                continue
            parts: tuple[str, ...] = ("place", group)
        else:
            parts = tuple(key.split("."))
            if len(parts) not in PARTS[head] or not all(NAME.match(p) for p in parts):
                error(f"'{key}' is not an override key; {KEYS[head]}", Code.SYNTAX, key_span)
                continue
        setting = Setting(index, ".".join(parts), parts, value, key_span, value_span)
        problem = _value_problem(setting)
        if problem is not None:
            error(problem, Code.SYNTAX, value_span)
            continue
        items.append(setting)
    if errors:
        raise PlaceError(errors, source)
    return Settings(tuple(items), source)


# ---- one value, parsed on its own -----------------------------------------------------------

# Each kind of value: the statement it is parsed in (the text before and after it) and the node
# of that statement that must span the value exactly; 'value' is a block entry's value.
Pick = Callable[[ast.Statement], object]


def _entry_value(stmt: ast.Statement) -> object:
    if isinstance(stmt, (ast.ModelStmt, ast.PrecisionStmt)) and stmt.block is not None \
            and len(stmt.block.entries) == 1:
        return stmt.block.entries[0].value
    if isinstance(stmt, ast.MeshStmt) and len(stmt.entries) == 1 \
            and isinstance(stmt.entries[0], ast.AxisEntry) and stmt.entries[0].block is None:
        return stmt.entries[0].value
    if isinstance(stmt, ast.ClipStmt) and len(stmt.entries) == 1:
        return stmt.entries[0].value
    return None


def _name(stmt: ast.Statement) -> object:
    if isinstance(stmt, (ast.ModelStmt, ast.PrecisionStmt)) and stmt.block is None:
        return stmt.name
    return stmt.kind if isinstance(stmt, ast.LossScaleStmt) else None


def _group(stmt: ast.Statement) -> object:
    return stmt.group if isinstance(stmt, ast.PlaceStmt) else None


def _argument(stmt: ast.Statement) -> object:
    if isinstance(stmt, (ast.RecomputeStmt, ast.LossStmt)):
        return stmt.call
    if isinstance(stmt, ast.PlaceStmt):
        return stmt.placement
    return stmt.value if isinstance(stmt, ast.MicrobatchesStmt) else None


WRAPPERS: dict[str, tuple[str, str, type, Pick]] = {
    "value": ("model { key = ", " }", ast.ModelStmt, _entry_value),
    "mesh": ("mesh { key = ", " }", ast.MeshStmt, _entry_value),
    "clip": ("clip key = ", "", ast.ClipStmt, _entry_value),
    "model": ("model ", "", ast.ModelStmt, _name),
    "precision": ("precision ", "", ast.PrecisionStmt, _name),
    "loss_scale": ("loss_scale ", "", ast.LossScaleStmt, _name),
    "recompute": ("recompute ", "", ast.RecomputeStmt, _argument),
    "loss": ("loss ", "", ast.LossStmt, _argument),
    "place": ("place ", " over x", ast.PlaceStmt, _argument),
    "microbatches": ("microbatches = ", "", ast.MicrobatchesStmt, _argument),
}
WHAT = {"value": "one value (a number, a quantity such as 80GB, a name or a string)",
        "mesh": "one value (a number, a quantity such as 80GB, or a name)",
        "model": "a model name", "precision": "a precision preset name",
        "loss_scale": "one word", "recompute": "a recomputation, e.g. selective",
        "loss": "a loss normalisation, e.g. token_mean",
        "place": "one placement, e.g. zero3, fsdp(grad_op) or (S*, S, S, R)",
        "microbatches": "one number", "clip": "one number", "offload": "a list of states"}


def _kind(setting: Setting) -> str:
    head = setting.parts[0]
    if head in ("model", "precision") and len(setting.parts) == 2:
        return "value"
    if head == "mesh":
        return "mesh" if len(setting.parts) == 2 else "value"
    return head


def _value_problem(setting: Setting) -> str | None:
    kind = _kind(setting)
    value = setting.value
    if kind == "offload":
        if value == "none" or _parses(f"offload {value}", ast.OffloadStmt, lambda stmt: stmt,
                                      0, f"offload {value}"):
            return None
    else:
        before, after, kind_type, pick = WRAPPERS[kind]
        if _parses(before + value + after, kind_type, pick, len(before), value):
            return None
    return f"'{value}' is not {WHAT[kind]}"


def _parses(text: str, kind: type, pick: Pick, start: int, value: str) -> bool:
    """Whether ``text`` is one statement of ``kind`` whose ``pick`` node spans exactly ``value``
    at offset ``start`` (so the value cannot end its statement or start another)."""
    try:
        file = parse_source(Source("<override>", text))
    except PlaceError:
        return False
    if len(file.statements) != 1 or not isinstance(file.statements[0], kind):
        return False
    node = pick(file.statements[0])
    span = getattr(node, "span", None)
    return span == Span(1, start + 1, 1, start + len(value) + 1)


# ---- edits ----------------------------------------------------------------------------------


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


# ---- applying the overrides -----------------------------------------------------------------


def apply(source: Source, settings: Settings) -> Edited:
    """``source``'s text with every override applied, in order; raises :class:`PlaceError` for
    an override that names nothing it can set (an axis the mesh lacks, a named group)."""
    edited = Edited(source, settings, source.text)
    errors: list[Diagnostic] = []
    for setting in settings.items:
        file = _parse(edited)
        problem = _apply_one(edited, file, setting)
        if problem is not None:
            errors.append(Diagnostic(Severity.ERROR, problem, Code.UNKNOWN_NAME,
                                     setting.key_span))
    if errors:
        raise PlaceError(errors, settings.source)
    _follow_world(edited)
    return edited


def _parse(edited: Edited) -> ast.File:
    try:
        return parse_source(edited.source)
    except PlaceError as error:  # every value was parsed on its own first: a bug if it happens
        raise AssertionError(f"an override left unparsable text: {error}") from None


def _first(file: ast.File, kind: type) -> list[ast.Statement]:
    """The statements of one kind; for ``loss``, the main loss only (not a named term)."""
    return [s for s in file.statements if isinstance(s, kind)
            and not (isinstance(s, ast.LossStmt) and s.term is not None)]


def _replace(edited: Edited, setting: Setting, span: Span, text: str, value_at: int = 0,
             key_at: int = -1, key_len: int = 0) -> None:
    edited.apply(Edit(setting, span.line, span.column, span.end_line, span.end_column, text,
                      value_at, key_at, key_len))


def _insert(edited: Edited, setting: Setting, line: int, column: int, text: str, value_at: int,
            key_at: int = -1, key_len: int = 0) -> None:
    edited.apply(Edit(setting, line, column, line, column, text, value_at, key_at, key_len))


def _set_entry(edited: Edited, setting: Setting, block: ast.Block | None, end: Span,
               key: str) -> None:
    """Set ``key`` in ``block`` (replace its value, or add the entry first), or give the
    statement ending at ``end`` a block holding it."""
    value = setting.value
    if block is not None:
        for entry in block.entries:
            if entry.key.text == key:
                _replace(edited, setting, entry.value.span, value)
                return
        text = f" {key} = {value},"
        _insert(edited, setting, block.span.line, block.span.column + 1, text, len(key) + 4, 1,
                len(key))
        return
    text = f" {{ {key} = {value} }}"
    _insert(edited, setting, end.end_line, end.end_column, text, len(key) + 6, 3, len(key))


def _apply_one(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """Apply one override to ``edited``; a message when it names nothing it can set."""
    head, parts, value = setting.parts[0], setting.parts, setting.value
    if head == "model" or head == "precision":
        stmts = _first(file, ast.ModelStmt if head == "model" else ast.PrecisionStmt)
        stmt = stmts[0] if stmts else None
        assert stmt is None or isinstance(stmt, (ast.ModelStmt, ast.PrecisionStmt))
        word = len(head) + 1
        if len(parts) == 1:
            if stmt is None:
                edited.append(setting, f"{head} {value}", word)
            elif head == "precision":  # a preset replaces the statement, block and all
                _replace(edited, setting, stmt.span, f"precision {value}", word)
            elif stmt.name is not None:
                _replace(edited, setting, stmt.name.span, value)
            else:
                _insert(edited, setting, stmt.span.line, stmt.span.column + len(head), f" {value}", 1)
        elif stmt is None:
            key = parts[1]
            edited.append(setting, f"{head} {{ {key} = {value} }}", word + len(key) + 5, word + 2,
                          len(key))
        else:
            _set_entry(edited, setting, stmt.block, stmt.span, parts[1])
        return None
    if head == "mesh":
        meshes = _first(file, ast.MeshStmt)
        name = parts[1]
        if not meshes:
            if len(parts) == 3:
                return f"the file has no mesh, so no axis '{name}'"
            edited.append(setting, f"mesh {{ {name} = {value} }}", len(name) + 10, 7, len(name))
            return None
        mesh = meshes[0]
        assert isinstance(mesh, ast.MeshStmt)
        entries = {e.name.text: e for e in mesh.entries}
        entry = entries.get(name)
        if isinstance(entry, ast.GroupEntry):
            return f"'{name}' is a named group of the mesh, not an axis or a property"
        if len(parts) == 3:
            if entry is None or name in MESH_PROPERTIES or name in NAMED_PROPERTIES:
                axes = [n for n, e in entries.items() if isinstance(e, ast.AxisEntry)
                        and n not in MESH_PROPERTIES and n not in NAMED_PROPERTIES]
                return f"the mesh has no axis '{name}'{did_you_mean(name, axes)}"
            _set_entry(edited, setting, entry.block, entry.span, parts[2])
            return None
        if entry is not None:
            _replace(edited, setting, entry.value.span, value)
        else:  # a new axis goes last, innermost (or a property the mesh does not write)
            line, column = mesh.span.end_line, mesh.span.end_column - 1
            indent = "    " if not edited.text.split("\n")[line - 1][:column - 1].strip() else " "
            _insert(edited, setting, line, column, f"{indent}{name} = {value} ",
                    len(indent) + len(name) + 3, len(indent), len(name))
        return None
    if head == "place":
        group = parts[1]
        for stmt in _first(file, ast.PlaceStmt):
            assert isinstance(stmt, ast.PlaceStmt)
            if group_text(stmt.group) == group and stmt.groups is None:
                _replace(edited, setting, stmt.placement.span, value)
                return None
        edited.append(setting, f"place {value} over {group}", 6, len(value) + 12, len(group))
        return None
    if head == "clip":
        clips = _first(file, ast.ClipStmt)
        key = parts[1]
        if not clips:
            edited.append(setting, f"clip {key} = {value}", len(key) + 8, 5, len(key))
            return None
        clip = clips[0]
        assert isinstance(clip, ast.ClipStmt)
        for item in clip.entries:
            if item.key.text == key:
                _replace(edited, setting, item.value.span, value)
                return None
        _insert(edited, setting, clip.span.line, clip.span.column + 4, f" {key} = {value},",
                len(key) + 4, 1, len(key))
        return None
    if head == "offload":
        offloads = _first(file, ast.OffloadStmt)
        for extra in reversed(offloads[1:]):  # the last first: the spans before it stay put
            _replace(edited, setting, extra.span, "", -1)
        if value == "none":
            if offloads:
                _replace(edited, setting, offloads[0].span, "", -1)
        elif offloads:
            _replace(edited, setting, offloads[0].span, f"offload {value}", 8)
        else:
            edited.append(setting, f"offload {value}", 8)
        return None
    # microbatches, recompute, loss, loss_scale: one statement and its argument
    kind, keyword = STATEMENTS[head]
    found = _first(file, kind)
    if found:
        node = _name(found[0]) if head == "loss_scale" else _argument(found[0])
        assert isinstance(node, (ast.Name, ast.Call, ast.NumberValue, ast.QuantityValue,
                                 ast.StringValue, ast.NameValue, ast.StarredValue))
        _replace(edited, setting, node.span, value)
    else:
        edited.append(setting, f"{keyword}{value}", len(keyword))
    return None


STATEMENTS: dict[str, tuple[type, str]] = {  # one statement each, and its keyword
    "microbatches": (ast.MicrobatchesStmt, "microbatches = "),
    "recompute": (ast.RecomputeStmt, "recompute "),
    "loss": (ast.LossStmt, "loss "),
    "loss_scale": (ast.LossScaleStmt, "loss_scale "),
}


def group_text(group: ast.Group) -> str:
    """A group as a key names it: ``dp``, ``shard*replica``, ``ends(pp)``, ``(dp,cp)``."""
    out = []
    for term in group.terms:
        if isinstance(term, ast.AxisRef):
            out.append(term.name.text)
        elif isinstance(term, ast.DerivedGroup):
            out.append(f"{term.function.text}({term.axis.text})")
        else:
            out.append("(" + ",".join(n.text for n in term.names) + ")")
    return "*".join(out)


def _follow_world(edited: Edited) -> None:
    """The ``world`` the mesh writes follows the axes an override resized, unless an override
    sets ``mesh.world`` itself."""
    resized = [s for s in edited.settings.items if s.parts[0] == "mesh" and len(s.parts) == 2
               and s.parts[1] not in MESH_PROPERTIES and s.parts[1] not in NAMED_PROPERTIES]
    if not resized or any(s.key == "mesh.world" for s in edited.settings.items):
        return
    meshes = _first(_parse(edited), ast.MeshStmt)
    if not meshes:
        return
    mesh = meshes[0]
    assert isinstance(mesh, ast.MeshStmt)
    world: ast.AxisEntry | None = None
    product = 1
    for entry in mesh.entries:
        if not isinstance(entry, ast.AxisEntry) or entry.name.text in NAMED_PROPERTIES:
            continue
        if entry.name.text == "world":
            world = entry
        elif entry.name.text in MESH_PROPERTIES:
            continue
        elif isinstance(entry.value, ast.NumberValue) and entry.value.value.denominator == 1:
            product *= int(entry.value.value)
        else:
            return  # a size lowering will refuse: no world to derive
    if (world is None or not isinstance(world.value, ast.NumberValue)
            or world.value.value == product):
        return
    _replace(edited, resized[0], world.value.span, str(product), -1)
    edited.implied.append(Override("mesh.world", str(product), implied=True))
