"""Verification time per example, the same strategies at dp = 8 vs dp = 4096, and sharded
data parallelism under a pipeline at 8 to 512 micro-batches.

The Z3 encoding reasons about classes of ranks rather than ranks, so checking must not grow with
the mesh; a micro-batch loop whose micro-batches reach a steady state is summarised, so it must
not grow with the micro-batch count either. Run: python benchmarks/verify_scaling.py
[--clock cpu] [--skip-examples] (``--clock cpu`` times the process's CPU, which other jobs on a
loaded machine disturb far less than the wall clock).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)

from placeverify.api import resize, verify  # noqa: E402
from placeverify.lower import load, load_text  # noqa: E402

REPEATS = 5
CLOCK = time.perf_counter

# Sharded data parallelism under a 1F1B pipeline: the canonical step reduce-scatters in every
# micro-batch (issue 16's slow shapes: 79 s for FSDP at 128 micro-batches before the summary).
UNDER_PIPELINE = {
    "fsdp": ("dp = 2", "place fsdp over dp"),
    "zero2": ("dp = 2", "place zero2 over dp"),
    "hsdp": ("replica = 2\n    shard = 2", "place hsdp over replica * shard"),
}


def under_pipeline(preset: str, microbatches: int) -> str:
    axes, place = UNDER_PIPELINE[preset]
    return (f'strategy "{preset} under 1f1b"\nmodel llama3_8b {{ micro_batch = 1 }}\n'
            f"mesh {{\n    {axes}\n    pp = 4\n}}\n{place}\n"
            f"place pipeline(1f1b, microbatches = {microbatches}) over pp\nloss microbatch_mean\n")


def timed(strategy) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(REPEATS):
        started = CLOCK()
        verify(strategy)
        times.append(CLOCK() - started)
    return statistics.median(times)


def main() -> None:
    global CLOCK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time the wall clock (default) or the process's CPU")
    parser.add_argument("--skip-examples", action="store_true",
                        help="only the data-parallel and micro-batch scaling tables")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    found: list[figures.Figure] = []
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    verify(load(str(ROOT / "examples/zero-paper/zero3.place")))  # warm up z3
    if not args.skip_examples:
        print(f"verification time per example (median of 5, in process, {args.clock} clock)")
        rows = []
        for path in sorted((ROOT / "examples").rglob("*.place")):
            seconds = timed(load(str(path)))
            rows.append(seconds)
            print(f"  {seconds * 1000:8.1f} ms  {path.relative_to(ROOT)}")
        print(f"  median {statistics.median(rows) * 1000:.1f} ms, max {max(rows) * 1000:.1f} ms "
              f"over {len(rows)} files")
        found.append((f"verification alone, per example file ({len(rows)} files, in process, "
                      "median of 5 each)",
                      f"median {statistics.median(rows) * 1000:.1f} ms, max {max(rows) * 1000:.1f} ms"))
        print()
    print("the same strategy at growing data-parallel size (median of 5)")
    cases = ["examples/ok/ga-token-normalisation-fixed.place",
             "examples/bugs/ga-token-normalisation.place",
             "examples/strategies/llama3-8b-zero3.place",
             "examples/bugs/hsdp-shard-group-of-one.place"]
    for case in cases:
        strategy = load(str(ROOT / case))
        axis = "replica" if "hsdp" in case else "dp"
        cells, ms = [], []
        for size in (8, 64, 512, 4096):
            resized = resize(strategy, {axis: size})
            ms.append(timed(resized) * 1000)
            cells.append(f"{axis}={size}: {ms[-1]:7.1f} ms")
        print(f"  {case}\n    " + "   ".join(cells))
        found.append((f"`{case}` at {axis} = 8 / 64 / 512 / 4096",
                      " / ".join(f"{x:.1f}" for x in ms) + " ms"))
    print()
    print("sharded data parallelism under a 1F1B pipeline (pp = 4) at growing micro-batch count "
          "(median of 5)")
    for preset in UNDER_PIPELINE:
        cells, ms = [], []
        for m in (8, 32, 128, 512):
            strategy = load_text(under_pipeline(preset, m), f"{preset}-{m}.place")
            ms.append(timed(strategy) * 1000)
            cells.append(f"m={m}: {ms[-1]:7.1f} ms")
        print(f"  {preset:6}" + "   ".join(cells))
        found.append((f"`{preset}` under 1F1B (pp = 4, `llama3_8b`, `loss microbatch_mean`) at "
                      "8 / 32 / 128 / 512 micro-batches", " / ".join(f"{x:.1f}" for x in ms) + " ms"))
    if args.docs:
        figures.write_section("verify_scaling", "Verification time as the mesh and the micro-batches grow",
                              found, name=args.docs_name,
                              facts={**figures.machine(load=True), "clock": args.clock})


if __name__ == "__main__":
    main()
