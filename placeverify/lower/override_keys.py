"""The ``--set KEY=VALUE`` options of a command line, parsed and checked before any file is
touched (:mod:`placeverify.lower.overrides` applies them; its docstring has the keys).

Each key is checked against :data:`KEYS` and :data:`PARTS`; each value is parsed on its own as
exactly one node of the kind its key takes (a value, a placement, a call, a name), inside the
statement it will stand in (:data:`WRAPPERS`): a value that would end the statement or start
another is refused, so nothing is ever spliced into the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span, did_you_mean
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_source

SOURCE_PATH = "--set"  # the name diagnostics about an override print
MAX_SETTINGS = 100
MAX_LENGTH = 1000

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What each first part of a key takes after it, as the help and the errors show it.
KEYS: dict[str, str] = {
    "model": "model=NAME or model.KEY=VALUE (a key of the model block, e.g. model.seq=8192)",
    "precision": "precision=NAME or precision.KEY=VALUE (params, gather, compute, grads, reduce, "
                 "optimizer, activations, loss_scale)",
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


def name_of(stmt: ast.Statement) -> object:
    """The name a ``model``, ``precision`` or ``loss_scale`` statement without a block gives."""
    if isinstance(stmt, (ast.ModelStmt, ast.PrecisionStmt)) and stmt.block is None:
        return stmt.name
    return stmt.kind if isinstance(stmt, ast.LossScaleStmt) else None


def _group(stmt: ast.Statement) -> object:
    return stmt.group if isinstance(stmt, ast.PlaceStmt) else None


def argument_of(stmt: ast.Statement) -> object:
    """The argument of a ``recompute``, ``loss``, ``place`` or ``microbatches`` statement."""
    if isinstance(stmt, (ast.RecomputeStmt, ast.LossStmt)):
        return stmt.call
    if isinstance(stmt, ast.PlaceStmt):
        return stmt.placement
    return stmt.value if isinstance(stmt, ast.MicrobatchesStmt) else None


WRAPPERS: dict[str, tuple[str, str, type, Pick]] = {
    "value": ("model { key = ", " }", ast.ModelStmt, _entry_value),
    "mesh": ("mesh { key = ", " }", ast.MeshStmt, _entry_value),
    "clip": ("clip key = ", "", ast.ClipStmt, _entry_value),
    "model": ("model ", "", ast.ModelStmt, name_of),
    "precision": ("precision ", "", ast.PrecisionStmt, name_of),
    "loss_scale": ("loss_scale ", "", ast.LossScaleStmt, name_of),
    "recompute": ("recompute ", "", ast.RecomputeStmt, argument_of),
    "loss": ("loss ", "", ast.LossStmt, argument_of),
    "place": ("place ", " over x", ast.PlaceStmt, argument_of),
    "microbatches": ("microbatches = ", "", ast.MicrobatchesStmt, argument_of),
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
