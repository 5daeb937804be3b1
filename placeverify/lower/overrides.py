"""``--set KEY=VALUE``: a strategy with some of its values replaced, then lowered like any file.

Keys name what the language names (``docs/overrides.md``):

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

from collections.abc import Callable

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span, did_you_mean
from placeverify.ir.strategy import Override
from placeverify.lower.edited import Edit, Edited
from placeverify.lower.mesh import MESH_PROPERTIES, NAMED_PROPERTIES
from placeverify.lower.override_keys import Setting, Settings, argument_of, name_of, parse_settings
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_source

# Setting, Settings, parse_settings, Edit and Edited were defined here: api, compare_cli, the
# importers, benchmarks/ and tests/ import them from this module.
__all__ = ["Edit", "Edited", "Setting", "Settings", "apply", "group_text", "parse_settings"]


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


def _apply_block(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """``model=NAME``, ``precision=NAME`` and an entry of either's block."""
    head, parts, value = setting.parts[0], setting.parts, setting.value
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


def _apply_mesh(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """``mesh.AXIS=N``, ``mesh.PROPERTY=VALUE`` and ``mesh.AXIS.KEY=VALUE``."""
    parts, value = setting.parts, setting.value
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


def _apply_place(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """``place.GROUP=PLACEMENT``: the placement over GROUP, or a new ``place`` statement."""
    group, value = setting.parts[1], setting.value
    for stmt in _first(file, ast.PlaceStmt):
        assert isinstance(stmt, ast.PlaceStmt)
        if group_text(stmt.group) == group and stmt.groups is None:
            _replace(edited, setting, stmt.placement.span, value)
            return None
    edited.append(setting, f"place {value} over {group}", 6, len(value) + 12, len(group))
    return None


def _apply_clip(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """``clip.KEY=VALUE``."""
    key, value = setting.parts[1], setting.value
    clips = _first(file, ast.ClipStmt)
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


def _apply_offload(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """``offload=STATES|none``: one ``offload`` statement, or none."""
    value = setting.value
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


def _apply_statement(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """``microbatches``, ``recompute``, ``loss``, ``loss_scale``: one statement and its
    argument."""
    head, value = setting.parts[0], setting.value
    kind, keyword = STATEMENTS[head]
    found = _first(file, kind)
    if found:
        node = name_of(found[0]) if head == "loss_scale" else argument_of(found[0])
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

# How each first part of a key is applied to ``edited``: a message when it names nothing the
# file lets it set.
APPLY: dict[str, Callable[[Edited, ast.File, Setting], str | None]] = {
    "model": _apply_block, "precision": _apply_block, "mesh": _apply_mesh, "place": _apply_place,
    "clip": _apply_clip, "offload": _apply_offload, **dict.fromkeys(STATEMENTS, _apply_statement),
}


def _apply_one(edited: Edited, file: ast.File, setting: Setting) -> str | None:
    """Apply one override to ``edited``; a message when it names nothing it can set."""
    return APPLY[setting.parts[0]](edited, file, setting)


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
