"""The importers' registry: one reader per format, format detection from the content, and
:func:`load`, which lowers the produced ``.place`` text and points its errors at the keys."""


from __future__ import annotations

import json
import re
from collections.abc import Callable

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source
from placeverify.importers import Options, accelerate, deepspeed, megatron, torchtitan
from placeverify.importers.common import Imported, Plan, Reader, render
from placeverify.ir.strategy import Strategy
from placeverify.lower import load_text
from placeverify.lower.overrides import Settings
from placeverify.syntax.source import read_source

DEFAULTS = Options()  # no --model, --world or --format
ReadFn = Callable[[Reader, Source, "str | None", "int | None"], Plan]
FORMATS: dict[str, ReadFn] = {
    "megatron": megatron.read,
    "deepspeed": deepspeed.read,
    "torchtitan": torchtitan.read,
    "accelerate": accelerate.read,
}


def detect(source: Source) -> str:
    """The format of a configuration, from its content."""
    text = source.text
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            if "model_type" in data and "zero_optimization" not in data:
                raise _refuse(source, "this is a Hugging Face model config.json: give it with "
                              "--model beside a training configuration")
            return "deepspeed"
    if re.search(r"^\s*\[(parallelism|training|activation_checkpoint|job)\]", text, re.M):
        return "torchtitan"
    if re.search(r"^distributed_type\s*:", text, re.M):
        return "accelerate"
    if re.search(r"--(tensor-model-parallel-size|pipeline-model-parallel-size|num-layers|"
                 r"micro-batch-size|hidden-size)\b", text) or "pretrain_gpt" in text:
        return "megatron"
    raise _refuse(source, "cannot tell the format of this file (Megatron-LM arguments, DeepSpeed "
                  "JSON, torchtitan TOML or accelerate YAML); give --format")


def _refuse(source: Source, message: str) -> PlaceError:
    return PlaceError([Diagnostic(Severity.ERROR, message, Code.BAD_VALUE)], source)


def import_file(path: str, options: Options = DEFAULTS) -> Imported:
    """Read a configuration file and produce its .place text (raises PlaceError on errors)."""
    source = read_source(path)
    fmt = options.fmt or detect(source)
    if fmt not in FORMATS:
        raise _refuse(source, f"unknown format '{fmt}'; expected one of " + ", ".join(FORMATS))
    reader = Reader(source)
    plan = FORMATS[fmt](reader, source, options.model, options.world)
    reader.raise_if_errors()
    text, origins = render(plan)
    return Imported(fmt, path, text, origins, reader.warnings())


def load(path: str, options: Options = DEFAULTS, settings: Settings | None = None,
         imported: Imported | None = None) -> tuple[Strategy, Imported]:
    """The Strategy an imported file means (under ``settings``, its ``--set`` overrides), and the
    import; lowering errors point at the keys, or at the override they are in."""
    if imported is None:
        imported = import_file(path, options)
    generated = f"{path} (imported)"
    try:
        return load_text(imported.text, generated, settings), imported
    except PlaceError as error:
        raise remap(error, imported) from None


def remap(error: PlaceError, imported: Imported) -> PlaceError:
    """A lowering error of the produced text, pointed at the key each line came from."""
    generated = Source(f"{imported.path} (imported)", imported.text)
    out: list[Diagnostic] = []
    target: Source | None = None
    for d in error.diagnostics:
        if d.source is not None:  # about an override (--set), not the imported text
            out.append(d)
            continue
        origin = imported.origins.get(d.span.line) if d.span is not None else None
        line = generated.line_text(d.span.line).strip() if d.span is not None else ""
        note = (f"in the imported strategy, line {d.span.line}: {line}",) if d.span else ()
        if origin is not None and origin.span is not None and (
                target is None or origin.source.path == target.path):
            target = origin.source
            out.append(Diagnostic(d.severity, f"{d.message} (from {origin.key})", d.code,
                                  origin.span, (*d.notes, *note)))
        else:
            out.append(Diagnostic(d.severity, d.message, d.code, None, (*d.notes, *note)))
    return PlaceError(out, target or Source(imported.path, ""), error.exit_code)
