"""Fuzz the whole pipeline with the time budget: generated programs and mutated examples.

Generates well-formed ``.place`` programs from a seeded random generator (random models, 1-5
axes of sizes 1..4096, presets and tuples, step blocks with loops, collectives, scales, clips,
seeds) plus token mutations of the bundled examples (one input in five), checks each as
``placeverify check`` does — :func:`placeverify.api.check_strategy` with ``--budget`` seconds,
then the text report, the JSON document and the trace — and prints counts per exit code and
verdict, internal errors (an exception other than a diagnostic, or an ``internal-error``
obligation), dead processes (a worker that crashed, ran out of its memory limit or was killed
after ``--kill-after`` seconds on one input), budget overruns (over the budget + 10 %), the
slowest inputs and the peak RSS (with the input that reached it).

The inputs depend only on ``--seed`` and their index, never on ``-j``: ``--show N`` prints input
N, and ``--save DIR`` writes every failing input there, for a regression test. With ``-j N``
(N >= 1) the inputs run in N worker processes, each with an address-space limit of
``--memory-limit`` MiB, restarted when one dies; ``-j 0`` runs them in this process (the test
suite's short run).

    python benchmarks/fuzz.py --count 10000 --seed 0 --budget 5 -j 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing as mp
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from rich.console import Console

from placeverify import api
from placeverify.console import verdict_exit
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.report.outcome import Outcome as Checked
from placeverify.report.outcome import report_document
from placeverify.report.text import render_check
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
MAX_DEVICES = 1 << 20


def program(rng: random.Random) -> str:
    n = rng.randint(1, 5)
    axes = [f"x{i}" for i in range(n)]
    sizes = [rng.choice([1, 2, 3, 4, 8, 64, 512, 4096]) for _ in axes]
    while math.prod(sizes) > MAX_DEVICES:  # placeverify refuses a mesh of 10^8 devices or more
        sizes[rng.randrange(n)] = rng.choice([1, 2, 3, 4, 8])
    m = rng.choice([1, 2, 4, 8, 32, 128])
    model = rng.choice(MODELS)
    # Tensor, context, pipeline and expert parallelism need an architecture; experts a
    # mixture-of-experts model (other choices only reach the same refusal again).
    other = ([] if model.startswith("model {") else
             [o for o in OTHER if o != "expert" or "mixtral" in model])
    lines = ['strategy "fuzz"', model, "mesh {",
             *(f"    {a} = {s}" for a, s in zip(axes, sizes, strict=True)), "}"]
    for i, a in enumerate(axes):
        if i == 0 or rng.random() < 0.6 or not other:
            lines.append(f"place {rng.choice(DATA)} over {a}")
        else:
            lines.append(f"place {rng.choice(other).format(m=m)} over {a}")
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
    code: int | None  # the exit code placeverify check would give; None: the process died
    verdict: str
    seconds: float
    internal: str = ""  # the internal error, if any
    rss_mib: float = 0.0  # the peak RSS of the process that ran it, after it
    dead: str = ""  # why the process running it died


def run_one(name: str, text: str, budget: float) -> Outcome:
    """Check one input as ``placeverify check --timeout BUDGET`` would, rendering included."""
    started = time.monotonic()
    try:
        result = api.check_strategy(api.load_text(text, name), budget_s=budget)
        v = result.verification
        assert v is not None
        code = verdict_exit(v.overall())
        render_check(result, Console(file=io.StringIO(), width=120))
        json.dumps(report_document(Checked(name, code, result=result)))
        if v.trace is not None:
            json.dumps(v.trace.to_json())
    except PlaceError as err:
        return Outcome(name, int(err.exit_code), "error", time.monotonic() - started)
    except Exception as err:  # an internal error: the benchmark's point
        return Outcome(name, int(ExitCode.INTERNAL_ERROR), "internal", time.monotonic() - started,
                       f"{type(err).__name__}: {err}")
    seconds = time.monotonic() - started
    failed = [o.reason for o in v.obligations if o.kind is ObligationKind.INTERNAL_ERROR]
    return Outcome(name, int(code), v.overall().value, seconds, failed[0] if failed else "")


def inputs(count: int, seed: int) -> Iterator[tuple[str, str]]:
    """The campaign's inputs: (name, text), the same for a seed whatever runs them."""
    rng = random.Random(seed)
    examples = [p.read_text() for p in sorted((ROOT / "examples").rglob("*.place"))]
    for i in range(count):
        text = mutant(rng, examples) if rng.random() < 0.2 else program(rng)
        yield f"fuzz-{seed}-{i}.place", text


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _serve(conn: Connection, budget: float, memory_mib: int | None) -> None:
    """A worker: check each input it is sent, answer with its outcome."""
    if memory_mib:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = memory_mib << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard < 0 else min(limit, hard), hard))
    while True:
        job = conn.recv()
        if job is None:
            return
        name, text = job
        outcome = run_one(name, text, budget)
        outcome.rss_mib = _rss_mib()
        conn.send(asdict(outcome))


