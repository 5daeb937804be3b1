"""The importers' registry: one reader per format, format detection from the content, and
:func:`load`, which lowers the produced ``.place`` text and points its errors at the keys."""


from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source
from placeverify.importers import (
    Options,
    accelerate,
    axolotl,
    deepspeed,
    megatron,
    megatron_yaml,
    torchtitan,
    torchtitan_registry,
    trl_cli,
)
from placeverify.importers.common import FRAMEWORKS, Imported, Plan, Reader, render
from placeverify.importers.positions import load_json, load_toml
from placeverify.importers.python_literals import Module
from placeverify.importers.rules import Facts
from placeverify.importers.rules import judge as judge_rules
from placeverify.importers.shell import Script
from placeverify.importers.shell_inputs import Inputs
from placeverify.importers.yaml_nodes import load_yaml
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
    "axolotl": axolotl.read,
    "trl": trl_cli.read,
}


def detect(source: Source) -> str:
    """The format of a configuration, from its content. A ``.json`` file that is not JSON, and
    a file whose content names no format but does not parse in the syntax its name (or its first
    character, ``{``) says, get that parser's error at its line and column
    (:func:`syntax_error_of`)."""
    text = source.text
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None  # not JSON: the syntax error is reported unless the content says more
        if data is None and Path(source.path).suffix.lower() == ".json":
            error = syntax_error_of(source)  # a .json file is JSON, whatever words it holds
            if error is not None:
                raise error
        if isinstance(data, dict):
            if "model_type" in data and "zero_optimization" not in data:
                raise _refuse(source, "this is a Hugging Face model config.json: give it with "
                              "--model beside a training configuration")
            return "deepspeed"
    if torchtitan_registry.is_registry(source):
        return "torchtitan"
    if re.search(r"^\s*\[(parallelism|training|activation_checkpoint|job)\]", text, re.M):
        return "torchtitan"
    if re.search(r"^distributed_type\s*:", text, re.M):
        return "accelerate"
    if re.search(r"^base_model\s*:", text, re.M):
        return "axolotl"
    if re.search(r"^model_name_or_path\s*:", text, re.M):
        return "trl"
    if re.search(r"--(tensor-model-parallel-size|pipeline-model-parallel-size|num-layers|"
                 r"micro-batch-size|hidden-size)\b", text) or "pretrain_gpt" in text:
        return "megatron"
    error = syntax_error_of(source)
    if error is not None:
        raise error
    raise _refuse(source, "cannot tell the format of this file (Megatron-LM arguments, DeepSpeed "
                  "JSON, torchtitan TOML or config registry, accelerate, axolotl or TRL YAML); give --format")


def _yaml(source: Source) -> object:
    """The YAML the importers read: a Megatron-LM test configuration's ``MODEL_ARGS`` lines, or
    the block mappings accelerate writes."""
    if megatron_yaml.is_test_config(source):
        return megatron_yaml.arguments(source)
    return load_yaml(source)


# The parser of each syntax, by the file's suffix; each raises a positioned PlaceError.
SYNTAXES: dict[str, Callable[[Source], object]] = {
    ".json": load_json, ".toml": load_toml, ".yaml": _yaml, ".yml": _yaml,
    **{suffix: Script for suffix in (".sh", ".bash", ".slurm", ".sbatch", ".args")},
    ".py": Module,
}


def syntax_error_of(source: Source) -> PlaceError | None:
    """The syntax error of a file in the syntax its suffix says (JSON for an unnamed one that
    starts with ``{``), or None when it parses (or no syntax is said)."""
    check = SYNTAXES.get(Path(source.path).suffix.lower())
    if check is None and source.text.lstrip().startswith("{"):
        check = load_json
    if check is None:
        return None
    try:
        check(source)
    except PlaceError as error:
        if error.diagnostics and all(d.code is Code.SYNTAX for d in error.diagnostics):
            return error
    return None


def _refuse(source: Source, message: str) -> PlaceError:
    return PlaceError([Diagnostic(Severity.ERROR, message, Code.BAD_VALUE)], source)


