"""The ``placeverify`` command: parse arguments, call the library, choose the exit code.

The group and ``check`` are here; the other commands are in :mod:`placeverify.cli.commands`, the
shared options in :mod:`placeverify.cli.options` and the exit codes in
:mod:`placeverify.cli.exits`. ``placeverify.cli:main`` is the console script.
"""

from __future__ import annotations

import atexit
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from placeverify import __version__
from placeverify.cli.commands import compare, import_, measure, prove, replay, search
from placeverify.cli.exits import EXIT_CODES, Group, epilog, guarded
from placeverify.cli.options import (
    PATH,
    budget_option,
    emit_json,
    emit_outcomes,
    every_size_options,
    expand_paths,
    import_options,
    import_settings,
    is_folder,
    output_of,
    output_options,
    override_settings,
    quiet_option,
    set_option,
    width_option,
)
from placeverify.console import (
    Progress,
    console,
    error_console,
    print_errors,
    print_failure,
    verdict_exit,
    worst,
)
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.files import WriteFailed, check_writable, reason

# A command's process ends with the command. Freezing the heap at exit spares the interpreter's
# final garbage collections a walk over every object the loaded modules hold (about 30 ms of a
# 0.3 s check); what they would free, the operating system reclaims. Nothing else changes: atexit
# handlers still run and the standard streams are still flushed.
atexit.register(gc.freeze)


@click.group(cls=Group, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="placeverify")
def main() -> None:
    """placeverify: check a distributed-training strategy before you launch it.

    A .place file says how parameters, optimizer state, gradients and activations are placed on
    each mesh axis and what one training step does. placeverify derives per-device memory and
    per-step communication, and proves with Z3 that the step matches single-device training
    (gradient integrity, state consistency, composition safety) or shows a counterexample.
    """


