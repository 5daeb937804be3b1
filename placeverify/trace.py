"""Counterexample traces: a versioned JSON document the replay backend can run.

Schema ``placeverify.trace/1`` (documented in ``docs/verification.md``):

``schema``, ``placeverify`` (version), ``file``, ``source`` (the .place text, re-parsed by the
replay, never evaluated), ``strategy``, ``condition``, ``kind``, ``claim``, ``reason``, ``fix``,
``line``, ``column``, ``group`` (parameter group or null), ``mesh`` ({axis: size}, the smallest
mesh found), ``microbatches``, ``tokens`` and ``samples`` ([{coords, microbatch, tokens|samples}]),
``gradients`` ([{coords, microbatch, chunk, sum}]: per-atom gradient sums used by the exact
interpreter), ``devices`` ([{coords, steps: [{op, line, microbatch, grads, shard}], consumed}]),
``reference`` (the single-device value), ``values`` (solver values for non-gradient evidence).
Rationals are strings "p/q". Traces are written atomically and loaded with a schema check.

:class:`Trace` is the document as typed data: :meth:`Trace.to_json` writes exactly the keys and
order above, :meth:`Trace.from_json` reads them back and refuses a missing key or a wrong type
(:class:`TraceError`, an input error).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from placeverify import __version__
from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source, Span
from placeverify.errors import PlaceverifyError
from placeverify.evidence import Counterexample, Divergence, Evidence
from placeverify.files import write_file
from placeverify.ir.model import ParamGroup
from placeverify.ir.strategy import Strategy
from placeverify.lower.values import MAX_AXIS
from placeverify.obligations import Condition, Obligation, ObligationKind
from placeverify.semantics.groups import group_view
from placeverify.semantics.surd import Real
from placeverify.syntax.source import MAX_FILE_BYTES, decode_text

SCHEMA = "placeverify.trace/1"
MAX_TRACE_BYTES = 8 << 20
MAX_TRACE_DEPTH = 32  # JSON nesting: a trace needs 5 levels; deeper is an input error
EVERY_SIZE = "every_size"  # values key: check --every-size wrote it at sizes beyond the file's
MAX_ATOM_COUNT = 4096  # tokens or samples of one atom: the replay allocates them
REQUIRED = ("schema", "source", "condition", "kind", "mesh", "microbatches")
KEYS = ("schema", "placeverify", "file", "source", "strategy", "condition", "kind", "claim",
        "reason", "fix", "line", "column", "group", "mesh", "microbatches", "tokens", "samples",
        "gradients", "devices", "reference", "values")

Coords = dict[str, int]
T = TypeVar("T")


class TraceError(PlaceverifyError):
    """A trace document that is not a well-formed ``placeverify.trace/1`` (an input error);
    ``at`` is the top-level key it is about, where the message points."""

    def __init__(self, message: str, code: Code = Code.TRACE, at: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.at = at


@dataclass(frozen=True, slots=True)
class AtomCount:
    """One atom's token or sample count (``tokens`` and ``samples`` rows)."""

    coords: Coords
    microbatch: int
    count: int


@dataclass(frozen=True, slots=True)
class AtomGradient:
    """The gradient sum of one atom's chunk (a ``gradients`` row), a rational as ``"p/q"``."""

    coords: Coords
    microbatch: int
    chunk: Coords
    sum: str


@dataclass(frozen=True, slots=True)
class StepRow:
    """One statement's effect on a device's gradient buffer (a device's ``steps`` row)."""

    op: str
    line: int | None
    microbatch: int | None
    grads: str
    shard: str | None


@dataclass(frozen=True, slots=True)
class DeviceRun:
    """What one device of the counterexample mesh does (a ``devices`` row)."""

    coords: Coords
    steps: tuple[StepRow, ...]
    consumed: str | None


