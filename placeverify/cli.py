"""The ``placeverify`` command: parse arguments, call the library, choose the exit code."""

from __future__ import annotations

import atexit
import dataclasses
import gc
import json
import os
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from placeverify import __version__
from placeverify.console import (
    Progress,
    Terminated,
    console,
    error_console,
    output_width,
    print_errors,
    verdict_exit,
    worst,
)
from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source
from placeverify.files import WriteFailed, check_writable
from placeverify.ir.placement import TensorOverlap

# A command's process ends with the command. Freezing the heap at exit spares the interpreter's
# final garbage collections a walk over every object the loaded modules hold (about 30 ms of a
# 0.3 s check); what they would free, the operating system reclaims. Nothing else changes: atexit
# handlers still run and the standard streams are still flushed.
atexit.register(gc.freeze)

EXIT_CODES = """\b
Exit codes:
  0  every condition proved (or nothing to verify)
  1  a condition refuted (a counterexample was found); replay: not confirmed
  2  malformed or inconsistent input, or a usage error
  3  unknown: some condition neither proved nor refuted (never reported as proved);
     replay: unknown, or unconfirmed (run on a smaller mesh where Z3's verdict
     differs from the declared mesh's)
  4  a file is missing, unreadable or not a regular file
  5  replay/measure could not run (torch missing, a rank crashed or hung);
     check --plot: matplotlib missing (the plot extra)
  6  with --require-fit: a strategy does not fit (predicted total above device_memory)
  70 internal error (a bug in placeverify; please report it)
  129 stopped by SIGHUP, after stopping rank processes and removing temporary files
  130 stopped by SIGINT (Ctrl-C), the same way
  143 stopped by SIGTERM, the same way
"""

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


def import_options(command: Callable[..., None]) -> Callable[..., None]:
    """--model, --world and --format: how a framework configuration file is imported."""
    command = click.option("--format", "fmt", default=None,
                           type=click.Choice(["megatron", "deepspeed", "torchtitan", "accelerate"]),
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
    """--width N: the columns of the text output (README "CLI reference")."""
    return click.option(
        "--width", type=click.IntRange(20, 10_000), default=None,
        help="Columns the text output may use (default: COLUMNS, also off a terminal, else the "
             "terminal's, else 120); a table that does not fit is listed, never cut.")(command)


def set_option(command: Callable[..., None]) -> Callable[..., None]:
    """--set KEY=VALUE (repeatable): override a value of every strategy (README "Overrides")."""
    return click.option(
        "--set", "overrides", multiple=True, metavar="KEY=VALUE",
        help="Override a value of the strategy, e.g. mesh.dp=16, model.seq=8192, "
             "place.dp=zero3, precision=megatron, microbatches=8 (repeatable; README "
             "\"Overrides\").")(command)


def override_settings(texts: tuple[str, ...]) -> Any:
    """The checked overrides, or None without any (a malformed one is an error, exit 2)."""
    if not texts:
        return None
    from placeverify.api import overrides

    return overrides(texts)


def import_settings(model: str | None, world: int | None, fmt: str | None) -> Any:
    from placeverify.importers import Options

    return Options(model, world, fmt)


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, ensure_ascii=False))


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
    click.echo(render_sarif(found, code) if output == "sarif" else render_github(found, outcomes, code))


def guarded(run: Callable[[], ExitCode]) -> NoReturn:
    """Run a command body; turn every failure into a message and an exit code, never a traceback."""
    try:
        code = run()
    except PlaceError as error:
        print_errors(error)
        code = error.exit_code
    except WriteFailed as failed:  # a full disk, a folder at the path: exit 4, nothing left
        print_errors(failed.error())
        code = ExitCode.READ_ERROR
    except click.UsageError as error:
        error_console().print(f"Error: {error.format_message()}", markup=False)
        code = ExitCode.INPUT_ERROR
    except KeyboardInterrupt:
        error_console().print("placeverify: interrupted", markup=False)
        code = ExitCode.INTERRUPTED
    except Terminated as stop:
        error_console().print(f"placeverify: stopped by {signal.Signals(stop.signum).name}",
                              markup=False)
        code = stop.exit_code
    except BrokenPipeError:
        code = ExitCode.OK
    except Exception as error:  # a bug: say so plainly, keep the traceback for --debug
        if os.environ.get("PLACEVERIFY_DEBUG"):
            raise
        error_console().print(
            f"placeverify: internal error: {type(error).__name__}: {error}\n"
            "This is a bug in placeverify. Rerun with PLACEVERIFY_DEBUG=1 for the traceback.",
            markup=False)
        code = ExitCode.INTERNAL_ERROR
    sys.exit(int(code))


