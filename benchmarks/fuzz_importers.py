"""Fuzz the importers: mutated configuration files must give a diagnostic, never a traceback.

Seeds are configuration files (by default the importers' own fixtures, ``tests/importers``; give
folders of real ones, e.g. a clone of Megatron-LM's ``examples``). Each input is a seed with 1-6
random edits (a fragment of shell, YAML, TOML or JSON syntax inserted, a span deleted, a span of
the file copied elsewhere); it is imported in this process as ``placeverify import`` would, under
each format that could read it, with ``--world``. An exception other than a
:class:`~placeverify.diagnostics.PlaceError`, or an import that takes more than ``--timeout``
seconds, is a failure: the script prints it, writes the input to ``--save DIR`` if given, and
exits 1. The inputs depend only on ``--seed``.

    .venv/bin/python benchmarks/fuzz_importers.py --count 5000 --seed 0
    .venv/bin/python benchmarks/fuzz_importers.py ~/Megatron-LM/examples --count 5000
"""

from __future__ import annotations

import argparse
import atexit
import random
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placeverify.diagnostics import PlaceError  # noqa: E402
from placeverify.importers import EXTENSIONS, Options  # noqa: E402
from placeverify.importers.registry import import_file  # noqa: E402

FRAGMENTS = (
    "$(", ")", "`", '"', "'", "${", "}", "[[", "]]", "if ", "then", "fi", "\n", "\\\n",
    "<<EOF\n", "EOF\n", "$((", "))", "=(", "+=", "--tensor-model-parallel-size ", "$@", ";",
    "&&", "||", "case x in", "esac", "#", "$1", "${A[@]}", "for i in 1 2; do", "done", "(",
    "MODEL_ARGS:\n", "  --num-layers: ", ": ", "[", "]", "<<: *A", "&A", "true", "${X}",
    "MODE: inference\n", "\t", "distributed_type: DEEPSPEED\n", "deepspeed_config:\n",
    "  deepspeed_config_file: x.json\n", "-1", "0", "1.5", '"abc"', "99999999999999999999",
    "\n[parallelism]\n", "pipeline_parallel_degree = 2\n", '"auto"', "{", ",", "null",
    '"zero_optimization": {"stage": 3}', '"train_micro_batch_size_per_gpu": ',
    "base_model: x\n", "adapter: qlora\n", "lora_target_modules: ", "deepspeed: x.json\n",
    "fsdp_config:\n", "use_peft: true\n", "load_in_4bit: true\n", "optimizer: ",
)
FORMATS = {".sh": ("megatron",), ".bash": ("megatron",), ".args": ("megatron",),
           ".yaml": (None, "megatron", "accelerate", "axolotl", "trl"),
           ".yml": (None, "megatron", "accelerate", "axolotl", "trl"),
           ".toml": ("torchtitan",), ".json": ("deepspeed",)}


class Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Timeout()


def seeds(paths: list[str]) -> list[tuple[str, str]]:
    out = []
    for given in paths or [str(ROOT / "tests" / "importers")]:
        path = Path(given)
        found = sorted(p for p in path.rglob("*") if p.suffix.lower() in EXTENSIONS) \
            if path.is_dir() else [path]
        for p in found:
            if p.is_file() and p.stat().st_size < 200_000:
                out.append((p.suffix.lower(), p.read_text(errors="replace")))
    return out


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(text) + 1)
        op = rng.random()
        if op < 0.45:
            text = text[:i] + rng.choice(FRAGMENTS) + text[i:]
        elif op < 0.75:
            text = text[:i] + text[i + rng.randint(1, 20):]
        else:
            j = rng.randrange(len(text) + 1)
            text = text[:i] + text[j:j + rng.randint(1, 40)] + text[i:]
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="seed files or folders (default: tests/importers)")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--timeout", type=int, default=10, help="seconds per import")
    parser.add_argument("--save", help="write each failing input into this folder")
    args = parser.parse_args()
    pool = seeds(args.paths)
    if not pool:
        print("no seed files", file=sys.stderr)
        return 2
    model = ROOT / "tests" / "importers" / "llama3-8b-config.json"
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="pv-fuzz-import-"))
    atexit.register(shutil.rmtree, folder, True)  # the inputs' folder goes with the run
    signal.signal(signal.SIGALRM, _alarm)
    failures = imported = refused = 0
    for index in range(args.count):
        suffix, text = rng.choice(pool)
        text = mutate(text, rng)
        path = folder / f"input{suffix}"
        path.write_text(text)
        for fmt in FORMATS.get(suffix, (None,)):
            signal.alarm(args.timeout)
            try:
                import_file(str(path), Options(str(model), args.world, fmt))
                imported += 1
            except PlaceError:
                refused += 1
            except Exception as error:  # a bug: a traceback where a diagnostic belongs
                failures += 1
                what = "timeout" if isinstance(error, Timeout) else \
                    traceback.format_exc().strip().splitlines()[-1]
                print(f"input {index} ({suffix}, format {fmt}): {what}")
                if args.save:
                    Path(args.save).mkdir(parents=True, exist_ok=True)
                    (Path(args.save) / f"input-{args.seed}-{index}{suffix}").write_text(text)
            finally:
                signal.alarm(0)
    print(f"{args.count} inputs from {len(pool)} seeds: {imported} imported, {refused} refused "
          f"with a diagnostic, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
