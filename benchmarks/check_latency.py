"""Whole-process latency of ``placeverify check`` (verification on) on every example.

Each file is checked in a fresh process, as a user runs it, several times; the script prints the
median, fastest and slowest wall time per file, then the median over files (goal: well under
0.5 s). A baseline row shows what the interpreter alone costs on this machine.

    .venv/bin/python benchmarks/check_latency.py                 # every examples/**/*.place
    .venv/bin/python benchmarks/check_latency.py -n 10 examples/zero-paper
    .venv/bin/python benchmarks/check_latency.py --json latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
GOAL_SECONDS = 0.5

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)


@dataclass(frozen=True)
class Timing:
    file: str
    exit_code: int
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def command() -> list[str]:
    """The console script installed beside this interpreter, else ``python -m placeverify``."""
    script = Path(sys.executable).parent / "placeverify"
    if script.exists():
        return [str(script)]
    found = shutil.which("placeverify")
    return [found] if found else [sys.executable, "-m", "placeverify"]


def wall_time(argv: list[str]) -> tuple[int, float]:
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          check=False, timeout=300)
    return done.returncode, time.perf_counter() - started


def measure(argv: list[str], repeat: int, warmup: int) -> tuple[int, list[float]]:
    for _ in range(warmup):
        wall_time(argv)
    runs = [wall_time(argv) for _ in range(repeat)]
    codes = {code for code, _ in runs}
    if len(codes) != 1:
        raise SystemExit(f"{' '.join(argv)}: exit code changed between runs: {sorted(codes)}")
    return codes.pop(), [seconds for _, seconds in runs]


def example_files(items: list[str]) -> list[Path]:
    if not items:
        items = [str(ROOT / "examples")]
    files: list[Path] = []
    for item in items:
        path = Path(item)
        files.extend(sorted(path.rglob("*.place")) if path.is_dir() else [path])
    return files


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="files or folders (default: examples/)")
    parser.add_argument("-n", "--repeat", type=int, default=5, help="timed runs per file (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per file first (default 1)")
    parser.add_argument("--json", metavar="FILE", help="also write the timings as JSON here")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    base = command()
    files = example_files(args.paths)
    if not files:
        parser.error("no .place files found")
    os.environ.pop("PLACEVERIFY_DEBUG", None)
    compiled = any((ROOT / "placeverify" / "__pycache__").glob("*.pyc"))
    print(f"bytecode: {'precompiled (.pyc present)' if compiled else 'none: every run compiles the sources'}"
          f"; PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')}; "
          f"parser cache: {os.environ.get('PLACEVERIFY_CACHE_DIR') or 'default (~/.cache/placeverify)'}")

    _, interpreter = measure([sys.executable, "-c", "pass"], args.repeat, args.warmup)
    _, version = measure([*base, "--version"], args.repeat, args.warmup)
    print(f"command: {' '.join(base)} check FILE   ({args.repeat} runs per file after "
          f"{args.warmup} warm-up; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    print(f"baseline: python -c pass {statistics.median(interpreter):.3f} s, "
          f"placeverify --version {statistics.median(version):.3f} s")
    print()
    width = max(len(shown(f)) for f in files)
    print(f"{'file':<{width}}  exit  median     min     max")
    timings: list[Timing] = []
    for path in files:
        code, seconds = measure([*base, "check", str(path)], args.repeat, args.warmup)
        timing = Timing(shown(path), code, seconds)
        timings.append(timing)
        print(f"{timing.file:<{width}}  {code:>4}  {timing.median:6.3f}  {min(seconds):6.3f}  "
              f"{max(seconds):6.3f}", flush=True)

    medians = sorted(t.median for t in timings)
    overall = statistics.median(medians)
    p90 = medians[min(len(medians) - 1, int(0.9 * len(medians)))]
    print()
    print(f"{len(timings)} files: median {overall:.3f} s, p90 {p90:.3f} s, slowest {medians[-1]:.3f} s "
          f"({max(timings, key=lambda t: t.median).file})")
    verdict = "met" if overall < GOAL_SECONDS else "NOT met"
    print(f"goal: median under {GOAL_SECONDS} s: {verdict}")
    if args.docs:
        slowest = max(timings, key=lambda t: t.median).file
        figures.write_section("check_latency", "Whole-process `placeverify check`", [
            (f"`placeverify check FILE` over {len(timings)} example files, a fresh process each "
             f"({args.repeat} runs per file after {args.warmup} warm-up; median per file)",
             f"median {overall:.3f} s, p90 {p90:.3f} s, slowest {medians[-1]:.3f} s (`{slowest}`)"),
            ("baseline: `python -c pass`", f"{statistics.median(interpreter):.3f} s"),
            ("baseline: `placeverify --version`", f"{statistics.median(version):.3f} s"),
            (f"goal: median under {GOAL_SECONDS} s", verdict)],
            name=args.docs_name,
            facts={**figures.machine(load=True),
                   "bytecode": "precompiled" if compiled else "none (every run compiles)",
                   "parser cache": "as configured" if os.environ.get("PLACEVERIFY_CACHE_DIR")
                   else "default (~/.cache/placeverify)"})
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": base, "repeat": args.repeat, "warmup": args.warmup,
            "baseline": {"python": statistics.median(interpreter),
                         "version": statistics.median(version)},
            "median": overall, "p90": p90,
            "files": [{**asdict(t), "median": t.median} for t in timings]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