@main.command(epilog=epilog("check"))
@click.argument("files", nargs=-1, required=True, type=PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--formulas", is_flag=True, help="Show the SymPy closed forms of every cost.")
@click.option("--no-verify", is_flag=True, help="Costs only; skip the Z3 proofs.")
@click.option("--trace", "trace_path", type=PATH, metavar="FILE",
              help="Write the counterexample trace (JSON) of a refuted file here.")
@click.option("--replay", is_flag=True,
              help="Replay the step on real torch.distributed processes at the declared mesh "
                   "(a smaller one, said so, above 8 devices; needs torch).")
@click.option("--plot", "plot_path", type=PATH, metavar="FILE", default=None,
              help="Draw the memory per rank kind to FILE.png or FILE.svg, and a pipeline's "
                   "schedule to FILE-schedule.png/.svg (needs the plot extra: matplotlib).")
@every_size_options
@budget_option
@output_options
@import_options
@set_option
@width_option
@quiet_option
def check(files: tuple[str, ...], as_json: bool, formulas: bool, no_verify: bool,
          trace_path: str | None, replay: bool, plot_path: str | None, every_size: bool,
          fixed: tuple[str, ...], timeout: float, output: str, require_fit: bool,
          model: str | None, world: int | None, fmt: str | None,
          env: tuple[tuple[str, str], ...], script_args: tuple[str, ...] | None,
            config: str | None,
          overrides: tuple[str, ...], width: int | None, quiet: bool) -> None:
    """Check strategies: costs, and proofs of the three correctness conditions."""

    def run() -> ExitCode:
        from placeverify.report.text import render_check

        fmt_out = output_of(as_json, output)
        settings = override_settings(overrides)
        paths = expand_paths(files)
        if fixed and not every_size:
            raise click.UsageError("--fixed holds sizes of --every-size; give --every-size too")
        if every_size and no_verify:
            raise click.UsageError("--every-size proves the conditions; --no-verify skips them")
        refused = refuse_outputs(paths, trace_path, plot_path)
        if refused is not None:
            return refused
        each = CheckRun(fmt_out, as_json, formulas, not no_verify, timeout,
                       import_settings(model, world, fmt, env, script_args, config), settings, require_fit,
                       trace_path, plot_path, replay, tuple(fixed) if every_size else None)
        outcomes: list[Any] = []
        out = console(width)
        progress = Progress(quiet)
        for index, path in enumerate(paths):
            progress.item("check", index + 1, len(paths), path)
            outcome = each.one(path, out, progress)
            outcomes.append(outcome)
            if fmt_out == "text" and outcome.result is not None:
                if index:
                    out.rule()
                render_check(outcome.result, out, formulas=formulas)
        progress.done()
        code = worst(o.exit_code for o in outcomes)
        if fmt_out == "json":  # one file argument: its document; several or a folder: the list
            from placeverify.report.outcome import check_list_document, report_document

            listing = len(files) > 1 or any(is_folder(Path(f)) for f in files)
            emit_json(check_list_document(outcomes, code) if listing
                      else report_document(outcomes[0]))
        elif fmt_out != "text":
            emit_outcomes(fmt_out, outcomes, code, require_fit)
        return code

    guarded(run)


def refuse_outputs(paths: list[str], trace_path: str | None, plot_path: str | None) -> ExitCode | None:
    """Before any work: ``--trace`` and ``--plot`` take one file and a path that can be written
    (exit 2 or 4 otherwise); ``--plot`` needs matplotlib (exit 5)."""
    if trace_path is not None:
        if len(paths) != 1:
            raise click.UsageError("--trace takes exactly one file")
        check_writable(trace_path, "trace")
    if plot_path is not None:
        from placeverify.report import plot

        if len(paths) != 1:
            raise click.UsageError("--plot takes exactly one file")
        try:
            plot.check_format(plot_path)
        except ValueError as error:
            raise click.UsageError(str(error)) from None
        check_writable(plot_path, "plot")
        if not plot.available():
            print_failure("--plot needs matplotlib, the plot extra: pip install 'placeverify[plot]'")
            return ExitCode.BACKEND_ERROR
    return None


@dataclass(frozen=True)
class CheckRun:
    """What ``check`` does with each file, from its options."""

    fmt_out: str  # text, json, sarif or github
    as_json: bool
    formulas: bool
    verify: bool
    budget_s: float
    imports: Any  # placeverify.importers.Options
    settings: Any  # placeverify.lower.overrides.Settings, or None
    require_fit: bool
    trace_path: str | None
    plot_path: str | None
    replay: bool
    every_size: tuple[str, ...] | None  # --every-size: the names --fixed holds; None without

    def one(self, path: str, out: Console, progress: Progress) -> Any:
        """The outcome of checking one file (its errors printed), after its trace, plots and
        replay."""
        from placeverify.api import check as check_file
        from placeverify.report.outcome import Outcome, fits

        try:
            result = check_file(path, verify_conditions=self.verify, formulas=self.formulas,
                                budget_s=self.budget_s, imports=self.imports,
                                settings=self.settings, every_size=self.every_size)
        except PlaceError as error:
            print_errors(error)
            return Outcome(path, error.exit_code, error=error)
        code = ExitCode.OK
        overall = result.overall()
        if overall is not None:
            code = verdict_exit(overall)
        if self.require_fit and fits(result) is False:
            code = worst([code, ExitCode.DOES_NOT_FIT])
        if self.trace_path is not None and result.verification is not None:
            write_trace(result, self.trace_path)
        if self.plot_path is not None:
            code = worst([code, write_plots(result, self.plot_path)])
        replayed = None
        if self.replay and result.verification is not None:
            if self.fmt_out != "text":
                from placeverify.replay.cli import replay_document

                replay_code, replayed = replay_document(result)
            else:
                replay_code = replay_check(result, self.as_json, out, progress)
            code = worst([code, replay_code])
        return Outcome(path, code, result=result, replay=replayed)


def write_trace(result: Any, path: str) -> None:
    from placeverify.trace import write

    trace = counterexample_trace(result)
    if trace is None:
        error_console().print("placeverify: note: no counterexample to write: "
                              f"{result.strategy.source.path} is {result.overall().value}",
                              markup=False)
        return
    write(trace, path)
    error_console().print(f"trace written to {path}", markup=False)


def counterexample_trace(result: Any) -> Any:
    """The trace ``--trace`` writes and ``--replay`` runs: the file's sizes' first refutation, or
    with ``--every-size`` and none there, the one at the smallest sizes where a condition fails."""
    if result.verification.trace is not None or result.every_size is None:
        return result.verification.trace
    from dataclasses import replace as replaced

    from placeverify.trace import EVERY_SIZE

    failing = result.every_size.at_failing
    if failing is None or failing.trace is None:
        return None
    trace = failing.trace  # at other sizes than the file's: the replay judges it at its own
    return replaced(trace, values={**trace.values, EVERY_SIZE: True})


def write_plots(result: Any, path: str) -> ExitCode:
    """``check --plot``: the memory chart at ``path``, and with a pipeline the schedule next to
    it (``FILE-schedule.png``); a file that cannot be written is exit 4."""
    from placeverify.report import plot

    pipeline = result.strategy.pipeline
    targets = [path]
    if pipeline is not None and result.strategy.size(pipeline.axis) > 1:
        targets.append(plot.schedule_path(path))
    for target in targets:
        try:
            if target == path:
                plot.memory_chart(result, target)
            else:
                plot.schedule_chart(result.strategy, target)
        except plot.PlotUnavailable as err:
            print_failure(str(err))
            return ExitCode.BACKEND_ERROR
        except OSError as err:
            print_errors(WriteFailed(target, reason(err), "plot").error())
            return ExitCode.READ_ERROR
        error_console().print(f"plot written to {target}", markup=False)
    return ExitCode.OK


def replay_check(result: Any, as_json: bool, out: Console, progress: Progress) -> ExitCode:
    from placeverify.replay.cli import replay_result

    return replay_result(result, as_json=as_json, console=out, progress=progress)


for _command in (compare, prove, replay, measure, search, import_):
    main.add_command(_command)
