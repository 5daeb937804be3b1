"""Fuzz the whole pipeline with the time budget: generated programs and mutated examples.

Generates well-formed ``.place`` programs from a seeded random generator (random models, 1-5
axes of sizes 1..4096, presets and tuples, step blocks with loops, collectives, scales, clips,
seeds) plus token mutations of the bundled examples, runs each through :func:`placeverify.api.check`
in this process with ``--budget`` seconds, and prints counts per exit code and verdict, internal
errors (an exception other than a diagnostic, or an ``internal-error`` obligation), budget
overruns (over the budget + 10 %), the slowest inputs and the peak RSS.

    python benchmarks/fuzz.py --count 10000 --seed 0 --budget 5
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from placeverify import api
from placeverify.console import verdict_exit
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.verdicts import ObligationKind

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["model { params = 7.5e9 }", "model llama3_8b", "model gpt3_175b { micro_batch = 1 }",
          "model { params = 1e6 }", "model mixtral_8x7b"]
DATA = ["ddp", "zero1", "zero2", "zero3", "fsdp", "(R, S, R, R)", "(S*, S, S, R)", "(R, R, R, R)"]
OTHER = ["megatron", "megatron(sequence_parallel)", "context", "expert",
         "pipeline(1f1b, microbatches = {m})", "pipeline(gpipe, microbatches = {m})"]
REDUCE = ["all_reduce(sum)", "all_reduce(mean)", "reduce_scatter(sum)", "reduce_scatter(mean)",
          "reduce_scatter(sum, accumulate)"]
LOSSES = ["token_mean", "sample_mean", "microbatch_mean", "sum"]


def program(rng: random.Random) -> str:
    n = rng.randint(1, 5)
    axes = [f"x{i}" for i in range(n)]
    sizes = [rng.choice([1, 2, 3, 4, 8, 64, 512, 4096]) for _ in axes]
    m = rng.choice([1, 2, 4, 8, 32, 128])
    lines = ['strategy "fuzz"', rng.choice(MODELS), "mesh {",
             *(f"    {a} = {s}" for a, s in zip(axes, sizes, strict=True)), "}"]
    for i, a in enumerate(axes):
        if i == 0 or rng.random() < 0.6:
            lines.append(f"place {rng.choice(DATA)} over {a}")
        else:
            lines.append(f"place {rng.choice(OTHER).format(m=m)} over {a}")
    lines.append(f"loss {rng.choice(LOSSES)}")
    if rng.random() < 0.3:
        lines.append(f"clip max_norm = {rng.choice(['1.0', '0.5'])}")
    if rng.random() < 0.5:
        group = " * ".join(rng.sample(axes, rng.randint(1, n)))
        body = [f"backward {rng.choice(['sum', 'mean', 'sum / tokens(' + axes[0] + ', step)'])}"]
        if rng.random() < 0.4:
            body.append(f"{rng.choice(REDUCE)} grads over {group}")
        step = ["step {", f"    microbatches = {m}", "    each microbatch {",
                *(f"        {b}" for b in body), "    }"]
        if rng.random() < 0.7:
            step.append(f"    {rng.choice(REDUCE)} grads over {group}")
        if rng.random() < 0.3:
            step.append(f"    scale grads by 1 / {rng.choice(['|' + axes[0] + '|', 'microbatches', '2'])}")
        if rng.random() < 0.2:
            step.append("    clip(max_norm = 1.0) grads over " + group)
        if rng.random() < 0.1:
            step.append("    free grads")
        step.append("    update params")
        if rng.random() < 0.3:
            step.append(f"    all_gather params over {axes[0]}")
        if rng.random() < 0.1:
            step.append(f"    seed dropout(sharded) {rng.choice(['same', 'differ'])} over {axes[0]}")
        lines += [*step, "}"]
    elif rng.random() < 0.3:
        lines.append(f"microbatches = {m}")
    return "\n".join(lines) + "\n"


def mutant(rng: random.Random, examples: list[str]) -> str:
    words = rng.choice(examples).split(" ")
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(words))
        choice = rng.random()
        if choice < 0.4:
            words[i] = rng.choice(words)
        elif choice < 0.7:
            del words[i]
        else:
            words.insert(i, rng.choice(["2", "dp", "tp", "sum", "mean", "4096", "{", "}", "over"]))
    return " ".join(words)


@dataclass
class Outcome:
    name: str
    code: int
    verdict: str
    seconds: float
    internal: str = ""


def run_one(name: str, text: str, budget: float) -> Outcome:
    started = time.monotonic()
    try:
        result = api.check_strategy(api.load_text(text, name), budget_s=budget)
    except PlaceError as err:
        return Outcome(name, int(err.exit_code), "error", time.monotonic() - started)
    except Exception as err:  # an internal error: the benchmark's point
        return Outcome(name, int(ExitCode.INTERNAL_ERROR), "internal", time.monotonic() - started,
                       f"{type(err).__name__}: {err}")
    seconds = time.monotonic() - started
    v = result.verification
    assert v is not None
    failed = [o.reason for o in v.obligations if o.kind is ObligationKind.INTERNAL_ERROR]
    return Outcome(name, int(verdict_exit(v.overall())), v.overall().value, seconds,
                   failed[0] if failed else "")


def campaign(count: int, seed: int, budget: float, out: object = sys.stdout) -> list[Outcome]:
    rng = random.Random(seed)
    examples = [p.read_text() for p in sorted((ROOT / "examples").rglob("*.place"))]
    outcomes = []
    for i in range(count):
        text = mutant(rng, examples) if rng.random() < 0.2 else program(rng)
        outcomes.append(run_one(f"fuzz-{seed}-{i}.place", text, budget))
    return outcomes


def summary(outcomes: list[Outcome], budget: float) -> str:
    by_code: dict[int, int] = {}
    by_verdict: dict[str, int] = {}
    for o in outcomes:
        by_code[o.code] = by_code.get(o.code, 0) + 1
        by_verdict[o.verdict] = by_verdict.get(o.verdict, 0) + 1
    internal = [o for o in outcomes if o.internal]
    over = [o for o in outcomes if o.seconds > budget * 1.1]
    slow = sorted(outcomes, key=lambda o: -o.seconds)[:5]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    codes = ", ".join(f"{c}: {n}" for c, n in sorted(by_code.items()))
    lines = [f"inputs {len(outcomes)}; exit codes {codes}",
             "verdicts " + ", ".join(f"{v}: {n}" for v, n in sorted(by_verdict.items())),
             f"internal errors {len(internal)}; budget overruns (> {budget * 1.1:g} s) {len(over)}",
             "slowest " + ", ".join(f"{o.name} {o.seconds:.2f} s ({o.verdict})" for o in slow),
             f"peak RSS {rss:.0f} MiB"]
    lines += [f"  internal: {o.name}: {o.internal}" for o in internal[:10]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=5.0)
    args = parser.parse_args()
    started = time.monotonic()
    outcomes = campaign(args.count, args.seed, args.budget)
    print(summary(outcomes, args.budget))
    print(f"wall {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
