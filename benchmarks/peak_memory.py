"""Predicted against measured peak memory per rank, for every strategy under examples/measure.

    .venv/bin/python benchmarks/peak_memory.py [FILES or FOLDERS ...] [--device cpu|cuda] [--json]
        [--repeat N] [--no-foreign]

Each file runs as ``placeverify measure`` runs it (DDP, ZeroRedundancyOptimizer, FSDP2 with and
without resharding, DTensor TP, FSDP2 x TP, torch pipelining with GPipe and 1F1B), two warm-up
steps and a measured third, with the allocator metered phase by phase
(:class:`placeverify.measure.allocation.AllocationMeter`: the profiler's memory events on CPU,
``torch.cuda.max_memory_allocated`` on CUDA). The prediction is ``placeverify check``'s
``memory.peak_bytes`` for the same file with ``memory_profile = torch_cpu`` (CPU) or ``torch``
(CUDA), the largest over the orders the implementation allows: on CPU, FSDP2's start of
backward with the last layer's all-gather output still held by gloo's worker thread
(``cost/torch_moments.py``, ``gloo_held_parts``), which happens in some runs and not others; the last
column gives the figure without that order. On CUDA the runtime's own allocations made before
the model exists (cuBLAS's workspace) are measured on each rank and left out of the measured
figure; they are what ``reserve`` is for.
Pipelines run on CPU only: gloo's send / recv take no CUDA tensors, and NCCL refuses two ranks on
one GPU. Needs torch.

By default the strategies of ``benchmarks/models/<model>/`` run too, on model code placeverify
did not write (``benchmarks/models/foreign.py``): a nanoGPT-style model of its own and
``transformers``' GPT-2 and Llama built from their configs (the ``models`` extra; without it
their rows say so). A file under ``benchmarks/models/<model>/`` is measured on that model, the
prediction made from the file as for any other.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placeverify.backend.runtime import BackendFailure, run_jobs  # noqa: E402
from placeverify.cost import analyse, whole  # noqa: E402
from placeverify.cost.implementations.spec import Implementation  # noqa: E402
from placeverify.cost.peak import GLOO_HELD_MOMENT  # noqa: E402
from placeverify.ir.strategy import Strategy  # noqa: E402
from placeverify.lower import load  # noqa: E402
from placeverify.measure.plan import plan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)
from measure_table import files  # noqa: E402  (the same files: examples/measure by default)


def with_profile(strategy: Strategy, profile: str) -> Strategy:
    mesh = dataclasses.replace(strategy.mesh, memory_profile=profile)
    return dataclasses.replace(strategy, config=dataclasses.replace(strategy.config, mesh=mesh))


def predicted(strategy: Strategy, device: str, usual: bool = False
              ) -> tuple[dict[str, int], dict[str, str]]:
    """Peak bytes and moment per rank kind (``only`` / ``first`` / ``middle`` / ``last``): the
    largest over the orders the implementation allows, or with ``usual`` the largest without
    the moments of a later-than-usual release by gloo's worker thread (``GLOO_HELD_MOMENT``)."""
    peak = analyse(with_profile(strategy, "torch" if device == "cuda" else "torch_cpu")).peak
    assert peak is not None
    best: dict[str, tuple[int, str]] = {}
    for m in peak.moments:
        if usual and m.name == GLOO_HELD_MOMENT:
            continue
        if m.rank not in best or whole(m.total) > best[m.rank][0]:
            best[m.rank] = (whole(m.total), m.name)
    return {k: v[0] for k, v in best.items()}, {k: v[1] for k, v in best.items()}


MODELS = ROOT / "benchmarks" / "models"
FOREIGN_WORKER = MODELS / "worker.py"
MODEL_ENV = "PLACEVERIFY_FOREIGN_MODEL"  # benchmarks/models/worker.py reads it


def foreign_model(path: Path) -> str | None:
    """The model a file is measured on: the folder's name under ``benchmarks/models``."""
    parent = path.resolve().parent
    return parent.name if parent.parent == MODELS else None


def foreign_files() -> list[Path]:
    return sorted(MODELS.glob("*/*.place"))


def rank_kind(stages: int, rank: int) -> str:
    if stages == 1:
        return "only"
    return "first" if rank == 0 else "last" if rank == stages - 1 else "middle"


