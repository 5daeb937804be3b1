"""Strategies side by side: the paper's comparison table, with ratios to the first strategy.

The traffic column is all the network traffic of a step (gradient and parameter collectives,
tensor-, pipeline-, context- and expert-parallel activations, scalars); the ZeRO paper's
gradient-and-parameter figure stays in the JSON as ``state_traffic_bytes`` with its own ratio.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from placeverify.cost import whole
from placeverify.report.data import overrides_document
from placeverify.report.text import VERDICT_STYLE
from placeverify.result import CheckResult
from placeverify.verdicts import Verdict

COMPARE_SCHEMA = "placeverify.compare/1"


def compare_row(path: str, result: CheckResult) -> dict[str, Any]:
    """One strategy's row of the comparison (``verdicts`` only when it was verified)."""
    s, costs = result.strategy, result.costs
    device = costs.device_bytes()
    idle = costs.idle()
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
        "idle_fraction": None if idle is None else float(Fraction(idle)),
        "fits": None if s.mesh.device_memory is None else
        whole(device["total"]) <= s.mesh.device_memory,
    }
    if result.verification is not None:
        row["verdicts"] = result.verification.verdicts()
    if s.overrides:
        row["overrides"] = overrides_document(s)
    return row


def compare_document(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison document: the rows, with ratios against the first (the baseline)."""
    if rows:
        base_memory = rows[0]["memory"]["total"]
        base_traffic = rows[0]["traffic_bytes"]
        base_state = rows[0]["state_traffic_bytes"]
        for row in rows:
            row["memory_ratio"] = _ratio(row["memory"]["total"], base_memory)
            row["traffic_ratio"] = _ratio(row["traffic_bytes"], base_traffic)
            row["state_traffic_ratio"] = _ratio(row["state_traffic_bytes"], base_state)
    return {"schema": COMPARE_SCHEMA, "baseline": rows[0]["file"] if rows else None,
            "strategies": rows}


def _ratio(value: int, base: int) -> float | None:
    return None if base == 0 else value / base


def render_compare(document: dict[str, Any], console: Console) -> None:
    rows = document["strategies"]
    if not rows:
        return
    console.print(Text("strategies compared (ratios against the first)", style="bold"))
    if document.get("overrides"):
        console.print(Text("overrides: " + ", ".join(document["overrides"]), style="bold"))
    table = Table(box=box.SIMPLE_HEAD)
    for column, justify in (("file", "left"), ("(Θ, Ω, G, A)", "left"), ("Θ", "right"),
                            ("Ω", "right"), ("G", "right"), ("A", "right"), ("total", "right"),
                            ("x", "right"), ("traffic", "right"), ("x", "right"),
                            ("fits", "left"), ("idle", "right")):
        table.add_column(column, justify=justify,  # type: ignore[arg-type]
                         no_wrap=column not in ("file", "(Θ, Ω, G, A)"))
    with_verdicts = any("verdicts" in r for r in rows)
    if with_verdicts:
        table.add_column("verdicts")
    for r in rows:
        m = r["memory"]
        placement = " ".join(f"{t}{a}" if len(r["placement"]) > 1 else t
                             for a, t in r["placement"].items())
        cells: list[Any] = [
            Path(r["file"]).stem, placement, short(m["params"]), short(m["optimizer"]),
            short(m["gradients"]), short(m["activations"] + m.get("outside_layers", 0)),
            short(m["total"]), _times(r["memory_ratio"]),
            short(r["traffic_bytes"]), _times(r["traffic_ratio"]),
            "-" if r["fits"] is None else "yes" if r["fits"] else Text("no", style="bold red"),
            "-" if r["idle_fraction"] is None else f"{r['idle_fraction']:.1%}"]
        if with_verdicts:
            verdicts = r.get("verdicts", {})
            worst = Verdict.PROVED
            for v in verdicts.values():
                if v == "refuted" or (v == "unknown" and worst is Verdict.PROVED):
                    worst = Verdict(v)
            cells.append(Text(worst.value, style=VERDICT_STYLE[worst]))
        table.add_row(*cells)
    console.print(table)
    console.print("  A: activations in and outside the layers; total: the fullest rank; traffic: "
                  "all network bytes per device per step; idle: the bubble's share", style="dim")
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