def import_file(path: str, options: Options = DEFAULTS, *, judge: bool = True) -> Imported:
    """Read a configuration file and produce its .place text (raises PlaceError on errors).

    With ``judge`` the text is lowered (an error points at the key) and the framework's
    consistency rules are decided on it (:mod:`placeverify.importers.rules`): a broken rule is an
    error or a warning at its key. Without, both are left to :func:`load`, which decides them
    on the overridden strategy."""
    source = read_source(path)
    fmt = options.fmt or detect(source)
    if fmt not in FORMATS:
        raise _refuse(source, f"unknown format '{fmt}'; expected one of " + ", ".join(FORMATS))
    reader = Reader(source, options.given, Inputs(options.env, options.script_args),
                    options.config)
    plan = FORMATS[fmt](reader, source, options.model, options.world)
    reader.raise_if_errors()
    text, origins = render(plan)
    imported = Imported(fmt, path, text, origins, reader.warnings(), list(plan.rules))
    if judge:
        _, imported = load(path, options, None, imported)
    return imported


def load(path: str, options: Options = DEFAULTS, settings: Settings | None = None,
         imported: Imported | None = None) -> tuple[Strategy, Imported]:
    """The Strategy an imported file means (under ``settings``, its ``--set`` overrides), and the
    import; lowering errors point at the keys, or at the override they are in. The framework's
    consistency rules are decided on the strategy as lowered: a broken one is an error (raised)
    or a warning (added to the import's), at its key, or at the override that broke it."""
    if imported is None:
        imported = import_file(path, with_given(options, settings), judge=False)
    strategy = _lower(imported, settings)
    if settings and any(s.parts[0] in ("mesh", "place") for s in settings.items):
        strategy = _retitled(strategy, imported)
    if not imported.rules:
        return strategy, imported
    written: Facts | None = Facts.of(strategy)
    if settings:
        try:
            written = Facts.of(_lower(imported, None))
        except PlaceError:
            written = None  # the file alone does not lower: nothing to tell the overrides by
    found = judge_rules(imported.rules, Facts.of(strategy), written, settings)
    errors = [(d, s) for d, s in found if d.severity is Severity.ERROR]
    if errors:
        raise PlaceError([d for d, _ in errors], errors[0][1])
    return strategy, replace(imported, warnings=[*imported.warnings, *found], rules=[])


def with_given(options: Options, settings: Settings | None) -> Options:
    """The options, told which keys the overrides give (a value the file lacks is then the
    override's, not an error)."""
    return replace(options, given=frozenset(s.key for s in settings.items)) if settings else options


def _retitled(strategy: Strategy, imported: Imported) -> Strategy:
    """The strategy titled with its mesh as overridden: the import's title names the file's own
    sizes (and DeepSpeed's its ZeRO stage), which a ``mesh``/``place`` override may change."""
    sizes = ", ".join(f"{axis.name} = {axis.size}" for axis in strategy.mesh.axes)
    framework = FRAMEWORKS.get(imported.fmt)
    name = (f"{Path(imported.path).name}: {framework.name if framework else imported.fmt} "
            f"with overrides, {sizes}")
    return replace(strategy, config=replace(strategy.config, name=name))


def _lower(imported: Imported, settings: Settings | None) -> Strategy:
    try:
        return load_text(imported.text, f"{imported.path} (imported)", settings)
    except PlaceError as error:
        raise remap(error, imported) from None


def remap(error: PlaceError, imported: Imported) -> PlaceError:
    """A lowering error of the produced text, pointed at the key each line came from."""
    out: list[Diagnostic] = []
    target: Source | None = None
    for d in error.diagnostics:
        if d.source is not None:  # about an override (--set), not the imported text
            out.append(d)
            continue
        origin = imported.origins.get(d.span.line) if d.span is not None else None
        note = (imported.where(d.span.line),) if d.span else ()
        if origin is not None and origin.span is not None and (
                target is None or origin.source.path == target.path):
            target = origin.source
            out.append(Diagnostic(d.severity, f"{d.message} (from {origin.key})", d.code,
                                  origin.span, (*d.notes, *note)))
        else:
            out.append(Diagnostic(d.severity, d.message, d.code, None, (*d.notes, *note)))
    return PlaceError(out, target or Source(imported.path, ""), error.exit_code)