@click.group(epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="placeverify")
def main() -> None:
    """placeverify: check a distributed-training strategy before you launch it.

    A .place file says how parameters, optimizer state, gradients and activations are placed on
    each mesh axis and what one training step does. placeverify derives per-device memory and
    per-step communication, and proves with Z3 that the step matches single-device training
    (gradient integrity, state consistency, composition safety) or shows a counterexample.
    """


@main.command(epilog=EXIT_CODES)
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
@budget_option
@output_options
@import_options
@set_option
@width_option
@quiet_option
def check(files: tuple[str, ...], as_json: bool, formulas: bool, no_verify: bool,
          trace_path: str | None, replay: bool, plot_path: str | None, timeout: float,
          output: str, require_fit: bool, model: str | None, world: int | None, fmt: str | None,
          overrides: tuple[str, ...], width: int | None, quiet: bool) -> None:
    """Check strategies: costs, and proofs of the three correctness conditions."""

    def run() -> ExitCode:
        from placeverify.api import check as check_file
        from placeverify.report.outcome import Outcome, check_list_document, fits, report_document
        from placeverify.report.text import render_check

        fmt_out = output_of(as_json, output)
        settings = override_settings(overrides)
        paths = expand_paths(files)
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
                error_console().print("placeverify: --plot needs matplotlib, the plot extra: "
                                      "pip install 'placeverify[plot]'", markup=False)
                return ExitCode.BACKEND_ERROR
        codes: list[ExitCode] = []
        outcomes: list[Outcome] = []
        out = console(width)
        progress = Progress(quiet)
        for index, path in enumerate(paths):
            progress.item("check", index + 1, len(paths), path)
            try:
                result = check_file(path, verify_conditions=not no_verify, formulas=formulas,
                                    budget_s=timeout, imports=import_settings(model, world, fmt),
                                    settings=settings)
            except PlaceError as error:
                print_errors(error)
                codes.append(error.exit_code)
                outcomes.append(Outcome(path, error.exit_code, error=error))
                continue
            code = ExitCode.OK
            if result.verification is not None:
                code = verdict_exit(result.verification.overall())
            if require_fit and fits(result) is False:
                code = worst([code, ExitCode.DOES_NOT_FIT])
            if trace_path is not None and result.verification is not None:
                write_trace(result, trace_path)
            if plot_path is not None:
                code = worst([code, write_plots(result, plot_path)])
            replayed = None
            if replay and result.verification is not None:
                if fmt_out != "text":
                    from placeverify.replay.cli import replay_document

                    replay_code, replayed = replay_document(result)
                else:
                    replay_code = replay_check(result, as_json, out, progress)
                code = worst([code, replay_code])
            codes.append(code)
            outcomes.append(Outcome(path, code, result=result, replay=replayed))
            if fmt_out == "text":
                if index:
                    out.rule()
                render_check(result, out, formulas=formulas)
        progress.done()
        if fmt_out == "json":  # one file argument: its document; several or a folder: the list
            listing = len(files) > 1 or any(is_folder(Path(f)) for f in files)
            emit_json(check_list_document(outcomes, worst(codes)) if listing
                      else report_document(outcomes[0]))
        elif fmt_out != "text":
            emit_outcomes(fmt_out, outcomes, worst(codes), require_fit)
        return worst(codes)

    guarded(run)


