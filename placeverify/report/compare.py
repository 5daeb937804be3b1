"""Strategies side by side: the paper's comparison table, with ratios to the first strategy."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from placeverify.console import print_errors, verdict_exit
from placeverify.cost import whole
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.report.text import VERDICT_STYLE
from placeverify.verdicts import Verdict

COMPARE_SCHEMA = "placeverify.compare/1"


def compare_document(paths: list[str], with_verdicts: bool,
                     imports: Any = None) -> tuple[dict[str, Any], list[ExitCode]]:
    from placeverify.api import check

    rows: list[dict[str, Any]] = []
    codes: list[ExitCode] = []
    for path in paths:
        try:
            result = check(path, verify_conditions=with_verdicts, imports=imports)
        except PlaceError as error:
            print_errors(error)
            codes.append(error.exit_code)
            continue
        s, costs = result.strategy, result.costs
        device = costs.device_bytes()
        row: dict[str, Any] = {
            "file": path,
            "strategy": s.name,
            "placement": {p.axis: p.tuple_text() for p in s.placements},
            "presets": {p.axis: p.preset for p in s.placements},
            "mesh": {a.name: a.size for a in s.mesh.axes},
            "memory": {k: whole(v) for k, v in device.items()},
            "host_bytes": whole(costs.host_bytes()),
            "state_traffic_bytes": whole(costs.state_bytes()),
            "traffic_bytes": whole(costs.network_bytes()),
            "bubble_fraction": None if costs.bubble is None else float(Fraction(costs.bubble)),
            "fits": None if s.mesh.device_memory is None else
            whole(device["total"]) <= s.mesh.device_memory,
        }
        if result.verification is not None:
            row["verdicts"] = result.verification.verdicts()
            codes.append(verdict_exit(result.verification.overall()))
        else:
            codes.append(ExitCode.OK)
        rows.append(row)
    if rows:
        base_memory = rows[0]["memory"]["total"]
        base_traffic = rows[0]["state_traffic_bytes"]
        for row in rows:
            row["memory_ratio"] = _ratio(row["memory"]["total"], base_memory)
            row["traffic_ratio"] = _ratio(row["state_traffic_bytes"], base_traffic)
    return {"schema": COMPARE_SCHEMA, "baseline": rows[0]["file"] if rows else None,
            "strategies": rows}, codes


def _ratio(value: int, base: int) -> float | None:
    return None if base == 0 else value / base


def render_compare(document: dict[str, Any], console: Console) -> None:
    rows = document["strategies"]
    if not rows:
        return
    console.print(Text("strategies compared (ratios against the first)", style="bold"))
    table = Table(box=box.SIMPLE_HEAD)
    for column, justify in (("file", "left"), ("(Θ, Ω, G, A)", "left"), ("Θ", "right"),
                            ("Ω", "right"), ("G", "right"), ("A", "right"), ("total", "right"),
                            ("x", "right"), ("G+Θ traffic", "right"), ("x", "right")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    with_verdicts = any("verdicts" in r for r in rows)
    if with_verdicts:
        table.add_column("verdicts")
    for r in rows:
        m = r["memory"]
        placement = " ".join(f"{t}{a}" if len(r["placement"]) > 1 else t
                             for a, t in r["placement"].items())
        cells: list[Any] = [
            Path(r["file"]).stem, placement, short(m["params"]), short(m["optimizer"]),
            short(m["gradients"]), short(m["activations"]),
            short(m["total"]), _times(r["memory_ratio"]),
            short(r["state_traffic_bytes"]), _times(r["traffic_ratio"])]
        if with_verdicts:
            verdicts = r.get("verdicts", {})
            worst = Verdict.PROVED
            for v in verdicts.values():
                if v == "refuted" or (v == "unknown" and worst is Verdict.PROVED):
                    worst = Verdict(v)
            cells.append(Text(worst.value, style=VERDICT_STYLE[worst]))
        table.add_row(*cells)
    console.print(table)
    for r in rows:
        console.print(f"  {Path(r['file']).stem}: {r['strategy']}", style="dim")


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3g}x"


def short(value: Any) -> str:
    """Bytes with four significant digits (the compact table)."""
    n = float(Fraction(value))
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} B"
