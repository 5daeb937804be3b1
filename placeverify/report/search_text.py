"""``placeverify search``'s report: the text a person reads and the JSON document
(``placeverify.search/1``, schema ``placeverify/schemas/search.schema.json``)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from rich.console import Console

from placeverify.report.layout import Column, fit, print_lines
from placeverify.report.units import significant, size

if TYPE_CHECKING:
    from placeverify.search.run import Evaluated, SearchResult

SCHEMA = "placeverify.search/1"


def _layout_json(e: Evaluated, verdict: str | None, written: dict[str, str]) -> dict[str, Any]:
    lay = e.layout
    return {
        "label": e.label,
        "layout": {
            "tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "chunks": lay.v, "ep": lay.ep, "dp": lay.dp,
            "sharding": lay.sharding.value, "shard": lay.shard, "sequence_parallel": lay.sp,
            "recompute": lay.recompute.value, "offload": lay.offload, "micro_batch": lay.b,
            "microbatches": lay.m, "reduce": "step" if lay.reduce_step else "microbatch",
            "tp_overlap": lay.tp_overlap.json, "data_overlap": not lay.dp_wait,
            "stage_layers": list(lay.stages) if lay.stages is not None else None},
        "peak_bytes": e.peak_bytes, "needed_bytes": e.needed_bytes,
        "step_seconds": e.step_seconds, "tokens_per_second": e.tokens_per_second, "mfu": e.mfu,
        "verdict": verdict, "file": written.get(e.label)}


def search_document(result: SearchResult, exit_code: int,
                    written: dict[str, str] | None = None) -> dict[str, Any]:
    p = result.problem
    files = written or {}
    return {
        "schema": SCHEMA,
        "problem": {
            "model": p.title, "device": p.device.key, "devices": p.devices,
            "global_batch": p.global_batch, "seq": p.arch.seq, "tokens_per_step": p.tokens,
            "device_memory": p.device_memory, "reserve": p.reserve,
            "pcie_bandwidth": float(p.pcie_bandwidth), "pcie_assumed": p.pcie_assumed},
        "counts": {
            "candidates": result.candidates, "screened_fitting": result.screened_fitting,
            "finalists": result.finalists, "fitting": len(result.evaluated),
            "not_fitting": result.not_fitting, "verified": len(result.verdicts),
            "rejected": len(result.rejected)},
        "seconds": result.seconds,
        "candidates_per_second": result.rate,
        "screen_deviation": {"peak": result.screen_deviation[0],
                             "step_time": result.screen_deviation[1]},
        "top": [_layout_json(e, result.verdicts.get(e.label), files) for e in result.top],
        "frontier": [_layout_json(e, result.verdicts.get(e.label), files)
                     for e in result.frontier],
        "dropped": [{"label": k, "verdict": v} for k, v in result.dropped],
        "rejected": [{"label": k, "error": v} for k, v in result.rejected],
        "exit_code": exit_code,
    }


# What a layout's label says (placeverify.search.space.Layout.label), printed under the tables.
LEGEND = ("layout: tN tensor-parallel degree; cpN context-parallel; pN pipeline stages (vN "
          "model chunks each); epN expert-parallel; dN data-parallel ranks, then how they shard the "
          "model states: ddp, zero1, zero2, zero3 (FSDP full shard) or hsdpN (shards of N); /step: "
          "sharded gradients reduced once a step, not every micro-batch; /no-overlap: data-parallel "
          "collectives waited for; sp sequence parallelism (+overlap: its collectives beside the "
          "GEMMs); rc- recomputation none, selective or full; offload: optimizer states and "
          "gradients on the host; bN micro-batch size in sequences; mN micro-batches per step. "
          "step: the estimated step time; MFU: model FLOPs utilization; peak+reserve: the fullest "
          "rank's peak plus the reserve, compared with the device memory for fits")


def _row(e: Evaluated) -> list[str]:
    return [e.label, f"{significant(e.step_seconds)} s", significant(e.tokens_per_second),
            "-" if e.mfu is None else f"{100 * e.mfu:.1f}%", size(e.needed_bytes)]


def _table(console: Console, title: str, rows: list[list[str]], width: int) -> None:
    """The rows as a table that fits ``width`` (wrapped, transposed or listed when it does not;
    never a cut cell: :mod:`placeverify.report.layout`)."""
    console.print(title, markup=False, highlight=False)
    label = Column("layout", tuple(r[0] for r in rows), "left")
    columns = [Column(head, tuple(r[i] for r in rows), group=head)
               for i, head in enumerate(("step", "tokens/s", "MFU", "peak+reserve"), 1)]
    print_lines(console, fit(label, columns, width)[1])


def render_search(result: SearchResult, console: Console, width: int,
                  written: dict[str, str] | None = None) -> None:
    p = result.problem
    s = result.seconds
    console.print(
        f"search: {p.title} on {p.devices:,} x {p.device.key}, global batch "
        f"{p.global_batch:,} x {p.arch.seq:,} tokens, device memory {size(p.device_memory)}"
        + (f", reserve {size(p.reserve)}" if p.reserve else ""), markup=False, highlight=False)
    console.print(
        f"  {result.candidates:,} legal layouts screened in {s.get('screen', 0):.2f} s "
        f"({result.rate:,.0f} per second), {result.screened_fitting:,} fit the screen; "
        f"{result.finalists} finalists under the full model in {s.get('evaluate', 0):.2f} s "
        f"({len(result.evaluated)} fit); {len(result.verdicts)} verified in "
        f"{s.get('verify', 0):.2f} s; total {s.get('total', 0):.2f} s",
        markup=False, highlight=False)
    if p.pcie_assumed:
        console.print(f"  offload assumes {size(p.pcie_bandwidth)}/s host links (no "
                      "pcie_bandwidth given)", markup=False, highlight=False)
    console.print()
    if not result.top:
        console.print("no layout fits and is proved", markup=False, highlight=False)
    else:
        _table(console, "fastest layouts (each proved on all three conditions, and fits)",
               [_row(e) for e in result.top], width)
        console.print()
        _table(console, "Pareto frontier: peak memory vs step time (proved, fits)",
               [_row(e) for e in result.frontier], width)
        console.print()
        for line in textwrap.wrap(LEGEND, max(20, width) - 2, break_on_hyphens=False):
            console.print("  " + line, markup=False, highlight=False)
    for label, verdict in result.dropped:
        console.print(f"not shown: {label}: {verdict}", markup=False, highlight=False)
    if result.rejected:
        label, error = result.rejected[0]
        console.print(f"{len(result.rejected)} layouts rejected by the language when written "
                      f"out; first: {label}: {error}", markup=False, highlight=False)
    for label, path in (written or {}).items():
        console.print(f"wrote {path}  ({label})", markup=False, highlight=False)
