"""``placeverify search``: read the problem, run the search, print or write what it found.

Exit codes: 0 when at least one layout fits and is proved (every layout shown is both); 6 when
no layout fits the device at its predicted peak; 3 when layouts fit but none could be proved
(each was refuted or left unknown; they are named, never shown as results); 2 for bad input,
and for a problem with no legal layout (:func:`refuse_empty_space` names the divisibility that failed).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from placeverify.console import echo, write_atomically
from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source
from placeverify.ir.devices import devices as bundled_devices
from placeverify.ir.model import ARCHITECTURES
from placeverify.ir.placement import Overlap, Role, TensorOverlap
from placeverify.ir.strategy import Strategy
from placeverify.search.problem import Problem, problem_from
from placeverify.search.run import SearchResult, search
from placeverify.search.space import Space, why_no_layout


def base_strategy(file: str | None, model: str | None, devices: int | None,
                  device: str | None, imports: Any, settings: Any,
                  seq: int | None = None) -> Strategy:
    """The strategy the problem is read from: the file (a .place or a framework
    configuration), or one written from the flags (``--model`` a bundled name or a Hugging
    Face config.json)."""
    from placeverify.api import load, load_text
    from placeverify.importers import is_importable

    if file is not None:
        if is_importable(file):
            from placeverify.importers.cli import load_strategy

            return load_strategy(file, imports, with_seq(settings, seq))
        return load(file, settings)
    if model is None or devices is None or device is None:
        raise click.UsageError("without a FILE, search needs --model, --device and --devices")
    statement = f"model {model}"
    if model not in ARCHITECTURES:
        if not model.endswith(".json"):
            raise click.UsageError(f"unknown model '{model}' (bundled: "
                                   f"{', '.join(ARCHITECTURES)}); give a Hugging Face "
                                   "config.json, or a .place or configuration FILE")
        from placeverify.importers.cli import print_diagnostics
        from placeverify.importers.hf_config import model_statement

        statement, warnings = model_statement(model, seq)
        print_diagnostics(warnings)
    text = (f'strategy "search"\n{statement}\nprecision megatron\n'
            f"mesh {{\n    dp = {devices}\n    device = {device}\n}}\nplace ddp over dp\n")
    return load_text(text, "<search flags>", settings)


def with_seq(settings: Any, seq: int | None) -> Any:
    """The overrides with ``--seq`` as ``model.seq`` (a configuration that does not give the
    sequence length is refused without one, never given the model's longest:
    placeverify.importers.hf_config), unless a ``--set model.seq`` is there already."""
    if seq is None or (settings and any(s.key == "model.seq" for s in settings.items)):
        return settings
    from placeverify.api import overrides

    return overrides([*(s.text for s in settings.items), f"model.seq={seq}"] if settings
                     else [f"model.seq={seq}"])


def run_search(file: str | None, *, model: str | None, device: str | None,
               devices: int | None, global_batch: int | None, batch_tokens: int | None,
               seq: int | None, top: int, space: Space, slack: float, out_dir: str | None,
               plot: str | None, as_json: bool, budget_s: float, imports: Any, settings: Any,
               console: Console, width: int, progress: Any) -> ExitCode:
    from placeverify.api import parse
    from placeverify.report.search_text import render_search, search_document

    profile = None
    if device is not None:
        profile = bundled_devices().get(device)
        if profile is None:
            raise click.UsageError(f"unknown device '{device}' (bundled: "
                                   f"{', '.join(bundled_devices())})")
    strategy = base_strategy(file, model, devices, device, imports, settings, seq)
    if file is not None:
        space = framework_space(strategy, space)
    problem = problem_from(strategy, parse(strategy.source), devices=devices, device=profile,
                           global_batch=global_batch, batch_tokens=batch_tokens, seq=seq)
    if file is None and model is not None and model not in ARCHITECTURES:
        # a Hugging Face config.json: its file names the model (its statement says "transformer")
        problem = dataclasses.replace(problem, title=Path(model).name)
    refuse_empty_space(problem, space, file)
    if plot is not None:
        _check_plot_target(plot)
    with progress.task(f"search: {problem.title} on {problem.devices} devices") as say:
        result = search(problem, space, top=top, budget_s=budget_s, slack=slack, report=say)
    code = exit_code(result)
    written = write_layouts(result, out_dir) if out_dir is not None else {}
    if plot is not None and result.frontier:
        _plot(result, plot)
    if as_json:
        echo(json.dumps(search_document(result, int(code), written), indent=2,
                        ensure_ascii=False))
    else:
        render_search(result, console, width, written)
        if plot is not None and result.frontier:
            console.print(f"frontier plot written to {plot}", markup=False, highlight=False)
    return code


def refuse_empty_space(problem: Problem, space: Space, file: str | None) -> None:
    """Exit 2 when no layout of the problem is legal, saying which divisibility failed (the
    search would screen nothing and answer "no layout fits")."""
    reasons = why_no_layout(problem.arch, problem.devices, problem.global_batch,
                            problem.device.gpus_per_node, space)
    if reasons:
        message = (f"no legal layout of {problem.devices:,} devices for a global batch of "
                   f"{problem.global_batch:,} sequences of {problem.arch.seq:,} tokens")
        raise PlaceError([Diagnostic(Severity.ERROR, message, Code.NOT_DIVISIBLE,
                                     notes=tuple(reasons))],
                         Source(file or "placeverify search", ""), ExitCode.INPUT_ERROR)


def framework_space(strategy: Strategy, space: Space) -> Space:
    """The framework settings a FILE carries into the layouts searched: tensor-parallel
    collectives overlapped with the GEMMs (a tensor axis placed ``overlap = true``, as
    ``--tp-overlap``, or ``overlap = backward``, as ``--tp-overlap-backward``) and data-parallel
    collectives waited for (a data axis placed ``overlap = none``, as ``--no-data-overlap``), so
    that searching an imported Megatron-LM or DeepSpeed configuration keeps what its framework
    does."""
    placements = strategy.placements
    order = list(TensorOverlap)  # none, backward, all: the file's or the flag's, whichever more
    tensor = max((p.overlap for p in placements if p.role is Role.TENSOR), key=order.index,
                 default=TensorOverlap.NONE)
    waits = any(p.role is Role.DATA and p.data_overlap is Overlap.NONE for p in placements)
    return dataclasses.replace(space, tp_overlap=max(space.tp_overlap, tensor, key=order.index),
                               data_overlap=space.data_overlap and not waits)


def exit_code(result: SearchResult) -> ExitCode:
    if result.top:
        return ExitCode.OK
    if not result.evaluated:
        return ExitCode.DOES_NOT_FIT
    return ExitCode.UNKNOWN


def write_layouts(result: SearchResult, out_dir: str) -> dict[str, str]:
    """Write every layout shown (the top and the frontier) as ``.place`` files in ``out_dir``
    (created if needed), each atomically; returns label -> path."""
    folder = Path(out_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlaceError([Diagnostic(Severity.ERROR, f"cannot create {out_dir}: {err.strerror}",
                                     Code.READ)], Source(out_dir, ""), ExitCode.READ_ERROR) from None
    written: dict[str, str] = {}
    shown = [*result.top, *(e for e in result.frontier if e not in result.top)]
    for rank, e in enumerate(shown, 1):
        kind = "top" if e in result.top else "frontier"
        name = f"{rank:02d}-{kind}-" + e.label.replace(" ", "_") + ".place"
        path = folder / name
        write_atomically(e.text, path)
        written[e.label] = str(path)
    return written


def _check_plot_target(plot: str) -> None:
    if Path(plot).suffix.lower() not in (".png", ".svg"):
        raise click.UsageError(f"--plot writes .png or .svg files, not '{Path(plot).suffix or plot}'")
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise PlaceError([Diagnostic(Severity.ERROR, "--plot needs matplotlib: pip install "
                                     "'placeverify[plot]'", Code.READ)], Source(plot, ""),
                         ExitCode.BACKEND_ERROR)


def _plot(result: SearchResult, path: str) -> None:
    from placeverify.report.plot import FrontierPoint, frontier_chart

    shown = {id(e) for e in result.frontier}
    points = [FrontierPoint(e.label, e.needed_bytes, e.step_seconds, id(e) in shown)
              for e in [*result.evaluated]]
    best = result.top[0] if result.top else None
    chosen = next((q for q in points if best is not None and q.label == best.label), None)
    frontier_chart(points, chosen, path, result.problem.device_memory, result.problem.reserve)
