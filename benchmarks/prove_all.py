"""Time to prove every rule in proofs/ (goal: under 10 s on a 2-core machine).

Prints the whole-process wall time of `placeverify prove proofs/` (median of 3) and the time of
each rule. Run: python benchmarks/prove_all.py
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
RUNS = 3

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    walls = []
    doc = None
    for _ in range(RUNS):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "placeverify", "prove", "--json", "proofs/"],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)
        walls.append(time.perf_counter() - started)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            raise SystemExit(f"placeverify prove exited {done.returncode}")
        doc = json.loads(done.stdout)
    assert doc is not None
    for rule in doc["rules"]:
        print(f"  {rule['seconds']:6.2f} s  {rule['verdict']:<8} {Path(rule['file']).name}")
    print(f"{len(doc['rules'])} rules; solver time {doc['seconds']:.2f} s; whole process "
          f"{statistics.median(walls):.2f} s (median of {RUNS})")
    if args.docs:
        verdicts = collections.Counter(rule["verdict"] for rule in doc["rules"])
        slowest = max(doc["rules"], key=lambda rule: rule["seconds"])
        figures.write_section("prove_all", "`placeverify prove proofs/`", [
            (f"`placeverify prove proofs/`, {len(doc['rules'])} rules",
             f"whole process {statistics.median(walls):.2f} s (median of {RUNS}); solver time "
             f"{doc['seconds']:.2f} s"),
            ("verdicts", ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items()))),
            ("slowest rule", f"`{Path(slowest['file']).name}`, {slowest['seconds']:.2f} s")],
            name=args.docs_name, facts=figures.machine(load=True))


if __name__ == "__main__":
    main()
