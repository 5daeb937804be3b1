"""The "Step time" section of the human report (placeverify.cost.time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from placeverify.cost.time import StepTime


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def render_time(time: StepTime, console: Console) -> None:
    device = time.device or "no device"
    console.print(f"step time  ({device}, {time.matmul} matmuls"
                  + ("" if time.efficiency is None else f" at {time.efficiency:.0%} of peak")
                  + ")")
    if time.step_seconds is not None:
        tps = time.tokens_per_second or 0.0
        mfu = "" if time.mfu is None else f", MFU {time.mfu:.1%}"
        console.print(f"  step {_s(time.step_seconds)}, {tps:,.0f} tokens/s{mfu}")
        batches = "micro-batch" if time.microbatches == 1 else "micro-batches"
        console.print(f"  compute {_s(time.compute_seconds)} ({time.microbatches} {batches}), "
                      f"bubble {_s(time.bubble_seconds)}, optimizer {_s(time.optimizer_seconds)}")
    exposed = ", ".join(f"{axes} {_s(sec)}" for axes, sec in time.exposed if sec > 0)
    console.print(f"  exposed communication: {exposed or 'none'}")
    for note in time.notes:
        console.print(f"  note: {note}")
    console.print()
