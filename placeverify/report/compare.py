"""Strategies side by side: the paper's comparison table, with ratios to the first strategy.

The traffic column is all the network traffic of a step (gradient and parameter collectives,
tensor-, pipeline-, context- and expert-parallel activations, scalars); the ZeRO paper's
gradient-and-parameter figure stays in the JSON as ``state_traffic_bytes`` with its own ratio.
"""

from __future__ import annotations

import textwrap
from fractions import Fraction
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from placeverify.cost import whole
from placeverify.cost.time import step_time
from placeverify.report.data import overrides_document
from placeverify.report.layout import Cell, Column, fit, print_lines
from placeverify.report.styles import VERDICT_STYLE
from placeverify.report.units import AUTO, ratio, share, significant, size
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
        "fits": costs.fits(),
        "peak_bytes": None if costs.peak is None else whole(costs.peak.bytes),
    }
    row.update(_time_fields(result, row["traffic_bytes"]))
    if result.verification is not None:
        row["verdicts"] = result.verification.verdicts()
    if s.overrides:
        row["overrides"] = overrides_document(s)
    return row


def _time_fields(result: CheckResult, traffic: int) -> dict[str, Any]:
    """The step-time estimate's figures (None without one: no device, a bare parameter count),
    and the network bytes per device per token of the step (bytes per step / tokens per step:
    comparable across global batches; None for a bare parameter count, which has no tokens)."""
    t = result.time
    untimed = t or step_time(result.strategy, result.costs)  # no device: its tokens still count
    tokens = untimed.tokens if untimed is not None else 0
    return {"step_seconds": None if t is None else t.step_seconds,
            "tokens_per_second": None if t is None else t.tokens_per_second,
            "mfu": None if t is None else t.mfu,
            "traffic_bytes_per_token": traffic / tokens if tokens else None}


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


def render_compare(document: dict[str, Any], console: Console, width: int = 120,
                   units: str = AUTO) -> None:
    """The comparison as a table that fits ``width`` columns (:mod:`placeverify.report.layout`:
    wrapped at column groups, transposed or listed when it does not), bytes in ``units``
    (:mod:`placeverify.report.units`)."""
    rows = document["strategies"]
    if not rows:
        return
    unit_note = "" if units == AUTO else f"; bytes in {units}"
    _say(console, f"strategies compared (ratios against the first{unit_note})", width, "bold")
    overrides = document.get("overrides")
    if overrides:
        _say(console, "overrides: " + ", ".join(overrides), width, "bold")
    label = Column("file", tuple(Path(r["file"]).stem for r in rows), "left")
    _layout, lines = fit(label, compare_columns(rows, units), width)
    print_lines(console, lines)
    console.print()
    _say(console, "A: activations in and outside the layers; total: the fullest rank; traffic: "
         "all network bytes per device per step; per token: those bytes over the step's tokens; "
         "step, tokens/s, MFU: the step-time estimate (a file naming a device); idle: the "
         "bubble's share", width, "dim")
    for r in rows:
        _say(console, f"{Path(r['file']).stem}: {r['strategy']}", width, "dim")


def _say(console: Console, text: str, width: int, style: str) -> None:
    """Prose, wrapped at ``width`` (a table's cells never are)."""
    for line in textwrap.wrap(text, max(20, width) - 2, break_on_hyphens=False) or [""]:
        console.print(Text("  " + line if style == "dim" else line, style=style), soft_wrap=True)


def compare_columns(rows: list[dict[str, Any]], units: str = AUTO) -> list[Column]:
    """The comparison's columns after the file, in groups: placement; memory (Θ, Ω, G, A, the
    fullest rank's total and its ratio, and the peak when the rows give ``peak_bytes``); traffic
    and its ratio; fits, the pipeline's idle share and, with --verify, the worst verdict."""
    def col(header: str, cells: list[Any], group: str, align: str = "right",
            name: str = "") -> Column:
        return Column(header, tuple(cells), align, group, name)  # type: ignore[arg-type]

    def sized(value: Any) -> str:
        return size(value, units)

    mem = [r["memory"] for r in rows]
    columns = [
        col("(Θ, Ω, G, A)", [_placement(r) for r in rows], "placement", "left"),
        col("Θ", [sized(m["params"]) for m in mem], "memory"),
        col("Ω", [sized(m["optimizer"]) for m in mem], "memory"),
        col("G", [sized(m["gradients"]) for m in mem], "memory"),
        col("A", [sized(m["activations"] + m.get("outside_layers", 0)) for m in mem], "memory"),
        col("total", [sized(m["total"]) for m in mem], "memory"),
        col("x", [ratio(r.get("memory_ratio")) for r in rows], "memory", name="total x"),
    ]
    # The hook for a peak-memory figure: a row with "peak_bytes" (issue 13) gets this column.
    if any(r.get("peak_bytes") is not None for r in rows):
        columns.append(col("peak", ["-" if r.get("peak_bytes") is None else sized(r["peak_bytes"])
                                    for r in rows], "memory"))
    columns += [
        col("traffic", [sized(r["traffic_bytes"]) for r in rows], "traffic"),
        col("x", [ratio(r.get("traffic_ratio")) for r in rows], "traffic", name="traffic x"),
        col("per token", [_maybe(r.get("traffic_bytes_per_token"), sized) for r in rows],
            "traffic"),
    ]
    if any(r.get("step_seconds") is not None for r in rows):
        columns += [
            col("step", [_maybe(r.get("step_seconds"), lambda v: f"{significant(v)} s")
                         for r in rows], "time"),
            col("tokens/s", [_maybe(r.get("tokens_per_second"), significant) for r in rows],
                "time"),
            col("MFU", [_maybe(r.get("mfu"), lambda v: f"{100 * v:.1f}%") for r in rows], "time"),
        ]
    columns += [
        col("fits", ["-" if r["fits"] is None else "yes" if r["fits"]
                     else Text("no", style="bold red") for r in rows], "outcome", "left"),
        col("idle", [share(r["idle_fraction"]) for r in rows], "outcome"),
    ]
    if any("verdicts" in r for r in rows):
        columns.append(col("verdicts", [_worst(r) for r in rows], "outcome", "left"))
    return columns


def _maybe(value: Any, show: Any) -> str:
    return "-" if value is None else str(show(value))


def _placement(row: dict[str, Any]) -> str:
    placement = row["placement"]
    return " ".join(f"{t}{a}" if len(placement) > 1 else t for a, t in placement.items())


def _worst(row: dict[str, Any]) -> Cell:
    verdicts = row.get("verdicts")
    if verdicts is None:
        return "-"
    worst = Verdict.PROVED
    for v in verdicts.values():
        if v == "refuted" or (v == "unknown" and worst is Verdict.PROVED):
            worst = Verdict(v)
    return Text(worst.value, style=VERDICT_STYLE[worst])
