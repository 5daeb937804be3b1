"""The commands other than ``check``: compare, prove, replay, measure, search and import.

Each parses its arguments and calls the module that runs it, loaded only when it runs (z3,
sympy and torch stay out of start-up); :func:`placeverify.cli.exits.guarded` chooses the exit.
"""

from __future__ import annotations

import dataclasses

import click

from placeverify.cli.exits import epilog, guarded
from placeverify.cli.options import (
    PATH,
    budget_option,
    emit_json,
    emit_outcomes,
    expand_paths,
    finite,
    import_options,
    import_settings,
    output_of,
    output_options,
    override_settings,
    quiet_option,
    set_option,
    width_option,
)
from placeverify.console import Progress, console, output_width, worst
from placeverify.diagnostics import ExitCode
from placeverify.files import check_writable
from placeverify.ir.placement import TensorOverlap


@click.command(epilog=epilog("compare"))
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
            world: int | None, fmt: str | None, env: tuple[tuple[str, str], ...],
            script_args: tuple[str, ...] | None,
            config: str | None, overrides: tuple[str, ...], quiet: bool) -> None:
    """Compare strategies side by side (the paper's comparison table)."""

    def run() -> ExitCode:
        from placeverify.compare_cli import compare_files
        from placeverify.report.compare import render_compare

        fmt_out = output_of(as_json, output)
        settings = override_settings(overrides)
        paths = expand_paths(files)
        imports = import_settings(model, world, fmt, env, script_args, config)
        document, outcomes = compare_files(paths, with_verdicts, imports,
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


@click.command(epilog=epilog("prove"))
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


@click.command(epilog=epilog("replay"))
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

            check_writable(emit)

            return emit_trace(trace, emit, world=world, steps=steps, console=console(width))
        from placeverify.replay.cli import replay_trace

        return replay_trace(trace, as_json=as_json, steps=steps, world=world, timeout=timeout,
                            console=console(width), progress=Progress(quiet))

    guarded(run)


@click.command(epilog=epilog("measure"))
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


@click.command(epilog=epilog("search"))
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
           world: int | None, fmt: str | None, env: tuple[tuple[str, str], ...],
           script_args: tuple[str, ...] | None,
            config: str | None, overrides: tuple[str, ...], quiet: bool) -> None:
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
                          budget_s=timeout, imports=import_settings(model, world, fmt, env,
                                                                 script_args, config),
                          settings=override_settings(overrides), console=console(),
                          width=output_width(width), progress=Progress(quiet))

    guarded(run)


@click.command("import", epilog=epilog("import"))
@click.argument("file", type=PATH)
@click.option("-o", "--output", "out", type=PATH, metavar="FILE", default=None,
              help="Write the .place file here (atomically) instead of printing it.")
@import_options
@set_option
def import_(file: str, out: str | None, model: str | None, world: int | None,
            fmt: str | None, env: tuple[tuple[str, str], ...], script_args: tuple[str, ...] | None,
            config: str | None,
            overrides: tuple[str, ...]) -> None:
    """Import a Megatron-LM script, DeepSpeed JSON, torchtitan TOML or accelerate YAML as .place."""

    def run() -> ExitCode:
        from placeverify.importers.cli import import_command

        if out is not None:
            check_writable(out)
        return import_command(file, import_settings(model, world, fmt, env, script_args,
                                                     config), out,
                              override_settings(overrides))

    guarded(run)
