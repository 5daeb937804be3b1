"""How far past its time budget a verification runs, beside CPU hogs and a large caller heap.

``placeverify check --timeout S`` promises an answer (unknown where undecided) within S seconds.
This script verifies three slow files (the ones ``tests/test_budget.py`` uses) many times under a
2 s budget with 300 ms queries, beside a busy loop on twice as many processes as cores, in a
process that holds ``--heap`` small objects before it verifies (as a test worker or a notebook
does), and prints each file's median and worst wall time. ``--compare`` runs the same again with
the caller's heap left in garbage collection (:mod:`placeverify.verify.heap` off), the behaviour
before that module. Then it times ``placeverify check`` in a fresh process on DDP over 12 and 16
axes of size 2 under the default 30 s budget.

    .venv/bin/python benchmarks/budget.py
    .venv/bin/python benchmarks/budget.py --runs 10 --heap 3000000 --compare
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)

import placeverify.verify as verify_package  # noqa: E402
from placeverify import api  # noqa: E402
from tests.test_budget import DDP_MANY_AXES, FUZZ_0_93, FUZZ_1_142, cpu_hogs  # noqa: E402

BUDGET_S = 2.0
QUERY_MS = 300
FILES = (("fuzz-1-142", FUZZ_1_142), ("fuzz-0-93", FUZZ_0_93), ("ddp12", DDP_MANY_AXES))


def ddp_over(axes: int) -> str:
    return "\n".join([f'strategy "DDP over {axes} axes of size 2"', "model { params = 7.5e9 }",
                      "mesh {", *(f"    a{i} = 2" for i in range(axes)), "}",
                      *(f"place ddp over a{i}" for i in range(axes))]) + "\n"


def in_process(runs: int, frozen: bool) -> dict[str, list[float]]:
    strategies = [api.load_text(text, f"{name}.place") for name, text in FILES]
    took: dict[str, list[float]] = {name: [] for name, _ in FILES}
    original = verify_package.callers_heap_frozen
    if not frozen:
        verify_package.callers_heap_frozen = contextlib.nullcontext  # type: ignore[assignment]
    try:
        with cpu_hogs():
            for _ in range(runs):
                for (name, _), strategy in zip(FILES, strategies, strict=True):
                    started = time.monotonic()
                    api.verify(strategy, timeout_ms=QUERY_MS, budget_s=BUDGET_S)
                    took[name].append(time.monotonic() - started)
    finally:
        verify_package.callers_heap_frozen = original
    return took


def cli_seconds(axes: int) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as folder:
        place = Path(folder) / f"ddp{axes}.place"
        place.write_text(ddp_over(axes))
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "placeverify", "check", str(place)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              check=False, timeout=120)
        return done.returncode, time.monotonic() - started


def rows(took: dict[str, list[float]], label: str) -> list[figures.Figure]:
    return [(f"{name}.place, {label}: median / worst of {len(s)} (budget {BUDGET_S:g} s)",
             f"{statistics.median(s):.2f} s / {max(s):.2f} s") for name, s in took.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="verifications of each file (5)")
    parser.add_argument("--heap", type=int, default=2_000_000,
                        help="small objects the process holds before it verifies (2,000,000)")
    parser.add_argument("--compare", action="store_true",
                        help="also run with the caller's heap left in garbage collection")
    parser.add_argument("--no-cli", action="store_true", help="skip the fresh-process checks")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    heap = [[i] for i in range(args.heap)]  # what a caller holds; kept alive to the end
    found = rows(in_process(args.runs, True), f"heap of {len(heap):,} objects frozen")
    if args.compare:
        found += rows(in_process(args.runs, False), "the same heap collected")
    if not args.no_cli:
        for axes in (12, 16):
            code, seconds = cli_seconds(axes)
            found.append((f"`placeverify check` DDP over {axes} axes of size 2 (default 30 s "
                          f"budget), exit code", f"{seconds:.1f} s, exit {code}"))
    for what, figure in found:
        print(f"{what}: {figure}")
    if args.docs:
        figures.write_section("budget", "Time budgets under load", found, name=args.docs_name,
                              facts=figures.machine(load=True))


if __name__ == "__main__":
    main()
