"""A counterexample trace as a table a person can follow: the value after each statement."""

from __future__ import annotations

from fractions import Fraction

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from placeverify.console import print_table
from placeverify.trace import Trace

MAX_DEVICES = 4


def _num(text: str | None) -> str:
    if text is None:
        return "-"
    try:
        value = Fraction(text)
    except ValueError:
        return text  # an exact sum of square roots, written as the trace holds it
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def _coords(coords: dict[str, int]) -> str:
    return ", ".join(f"{a} {c}" for a, c in coords.items()) or "device 0"


def render_trace(trace: Trace, console: Console) -> None:
    condition = trace.condition.value.replace("_", " ")
    group = f", {trace.group.value} parameters" if trace.group is not None else ""
    console.print(Text(f"counterexample ({condition}{group})", style="bold"))
    mesh = ", ".join(f"{a} = {n}" for a, n in trace.mesh.items())
    console.print(f"  mesh: {mesh}; microbatches = {trace.microbatches}")
    if trace.tokens:
        parts = []
        for t in trace.tokens:
            where = _coords(t.coords) + ", " if t.coords else ""
            parts.append(f"{where}micro-batch {t.microbatch}: {t.count} token"
                         f"{'s' if t.count != 1 else ''}")
        console.print("  tokens: " + "; ".join(parts[:8]) + ("; ..." if len(parts) > 8 else ""))
    if trace.gradients:
        parts = [f"{_num(g.sum)}" for g in trace.gradients[:8]]
        console.print("  gradient sum of each micro-batch's tokens (distinct, so any wrong weight "
                      "shows): " + ", ".join(parts) + (", ..." if len(trace.gradients) > 8 else ""))
    devices = trace.devices
    if devices:
        shown = devices[:MAX_DEVICES]
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("line", justify="right")
        table.add_column("statement")
        table.add_column("mb", justify="right")
        for d in shown:
            table.add_column(_coords(d.coords), justify="right")
        for i, step in enumerate(shown[0].steps):
            cells = []
            for d in shown:
                s = d.steps[i]
                cells.append(_num(s.shard) + " (shard)" if s.shard is not None
                             else _num(s.grads))
            mb = "" if step.microbatch is None else str(step.microbatch)
            table.add_row(str(step.line or ""), step.op, mb, *cells)
        table.add_row("", Text("optimizer consumes", style="bold"), "",
                      *[Text(_num(d.consumed), style="bold red"
                             if d.consumed != trace.reference else "bold") for d in shown])
        table.add_row("", "single-device gradient", "", *[_num(trace.reference) for _ in shown])
        print_table(console, table)
        if len(devices) > MAX_DEVICES:
            console.print(f"  ({len(devices) - MAX_DEVICES} more devices in the JSON trace)",
                          style="dim")
    elif trace.values.get("devices"):
        rows = trace.values["devices"]
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("device")
        keys = [k for k in rows[0] if k not in ("coords", "note")]
        for key in keys:
            table.add_column(key, justify="right")
        table.add_column("")
        for row in rows:
            table.add_row(_coords(row["coords"]), *[str(row.get(k, "")) for k in keys],
                          row.get("note", ""))
        print_table(console, table)
    elif trace.values:
        for key, value in trace.values.items():
            console.print(f"  {key.replace('_', ' ')}: {value}")
    where = f"{trace.file}:{trace.line}" if trace.line else str(trace.file)
    console.print(f"  fails at {where}: {trace.claim}")
    if trace.fix:
        console.print(Text(f"  fix: {trace.fix}", style="cyan"))
