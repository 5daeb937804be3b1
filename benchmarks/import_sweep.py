"""How many real configuration files placeverify reads, and why it refuses the others.

Give it folders or files (a clone of NVIDIA/Megatron-LM, huggingface/trl, ...); every file of
an importable suffix is imported and checked in this process as ``placeverify check FILE`` would
(with the same ``--world``, ``--model``, ``--format`` and ``--set``), and the script prints how many
were checked (exit 0, 1 or 3: a verdict was reached), how many were refused as bad input, and the
refusals grouped by their message (numbers blanked) with one example file each. An internal error
(a traceback: a bug) is listed apart and makes the script exit 1.

    .venv/bin/python benchmarks/import_sweep.py ~/Megatron-LM/tests/functional_tests/test_cases \\
        --name model_config.yaml --world 8 --set model.vocab=50304
    .venv/bin/python benchmarks/import_sweep.py ~/Megatron-LM/examples --name '*.sh'
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)

from placeverify.api import check_strategy  # noqa: E402
from placeverify.diagnostics import PlaceError  # noqa: E402
from placeverify.importers import EXTENSIONS, Options  # noqa: E402
from placeverify.importers.registry import load  # noqa: E402
from placeverify.lower.overrides import parse_settings  # noqa: E402


def files(paths: list[str], pattern: str | None) -> list[Path]:
    out: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = path.rglob(pattern) if pattern else (
                p for p in path.rglob("*") if p.suffix.lower() in EXTENSIONS)
            out.extend(sorted(p for p in found if p.is_file()))
        else:
            out.append(path)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--name", help="only files whose name matches this glob")
    parser.add_argument("--world", type=int)
    parser.add_argument("--model")
    parser.add_argument("--format", dest="fmt")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--no-verify", action="store_true", help="costs only, no Z3")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    options = Options(args.model, args.world, args.fmt)
    settings = parse_settings(args.sets) if args.sets else None
    checked, refused, crashed = 0, collections.Counter[str](), []
    example: dict[str, Path] = {}
    todo = files(args.paths, args.name)
    for path in todo:
        try:
            strategy, _ = load(str(path), options, settings)
            check_strategy(strategy, verify_conditions=not args.no_verify)
            checked += 1
        except PlaceError as error:
            first = next((d for d in error.diagnostics if d.severity.name == "ERROR"),
                         error.diagnostics[0]) if error.diagnostics else None
            reason = re.sub(r"\d+", "N", first.message if first else str(error))[:140]
            refused[reason] += 1
            example.setdefault(reason, path)
        except Exception:  # a bug: listed, never counted as a refusal
            crashed.append((path, traceback.format_exc(limit=3)))
    print(f"{len(todo)} files: {checked} checked, {sum(refused.values())} refused, "
          f"{len(crashed)} internal errors")
    for reason, count in refused.most_common():
        print(f"  {count:4d}  {reason}   (e.g. {example[reason]})")
    for path, text in crashed:
        print(f"internal error on {path}:\n{text}")
    if args.docs:
        found: list[figures.Figure] = [
            (f"configuration files of {', '.join(f'`{p}`' for p in args.paths)}",
             f"{len(todo)} files: {checked} checked, {sum(refused.values())} refused, "
             f"{len(crashed)} internal errors")]
        found += [(f"refused: {reason}", f"{count} (e.g. `{example[reason]}`)")
                  for reason, count in refused.most_common()]
        figures.write_section("import_sweep", "Importing real configuration files", found,
                              name=args.docs_name, facts=figures.machine())
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
