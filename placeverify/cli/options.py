"""The options the commands share, and how their values become the library's arguments.

Paths are taken as given (:data:`PATH`): whether a file can be read or written is placeverify's
check, a diagnostic with exit 4, never click's usage error (exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from placeverify.console import echo
from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source
from placeverify.importers.shell_inputs import parse_args, parse_env

# Paths are checked by placeverify, not by click: a missing, unreadable or non-regular file is
# exit 4 with a diagnostic (click's own checks would make it a usage error, exit 2).
PATH = click.Path(readable=False)


def finite(value: float) -> float:
    """Reject NaN, which every range comparison lets through."""
    if value != value:
        raise click.BadParameter("nan is not a number of seconds")
    return value


def budget_option(command: Callable[..., None]) -> Callable[..., None]:
    """--timeout: the time budget of the whole verification of one file."""
    return click.option(
        "--timeout", default=30.0, show_default=True, type=click.FloatRange(0.1, 3600),
        callback=lambda _ctx, _param, value: finite(value),
        help="Seconds for the whole verification of each file, shared by its solver queries "
             "(each at most 10 s); what is undecided when it runs out is unknown (exit 3).")(command)


def every_size_options(command: Callable[..., None]) -> Callable[..., None]:
    """--every-size and --fixed: the conditions for every size of the mesh axes and the
    micro-batch count, not only the file's (placeverify.verify.every_size)."""
    command = click.option(
        "--fixed", "fixed", multiple=True, metavar="NAME",
        help="With --every-size: hold this mesh axis, or 'microbatches', at the file's size "
             "(repeatable).")(command)
    return click.option(
        "--every-size", "every_size", is_flag=True,
        help="Also prove the three conditions for every size of every mesh axis and of the "
             "micro-batch count (a failure names the smallest sizes and shows the "
             "counterexample there); without it the verdicts cover the file's sizes.")(command)


def import_options(command: Callable[..., None]) -> Callable[..., None]:
    """--model, --world, --format, --env and --script-args: how a framework configuration file
    is imported (the last two: what a launch script is run with)."""
    command = click.option(
        "--script-args", "script_args", multiple=True, metavar="'ARG ...'",
        callback=lambda _ctx, _param, value: _words(parse_args, value) if value else None,
        help="The launch script's arguments ($1, $2, \"$@\", $#), split as a shell splits a "
             "command line (repeatable: the words add up); decides the tests, case arms and "
             "argument loops that depend on them.")(command)
    command = click.option(
        "--env", "env", multiple=True, metavar="NAME=VALUE",
        callback=lambda _ctx, _param, value: _words(parse_env, value),
        help="A variable of the launch script's environment (repeatable); decides the tests "
             "and values that depend on it.")(command)
    command = click.option(
        "--config", "config", default=None, metavar="NAME",
        help="The function of a torchtitan config_registry.py to read (torchtitan's own "
             "--config), when the file builds more than one configuration.")(command)
    command = click.option("--format", "fmt", default=None,
                           type=click.Choice(["megatron", "deepspeed", "torchtitan", "accelerate",
                                              "axolotl", "trl"]),
                           help="Configuration format (default: recognised from the content).")(command)
    command = click.option("--world", type=click.IntRange(1, 10**8), default=None,
                           help="World size, for configurations that leave it to the launcher.")(command)
    return click.option("--model", type=PATH, metavar="FILE", default=None,
                        help="A Hugging Face config.json describing the model.")(command)


def quiet_option(command: Callable[..., None]) -> Callable[..., None]:
    """--quiet: no progress lines on standard error."""
    return click.option(
        "-q", "--quiet", is_flag=True,
        help="No progress on standard error (off a terminal it is plain 'progress: ...' lines, "
             "for CI logs).")(command)


def width_option(command: Callable[..., None]) -> Callable[..., None]:
    """--width N: the columns of the text output (``docs/cli.md``)."""
    return click.option(
        "--width", type=click.IntRange(20, 10_000), default=None,
        help="Columns the text output may use (default: COLUMNS, also off a terminal, else the "
             "terminal's, else 120); a table that does not fit is listed, never cut.")(command)


def set_option(command: Callable[..., None]) -> Callable[..., None]:
    """--set KEY=VALUE (repeatable): override a value of every strategy (``docs/overrides.md``)."""
    return click.option(
        "--set", "overrides", multiple=True, metavar="KEY=VALUE",
        help="Override a value of the strategy, e.g. mesh.dp=16, model.seq=8192, "
             "place.dp=zero3, precision=megatron, microbatches=8 (repeatable; docs/overrides.md).")(command)


def override_settings(texts: tuple[str, ...]) -> Any:
    """The checked overrides, or None without any (a malformed one is an error, exit 2)."""
    if not texts:
        return None
    from placeverify.api import overrides

    return overrides(texts)


def _words(parse: Callable[[tuple[str, ...]], Any], value: tuple[str, ...]) -> Any:
    try:
        return parse(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def import_settings(model: str | None, world: int | None, fmt: str | None,
                    env: tuple[tuple[str, str], ...] = (),
                    script_args: tuple[str, ...] | None = None, config: str | None = None) -> Any:
    """The importers' options; a folder given as ``--model`` is refused here (exit 4), before
    any file is read."""
    from placeverify.importers import Options

    if model is not None and is_folder(Path(model)):
        raise PlaceError([Diagnostic(Severity.ERROR, "cannot read file: is a directory, not a "
                                     "config.json", Code.READ)], Source(model, ""), ExitCode.READ_ERROR)
    return Options(model, world, fmt, env=env, script_args=script_args, config=config)


def emit_json(document: Any) -> None:
    echo(json.dumps(document, indent=2, ensure_ascii=False))


def output_options(command: Callable[..., None]) -> Callable[..., None]:
    """--output-format and --require-fit: what a CI run prints and what fails it."""
    command = click.option("--require-fit", is_flag=True,
                           help="Exit 6 when a strategy does not fit (predicted total above "
                                "device_memory).")(command)
    return click.option("--output-format", "output", default="text", show_default=True,
                        type=click.Choice(["text", "json", "sarif", "github"]),
                        help="text, json (as --json), sarif (SARIF 2.1.0) or github (workflow "
                             "commands).")(command)


def output_of(as_json: bool, output: str) -> str:
    if as_json and output not in ("text", "json"):
        raise click.UsageError(f"--json and --output-format {output} disagree")
    return "json" if as_json else output


def emit_outcomes(output: str, outcomes: list[Any], code: ExitCode, require_fit: bool) -> None:
    """The SARIF log or the GitHub annotations of a run's outcomes."""
    from placeverify.report.findings import findings
    from placeverify.report.github import render_github
    from placeverify.report.sarif import render_sarif

    found = findings(outcomes, require_fit=require_fit)
    echo(render_sarif(found, code) if output == "sarif" else render_github(found, outcomes, code))



def expand_paths(items: Iterable[str]) -> list[str]:
    """Files as given; a folder stands for the .place files under it, sorted."""
    out: list[str] = []
    for item in items:
        p = Path(item)
        if is_folder(p):
            found = sorted(str(f) for f in p.rglob("*.place"))
            if not found:
                raise PlaceError([_no_files(item)], Source(item, ""), ExitCode.READ_ERROR)
            out.extend(found)
        else:
            out.append(item)
    return out


def is_folder(path: Path) -> bool:
    """Whether ``path`` is a folder; one that cannot be looked at (a parent its user may not
    search) is not, and reading it then says why (exit 4)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _no_files(folder: str) -> Any:
    return Diagnostic(Severity.ERROR, f"no .place files under {folder}", Code.READ)