def measure_file(path: Path, device: str, timeout: float) -> list[dict[str, Any]]:
    strategy = load(str(path))
    p = plan(strategy)
    if device == "cuda" and p.spec.implementation is Implementation.PIPELINE:
        return [{"file": path.name, "skipped": "pipelines run on CPU only (gloo send/recv "
                 "takes no CUDA tensors; NCCL refuses two ranks on one GPU)"}]
    model = foreign_model(path)
    name = f"{model}/{path.name}" if model else path.name
    worker: tuple[str, ...] = ("-m", "placeverify.measure.worker")
    if model is not None:
        if model != "nanogpt" and importlib.util.find_spec("transformers") is None:
            return [{"file": name, "skipped": "transformers is not installed (pip install "
                     "'placeverify[models]')"}]
        worker = (str(FOREIGN_WORKER),)
        os.environ[MODEL_ENV] = model  # the ranks' environment is a copy of this one
    try:
        results = run_jobs([p.spec], timeout=timeout, peak=True, device=device,
                           worker=worker)[0]
    except BackendFailure as failure:
        return [{"file": name, "skipped": f"the run failed: {failure}"}]
    bytes_by_kind, moment_by_kind = predicted(strategy, device)
    usual_bytes, usual_moment = predicted(strategy, device, usual=True)
    rows = []
    for r in results:
        phases = r["allocated"]["phases"]
        runtime = r["allocated"]["runtime"]
        phase, top = max(phases.items(), key=lambda kv: kv[1]["peak"])
        measured = top["peak"] - runtime
        kind = rank_kind(p.spec.pp, r["rank"]) if p.spec.pp > 1 else "only"
        kind = kind if kind in bytes_by_kind else next(iter(bytes_by_kind))
        rows.append({"file": name, "label": p.spec.label(), "rank": r["rank"],
                     "measured": measured, "measured_phase": phase, "runtime": runtime,
                     "predicted": bytes_by_kind[kind], "predicted_moment": moment_by_kind[kind],
                     "ratio": bytes_by_kind[kind] / measured if measured else None,
                     "usual": usual_bytes[kind], "usual_moment": usual_moment[kind],
                     "usual_ratio": usual_bytes[kind] / measured if measured else None})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each file this many times (a row per rank and run)")
    parser.add_argument("--no-foreign", action="store_true",
                        help="leave out benchmarks/models (the models placeverify did not write)")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    paths = files(args.paths)
    if not args.paths and not args.no_foreign:
        paths += foreign_files()
    for path in paths:
        for run in range(1, args.repeat + 1):
            print(f"measuring {path.name} on {args.device} (run {run}) ...", file=sys.stderr)
            rows.extend({**row, "run": run}
                        for row in measure_file(path, args.device, args.timeout))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    text = table(rows, args.device)
    print(text)
    if args.docs:
        figures.write_section("peak_memory", f"Peak memory, predicted against measured ({args.device})",
                              summary(rows), name=args.docs_name, tables=[text], notes=[NOTE],
                              facts=figures.machine(torch=True, device=args.device))
    return 0


NOTE = ("Each strategy runs two warm-up steps and a measured third; the prediction is "
        "`memory.peak_bytes` with `memory_profile = torch_cpu` (CPU) or `torch` (CUDA) "
        "([the model](models/peak.md)), the largest over the orders the implementation allows; the "
        "last column is the figure in the usual order ([two orders of frees under "
        "gloo](models/peak.md#two-orders-of-frees-under-gloo)).")


def summary(rows: list[dict[str, Any]]) -> list[figures.Figure]:
    """The figures of :func:`table`'s summary line, per strategy file and over all ranks."""
    measured = [r for r in rows if "skipped" not in r]
    out: list[figures.Figure] = []
    for file in dict.fromkeys(r["file"] for r in rows):
        mine = [r for r in measured if r["file"] == file]
        if not mine:
            skipped = next(r["skipped"] for r in rows if r["file"] == file)
            out.append((f"`{file}`", f"skipped: {skipped}"))
            continue
        ratios = sorted(r["ratio"] for r in mine)
        usual = sorted(r["usual_ratio"] for r in mine if r["usual"] != r["predicted"])
        text = spread(ratios)
        if usual:
            text += f"; usual order {spread(usual)}"
        out.append((f"`{file}`: predicted / measured peak over {len(mine)} rank peaks", text))
    ratios = [r["ratio"] for r in measured]
    nearest = [min([r["ratio"], r["usual_ratio"]], key=lambda x: abs(x - 1)) for r in measured]
    if ratios:
        out.append(("ranks within 5% of the predicted peak",
                    f"{sum(1 for r in ratios if abs(r - 1) <= 0.05)} of {len(ratios)}"))
        out.append(("ranks within 5% of the predicted peak or of the usual-order figure",
                    f"{sum(1 for r in nearest if abs(r - 1) <= 0.05)} of {len(ratios)}"))
    return out


def spread(ratios: list[float]) -> str:
    """The lowest and highest of sorted ratios, or the one figure when they print alike."""
    low, high = f"{ratios[0]:.3f}", f"{ratios[-1]:.3f}"
    return low if low == high else f"{low}-{high}"


def table(rows: list[dict[str, Any]], device: str) -> str:
    """The Markdown table and its summary. The predicted peak is the largest over the orders the
    implementation allows; where a moment depends on the order gloo's worker thread lets go of a
    buffer in, the last column is the figure without it (the usual order)."""
    lines = ["| strategy | run | rank | measured peak (phase) | predicted peak (moment) | "
             "predicted / measured | usual order / measured |", "|---|---|---|---|---|---|---|"]
    ratios, nearest = [], []
    for row in rows:
        if "skipped" in row:
            lines.append(f"| `{row['file']}` | {row['run']} | - | skipped: {row['skipped']} | | | |")
            continue
        ratios.append(row["ratio"])
        alternatives = [row["ratio"]]
        usual = "same"
        if row["usual"] != row["predicted"]:
            alternatives.append(row["usual_ratio"])
            usual = f"{row['usual_ratio']:.3f} ({row['usual_moment']})"
        nearest.append(min(alternatives, key=lambda r: abs(r - 1)))
        lines.append(f"| `{row['file']}` | {row['run']} | {row['rank']} | {row['measured']:,} "
                     f"({row['measured_phase']}) | {row['predicted']:,} ({row['predicted_moment']})"
                     f" | {row['ratio']:.3f} | {usual} |")
    within = sum(1 for r in ratios if abs(r - 1) <= 0.05)
    either = sum(1 for r in nearest if abs(r - 1) <= 0.05)
    lines.append(f"\n{within} of {len(ratios)} ranks within 5% of the predicted peak (ratios "
                 f"{min(ratios):.3f} to {max(ratios):.3f}); {either} of {len(ratios)} within 5% "
                 f"of the peak or of the usual-order figure ({device})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
