"""``check --every-size`` on every bundled example: verdicts at the file's sizes against every
size, and the time the every-size pass takes.

Every size includes the file's sizes, so a condition refuted at the file's sizes must be refuted
for every size, and one proved for every size must be proved at the file's sizes: a file where
either fails is a *contradiction* (a bug of the every-size pass). The script prints one row per
file whose verdicts differ, then the counts. With ``--replay`` each refutation found for every
size but not at the file's sizes is replayed where it fails (``check --every-size --trace``, then
``placeverify replay``, as a user runs them) and counted by the replay's verdict and the refuted
condition (composition safety is about a placement's bookkeeping, no value a run computes: its
replay answers "unconfirmed", as ``check --replay`` does)::

    .venv/bin/python benchmarks/every_size.py                    # every examples/**/*.place
    .venv/bin/python benchmarks/every_size.py examples/ok --timeout 60
    .venv/bin/python benchmarks/every_size.py --replay --docs     # docs/figures/every_size.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)

from placeverify.api import check  # noqa: E402
from placeverify.verdicts import CONDITIONS, Verdict  # noqa: E402


def contradictions(here: dict[str, Verdict], every: dict[str, Verdict]) -> list[str]:
    """The conditions whose every-size verdict contradicts the file's sizes' verdict."""
    return [c for c in here if (here[c] is Verdict.REFUTED and every[c] is not Verdict.REFUTED)
            or (every[c] is Verdict.PROVED and here[c] is not Verdict.PROVED)]


def replayed(path: Path) -> str:
    """The replay's verdict of the every-size counterexample of ``path`` (``confirmed``, ...)."""
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        cli = [sys.executable, "-m", "placeverify"]
        subprocess.run([*cli, "check", "-q", "--every-size", "--trace", str(trace), str(path)],
                       cwd=ROOT, capture_output=True, check=False, timeout=600)
        if not trace.exists():
            return "no trace"
        done = subprocess.run([*cli, "replay", "-q", "--json", str(trace)], cwd=ROOT,
                              capture_output=True, text=True, check=False, timeout=600)
        condition = json.loads(trace.read_text())["condition"]
        try:  # a placement's bookkeeping (composition) is about no value a run computes
            return f"{json.loads(done.stdout)['verdict']} ({condition})"
        except (ValueError, KeyError):
            return f"replay failed (exit {done.returncode}, {condition})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[ROOT / "examples"])
    parser.add_argument("--replay", action="store_true",
                        help="replay each refutation found for every size only")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="check --timeout per file (default 30)")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    files = sorted(p for path in args.paths
                   for p in (path.rglob("*.place") if path.is_dir() else [path]))
    kinds: Counter[str] = Counter()
    replays: Counter[str] = Counter()
    bad: list[str] = []
    seconds: list[float] = []
    started = time.perf_counter()
    for path in files:
        result = check(str(path), every_size=(), budget_s=args.timeout)
        assert result.verification is not None and result.every_size is not None
        here = {c.value: result.verification.verdict(c) for c in CONDITIONS}
        every = {c.value: result.every_size.verdicts[c] for c in CONDITIONS}
        seconds.append(result.every_size.seconds)
        wrong = contradictions(here, every)
        kinds[f"{result.verification.overall().value} -> {result.every_size.overall().value}"] += 1
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        if wrong:
            bad.append(f"{shown}: {', '.join(wrong)}")
        if args.replay and result.verification.overall() is not Verdict.REFUTED and \
                result.every_size.overall() is Verdict.REFUTED:
            verdict = replayed(path)
            replays[verdict] += 1
            print(f"{shown}: replayed where it fails: {verdict}")
        if here != every:
            print(f"{shown}: file sizes {result.verification.overall().value}, every size "
                  f"{result.every_size.overall().value}"
                  + "".join(f"; {c}: {here[c].value} -> {every[c].value}" for c in here
                            if here[c] is not every[c]))
    total = time.perf_counter() - started
    rows = [("files", f"{len(files):,}"),
            *((f"file sizes -> every size: {k}", f"{n:,}") for k, n in sorted(kinds.items())),
            ("contradictions (refuted at the file's sizes, not for every size, or the reverse)",
             f"{len(bad):,}"),
            *((f"replays of refutations for every size only: {k}", f"{n:,}")
              for k, n in sorted(replays.items())),
            ("every-size pass per file: median / max",
             f"{statistics.median(seconds):.2f} s / {max(seconds):.2f} s"),
            ("wall time", f"{total:.0f} s")]
    for what, figure in rows:
        print(f"{what}: {figure}")
    for line in bad:
        print(f"CONTRADICTION {line}")
    if args.docs:
        figures.write_section("every_size", "`check --every-size` on every example", rows,
                              name=args.docs_name)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