@dataclass(frozen=True, slots=True)
class Trace:
    """A counterexample trace, schema ``placeverify.trace/1`` (see the module doc)."""

    placeverify: str
    file: str | None
    source: str
    strategy: str | None
    condition: Condition
    kind: ObligationKind
    claim: str
    reason: str
    fix: str | None
    line: int | None
    column: int | None
    group: ParamGroup | None
    mesh: Coords
    microbatches: int
    tokens: tuple[AtomCount, ...]
    samples: tuple[AtomCount, ...]
    gradients: tuple[AtomGradient, ...]
    devices: tuple[DeviceRun, ...]
    reference: str | None  # the single-device gradient
    values: Mapping[str, Any]  # solver values for non-gradient evidence (free-form JSON)
    origin: str | None = field(default=None, compare=False)  # the file it was loaded from

    def to_json(self) -> dict[str, Any]:
        """The JSON document, keys in schema order."""
        return {
            "schema": SCHEMA,
            "placeverify": self.placeverify,
            "file": self.file,
            "source": self.source,
            "strategy": self.strategy,
            "condition": self.condition.value,
            "kind": self.kind.value,
            "claim": self.claim,
            "reason": self.reason,
            "fix": self.fix,
            "line": self.line,
            "column": self.column,
            "group": None if self.group is None else self.group.value,
            "mesh": self.mesh,
            "microbatches": self.microbatches,
            "tokens": [{"coords": t.coords, "microbatch": t.microbatch, "tokens": t.count}
                       for t in self.tokens],
            "samples": [{"coords": t.coords, "microbatch": t.microbatch, "samples": t.count}
                        for t in self.samples],
            "gradients": [{"coords": g.coords, "microbatch": g.microbatch, "chunk": g.chunk,
                           "sum": g.sum} for g in self.gradients],
            "devices": [{"coords": d.coords,
                         "steps": [{"op": s.op, "line": s.line, "microbatch": s.microbatch,
                                    "grads": s.grads, "shard": s.shard} for s in d.steps],
                         "consumed": d.consumed} for d in self.devices],
            "reference": self.reference,
            "values": self.values,
        }

    @staticmethod
    def from_json(doc: object) -> Trace:
        """Read a parsed JSON document; a wrong schema, a missing key or a wrong type raises
        :class:`TraceError`."""
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise TraceError(f"not a {SCHEMA} trace (schema: {found!r})",
                             at="schema" if isinstance(doc, dict) and "schema" in doc else None)
        missing = [k for k in REQUIRED if k not in doc] or [k for k in KEYS if k not in doc]
        if missing:
            raise TraceError("trace lacks " + ", ".join(missing))
        source = _typed(doc, "source", str, "a string")
        if len(source) > MAX_FILE_BYTES:
            raise TraceError("trace source is too large", Code.TOO_LARGE, "source")
        mesh = doc["mesh"]
        if not isinstance(mesh, dict) or not all(
                isinstance(k, str) and type(v) is int and 1 <= v <= MAX_AXIS for k, v in mesh.items()):
            raise TraceError(f"trace mesh must map axis names to sizes 1..{MAX_AXIS}", at="mesh")
        if not isinstance(doc["microbatches"], int) or not 1 <= doc["microbatches"] <= 1024:
            raise TraceError("trace microbatches must be 1..1024", at="microbatches")
        group = doc["group"]
        return Trace(
            placeverify=_typed(doc, "placeverify", str, "a string"),
            file=_optional(doc, "file", str, "a string or null"),
            source=source,
            strategy=_optional(doc, "strategy", str, "a string or null"),
            condition=_enum(doc, "condition", Condition),
            kind=_enum(doc, "kind", ObligationKind),
            claim=_typed(doc, "claim", str, "a string"),
            reason=_typed(doc, "reason", str, "a string"),
            fix=_optional(doc, "fix", str, "a string or null"),
            line=_optional(doc, "line", int, "an integer or null"),
            column=_optional(doc, "column", int, "an integer or null"),
            group=None if group is None else _enum(doc, "group", ParamGroup),
            mesh=mesh,
            microbatches=doc["microbatches"],
            tokens=_rows(doc, "tokens", f"{{coords, microbatch, tokens 1..{MAX_ATOM_COUNT}}}",
                         _count("tokens")),
            samples=_rows(doc, "samples", f"{{coords, microbatch, samples 1..{MAX_ATOM_COUNT}}}",
                          _count("samples")),
            gradients=_rows(doc, "gradients", "{coords, microbatch, chunk, sum}", _gradient),
            devices=_rows(doc, "devices", "{coords, steps, consumed}", _device),
            reference=_optional(doc, "reference", str, "a string or null"),
            values=_typed(doc, "values", dict, "an object"),
        )


def _typed(doc: Mapping[str, Any], key: str, kind: type[T], what: str) -> T:
    value = doc[key]
    if not isinstance(value, kind):
        raise TraceError(f"trace {key} must be {what}", at=key)
    return value


