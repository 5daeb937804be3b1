"""Counterexample traces: a versioned JSON document the replay backend can run.

Schema ``placeverify.trace/1`` (documented in README):

``schema``, ``placeverify`` (version), ``file``, ``source`` (the .place text, re-parsed by the
replay, never evaluated), ``strategy``, ``condition``, ``kind``, ``claim``, ``reason``, ``fix``,
``line``, ``column``, ``group`` (parameter group or null), ``mesh`` ({axis: size}, the smallest
mesh found), ``microbatches``, ``tokens`` and ``samples`` ([{coords, microbatch, tokens|samples}]),
``gradients`` ([{coords, microbatch, chunk, sum}]: per-atom gradient sums used by the exact
interpreter), ``devices`` ([{coords, steps: [{op, line, microbatch, grads, shard}], consumed}]),
``reference`` (the single-device value), ``values`` (solver values for non-gradient evidence).
Rationals are strings "p/q". Traces are written atomically and loaded with a schema check.
"""

from __future__ import annotations

import json
import os
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

from placeverify import __version__
from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source
from placeverify.evidence import Counterexample, Divergence, Evidence
from placeverify.ir.strategy import Strategy
from placeverify.semantics.groups import group_view
from placeverify.verdicts import Obligation

SCHEMA = "placeverify.trace/1"
MAX_TRACE_BYTES = 8 << 20
REQUIRED = ("schema", "source", "condition", "kind", "mesh", "microbatches")


def _fraction(value: Fraction | None) -> str | None:
    return None if value is None else str(value)


def build(strategy: Strategy, obligation: Obligation,
          evidence: Evidence | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "placeverify": __version__,
        "file": strategy.source.path,
        "source": strategy.source.text,
        "strategy": strategy.name,
        "condition": obligation.condition.value,
        "kind": obligation.kind,
        "claim": obligation.claim,
        "reason": obligation.reason,
        "fix": obligation.fix,
        "line": obligation.span.line if obligation.span else None,
        "column": obligation.span.column if obligation.span else None,
        "group": None,
        "mesh": {a.name: a.size for a in strategy.mesh.axes},
        "microbatches": strategy.step.microbatches,
        "tokens": [], "samples": [], "gradients": [], "devices": [],
        "reference": None,
        "values": obligation.counterexample or {},
    }
    if isinstance(evidence, Counterexample | Divergence):
        view = group_view(strategy, evidence.group)
        doc.update(group=evidence.group.value, mesh=dict(evidence.sizes),
                   microbatches=evidence.microbatches)
        if isinstance(evidence, Divergence) and evidence.values:
            doc["values"] = evidence.values
        instance = evidence.instance
        if instance is not None:
            doc["tokens"] = [{"coords": dict(zip(view.batch, b, strict=True)), "microbatch": k,
                              "tokens": n} for (b, k), n in sorted(instance.tokens.items())]
            doc["samples"] = [{"coords": dict(zip(view.batch, b, strict=True)), "microbatch": k,
                               "samples": n} for (b, k), n in sorted(instance.samples.items())]
            doc["gradients"] = [{"coords": dict(zip(view.batch, b, strict=True)), "microbatch": k,
                                 "chunk": dict(zip(view.extra, e, strict=True)), "sum": str(g)}
                                for (b, k, e), g in sorted(instance.grads.items())]
        run = evidence.run
        if run is not None:
            doc["devices"] = [{
                "coords": d.coords,
                "steps": [{"op": op, "line": line, "microbatch": k, "grads": str(full),
                           "shard": _fraction(shard)} for op, line, k, full, shard in d.rows],
                "consumed": _fraction(d.consumed)} for d in run.devices]
            doc["reference"] = str(run.reference)
    return doc


def write(trace: dict[str, Any], path: str) -> None:
    """Write atomically: a reader never sees half a trace, and an old file is never lost."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, temporary = tempfile.mkstemp(prefix=".trace-", suffix=".json", dir=directory)
    except OSError as err:
        raise PlaceError([Diagnostic(Severity.ERROR, f"cannot write trace: {err.strerror}",
                                     Code.READ)], Source(path, ""), ExitCode.READ_ERROR) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(trace, handle, indent=2, ensure_ascii=False)
            handle.write("\n")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load(path: str) -> dict[str, Any]:
    """Read and validate a trace (JSON only: nothing in it is evaluated or unpickled)."""
    from placeverify.syntax.source import MAX_FILE_BYTES, decode_text

    p = Path(path)
    source = Source(path, "")
    if not p.is_file():
        raise PlaceError([Diagnostic(Severity.ERROR, "cannot read trace: no such file", Code.READ)],
                         source, ExitCode.READ_ERROR)
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise PlaceError([Diagnostic(Severity.ERROR, "trace file is too large", Code.TOO_LARGE)],
                         source)
    text = decode_text(path, p.read_bytes())
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        from placeverify.diagnostics import Span

        raise PlaceError([Diagnostic(Severity.ERROR, f"not a JSON trace: {err.msg}", Code.TRACE,
                                     Span.point(err.lineno, err.colno))], Source(path, text)) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise PlaceError([Diagnostic(Severity.ERROR, f"not a {SCHEMA} trace (schema: {found!r})",
                                     Code.TRACE)], Source(path, text))
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise PlaceError([Diagnostic(Severity.ERROR, "trace lacks " + ", ".join(missing),
                                     Code.TRACE)], Source(path, text))
    if len(doc["source"]) > MAX_FILE_BYTES:
        raise PlaceError([Diagnostic(Severity.ERROR, "trace source is too large", Code.TOO_LARGE)],
                         source)
    mesh = doc["mesh"]
    if not isinstance(mesh, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and 1 <= v <= 64 for k, v in mesh.items()):
        raise PlaceError([Diagnostic(Severity.ERROR, "trace mesh must map axis names to sizes "
                                     "1..64", Code.TRACE)], Source(path, text))
    if not isinstance(doc["microbatches"], int) or not 1 <= doc["microbatches"] <= 1024:
        raise PlaceError([Diagnostic(Severity.ERROR, "trace microbatches must be 1..1024",
                                     Code.TRACE)], Source(path, text))
    return doc
