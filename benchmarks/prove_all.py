"""Time to prove every rule in proofs/ (goal: under 10 s on a 2-core machine).

Prints the whole-process wall time of `placeverify prove proofs/` (median of 3) and the time of
each rule. Run: python benchmarks/prove_all.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = 3


def main() -> None:
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


if __name__ == "__main__":
    main()