def _optional(doc: Mapping[str, Any], key: str, kind: type[T], what: str) -> T | None:
    return None if doc[key] is None else _typed(doc, key, kind, what)


def _enum(doc: Mapping[str, Any], key: str, kind: Callable[[str], T]) -> T:
    value = doc[key]
    try:
        return kind(value)
    except ValueError:
        raise TraceError(f"trace {key} {value!r} is not known", at=key) from None


def _coords(value: object) -> Coords:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, int)
                                              for k, v in value.items()):
        raise ValueError
    return value


def _maybe(value: object, kind: type[T]) -> T | None:
    if value is not None and not isinstance(value, kind):
        raise ValueError
    return value


def _exact(value: object, kind: type[T]) -> T:
    if not isinstance(value, kind):
        raise ValueError
    return value


def _count(name: str) -> Callable[[dict[str, Any]], AtomCount]:
    def read(row: dict[str, Any]) -> AtomCount:
        count = _exact(row[name], int)
        if not 1 <= count <= MAX_ATOM_COUNT:
            raise ValueError
        return AtomCount(_coords(row["coords"]), _exact(row["microbatch"], int), count)

    return read


def _gradient(row: dict[str, Any]) -> AtomGradient:
    return AtomGradient(_coords(row["coords"]), _exact(row["microbatch"], int),
                        _coords(row["chunk"]), _exact(row["sum"], str))


def _step(row: object) -> StepRow:
    row = _exact(row, dict)
    return StepRow(_exact(row["op"], str), _maybe(row["line"], int), _maybe(row["microbatch"], int),
                   _exact(row["grads"], str), _maybe(row["shard"], str))


def _device(row: dict[str, Any]) -> DeviceRun:
    return DeviceRun(_coords(row["coords"]), tuple(_step(s) for s in _exact(row["steps"], list)),
                     _maybe(row["consumed"], str))


def _rows(doc: Mapping[str, Any], key: str, shape: str,
          read: Callable[[dict[str, Any]], T]) -> tuple[T, ...]:
    rows = doc[key]
    try:
        return tuple(read(_exact(row, dict)) for row in _exact(rows, list))
    except (KeyError, ValueError):
        raise TraceError(f"trace {key} must be a list of {shape}", at=key) from None


def _fraction(value: Real | None) -> str | None:
    """``p/q``, or an exact sum of square roots (``1/2*sqrt(2)``) after ``|g| ^ 0.5`` factors."""
    return None if value is None else str(value)


def build(strategy: Strategy, obligation: Obligation, evidence: Evidence | None) -> Trace:
    """The trace of a refuted obligation and its evidence (a counterexample's exact run, or a
    divergence's solver values)."""
    values = obligation.counterexample or {}
    group = None
    mesh = {a.name: a.size for a in strategy.mesh.axes}
    microbatches = strategy.step.microbatches
    tokens: tuple[AtomCount, ...] = ()
    samples: tuple[AtomCount, ...] = ()
    gradients: tuple[AtomGradient, ...] = ()
    devices: tuple[DeviceRun, ...] = ()
    reference = None
    if isinstance(evidence, Counterexample | Divergence):
        view = group_view(strategy, evidence.group)
        group, mesh, microbatches = evidence.group, dict(evidence.sizes), evidence.microbatches
        if isinstance(evidence, Divergence) and evidence.values:
            values = evidence.values
        instance = evidence.instance
        if instance is not None:
            tokens = tuple(AtomCount(dict(zip(view.batch, b, strict=True)), k, n)
                           for (b, k), n in sorted(instance.tokens.items()))
            samples = tuple(AtomCount(dict(zip(view.batch, b, strict=True)), k, n)
                            for (b, k), n in sorted(instance.samples.items()))
            gradients = tuple(AtomGradient(dict(zip(view.batch, b, strict=True)), k,
                                           dict(zip(view.extra, e, strict=True)), str(g))
                              for (b, k, e), g in sorted(instance.grads.items()))
        run = evidence.run
        if run is not None:
            devices = tuple(DeviceRun(d.coords, tuple(
                StepRow(op, line, k, str(full), _fraction(shard))
                for op, line, k, full, shard in d.rows), _fraction(d.consumed))
                for d in run.devices)
            reference = str(run.reference)
    span = obligation.span
    if strategy.step.idle:  # the participation pattern refuted (semantics/participation.py)
        values = {**values, "participation": [[g.value, sorted(ks)] for g, ks in
                                               strategy.step.idle]}
    if strategy.step.empty:  # the micro-batches without tokens refuted (semantics/empty.py)
        values = {**values, "empty": sorted(strategy.step.empty)}
    return Trace(__version__, strategy.source.path, strategy.source.text, strategy.name,
                 obligation.condition, obligation.kind, obligation.claim, obligation.reason,
                 obligation.fix, span.line if span else None, span.column if span else None,
                 group, mesh, microbatches, tokens, samples, gradients, devices, reference, values)