def write_trace(result: Any, path: str) -> None:
    from placeverify.trace import write

    verification = result.verification
    if verification.trace is None:
        error_console().print(f"placeverify: no counterexample to write: {result.strategy.source.path}"
                              f" is {verification.overall().value}", markup=False)
        return
    write(verification.trace, path)
    error_console().print(f"trace written to {path}", markup=False)


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
            error_console().print(f"placeverify: {err}", markup=False)
            return ExitCode.BACKEND_ERROR
        except OSError as err:
            error_console().print(f"placeverify: cannot write plot {target}: "
                                  f"{err.strerror or err}", markup=False)
            return ExitCode.READ_ERROR
        error_console().print(f"plot written to {target}", markup=False)
    return ExitCode.OK


def replay_check(result: Any, as_json: bool, out: Console, progress: Progress) -> ExitCode:
    from placeverify.replay.cli import replay_result

    return replay_result(result, as_json=as_json, console=out, progress=progress)


@main.command(epilog=EXIT_CODES)
@click.argument("files", nargs=-1, required=True, type=PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--verify", "with_verdicts", is_flag=True, help="Also prove the three conditions.")
@click.option("--width", type=click.IntRange(20, 10_000), default=None,
              help="Columns the table may use (default: COLUMNS, else the terminal's, else 120); "
                   "a table wider than that is wrapped at column groups, transposed or listed, "
                   "never cut.")
@click.option("--units", type=click.Choice(["auto", "GB", "MB", "GiB", "MiB"]), default="auto",
              show_default=True,
              help="Unit of every byte figure: auto picks a decimal prefix per value (GB = 1e9 "
                   "bytes, as the report and the ZeRO paper); GiB/MiB are binary, as torch and "
                   "DeepSpeed print memory.")
@output_options
@budget_option
@import_options
@set_option
@quiet_option
def compare(files: tuple[str, ...], as_json: bool, with_verdicts: bool, width: int | None,
            units: str, output: str, require_fit: bool, timeout: float, model: str | None,
            world: int | None, fmt: str | None, overrides: tuple[str, ...], quiet: bool) -> None:
    """Compare strategies side by side (the paper's comparison table)."""

    def run() -> ExitCode:
        from placeverify.compare_cli import compare_files
        from placeverify.report.compare import render_compare

        fmt_out = output_of(as_json, output)
        settings = override_settings(overrides)
        paths = expand_paths(files)
        document, outcomes = compare_files(paths, with_verdicts, import_settings(model, world, fmt),
                                           require_fit=require_fit, budget_s=timeout,
                                           settings=settings, progress=Progress(quiet))
        codes = [o.exit_code for o in outcomes]
        if fmt_out == "json":
            emit_json(document)
        elif fmt_out == "text":
            render_compare(document, console(width), output_width(width), units)
        else:
            emit_outcomes(fmt_out, outcomes, worst(codes), require_fit)
        return worst(codes)

    guarded(run)


@main.command(epilog=EXIT_CODES)
@click.argument("paths", nargs=-1, required=True, type=PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(0.1, 3600),
              callback=lambda _ctx, _param, value: finite(value),
              help="Seconds for each rule file, shared by its solver queries (each at most 30 s); "
                   "what is undecided when it runs out is unknown (exit 3).")
@width_option
@quiet_option
def prove(paths: tuple[str, ...], as_json: bool, timeout: float, width: int | None,
          quiet: bool) -> None:
    """Prove the composition rules in .rule files (folders are searched)."""

    def run() -> ExitCode:
        from placeverify.prove.cli import prove_paths

        return prove_paths(paths, as_json=as_json, budget_s=timeout, console=console(width),
                           progress=Progress(quiet))

    guarded(run)


@main.command(epilog=EXIT_CODES)
@click.argument("trace", type=PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the replay result as JSON.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(1, 100),
              help="Training steps to run before comparing.")
@click.option("--world", type=click.IntRange(1, 64), default=None,
              help="Processes to run (default: the trace's mesh, resized above 8).")
@click.option("--timeout", default=120.0, show_default=True, type=click.FloatRange(1, 3600),
              callback=lambda _ctx, _param, value: finite(value),
              help="Seconds before a hung replay is stopped.")
@click.option("--emit", type=PATH, metavar="FILE", default=None,
              help="Write a standalone torchrun script (no placeverify import) instead of replaying.")
@width_option
@quiet_option
def replay(trace: str, as_json: bool, steps: int, world: int | None, timeout: float,
           emit: str | None, width: int | None, quiet: bool) -> None:
    """Replay a counterexample trace on real torch.distributed processes."""

    def run() -> ExitCode:
        if emit is not None:
            from placeverify.replay.emit import emit_trace

            return emit_trace(trace, emit, world=world, steps=steps, console=console(width))
        from placeverify.replay.cli import replay_trace

        return replay_trace(trace, as_json=as_json, steps=steps, world=world, timeout=timeout,
                            console=console(width), progress=Progress(quiet))

    guarded(run)


@main.command(epilog=EXIT_CODES)
@click.argument("file", type=PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the measurement as JSON.")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(1, 3600),
              callback=lambda _ctx, _param, value: finite(value),
              help="Seconds before a hung measurement is stopped (all ranks are killed).")
@width_option
@quiet_option
def measure(file: str, as_json: bool, timeout: float, width: int | None, quiet: bool) -> None:
    """Measure the real torch implementation of a strategy against the predictions."""

    def run() -> ExitCode:
        from placeverify.measure.cli import measure_file

        return measure_file(file, as_json=as_json, timeout=timeout, console=console(width),
                            progress=Progress(quiet))

    guarded(run)


@main.command(epilog=EXIT_CODES)
@click.argument("file", required=False, type=PATH)
@click.option("--device", default=None,
              help="Device profile (a100_80gb_sxm, h100_sxm, h200, mi300x, b200); default: the "
                   "FILE's mesh device.")
@click.option("--devices", type=click.IntRange(1, 10**7), default=None,
              help="Number of devices; default: the FILE's mesh.")
@click.option("--global-batch", type=click.IntRange(1, 10**9), default=None,
              help="Sequences per optimizer step; default: the FILE's (micro-batch x "
                   "micro-batches x data-parallel replicas).")
@click.option("--batch-tokens", type=click.IntRange(1, 10**13), default=None,
              help="Tokens per optimizer step (instead of --global-batch).")
@click.option("--seq", type=click.IntRange(1, 10**7), default=None, help="Sequence length.")
@click.option("--top", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Fastest layouts to show (each proved).")
@click.option("--max-tp", type=click.IntRange(1, 1024), default=None,
              help="Largest tensor-parallel degree (default: GPUs per node).")
@click.option("--no-offload", is_flag=True, help="Do not try optimizer offload.")
@click.option("--sharding", "shardings", multiple=True,
              type=click.Choice(["ddp", "zero1", "zero2", "zero3", "hsdp"]),
              help="Data-parallel sharding to try, repeatable (default: all); e.g. --sharding "
                   "zero1 for what Megatron-LM's distributed optimizer runs.")
@click.option("--tp-overlap", is_flag=True,
              help="The framework overlaps tensor-parallel collectives with the GEMMs "
                   "(Megatron-LM --tp-comm-overlap, torchtitan's async TP): every layout with "
                   "sequence parallelism is written megatron(sequence_parallel, overlap = true), "
                   "every other with tensor parallelism overlap = backward.")
@click.option("--tp-overlap-backward", is_flag=True,
              help="The framework runs the column-parallel layers' backward collectives beside "
                   "their GEMMs (Megatron-LM's and Transformer Engine's linear layers, by "
                   "default): every layout with tensor parallelism is written megatron(overlap "
                   "= backward).")
@click.option("--no-reduce-once", is_flag=True,
              help="In a pipeline, reduce ZeRO-2/3 and HSDP gradients every micro-batch instead "
                   "of once a step ('reduce = step', what torch.distributed.pipelining runs).")
@click.option("--no-data-overlap", is_flag=True,
              help="The framework waits for its data-parallel collectives (Megatron-LM without "
                   "--overlap-grad-reduce, DeepSpeed ZeRO-1/2 without overlap_comm): every "
                   "layout's data axes are written with 'overlap = none'.")
@click.option("--frontier-slack", type=click.FloatRange(1.0, 1000.0), default=1.5,
              show_default=True,
              help="Show the frontier's layouts up to this many times the fastest step time.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (placeverify.search/1).")
@click.option("-o", "--output-dir", "out_dir", type=PATH, metavar="DIRECTORY", default=None,
              help="Write every layout shown as a .place file into this folder.")
@click.option("--plot", type=PATH, metavar="FILE", default=None,
              help="Draw the frontier (peak memory vs step time) to a .png or .svg file "
                   "(needs the plot extra: pip install 'placeverify[plot]').")
@click.option("--width", type=click.IntRange(20, 10_000), default=None,
              help="Columns the tables may use (default: COLUMNS, else the terminal's, else 120).")
@budget_option
@import_options
@set_option
@quiet_option
def search(file: str | None, device: str | None, devices: int | None,
           global_batch: int | None, batch_tokens: int | None, seq: int | None, top: int,
           max_tp: int | None, no_offload: bool, shardings: tuple[str, ...],
           tp_overlap: bool, tp_overlap_backward: bool, no_reduce_once: bool,
           no_data_overlap: bool, frontier_slack: float, as_json: bool, out_dir: str | None,
           plot: str | None, width: int | None, timeout: float, model: str | None,
           world: int | None, fmt: str | None, overrides: tuple[str, ...], quiet: bool) -> None:
    """Search layouts: the fastest proved ones, and the frontier of peak memory vs step time.

    FILE (a .place file or a framework configuration, with --model config.json as for
    import) gives the model, precision, device and batch; flags replace them, or give them all
    without a FILE (--model naming a bundled model or a Hugging Face config.json, --device,
    --devices, --global-batch or --batch-tokens). FILE's tensor overlap (overlap = true or
    backward) and data-parallel waiting (overlap = none) carry into every layout, as
    --tp-overlap, --tp-overlap-backward and --no-data-overlap. Every layout shown fits at its
    predicted peak and is proved on all three conditions; exit 6 when none fits, 3 when none
    that fits is proved.
    """

    def run() -> ExitCode:
        from placeverify.search.cli import run_search
        from placeverify.search.space import Sharding, Space

        if global_batch is not None and batch_tokens is not None:
            raise click.UsageError("give --global-batch or --batch-tokens, not both")
        chosen = tuple(Sharding(s) for s in dict.fromkeys(shardings))
        level = (TensorOverlap.ALL if tp_overlap else
                 TensorOverlap.BACKWARD if tp_overlap_backward else TensorOverlap.NONE)
        space = Space(max_tp=max_tp, offload=not no_offload, tp_overlap=level,
                      reduce_once=not no_reduce_once, data_overlap=not no_data_overlap)
        if chosen:
            space = dataclasses.replace(space, shardings=chosen)
        model_name = model if file is None else None
        return run_search(file, model=model_name, device=device, devices=devices,
                          global_batch=global_batch, batch_tokens=batch_tokens, seq=seq, top=top,
                          space=space, slack=frontier_slack, out_dir=out_dir, plot=plot,
                          as_json=as_json,
                          budget_s=timeout, imports=import_settings(model, world, fmt),
                          settings=override_settings(overrides), console=console(),
                          width=output_width(width), progress=Progress(quiet))

    guarded(run)


@main.command("import", epilog=EXIT_CODES)
@click.argument("file", type=PATH)
@click.option("-o", "--output", "out", type=PATH, metavar="FILE", default=None,
              help="Write the .place file here (atomically) instead of printing it.")
@import_options
@set_option
def import_(file: str, out: str | None, model: str | None, world: int | None,
            fmt: str | None, overrides: tuple[str, ...]) -> None:
    """Import a Megatron-LM script, DeepSpeed JSON, torchtitan TOML or accelerate YAML as .place."""

    def run() -> ExitCode:
        from placeverify.importers.cli import import_command

        if out is not None:
            check_writable(out)
        return import_command(file, import_settings(model, world, fmt), out,
                              override_settings(overrides))

    guarded(run)


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


if __name__ == "__main__":
    main()
