"""``placeverify measure FILE``: run the strategy's real torch implementation and print predicted
against measured, side by side with the ratio (or ``--json``).

Exit codes: 0 when the measurement ran (whatever the ratios), 2 for a placement without a torch
implementation here (pointing at its line), 4 for an unreadable file, 5 when torch is missing or a
rank crashed or hung.
"""

from __future__ import annotations

import json
import math
import time

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from placeverify.backend.runtime import BackendFailure, run_workers
from placeverify.console import Progress, print_table, stderr_console, stop_cleanly_on_signals
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.lower import load
from placeverify.measure.compare import Comparison, Row, compare, comparison_document, model_text
from placeverify.measure.plan import plan


def measure_file(path: str, *, as_json: bool, timeout: float, console: Console,
                 progress: Progress | None = None) -> ExitCode:
    """Measure one ``.place`` file; print the comparison on ``console``; the exit code."""
    stop_cleanly_on_signals()
    err = stderr_console()
    try:
        strategy = load(path)
        measurement_plan = plan(strategy)
    except PlaceError as error:
        for diagnostic in error.diagnostics:
            err.print(diagnostic.render(error.source), markup=False, emoji=False)
        return error.exit_code
    started = time.perf_counter()
    try:
        with (progress or Progress()).task(f"measuring on {measurement_plan.spec.world} ranks: "
                                           f"{measurement_plan.spec.label()}") as say:
            results = run_workers(measurement_plan.spec, timeout=timeout, progress=say)
    except BackendFailure as error:
        err.print(f"placeverify: measure: {error}", markup=False, emoji=False)
        return ExitCode.BACKEND_ERROR
    comparison = compare(strategy, measurement_plan, results, time.perf_counter() - started)
    if as_json:
        console.out(json.dumps(comparison_document(comparison), indent=2, ensure_ascii=False),
                    highlight=False)
    else:
        render(comparison, console)
    return ExitCode.OK


def ratio_text(row: Row) -> str:
    if math.isinf(row.ratio):
        return "inf"
    return f"{row.ratio:.3f}"


def render(comparison: Comparison, console: Console) -> None:
    spec = comparison.plan.spec
    s = comparison.strategy
    console.print(Text(s.name, style="bold"), Text(f"  ({s.source.path})", style="dim"))
    console.print(f"implementation  {spec.label()}")
    mesh = {"pp": f"pp {spec.pp}"} if spec.pp > 1 else {}
    axes = mesh.get("pp") or " x ".join(f"{n} {v}" for n, v in (("dp", spec.dp), ("tp", spec.tp))
                                        if v > 1)
    console.print(f"ranks           {spec.world} processes (gloo, CPU, one thread each): {axes}")
    console.print(f"model           {model_text(spec)}")
    console.print(f"optimizer       torch.optim {spec.optimizer.value}, fp32")
    for note in comparison.notes:
        console.print(f"note            {note}")
    console.print()
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name, justify in (("", "left"), ("rank", "right"), ("predicted", "right"),
                          ("measured", "right"), ("ratio", "right"), ("calls", "right"),
                          ("placement model", "right"), ("", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    section = ""
    details: dict[str, str] = {}
    for row in comparison.rows:
        if row.section != section:
            if section:
                table.add_section()
            section = row.section
            table.add_row(Text(section, style="bold"))
        calls = ""
        if row.predicted_calls is not None:
            calls = f"{row.predicted_calls} / {row.measured_calls}"
        mark = Text("ok", style="green") if row.ok else Text("DIFFERS", style="bold red")
        tolerance = f" ±{row.tolerance:.0%}" if row.tolerance else ""
        table.add_row(f"  {row.quantity}", row.rank, f"{row.predicted:,}", f"{row.measured:,}",
                      ratio_text(row) + tolerance, calls,
                      "" if row.placement is None else f"{row.placement:,}", mark)
        if row.section == "communication":
            details.setdefault(row.quantity, "; ".join(filter(None, [row.what, row.wire])))
    print_table(console, table)
    for quantity, text in details.items():
        console.print(f"  {quantity}: {text}", style="dim")
    exact = [r for r in comparison.rows if r.tolerance == 0]
    close = [r for r in comparison.rows if r.tolerance]
    console.print(f"{sum(r.ok for r in exact)} of {len(exact)} exact rows at 1.000; "
                  f"{sum(r.ok for r in close)} of {len(close)} activation rows within tolerance; "
                  f"{comparison.seconds:.1f} s")
    console.print("bytes per rank per step; payload = the full tensor of each collective "
                  "(all-gather output, reduce-scatter input); calls = predicted / measured",
                  style="dim")
