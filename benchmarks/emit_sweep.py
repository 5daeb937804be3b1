"""Every bundled bug's standalone reproducer, run the way its docstring says.

For each ``examples/bugs/*.place``: ``placeverify check FILE --trace T`` (exit 1: refuted), then
``placeverify replay T --emit repro.py``, then the command that prints, ``torchrun --standalone
--nproc-per-node N repro.py`` (gloo on CPU), in a fresh folder. A reproducer reproduces when
torchrun exits 0 and rank 0 prints ``REPRODUCED``; it is refused when ``--emit`` exits 2 (the
message names the placement or statement and its line). Anything else — a traceback, another
exit code, a rank reported failed, ``NOT REPRODUCED`` — is counted and listed as a failure.

    python benchmarks/emit_sweep.py            # every bundled bug
    python benchmarks/emit_sweep.py --docs     # and write docs/figures/emit_sweep.md
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # benchmarks/figures.py: the Measured figures page

ROOT = Path(__file__).resolve().parents[1]
BUGS = ROOT / "examples" / "bugs"
TORCHRUN_TIMEOUT = 300


@dataclass(frozen=True)
class Outcome:
    bug: str
    kind: str  # reproduced | refused | failed
    detail: str


def _env() -> dict[str, str]:
    drop = ("PLACEVERIFY_DEBUG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _placeverify(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, encoding="utf-8", timeout=600,
                          check=False)


def refusal_reason(stderr: str) -> str:
    """What ``--emit`` refused, as a group: the construct, without the file, line or sizes."""
    message = stderr.strip().splitlines()[0] if stderr.strip() else "(no message)"
    message = re.sub(r"^.*?cannot emit \S+: ", "", message)
    message = re.sub(r"^line \d+: '[^']*': ", "", message)
    message = re.sub(r" \(`placeverify replay` runs this trace\)$", "", message)
    message = re.sub(r"; `placeverify replay` runs this trace\)$", ")", message)
    return re.sub(r"\d+", "N", message.strip())


def sweep_one(path: Path, folder: Path) -> Outcome:
    bug = path.stem
    trace = folder / "trace.json"
    done = _placeverify("check", str(path), "--trace", str(trace), cwd=ROOT)
    if done.returncode != 1 or not trace.exists():
        return Outcome(bug, "failed", f"check exited {done.returncode} without a trace")
    done = _placeverify("replay", str(trace), "--emit", "repro.py", cwd=folder)
    if done.returncode == 2:
        return Outcome(bug, "refused", refusal_reason(done.stderr))
    command = re.search(r"run: torchrun (.*)$", done.stdout.strip(), re.M)
    if done.returncode != 0 or command is None or "Traceback" in done.stderr:
        return Outcome(bug, "failed", f"--emit exited {done.returncode}: {done.stderr[-300:]}")
    try:
        ran = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                              *command.group(1).split()], cwd=folder, env=_env(),
                             capture_output=True, text=True, encoding="utf-8",
                             timeout=TORCHRUN_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(bug, "failed", f"torchrun ran past {TORCHRUN_TIMEOUT} s")
    verdict = next((line for line in ran.stdout.splitlines() if "REPRODUCED" in line), "")
    if ran.returncode == 0 and verdict.startswith("REPRODUCED") and "FAILED" not in ran.stderr:
        worst = re.search(r"^buggy: (.*)$", ran.stdout, re.M)
        return Outcome(bug, "reproduced", worst.group(1) if worst else verdict)
    return Outcome(bug, "failed", f"torchrun exited {ran.returncode}: {verdict or ran.stderr[-300:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated bug names (default: all)")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    wanted = {n for n in args.only.split(",") if n}
    paths = [p for p in sorted(BUGS.glob("*.place")) if not wanted or p.stem in wanted]
    outcomes = []
    for path in paths:
        with tempfile.TemporaryDirectory(prefix="pv-emit-") as folder:
            outcome = sweep_one(path, Path(folder))
        outcomes.append(outcome)
        print(f"{outcome.bug:<44} {outcome.kind:<10} {outcome.detail}", flush=True)
    kinds = Counter(o.kind for o in outcomes)
    reasons = Counter(o.detail for o in outcomes if o.kind == "refused")
    summary = (f"{len(outcomes)} bugs: {kinds['reproduced']} reproduced under torchrun (exit 0), "
               f"{kinds['refused']} refused by --emit (exit 2), {kinds['failed']} failed")
    print(summary)
    for reason, count in reasons.most_common():
        print(f"  refused {count}: {reason}")
    if args.docs:
        found: list[figures.Figure] = [
            ("bundled bugs", str(len(outcomes))),
            ("reproduced under torchrun (exit 0, REPRODUCED)", str(kinds["reproduced"])),
            ("refused by --emit (exit 2, the construct named)", str(kinds["refused"])),
            ("failed (any other outcome)", str(kinds["failed"])),
        ]
        table = ["| refused because | bugs |", "|---|---|"]
        table += [f"| {reason} | {count} |" for reason, count in reasons.most_common()]
        reproduced = ", ".join(f"`{o.bug}`" for o in outcomes if o.kind == "reproduced")
        figures.write_section(
            "emit_sweep", "Standalone reproducers (`replay --emit`) under torchrun", found,
            name=args.docs_name, facts=figures.machine(torch=True, device="cpu (gloo)"),
            tables=["\n".join(table)] if reasons else [],
            notes=[f"Reproduced: {reproduced}." if reproduced else "None reproduced.",
                   *(f"Failed: `{o.bug}`: {o.detail}" for o in outcomes if o.kind == "failed")])
    return 1 if kinds["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
