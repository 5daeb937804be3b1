"""Whole-process ``placeverify check`` latency of two source trees, measured back to back.

Each example file of the first tree is checked by ``python -m placeverify check FILE`` under each
tree in turn (``PYTHONPATH`` selects the tree; both use this virtualenv's interpreter), the runs
interleaved so that machine load affects both alike; the script prints the median and p90 over
files of each file's median wall time, and the same of its CPU time (user + system of the
process, from ``getrusage``), which other jobs on a loaded machine disturb far less than the wall
time. Byte-compile both trees first for a fair start-up.

    git worktree add /tmp/before <rev> && .venv/bin/python -m compileall -q /tmp/before/placeverify
    .venv/bin/python -m compileall -q placeverify
    .venv/bin/python benchmarks/latency_ab.py /tmp/before . -n 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # benchmarks/figures.py: the Measured figures page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the source tree measured first")
    parser.add_argument("after", type=Path, help="the source tree measured second")
    parser.add_argument("-n", type=int, default=3, help="runs per file and tree (default 3)")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    files = sorted(p.relative_to(trees["before"]).as_posix()
                   for p in (trees["before"] / "examples").rglob("*.place"))
    seconds: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    cpu: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for file in files:
        for _ in range(args.n):
            for name, root in trees.items():
                env = dict(os.environ, PYTHONPATH=str(root))
                used = _children_cpu()
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "placeverify", "check", file], cwd=root,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               check=False)
                seconds[name].setdefault(file, []).append(time.perf_counter() - started)
                cpu[name].setdefault(file, []).append(_children_cpu() - used)
    found: list[figures.Figure] = []
    for what, table in (("wall", seconds), ("cpu", cpu)):
        for name, per_file in table.items():
            medians = sorted(statistics.median(v) for v in per_file.values())
            p90 = medians[min(len(medians) - 1, int(0.9 * len(medians)))]
            print(f"{what:<4} {name:<7} {trees[name]}: {len(medians)} files, "
                  f"median {statistics.median(medians):.3f} s, p90 {p90:.3f} s")
            found.append((f"{what} time, {name} (`{args.before if name == 'before' else args.after}`)",
                          f"{len(medians)} files, median {statistics.median(medians):.3f} s, "
                          f"p90 {p90:.3f} s"))
    if args.docs:
        figures.write_section("latency_ab", "`placeverify check` latency of two source trees", found,
                              name=args.docs_name, facts=figures.machine(load=True))


def _children_cpu() -> float:
    """User + system seconds of every finished child process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