def write(trace: Trace, path: str) -> None:
    """Write the trace atomically (:func:`placeverify.files.write_atomically`): a reader never
    sees half a trace, and an old file is never lost. Only a regular file is written (a symlink
    to one is followed and its target replaced); a directory, a FIFO, a socket or a device at
    ``path``, a missing folder or a full disk is a :class:`PlaceError` with exit 4."""
    write_file(json.dumps(trace.to_json(), indent=2, ensure_ascii=False) + "\n", path, "trace")


def load(path: str) -> Trace:
    """Read and validate a trace (JSON only: nothing in it is evaluated or unpickled)."""
    p = Path(path)
    source = Source(path, "")
    if not p.is_file():
        raise PlaceError([Diagnostic(Severity.ERROR, "cannot read trace: no such file", Code.READ)],
                         source, ExitCode.READ_ERROR)
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise PlaceError([Diagnostic(Severity.ERROR, "trace file is too large", Code.TOO_LARGE)],
                         source)
    text = decode_text(path, p.read_bytes())
    deep = _too_deep(text, MAX_TRACE_DEPTH)
    if deep is not None:
        raise PlaceError([Diagnostic(Severity.ERROR, f"trace nested more than {MAX_TRACE_DEPTH} "
                                     "levels deep", Code.TRACE, Span.point(*deep))],
                         Source(path, text))
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise PlaceError([Diagnostic(Severity.ERROR, f"not a JSON trace: {err.msg}", Code.TRACE,
                                     Span.point(err.lineno, err.colno))], Source(path, text)) from None
    try:
        return replace(Trace.from_json(doc), origin=path)
    except TraceError as err:
        span = key_span(text, err.at) if err.at else None
        where = Source(path, text)
        if err.code is Code.TOO_LARGE:  # the source line would be the whole oversized source
            where, span = source, None
        raise PlaceError([Diagnostic(Severity.ERROR, err.message, err.code, span)], where) from None


def inconsistent(trace: Trace, message: str, at: str) -> PlaceError:
    """An input error about a loaded trace (exit 2), pointing at its top-level key ``at`` in the
    trace file it was loaded from (without a file, at nothing)."""
    if trace.origin is None:
        return PlaceError([Diagnostic(Severity.ERROR, message, Code.TRACE)],
                          Source(trace.file or "<trace>", ""))
    try:
        text = decode_text(trace.origin, Path(trace.origin).read_bytes())
    except (OSError, PlaceError):
        text = ""
    return PlaceError([Diagnostic(Severity.ERROR, message, Code.TRACE, key_span(text, at))],
                      Source(trace.origin, text))


def key_span(text: str, key: str) -> Span | None:
    """Where the top-level ``key`` of a JSON object text is written (its quoted name), if it is."""
    decoder = json.JSONDecoder()

    def blank(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    try:
        i = blank(0)
        if text[i] != "{":
            return None
        i = blank(i + 1)
        while text[i] == '"':
            name, end = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
            if name == key:
                line = text.count("\n", 0, i) + 1
                column = i - (text.rfind("\n", 0, i) + 1) + 1
                return Span(line, column, line, column + (end - i))
            i = blank(blank(end) + 1)  # past the ':'
            _, i = decoder.raw_decode(text, i)
            i = blank(i)
            if text[i] != ",":
                return None
            i = blank(i + 1)
    except (IndexError, ValueError):
        return None
    return None


def _too_deep(text: str, limit: int) -> tuple[int, int] | None:
    """The line and column where JSON arrays and objects nest past ``limit``, if they do (checked
    before parsing, which would otherwise recurse once per level)."""
    depth, line, column, in_string, escaped = 0, 1, 0, False, False
    for char in text:
        column += 1
        if char == "\n":
            line, column = line + 1, 0
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return line, column
        elif char in "]}":
            depth -= 1
    return None
