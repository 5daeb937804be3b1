"""Predicted against measured for every example under examples/measure, as a markdown table.

    .venv/bin/python benchmarks/measure_table.py [FILES or FOLDERS ...] [--json] [--timeout S]

Each file is what ``placeverify measure FILE`` runs (the same plan, workers and comparison);
files of the same world size share one set of worker processes to save the ~2 s torch import per
rank. One line per strategy and quantity; where ranks differ their
values are listed in rank order ("a / b / c") and the ratio column gives the ratio furthest
from 1 over them. Communication rows are per step, bytes of payload (the full tensor of each
collective). ``--placement-model`` adds what the placement-level cost model (``placeverify
check``) predicts for the same quantity, where it has a figure; for "A layers" that is
Korthikanti et al.'s per-layer count alone. Needs torch; runs on CPU with gloo.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)

from placeverify.backend.runtime import BackendFailure, run_jobs  # noqa: E402
from placeverify.diagnostics import PlaceError  # noqa: E402
from placeverify.lower import load  # noqa: E402
from placeverify.measure.compare import Comparison, Row, compare, comparison_document  # noqa: E402
from placeverify.measure.plan import Plan, plan  # noqa: E402


def files(items: list[str]) -> list[Path]:
    out: list[Path] = []
    for item in items or [str(ROOT / "examples" / "measure")]:
        path = Path(item)
        out.extend(sorted(path.glob("*.place")) if path.is_dir() else [path])
    return out


def measure_all(paths: list[Path], timeout: float) -> list[Comparison]:
    planned = []
    for path in paths:
        strategy = load(str(path))
        planned.append((strategy, plan(strategy)))
    by_world: dict[int, list[int]] = {}
    for index, (_, p) in enumerate(planned):
        by_world.setdefault(p.spec.world, []).append(index)
    comparisons: dict[int, Comparison] = {}
    for world, indices in sorted(by_world.items()):
        started = time.perf_counter()
        print(f"measuring {len(indices)} strategies on {world} ranks ...", file=sys.stderr)
        results = run_jobs([planned[i][1].spec for i in indices], timeout=timeout)
        seconds = (time.perf_counter() - started) / len(indices)
        for i, result in zip(indices, results, strict=True):
            strategy, p = planned[i]
            comparisons[i] = compare(strategy, p, result, seconds)
    return [comparisons[i] for i in range(len(planned))]


def worst_ratio(rows: list[Row]) -> float:
    """The ratio furthest from 1 over the ranks."""
    return max((r.ratio for r in rows), key=lambda x: abs(x - 1))


def joined(values: list[int]) -> str:
    return " / ".join(f"{v:,}" for v in values)


def markdown(comparisons: list[Comparison], placement: bool = False) -> str:
    header = "| strategy | state | predicted | measured | ratio |"
    rule = "|---|---|---:|---:|---:|"
    if placement:
        header += " placement model |"
        rule += "---:|"
    lines = [header, rule]
    for c in comparisons:
        name = f"`{Path(c.strategy.source.path).name}`: {label(c.plan)}"
        groups: dict[str, list[Row]] = {}
        for row in c.rows:
            groups.setdefault(row.key, []).append(row)
        for rows in groups.values():
            first = rows[0]
            quantity = first.quantity
            if first.measured_calls is not None:
                quantity += f", {joined([r.measured_calls or 0 for r in rows])} calls"
            if len(rows) > 1:
                quantity += f" (ranks {' / '.join(r.rank for r in rows)})"
            elif first.rank != "all":
                quantity += f" (rank {first.rank})"
            tolerance = " (±10%)" if first.tolerance else ""
            line = (f"| {name} | {quantity} | {joined([r.predicted for r in rows])} | "
                    f"{joined([r.measured for r in rows])} | {worst_ratio(rows):.3f}{tolerance} |")
            if placement:
                references = [r.placement for r in rows]
                text = "" if references[0] is None else joined([v or 0 for v in references])
                if len(set(references)) == 1 and references[0] is not None:
                    text = f"{references[0]:,}"
                line += f" {text} |"
            lines.append(line)
            name = ""
    return "\n".join(lines)


def label(p: Plan) -> str:
    spec = p.spec
    axes = ", ".join(f"{name} = {size}" for name, size in (("dp", spec.dp), ("tp", spec.tp),
                                                            ("pp", spec.pp)) if size > 1)
    return f"{spec.label()}, {axes}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="files or folders (default: examples/measure)")
    parser.add_argument("--json", action="store_true", help="print the JSON documents")
    parser.add_argument("--placement-model", action="store_true",
                        help="add a column with the placement-level cost model's figure "
                             "(placeverify check's formulas on the same model, fp32)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per world size")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    try:
        comparisons = measure_all(files(args.paths), args.timeout)
    except PlaceError as error:
        print(error, file=sys.stderr)
        return 2
    except BackendFailure as error:
        print(f"measure_table: {error}", file=sys.stderr)
        return 5
    if args.json:
        print(json.dumps([comparison_document(c) for c in comparisons], indent=2,
                         ensure_ascii=False))
    else:
        table = markdown(comparisons, args.placement_model)
        print(table)
        exact = [r for c in comparisons for r in c.rows if r.tolerance == 0]
        close = [r for c in comparisons for r in c.rows if r.tolerance]
        print(f"\n{sum(r.ok for r in exact)} of {len(exact)} exact rows at 1.000; "
              f"{sum(r.ok for r in close)} of {len(close)} activation rows within 10%.")
        if args.docs:
            figures.write_section("measure_table", "Measured against predicted: model states and "
                                  "communication", [
                (f"model states and communication, {len(comparisons)} strategies",
                 f"{sum(r.ok for r in exact)} of {len(exact)} exact rows at 1.000"),
                ("activations", f"{sum(r.ok for r in close)} of {len(close)} rows within 10%")],
                name=args.docs_name, facts=figures.machine(torch=True, device="cpu (gloo)"),
                tables=[table])
    return 0


if __name__ == "__main__":
    sys.exit(main())