@dataclass
class _Worker:
    process: Any
    conn: Connection
    job: tuple[int, str, str] | None = None
    started: float = 0.0


def _start(context: Any, budget: float, memory_mib: int | None) -> _Worker:
    mine, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(theirs, budget, memory_mib), daemon=True)
    process.start()
    theirs.close()
    return _Worker(process, mine)


def _parallel(jobs: list[tuple[str, str]], workers: int, budget: float, kill_after: float,
              memory_mib: int | None, progress: Callable[[int], None],
              stop_at: float) -> list[Outcome]:
    context = mp.get_context("fork")  # the workers share this module as loaded (and the examples)
    pool = [_start(context, budget, memory_mib) for _ in range(workers)]
    results: dict[int, Outcome] = {}
    queue = list(enumerate(jobs))
    queue.reverse()

    def assign(worker: _Worker) -> None:
        if queue and time.monotonic() < stop_at:
            index, (name, text) = queue.pop()
            worker.job, worker.started = (index, name, text), time.monotonic()
            worker.conn.send((name, text))
        else:
            worker.job = None

    def died(worker: _Worker, why: str) -> _Worker:
        assert worker.job is not None
        index, name, _ = worker.job
        results[index] = Outcome(name, None, "dead", time.monotonic() - worker.started, dead=why)
        progress(len(results))
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()
        worker.conn.close()
        fresh = _start(context, budget, memory_mib)
        assign(fresh)
        return fresh

    for worker in pool:
        assign(worker)
    try:
        while any(w.job is not None for w in pool):
            busy = [w for w in pool if w.job is not None]
            ready = wait([*(w.conn for w in busy), *(w.process.sentinel for w in busy)], timeout=1.0)
            now = time.monotonic()
            for i, worker in enumerate(pool):
                if worker.job is None:
                    continue
                if worker.conn in ready:
                    try:
                        outcome = Outcome(**worker.conn.recv())
                    except (EOFError, OSError):
                        pool[i] = died(worker, f"exit code {worker.process.exitcode}")
                        continue
                    results[worker.job[0]] = outcome
                    progress(len(results))
                    assign(worker)
                elif worker.process.sentinel in ready:
                    worker.process.join()
                    pool[i] = died(worker, f"exit code {worker.process.exitcode}")
                elif now - worker.started > kill_after:
                    pool[i] = died(worker, f"killed after {kill_after:g} s")
    finally:
        for worker in pool:
            if worker.process.is_alive():
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
                worker.process.join(timeout=5)
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()
    return [results[i] for i in range(len(jobs)) if i in results]  # a prefix, stopped at stop_at


def campaign(count: int, seed: int, budget: float, jobs: int = 0, kill_after: float | None = None,
             memory_mib: int | None = None,
             progress: Callable[[int], None] = lambda _done: None,
             max_seconds: float | None = None) -> list[Outcome]:
    """Run ``count`` inputs of ``seed``: in this process (``jobs`` 0) or in ``jobs`` workers;
    with ``max_seconds``, no input is started after that long (the outcomes are then fewer)."""
    todo = list(inputs(count, seed))
    stop_at = time.monotonic() + (max_seconds if max_seconds is not None else math.inf)
    if jobs <= 0:
        outcomes = []
        for name, text in todo:
            if time.monotonic() >= stop_at:
                break
            outcome = run_one(name, text, budget)
            outcome.rss_mib = _rss_mib()
            outcomes.append(outcome)
            progress(len(outcomes))
        return outcomes
    return _parallel(todo, jobs, budget, kill_after if kill_after is not None else 4 * budget + 30,
                     memory_mib, progress, stop_at)


