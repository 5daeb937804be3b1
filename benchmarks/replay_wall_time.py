"""Wall time of ``placeverify replay`` at world sizes 2, 4 and 8, cold and warm.

*Cold* is what a user pays for one command: a fresh ``placeverify replay trace.json --world N
--json`` process (Python start, Z3 at the replayed mesh, the forkserver importing torch and
warming up, the counterexample run and its control run); the median of ``-n`` such processes.
*Warm* is a replay in a process that has replayed before (the test suite, an editor integration):
the forkserver is up and each rank is a fork of it; the script reports the median of ``-n``
replays (counterexample and control) and of the counterexample run alone. Goal (issue 5): world 4
under 20 s cold on a 2-core machine, far less warm.

    .venv/bin/python benchmarks/replay_wall_time.py
    .venv/bin/python benchmarks/replay_wall_time.py --trace-of examples/bugs/missing-allreduce.place -n 5
    .venv/bin/python benchmarks/replay_wall_time.py --json replay_times.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
GOAL_COLD_WORLD_4 = 20.0
DEFAULT_BUG = "examples/bugs/tp-dropout-seed.place"

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)


def write_trace(bug: str, folder: str) -> str:
    path = os.path.join(folder, "trace.json")
    subprocess.run([sys.executable, "-m", "placeverify", "check", bug, "--trace", path],
                   cwd=ROOT, capture_output=True, check=False)
    if not os.path.exists(path):
        raise SystemExit(f"{bug} produced no counterexample trace")
    return path


def cold(trace: str, world: int) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "placeverify", "replay", trace, "--world",
                           str(world), "--json"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    seconds = time.perf_counter() - started
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        doc = {"verdict": "error", "stderr": done.stderr[-500:]}
    return seconds, doc


def warm(trace: str, world: int, repeats: int) -> tuple[float, float, str]:
    from placeverify.backend.runtime import pool
    from placeverify.replay.cli import execute
    from placeverify.replay.plan import plan_from_trace
    from placeverify.trace import load

    plan = plan_from_trace(load(trace), world=world, steps=3)
    pool().run(plan.main, 300)  # the forkserver is up and warm from here on
    totals, mains = [], []
    verdict = ""
    for _ in range(repeats):
        report = execute(plan, timeout=300, source=trace)
        verdict = report.verdict
        totals.append(report.seconds)
        if report.main is not None:
            mains.append(report.main.outcome.seconds)
    return statistics.median(totals), statistics.median(mains) if mains else float("nan"), verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-of", default=DEFAULT_BUG, help="bug file whose trace is replayed")
    parser.add_argument("--worlds", default="2,4,8")
    parser.add_argument("-n", "--repeats", type=int, default=3,
                        help="cold processes and warm replays per world (the median is shown)")
    parser.add_argument("--json", dest="json_path", help="also write the figures here")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        trace = write_trace(args.trace_of, folder)
        print(f"replay of the trace of {args.trace_of} ({os.cpu_count()} CPUs), 3 steps")
        print(f"{'world':>5}  {'cold (s)':>9}  {'warm (s)':>9}  {'warm run (s)':>12}  verdict")
        for world in worlds:
            colds = [cold(trace, world) for _ in range(args.repeats)]
            cold_s, doc = statistics.median(c[0] for c in colds), colds[-1][1]
            warm_s, warm_run, verdict = warm(trace, world, args.repeats)
            rows.append({"world": world, "cold_seconds": round(cold_s, 3),
                         "warm_seconds": round(warm_s, 3), "warm_run_seconds": round(warm_run, 3),
                         "verdict": doc.get("verdict"), "warm_verdict": verdict,
                         "mesh": doc.get("mesh")})
            print(f"{world:>5}  {cold_s:>9.2f}  {warm_s:>9.2f}  {warm_run:>12.2f}  "
                  f"{doc.get('verdict')} (mesh {doc.get('mesh')})")
    print("cold: a fresh `placeverify replay --world N --json` (counterexample and control); "
          "warm: the same in a process that has replayed before; warm run: the counterexample "
          "run alone")
    found: list[figures.Figure] = [
        (f"replay at world {r['world']}: cold / warm / warm counterexample run alone",
         f"{r['cold_seconds']:.2f} / {r['warm_seconds']:.2f} / {r['warm_run_seconds']:.2f} s; "
         f"verdict {r['verdict']} (mesh {r['mesh']})") for r in rows]
    four = next((r for r in rows if r["world"] == 4), None)
    if four is not None:
        ok = float(four["cold_seconds"]) < GOAL_COLD_WORLD_4  # type: ignore[arg-type]
        print(f"goal: world 4 cold under {GOAL_COLD_WORLD_4:g} s: {'met' if ok else 'NOT met'}")
        found.append((f"goal: world 4 cold under {GOAL_COLD_WORLD_4:g} s", "met" if ok else "NOT met"))
    if args.docs:
        figures.write_section(
            "replay_wall_time", "`placeverify replay` at growing world size", found,
            name=args.docs_name, facts=figures.machine(torch=True, device="cpu (gloo)", load=True),
            notes=[f"The trace of `{args.trace_of}`, 3 steps, median of {args.repeats}. Cold: a fresh "
                   "`placeverify replay trace.json --world N --json` process (counterexample and "
                   "control run); warm: the same in a process that has replayed before (the "
                   "forkserver up); warm run: the counterexample run alone."])
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