def summary(outcomes: list[Outcome], budget: float) -> str:
    by_code: dict[str, int] = {}
    by_verdict: dict[str, int] = {}
    for o in outcomes:
        code = "dead" if o.code is None else str(o.code)
        by_code[code] = by_code.get(code, 0) + 1
        by_verdict[o.verdict] = by_verdict.get(o.verdict, 0) + 1
    internal = [o for o in outcomes if o.internal]
    dead = [o for o in outcomes if o.code is None]
    over = [o for o in outcomes if o.seconds > budget * 1.1]
    slow = sorted(outcomes, key=lambda o: -o.seconds)[:5]
    peak = max(outcomes, key=lambda o: o.rss_mib, default=None)
    codes = ", ".join(f"{c}: {n}" for c, n in sorted(by_code.items(),
                                                     key=lambda kv: (not kv[0].isdigit(),
                                                                     int(kv[0]) if kv[0].isdigit() else 0)))
    seconds = [o.seconds for o in outcomes] or [0.0]
    reached = sum(1 for o in outcomes if o.verdict in ("proved", "refuted", "unknown"))
    lines = [f"inputs {len(outcomes)} ({reached} reached the verifier); exit codes {codes}",
             "verdicts " + ", ".join(f"{v}: {n}" for v, n in sorted(by_verdict.items())),
             f"internal errors {len(internal)}; dead processes {len(dead)}; "
             f"budget overruns (> {budget * 1.1:g} s) {len(over)}",
             f"seconds per input: median {statistics.median(seconds):.3f}, "
             f"p99 {sorted(seconds)[int(0.99 * (len(seconds) - 1))]:.2f}, max {max(seconds):.2f}",
             "slowest " + ", ".join(f"{o.name} {o.seconds:.2f} s ({o.verdict})" for o in slow),
             f"peak RSS {peak.rss_mib:.0f} MiB (after {peak.name})" if peak else "peak RSS -"]
    lines += [f"  internal: {o.name}: {o.internal}" for o in internal[:10]]
    lines += [f"  dead: {o.name}: {o.dead}" for o in dead[:10]]
    lines += [f"  over budget: {o.name}: {o.seconds:.2f} s ({o.verdict})" for o in over[:10]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=5.0, help="seconds per check (--timeout)")
    parser.add_argument("-j", "--jobs", type=int, default=1,
                        help="worker processes (0: run in this process)")
    parser.add_argument("--kill-after", type=float, default=None,
                        help="seconds on one input before its worker is killed (default 4 x "
                             "budget + 30)")
    parser.add_argument("--memory-limit", type=int, default=4096,
                        help="address-space limit of each worker, MiB (0: none)")
    parser.add_argument("--save", type=Path, default=None,
                        help="write internal-error, dead and over-budget inputs to this folder")
    parser.add_argument("--show", type=int, default=None, help="print input N and exit")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="start no input after this long (report the inputs run by then)")
    args = parser.parse_args()
    if args.show is not None:
        for index, (_, text) in enumerate(inputs(args.show + 1, args.seed)):
            if index == args.show:
                print(text, end="")
        return
    started = time.monotonic()
    step = max(1, args.count // 20)

    def progress(done: int) -> None:
        if done % step == 0:
            print(f"  {done}/{args.count} in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)

    outcomes = campaign(args.count, args.seed, args.budget, args.jobs, args.kill_after,
                        args.memory_limit or None, progress, args.max_seconds)
    print(" ".join(["python", "benchmarks/fuzz.py", *sys.argv[1:]]))
    if len(outcomes) < args.count:
        print(f"stopped after --max-seconds: inputs 0..{len(outcomes) - 1} of {args.count} ran")
    print(summary(outcomes, args.budget))
    print(f"wall {time.monotonic() - started:.0f} s")
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        texts = dict(inputs(args.count, args.seed))
        for o in outcomes:
            if o.internal or o.code is None or o.seconds > args.budget * 1.1:
                (args.save / o.name).write_text(texts[o.name])


if __name__ == "__main__":
    main()
