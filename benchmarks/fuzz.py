"""Fuzz the whole pipeline with the time budget: generated programs, mutated examples, and faults.

Generates well-formed ``.place`` programs from a seeded random generator (random models, 1-5
axes of sizes 1..4096, presets and tuples, step blocks with loops, collectives, scales, clips,
seeds) plus token mutations of the bundled examples (one input in five), checks each as
``placeverify check`` does — :func:`placeverify.api.check_strategy` with ``--budget`` seconds,
then the text report, the JSON document and the trace — and prints counts per exit code and
verdict, internal errors (an exception other than a diagnostic, or an ``internal-error``
obligation), dead processes (a worker that crashed, ran out of its memory limit or was killed
after ``--kill-after`` seconds on one input), budget overruns (over the budget + 10 %, and the
worst overrun in % of the budget), the slowest inputs and the peak RSS (with the input that
reached it).

``--faults F`` replaces a share F of the inputs by fault injections, each a real ``python -m
placeverify`` process in its own session with a private TMPDIR and a marker in its environment:

- ``signal``: SIGINT, SIGTERM or SIGKILL, to the process or to its process group (as a
  terminal's Ctrl-C), at a random point of ``check`` (a generated program or an example,
  with ``--trace`` half the time), ``search``, ``replay`` (a bundled bug's trace) or
  ``measure``. The exit must be the documented one (README "CLI reference": 130 for SIGINT,
  143 for SIGTERM, each also as death by that signal, which a shell reports the same; -9 for
  SIGKILL), or the command's own when it ended before the signal (within 1 s after it: the
  signal came too late); no traceback, no internal error; and 5 s after the exit no process
  carrying the run's marker or in its session (ranks, forkserver, resource tracker), nothing
  left in its TMPDIR and no half-written output.
- ``disk``: ``check --trace`` and ``import -o`` into a 64 KiB tmpfs whose blocks or inodes are
  used up (exit 4, a message, nothing written) or with one page left (the file, complete).
  Needs ``mount -t tmpfs`` (root); otherwise every such input is counted as skipped, loudly.
- ``paths``: unreadable and unwritable paths (exit 4): as ``nobody`` when that user can run
  this Python, else as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (the permission
  checks a non-root user meets), else skipped, loudly; and directories where files belong.

``--load`` runs the campaign beside a CPU hog (one busy-loop process per core, killed at the
end whatever happens), so that the budget overruns are measured on a busy machine.

The inputs depend only on ``--seed`` and their index, never on ``-j`` or ``--faults``: a
check input N is the same with and without faults. ``--show N`` prints input N, and ``--save
DIR`` writes every failing input there, for a regression test. With ``-j N`` (N >= 1) the
inputs run in N worker processes, each with an address-space limit of ``--memory-limit`` MiB
(lifted for the fault injections' processes), restarted when one dies; ``-j 0`` runs them in
this process (the test suite's short run).

    python benchmarks/fuzz.py --count 10000 --seed 0 --budget 5 -j 2 --faults 0.02
    python benchmarks/fuzz.py --count 10000 --seed 0 --budget 5 -j 2 --faults 0.02 --load
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import math
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures

from placeverify import api
from placeverify.console import verdict_exit
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.report.outcome import Outcome as Checked
from placeverify.report.outcome import report_document
from placeverify.report.text import render_check
from placeverify.verdicts import ObligationKind
from placeverify.verify.budget import whole_check

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
OVERRUN = 0.10  # README: the budget is kept within 10 % at any load


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
    family: str = "check"  # check (in this process), or a fault family: signal, disk, paths
    traceback: str = ""  # the last line of a traceback the command printed
    wrong: str = ""  # why its exit is not the documented one
    leftover: str = ""  # processes or files of the run left 5 s after its exit
    skipped: str = ""  # why this fault could not be injected here
    late: bool = False  # the signal came after the command had done its work
    detail: str = ""  # the command run and the point of the signal
    marker: str = ""  # the run's marker in its processes' environment (a fault's, to settle)
    session: int = 0  # the run's session id (its pid)
    ended: float = 0.0  # time.monotonic() at its exit
    work: str = ""  # its folder: tmp/ is its TMPDIR, out/ its outputs
    expect: str = ""  # the one file out/ may hold after the run


def run_one(name: str, text: str, budget: float) -> Outcome:
    """Check one input as ``placeverify check --timeout BUDGET`` would, rendering included."""
    started = time.monotonic()
    try:
        with whole_check(budget):  # as api.check: reading and costs count too
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


# ---------------------------------------------------------------------------------------------
# Fault injections: real processes, signalled, on a full disk, or at paths they may not use.

FAMILIES = ("signal", "disk", "paths")
FAMILY_WEIGHTS = {"signal": 0.7, "disk": 0.15, "paths": 0.15}
SIGNAL_COMMANDS = {"check": 0.35, "search": 0.15, "replay": 0.3, "measure": 0.2}
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
# README "CLI reference": 130 and 143 (128 + the signal's number) after the ranks are stopped
# and the temporary folders removed; a command that starts no process (check, search) may
# instead die of the signal, which a shell and CI report as the same 130 or 143. SIGKILL
# cannot be handled.
SIGNAL_EXITS = {"SIGINT": (130, -signal.SIGINT), "SIGTERM": (143, -signal.SIGTERM),
                "SIGKILL": (-signal.SIGKILL,)}
UNSIGNALLED_EXITS = (0, 1, 2, 3, 5, 6)  # the documented exits other than 4 and 70
DELAYS = {"check": 1.5, "search": 2.5, "replay": 5.0, "measure": 10.0}  # about a run's length here
REPLAY_BUGS = ("missing-allreduce", "zero1-no-allgather", "double-division")
MEASURE_FILES = ("ddp-mlp", "ddp")
SEARCHES = (("--devices", "8", "--global-batch", "64"), ("--devices", "64", "--global-batch", "512"))
CHECK_EXAMPLES = ("examples/zero-paper/zero3.place", "examples/ok/hsdp.place",
                  "examples/strategies/llama3-405b-4d.place", "examples/bugs/missing-allreduce.place",
                  "examples/bugs/zero1-no-allgather.place")
TRACE_BUG = "examples/bugs/missing-allreduce.place"  # refuted: check --trace writes its trace
IMPORT_ARGS = ("tests/importers/llama3-8b-zero3.json", "--model",
               "tests/importers/llama3-8b-config.json", "--world", "8", "--set", "model.seq=8192")
DISK_VARIANTS = ("blocks", "inodes", "room")  # blocks or inodes used up; one page left
# Each: needs a user who meets permission checks, and the command ({...} are made by run_paths).
# README's exit table: 4 "a file is missing, unreadable or not a regular file" (issue 36, 6).
PATH_CASES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "unreadable-file": (True, ("check", "{unreadable_place}")),
    "unreadable-model": (True, ("import", IMPORT_ARGS[0], "--model", "{unreadable_json}", "--world", "8")),
    "unwritable-trace": (True, ("check", TRACE_BUG, "--trace", "{read_only}/trace.json")),
    "unwritable-output": (True, ("import", *IMPORT_ARGS, "-o", "{read_only}/out.place")),
    "trace-is-dir": (False, ("check", TRACE_BUG, "--trace", "{folder}")),
    "output-is-dir": (False, ("import", *IMPORT_ARGS, "-o", "{folder}")),
    "model-is-dir": (False, ("import", IMPORT_ARGS[0], "--model", "{folder}", "--world", "8")),
}
SETTLE_S = 5.0  # how long after its exit a run's processes must be gone
AFTER_SIGNAL_S = 30.0  # a run still going this long after its signal is killed: a wrong exit
LATE_S = 1.0  # an unsignalled exit this soon after the signal: the signal came too late
FAULT_KILL_AFTER = 150.0  # seconds on one fault before its worker is killed
MARK = "PLACEVERIFY_FUZZ_RUN"
TRACEBACK = "Traceback (most recent call last)"
EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b")  # its last line
INTERNAL = re.compile(r"internal error|a bug in placeverify", re.I)
NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
NO_DAC = ("setpriv", "--inh-caps=-dac_override,-dac_read_search",
          "--bounding-set=-dac_override,-dac_read_search")


@dataclass
class Setting:
    """What the fault families need from this machine, found once per campaign (:func:`probe`)."""

    base: Path  # the campaign's folder: traces/, reference/, and one folder per fault
    campaign: str  # the prefix of every run's marker
    disk: str = ""  # why full disks cannot be made here ("" when they can)
    user: tuple[str, ...] = ()  # the prefix that runs a command as a user without privileges
    user_note: str = ""  # who that user is, or why there is none


SETTING: Setting | None = None  # set by campaign() before any worker is forked
STRAY: list[str] = []  # processes of the campaign found after it, whose run is unknown


def fault_spec(rng: random.Random, families: Sequence[str]) -> dict[str, Any]:
    """A fault injection: which, against what, and when; drawn from ``rng`` only."""
    weights = [FAMILY_WEIGHTS[f] for f in families]
    family = rng.choices(list(families), weights)[0]
    if family == "signal":
        command = rng.choices(list(SIGNAL_COMMANDS), list(SIGNAL_COMMANDS.values()))[0]
        spec: dict[str, Any] = {"family": family, "command": command,
                                "signal": rng.choice(list(SIGNALS)),
                                "target": rng.choice(["process", "group"]),
                                "delay": round(rng.uniform(0.05, DELAYS[command]), 2)}
        if command == "check":
            spec["input"] = rng.choice(["generated", *CHECK_EXAMPLES])
            spec["trace"] = rng.random() < 0.5
        elif command == "search":
            spec["input"] = rng.randrange(len(SEARCHES))
        elif command == "replay":
            spec["input"] = rng.choice(REPLAY_BUGS)
            spec["steps"] = rng.randint(1, 20)
        else:
            spec["input"] = rng.choice(MEASURE_FILES)
        return spec
    if family == "disk":
        return {"family": family, "command": rng.choice(["check", "import"]),
                "variant": rng.choice(DISK_VARIANTS)}
    return {"family": family, "command": "", "variant": rng.choice(sorted(PATH_CASES))}


def label(spec: dict[str, Any]) -> str:
    if spec["family"] == "signal":
        return f"signal-{spec['signal']}-{spec['target']}-{spec['command']}"
    return "-".join(filter(None, [spec["family"], spec["command"], spec["variant"]]))


def inputs(count: int, seed: int, faults: float = 0.0,
           families: Sequence[str] = FAMILIES) -> Iterator[tuple[str, str]]:
    """The campaign's inputs: (name, text), the same for a seed whatever runs them. A fault's
    text is its specification (JSON); the program drawn at its index is in it (``text``)."""
    rng = random.Random(seed)
    pick = random.Random(f"faults-{seed}")
    examples = [p.read_text() for p in sorted((ROOT / "examples").rglob("*.place"))]
    for i in range(count):
        text = mutant(rng, examples) if rng.random() < 0.2 else program(rng)
        if faults > 0 and pick.random() < faults:
            spec = fault_spec(pick, families)
            yield f"fault-{seed}-{i}-{label(spec)}", json.dumps({**spec, "text": text})
        else:
            yield f"fuzz-{seed}-{i}.place", text


def run_input(name: str, text: str, budget: float) -> Outcome:
    """One input: a check in this process, or a fault injection."""
    if name.startswith("fault-"):
        return run_fault(name, json.loads(text))
    return run_one(name, text, budget)


def run_fault(name: str, spec: dict[str, Any]) -> Outcome:
    assert SETTING is not None, "campaign() prepares the faults"
    work = Path(tempfile.mkdtemp(prefix="f-", dir=SETTING.base))
    work.chmod(0o755)
    try:
        runner = {"signal": run_signal, "disk": run_disk, "paths": run_paths}[spec["family"]]
        return runner(name, spec, work, SETTING)
    except Exception as err:  # the harness's own failure: say so, never lose the input
        return Outcome(name, None, "harness", 0.0, family=spec["family"], work=str(work),
                       dead=f"harness: {type(err).__name__}: {err}")


def _unlimited() -> None:
    """In a run's process before exec: the default signal actions (a harness started in the
    background inherits an ignored SIGINT, and an ignored signal stays ignored across exec)
    and no address-space limit (the worker's is for checks, not for torch)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def run_env(marker: str, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLACEVERIFY_DEBUG", "COLUMNS")}
    (work / "tmp").mkdir(exist_ok=True)
    (work / "tmp").chmod(0o1777)
    env.update({MARK: marker, "TMPDIR": str(work / "tmp"),
                "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
                "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])})
    return env


def placeverify(*args: str) -> list[str]:
    return [sys.executable, "-m", "placeverify", *args]


def first_traceback(output: str) -> str:
    """The traceback's last line (its exception), or ""."""
    at = output.find(TRACEBACK)
    if at < 0:
        return ""
    lines = [line for line in output[at:].splitlines() if line.strip()]
    ends = [line for line in lines if not line.startswith((" ", TRACEBACK))]
    named = [line for line in ends if EXCEPTION.match(line)]
    return (named or ends or lines)[0].strip()[:200]


def internal_error(code: int | None, output: str) -> str:
    if code == ExitCode.INTERNAL_ERROR:
        return "exit 70"
    found = INTERNAL.search(output)
    if found is None:
        return ""
    line = output[output.rfind("\n", 0, found.start()) + 1:].split("\n", 1)[0]
    return line.strip()[:200]


def judge_signal(name: str, sent: bool, code: int, after: float) -> tuple[str, bool]:
    """Whether a signalled run's exit is the documented one: (why not, or ""; whether the
    signal came too late to matter). ``after``: seconds from the signal to the exit."""
    if not sent:  # it ended before the signal
        if code in UNSIGNALLED_EXITS:
            return "", True
        return f"exit {code} without a signal", False
    if code in SIGNAL_EXITS[name]:
        return "", False
    expected = " or ".join(str(c) for c in SIGNAL_EXITS[name])
    if code in UNSIGNALLED_EXITS and code != ExitCode.BACKEND_ERROR and after <= LATE_S:
        return "", True
    return f"exit {code} {after:.1f} s after {name} (expected {expected})", False


def signal_argv(spec: dict[str, Any], work: Path, setting: Setting) -> tuple[list[str], str]:
    """The command of a signal fault, and the output file it may leave in ``work/out``."""
    command, given = spec["command"], spec["input"]
    out = work / "out"
    out.mkdir()
    if command == "check":
        path = ROOT / given
        if given == "generated":
            path = work / "input.place"
            path.write_text(spec["text"], encoding="utf-8")
        argv = ["check", str(path), "--timeout", "5", "-q"]
        if spec["trace"]:
            return [*argv, "--trace", str(out / "trace.json")], "trace.json"
        return argv, ""
    if command == "search":
        return ["search", "--model", "llama3_8b", "--device", "h100_sxm", *SEARCHES[given],
                "--timeout", "5", "-q"], ""
    if command == "replay":
        return ["replay", str(setting.base / "traces" / f"{given}.json"), "--steps",
                str(spec["steps"]), "--timeout", "60", "-q"], ""
    return ["measure", str(ROOT / "examples" / "measure" / f"{given}.place"), "--timeout", "60",
            "-q"], ""


def run_signal(name: str, spec: dict[str, Any], work: Path, setting: Setting) -> Outcome:
    """Start the command in its own session, signal it after ``delay`` seconds, judge its exit;
    what it leaves behind is judged 5 s after its exit (:func:`settle`)."""
    argv, expect = signal_argv(spec, work, setting)
    marker = f"{setting.campaign}-{work.name}"
    signame = spec["signal"]
    started = time.monotonic()
    with open(work / "stdout", "wb") as stdout, open(work / "stderr", "wb") as stderr:
        proc = subprocess.Popen(placeverify(*argv), stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stderr, cwd=ROOT, env=run_env(marker, work),
                                start_new_session=True, preexec_fn=_unlimited)
        hung = False
        try:
            proc.wait(timeout=spec["delay"])
            sent = False
        except subprocess.TimeoutExpired:
            sent = True
            with contextlib.suppress(ProcessLookupError):
                if spec["target"] == "group":
                    os.killpg(proc.pid, SIGNALS[signame])
                else:
                    os.kill(proc.pid, SIGNALS[signame])
        signalled = time.monotonic()
        try:
            proc.wait(timeout=AFTER_SIGNAL_S)
        except subprocess.TimeoutExpired:
            hung = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ended = time.monotonic()
    output = (work / "stdout").read_text(errors="replace") + (work / "stderr").read_text(errors="replace")
    code = proc.returncode
    if hung:
        wrong, late = f"still running {AFTER_SIGNAL_S:g} s after {signame}", False
    else:
        wrong, late = judge_signal(signame, sent, code, ended - signalled)
    internal = internal_error(code, output)
    if internal and not wrong and code == ExitCode.INTERNAL_ERROR:
        wrong = "exit 70 (internal error)"
    detail = (f"{signame} to the {spec['target']} at {spec['delay']:g} s"
              f"{'' if sent else ' (it had ended)'}: placeverify {' '.join(argv)}")
    return Outcome(name, code, "signalled" if sent else "ended", ended - started, internal,
                   family="signal", traceback=first_traceback(output), wrong=wrong, late=late,
                   detail=detail, marker=marker, session=proc.pid, ended=ended, work=str(work),
                   expect=expect)


def _mount(folder: Path, options: str) -> str:
    """Mount a tmpfs at ``folder``: "" or why it cannot be."""
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return f"mount -t tmpfs: {err}"
    return "" if done.returncode == 0 else f"mount -t tmpfs: {(done.stderr or done.stdout).strip()}"


def _unmount(folder: Path) -> None:
    for args in (["umount", str(folder)], ["umount", "-l", str(folder)]):
        if subprocess.run(args, capture_output=True, timeout=30, check=False).returncode == 0:
            return


def fill(disk: Path, variant: str) -> set[str]:
    """Use up the tmpfs's blocks or inodes (``room``: all blocks but one page); the fillers."""
    made: set[str] = set()
    with contextlib.suppress(OSError):
        for i in range(100_000):
            path = disk / f"fill-{i}"
            made.add(path.name)
            with open(path, "wb") as handle:
                if variant != "inodes":
                    handle.write(b"x" * 4096)
    if variant == "room":
        for i in sorted(made)[:1]:
            (disk / i).unlink()
            made.discard(i)
    return made


def run_disk(name: str, spec: dict[str, Any], work: Path, setting: Setting) -> Outcome:
    """``check --trace`` or ``import -o`` into a full tmpfs: exit 4, a message and nothing
    written; with one page left, the whole file."""
    if setting.disk:
        return Outcome(name, None, "skipped", 0.0, family="disk", skipped=setting.disk,
                       work=str(work))
    disk = work / "disk"
    disk.mkdir()
    options = "size=64k" + (",nr_inodes=16" if spec["variant"] == "inodes" else "")
    why = _mount(disk, options)
    if why:
        return Outcome(name, None, "skipped", 0.0, family="disk", skipped=f"skipped: {why}",
                       work=str(work))
    target_name = "trace.json" if spec["command"] == "check" else "out.place"
    target = disk / target_name
    argv = (["check", TRACE_BUG, "--trace", str(target), "-q"] if spec["command"] == "check" else
            ["import", *IMPORT_ARGS, "-o", str(target)])
    success = 1 if spec["command"] == "check" else 0
    marker = f"{setting.campaign}-{work.name}"
    started = time.monotonic()
    try:
        fillers = fill(disk, spec["variant"])
        done = subprocess.run(placeverify(*argv), capture_output=True, text=True, errors="replace",
                              cwd=ROOT, env=run_env(marker, work), timeout=120, check=False,
                              preexec_fn=_unlimited)
        left = sorted(set(os.listdir(disk)) - fillers)
        written = target.read_bytes() if target.is_file() else None
    finally:
        _unmount(disk)
    output = done.stdout + done.stderr
    code, wrong, leftover = done.returncode, "", ""
    reference = (setting.base / "reference" / target_name).read_bytes()
    if spec["variant"] == "room":
        if code != success:
            wrong = f"exit {code} with room for the file (expected {success})"
        elif written != reference:
            leftover = (f"{target_name} is not the whole file ({len(written or b'')} of "
                        f"{len(reference)} bytes)")
        elif left != [target_name]:
            leftover = "left: " + ", ".join(n for n in left if n != target_name)
    else:
        if code != ExitCode.READ_ERROR:
            wrong = f"exit {code} on a disk without {spec['variant']} (expected 4)"
        elif not done.stderr.strip() or TRACEBACK in done.stderr:
            wrong = "exit 4 without a message"
        if left:
            leftover = "half-written: " + ", ".join(left)
    detail = f"{spec['variant']} used up on a 64 KiB tmpfs: placeverify {' '.join(argv)}"
    if spec["variant"] == "room":
        detail = f"one page left on a 64 KiB tmpfs: placeverify {' '.join(argv)}"
    return Outcome(name, code, "disk", time.monotonic() - started, internal_error(code, output),
                   family="disk", traceback=first_traceback(output), wrong=wrong,
                   leftover=leftover, detail=detail, marker=marker, ended=time.monotonic(),
                   work=str(work))


def run_paths(name: str, spec: dict[str, Any], work: Path, setting: Setting) -> Outcome:
    """A path the command may not read or write, or a folder where a file belongs: exit 4 with
    a message, nothing written."""
    needs_user, template = PATH_CASES[spec["variant"]]
    if needs_user and not setting.user:
        return Outcome(name, None, "skipped", 0.0, family="paths", skipped=setting.user_note,
                       work=str(work))
    made = {"unreadable_place": work / "unreadable.place", "unreadable_json": work / "unreadable.json",
            "read_only": work / "read-only", "folder": work / "folder"}
    shutil.copyfile(ROOT / "examples" / "zero-paper" / "zero3.place", made["unreadable_place"])
    shutil.copyfile(ROOT / IMPORT_ARGS[2], made["unreadable_json"])
    made["unreadable_place"].chmod(0)
    made["unreadable_json"].chmod(0)
    made["read_only"].mkdir()
    made["read_only"].chmod(0o555)
    made["folder"].mkdir()
    argv = [part.format(**{k: str(v) for k, v in made.items()}) for part in template]
    marker = f"{setting.campaign}-{work.name}"
    prefix = list(setting.user) if needs_user else []
    started = time.monotonic()
    done = subprocess.run([*prefix, *placeverify(*argv)], capture_output=True, text=True,
                          errors="replace", cwd=ROOT, env=run_env(marker, work), timeout=120,
                          check=False, preexec_fn=_unlimited)
    output = done.stdout + done.stderr
    wrong = ""
    if done.returncode != ExitCode.READ_ERROR:
        wrong = f"exit {done.returncode} (expected 4): {done.stderr.strip().splitlines()[-1:]}"
    elif not done.stderr.strip():
        wrong = "exit 4 without a message"
    left = [f"{d.name}/{n}" for d in (made["read_only"], made["folder"]) for n in os.listdir(d)]
    who = f" as {setting.user_note}" if needs_user else ""
    return Outcome(name, done.returncode, "paths", time.monotonic() - started,
                   internal_error(done.returncode, output), family="paths",
                   traceback=first_traceback(output), wrong=wrong,
                   leftover=("written: " + ", ".join(left)) if left else "",
                   detail=f"{spec['variant']}{who}: placeverify {' '.join(argv)}", marker=marker,
                   ended=time.monotonic(), work=str(work))


def marked(marker: str, session: int = 0, ended: float = math.inf) -> dict[int, str]:
    """Every live process whose environment holds ``MARK=marker...``, or that is in session
    ``session`` and was started before ``ended`` (``time.monotonic()``; a later one has only
    reused the pid): pid -> its command line."""
    needle = f"{MARK}={marker}".encode()
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            # after "pid (comm)": state, ppid, pgrp, session, ..., starttime (field 22)
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
            if stat[0] in ("Z", "X"):
                continue
            in_session = (session > 0 and int(stat[3]) == session
                          and int(stat[19]) / ticks <= ended + 1.0)
            if not in_session and needle not in (entry / "environ").read_bytes():
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry.name)] = command.strip()[:160]
    return found


def kill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def left_files(folder: Path, allowed: str = "") -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.iterdir() if p.name != allowed)


def settle(outcome: Outcome) -> None:
    """5 s after a fault's exit: the processes of its run still alive (then killed), what it
    left in its TMPDIR, and a half-written or stray output; its folder is then removed."""
    if not outcome.work:
        return
    work = Path(outcome.work)
    found: list[str] = []
    if outcome.marker:
        processes = marked(outcome.marker, outcome.session, outcome.ended)
        kill(list(processes))
        found += [f"process {pid} {command}" for pid, command in sorted(processes.items())]
    found += [f"TMPDIR/{name}" for name in left_files(work / "tmp")]
    found += [f"out/{name} (half-written)" for name in left_files(work / "out", outcome.expect)]
    if outcome.expect == "trace.json" and (work / "out" / "trace.json").exists():
        try:
            json.loads((work / "out" / "trace.json").read_text())
        except (ValueError, OSError):
            found.append("out/trace.json (not a whole trace)")
    if found:
        outcome.leftover = "; ".join(filter(None, [outcome.leftover, *found]))
    with contextlib.suppress(OSError):
        for path in work.rglob("*"):
            with contextlib.suppress(OSError):
                path.chmod(0o700 if path.is_dir() else 0o600)
    shutil.rmtree(work, ignore_errors=True)


def settle_due(pending: list[Outcome], force: bool = False) -> None:
    """Settle the pending faults whose 5 s have passed (all of them with ``force``, waiting)."""
    while pending:
        due = pending[0].ended + SETTLE_S
        now = time.monotonic()
        if now < due:
            if not force:
                return
            time.sleep(due - now)
        settle(pending.pop(0))


def probe(base: Path) -> Setting:
    """What this machine allows: tmpfs mounts, and a user without privileges."""
    setting = Setting(base, f"pvfuzz{os.getpid()}x{uuid.uuid4().hex[:8]}")
    trial = base / "mount-probe"
    trial.mkdir()
    setting.disk = _mount(trial, "size=64k")
    if not setting.disk:
        _unmount(trial)
    trial.rmdir()
    secret = base / "secret"
    secret.write_text("x")
    secret.chmod(0)
    # The same interpreter, or the runs would test another Python (a user who cannot enter the
    # folder of this one's standard library gets the system's, with this one's packages).
    check = [sys.executable, "-c", f"import sys; print(sys.version, flush=True); open({str(secret)!r})"]
    tried = []
    for prefix, who in ((NOBODY, "nobody"),
                        (NO_DAC, "root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH")):
        try:
            done = subprocess.run([*prefix, *check], capture_output=True, text=True, timeout=60,
                                  check=False)
        except (OSError, subprocess.SubprocessError) as err:
            tried.append(f"{who}: {err}")
            continue
        if done.stdout.strip() != sys.version.strip() and "PermissionError" in done.stderr:
            tried.append(f"{who}: runs Python {done.stdout.split()[0]}, not {sys.version.split()[0]}")
        elif "PermissionError" in done.stderr and "Errno 13" in done.stderr:
            setting.user, setting.user_note = prefix, who
            if tried:
                setting.user_note += f" ({'; '.join(tried)})"
            break
        else:
            tried.append(f"{who}: " + (done.stderr.strip().splitlines()
                                       or ["it could read a mode-000 file"])[-1])
    else:
        setting.user_note = "skipped: no user without privileges: " + "; ".join(tried)
    secret.unlink()
    if setting.disk:
        setting.disk = f"skipped: {setting.disk}"
    return setting


def prepare(setting: Setting, replays: bool = True) -> None:
    """The replays' traces (with ``replays``) and the files a complete write must equal."""
    traces = setting.base / "traces"
    reference = setting.base / "reference"
    traces.mkdir()
    reference.mkdir()
    env = run_env(f"{setting.campaign}-prepare", setting.base)
    for bug in REPLAY_BUGS if replays else ():
        subprocess.run(placeverify("check", f"examples/bugs/{bug}.place", "-q", "--trace",
                                   str(traces / f"{bug}.json")),
                       cwd=ROOT, env=env, capture_output=True, timeout=300, check=False)
    subprocess.run(placeverify("check", TRACE_BUG, "-q", "--trace", str(reference / "trace.json")),
                   cwd=ROOT, env=env, capture_output=True, timeout=300, check=False)
    subprocess.run(placeverify("import", *IMPORT_ARGS, "-o", str(reference / "out.place")),
                   cwd=ROOT, env=env, capture_output=True, timeout=300, check=False)
    missing = [p.name for p in (*(traces / f"{b}.json" for b in REPLAY_BUGS if replays),
                                reference / "trace.json", reference / "out.place") if not p.is_file()]
    if missing:
        raise RuntimeError(f"could not prepare the faults' inputs: {', '.join(missing)}")


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[list[int]]:
    """One busy-loop process per core (``processes``), each killed when this ends (and by the
    kernel if this process dies first)."""
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(processes):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent))
        yield [h.pid for h in hogs]
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                hog.kill()
            hog.wait()


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
        outcome = run_input(name, text, budget)
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
    pending: list[Outcome] = []
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
        results[index] = Outcome(name, None, "dead", time.monotonic() - worker.started, dead=why,
                                 family="check" if name.startswith("fuzz-") else "fault")
        progress(len(results))
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()
        worker.conn.close()
        fresh = _start(context, budget, memory_mib)
        assign(fresh)
        return fresh

    def limit(worker: _Worker) -> float:
        assert worker.job is not None
        return kill_after if worker.job[1].startswith("fuzz-") else max(kill_after, FAULT_KILL_AFTER)

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
                    if outcome.work:
                        pending.append(outcome)
                    progress(len(results))
                    assign(worker)
                elif worker.process.sentinel in ready:
                    worker.process.join()
                    pool[i] = died(worker, f"exit code {worker.process.exitcode}")
                elif now - worker.started > limit(worker):
                    pool[i] = died(worker, f"killed after {limit(worker):g} s")
            settle_due(pending)
    finally:
        for worker in pool:
            if worker.process.is_alive():
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
                worker.process.join(timeout=5)
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()
        settle_due(pending, force=True)
    return [results[i] for i in range(len(jobs)) if i in results]  # a prefix, stopped at stop_at


def campaign(count: int, seed: int, budget: float, jobs: int = 0, kill_after: float | None = None,
             memory_mib: int | None = None,
             progress: Callable[[int], None] = lambda _done: None,
             max_seconds: float | None = None, faults: float = 0.0,
             families: Sequence[str] = FAMILIES) -> list[Outcome]:
    """Run ``count`` inputs of ``seed``: in this process (``jobs`` 0) or in ``jobs`` workers;
    with ``max_seconds``, no input is started after that long (the outcomes are then fewer).
    A share ``faults`` of them are fault injections of ``families``; each is settled (its
    leftovers found) before this returns, and the campaign's processes left unattributed are
    listed in :data:`STRAY`."""
    global SETTING
    todo = list(inputs(count, seed, faults, families))
    stop_at = time.monotonic() + (max_seconds if max_seconds is not None else math.inf)
    STRAY.clear()
    base = Path(tempfile.mkdtemp(prefix="pv-fuzz-"))
    base.chmod(0o755)
    try:
        if any(name.startswith("fault-") for name, _ in todo):
            SETTING = probe(base)
            prepare(SETTING, replays="signal" in families)
        if jobs > 0:
            return _parallel(todo, jobs, budget,
                             kill_after if kill_after is not None else 4 * budget + 30,
                             memory_mib, progress, stop_at)
        outcomes: list[Outcome] = []
        pending: list[Outcome] = []
        try:
            for name, text in todo:
                if time.monotonic() >= stop_at:
                    break
                outcome = run_input(name, text, budget)
                outcome.rss_mib = _rss_mib()
                outcomes.append(outcome)
                if outcome.work:
                    pending.append(outcome)
                settle_due(pending)
                progress(len(outcomes))
        finally:
            settle_due(pending, force=True)
        return outcomes
    finally:
        if SETTING is not None:
            stray = marked(SETTING.campaign)
            kill(list(stray))
            STRAY.extend(f"process {pid} {command}" for pid, command in sorted(stray.items()))
        SETTING = None
        shutil.rmtree(base, ignore_errors=True)


def _percent(seconds: float, budget: float) -> float:
    return 100.0 * (seconds - budget) / budget


def summary(outcomes: list[Outcome], budget: float, stray: Sequence[str] = (),
            command: str = "", load: str = "") -> str:
    """The campaign's figures: first one line each for inputs, internal errors, tracebacks,
    leftovers, wrong exits and budget overruns, then the details."""
    checks = [o for o in outcomes if o.family == "check"]
    faults = [o for o in outcomes if o.family != "check"]
    by_code: dict[str, int] = {}
    by_verdict: dict[str, int] = {}
    for o in checks:
        code = "dead" if o.code is None else str(o.code)
        by_code[code] = by_code.get(code, 0) + 1
        by_verdict[o.verdict] = by_verdict.get(o.verdict, 0) + 1
    internal = [o for o in outcomes if o.internal]
    tracebacks = [o for o in outcomes if o.traceback]
    leftovers = [o for o in outcomes if o.leftover]
    wrong = [o for o in outcomes if o.wrong]
    skipped = [o for o in faults if o.skipped]
    dead = [o for o in outcomes if o.code is None and not o.skipped]
    timed = [o for o in checks if o.code is not None]
    over = [o for o in timed if o.seconds > budget * (1 + OVERRUN)]
    worst = max(timed, key=lambda o: o.seconds, default=None)
    slow = sorted(checks, key=lambda o: -o.seconds)[:5]
    peak = max(outcomes, key=lambda o: o.rss_mib, default=None)
    codes = ", ".join(f"{c}: {n}" for c, n in sorted(by_code.items(),
                                                     key=lambda kv: (not kv[0].isdigit(),
                                                                     int(kv[0]) if kv[0].isdigit() else 0)))
    seconds = [o.seconds for o in checks] or [0.0]
    reached = sum(1 for o in checks if o.verdict in ("proved", "refuted", "unknown"))
    families: dict[str, int] = {}
    for o in faults:
        families[o.family] = families.get(o.family, 0) + 1
    if worst is None:
        worst_text = "worst overrun -"
    elif worst.seconds > budget:
        worst_text = (f"worst overrun {_percent(worst.seconds, budget):+.1f}% of the {budget:g} s "
                      f"budget ({worst.name}, {worst.seconds:.2f} s)")
    else:
        worst_text = (f"worst overrun none (slowest {worst.name}, {worst.seconds:.2f} s, "
                      f"{100 * worst.seconds / budget:.0f}% of the {budget:g} s budget)")
    lines = [f"command: {command}"] if command else []
    lines += [f"inputs {len(outcomes)} ({len(checks)} checks, {len(faults)} faults"
              + "".join(f", {f} {n}" for f, n in sorted(families.items())) + ")",
              f"internal errors {len(internal)}",
              f"tracebacks {len(tracebacks)}",
              f"leftovers {len(leftovers) + len(stray)}",
              f"wrong exits {len(wrong)}",
              f"budget overruns {len(over)} (over {100 * OVERRUN:g}% of the budget); {worst_text}"]
    if load:
        lines.append(f"load: {load}")
    for reason in sorted({o.skipped for o in skipped}):
        which = sorted({o.name.split("-", 3)[3] for o in skipped if o.skipped == reason})
        lines.append(f"SKIPPED {sum(o.skipped == reason for o in skipped)} faults "
                     f"({', '.join(which)}): {reason}")
    lines += [f"check exit codes {codes or '-'}; {reached} reached the verifier",
              "verdicts " + (", ".join(f"{v}: {n}" for v, n in sorted(by_verdict.items())) or "-"),
              f"dead processes {len(dead)}; signals that came after the end "
              f"{sum(o.late for o in faults)}",
              f"seconds per check: median {statistics.median(seconds):.3f}, "
              f"p99 {sorted(seconds)[int(0.99 * (len(seconds) - 1))]:.2f}, max {max(seconds):.2f}",
              "slowest " + (", ".join(f"{o.name} {o.seconds:.2f} s ({o.verdict})" for o in slow) or "-"),
              f"peak RSS {peak.rss_mib:.0f} MiB (after {peak.name})" if peak else "peak RSS -"]
    if faults:
        fault_codes: dict[str, int] = {}
        for o in faults:
            key = "skipped" if o.skipped else "dead" if o.code is None else str(o.code)
            fault_codes[key] = fault_codes.get(key, 0) + 1
        lines.append("fault exit codes " + ", ".join(f"{c}: {n}" for c, n in sorted(fault_codes.items())))
        kinds: dict[str, list[Outcome]] = {}
        for o in faults:
            kinds.setdefault(o.name.split("-", 3)[-1], []).append(o)
        for kind, runs in sorted(kinds.items()):
            found = {"wrong exits": sum(bool(o.wrong) for o in runs),
                     "tracebacks": sum(bool(o.traceback) for o in runs),
                     "internal": sum(bool(o.internal) for o in runs),
                     "leftovers": sum(bool(o.leftover) for o in runs),
                     "skipped": sum(bool(o.skipped) for o in runs)}
            said = ", ".join(f"{what} {n}" for what, n in found.items() if n) or "clean"
            lines.append(f"  {kind}: {len(runs)} runs, {said}")

    def said(o: Outcome) -> str:
        return f" [{o.detail}]" if o.detail else ""

    lines += [f"  internal: {o.name}: {o.internal}{said(o)}" for o in internal[:10]]
    lines += [f"  traceback: {o.name}: {o.traceback}{said(o)}" for o in tracebacks[:10]]
    lines += [f"  wrong exit: {o.name}: {o.wrong}{said(o)}" for o in wrong[:20]]
    lines += [f"  leftover: {o.name}: {o.leftover}{said(o)}" for o in leftovers[:20]]
    lines += [f"  leftover: (campaign) {s}" for s in stray[:10]]
    lines += [f"  dead: {o.name}: {o.dead}" for o in dead[:10]]
    lines += [f"  over budget: {o.name}: {o.seconds:.2f} s ({o.verdict})" for o in over[:10]]
    return "\n".join(lines)


DOCS_NOTE = """The inputs are generated programs (random models, 1-5 axes of sizes 1..4096, presets and
tuples, step blocks with loops, collectives, scales, clips, seeds) and, one input in five, token
mutations of the bundled examples, each checked as `check --timeout BUDGET` does (verification,
text report, JSON document, trace) in a worker with a 4 GiB address-space limit. With `--faults F`
a share F of the inputs are faults instead: SIGINT, SIGTERM or SIGKILL at a random point of `check`,
`search`, `replay` or `measure` (no leftover process 5 s later, the documented exit), a full tmpfs
disk under `check --trace` and `import -o` (exit 4, nothing half-written), and unreadable or
unwritable paths (exit 4). `--load` runs the campaign beside one busy-loop process per core."""


SUMMARY_LABELS = ("inputs", "internal errors", "tracebacks", "leftovers", "wrong exits",
                  "budget overruns", "load:", "SKIPPED", "check exit codes", "verdicts",
                  "dead processes", "seconds per check:", "slowest", "peak RSS")


def summary_figures(text: str) -> list[tuple[str, str]]:
    """The summary's lines as (what, figure) rows, split after the label each line of
    :func:`summary` starts with (``internal errors 0`` is ``("internal errors", "0")``); the
    command line is left out, as the section states its own."""
    rows = []
    for line in text.splitlines():
        label = next((x for x in SUMMARY_LABELS if line.startswith(x)), None)
        if label is not None:
            rows.append((label.rstrip(":"), line[len(label):].strip().replace("|", "/") or "-"))
    return rows


def failing(o: Outcome, budget: float) -> bool:
    return bool(o.internal or o.traceback or o.wrong or o.leftover or o.dead
                or (o.family == "check" and o.code is not None and o.seconds > budget * (1 + OVERRUN)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=5.0, help="seconds per check (--timeout)")
    parser.add_argument("-j", "--jobs", type=int, default=1,
                        help="worker processes (0: run in this process)")
    parser.add_argument("--faults", type=float, default=0.0,
                        help="share of the inputs that are fault injections (0..1, e.g. 0.02)")
    parser.add_argument("--fault-families", default=",".join(FAMILIES),
                        help=f"comma-separated, of {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--load", action="store_true",
                        help="run beside a CPU hog: one busy-loop process per core")
    parser.add_argument("--kill-after", type=float, default=None,
                        help="seconds on one input before its worker is killed (default 4 x "
                             f"budget + 30; a fault: at least {FAULT_KILL_AFTER:g})")
    parser.add_argument("--memory-limit", type=int, default=4096,
                        help="address-space limit of each worker, MiB (0: none)")
    parser.add_argument("--save", type=Path, default=None,
                        help="write failing inputs (internal error, traceback, wrong exit, "
                             "leftover, dead, over budget) to this folder")
    parser.add_argument("--show", type=int, default=None, help="print input N and exit")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="start no input after this long (report the inputs run by then)")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    families = tuple(f for f in args.fault_families.split(",") if f)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not 0 <= args.faults <= 1:
        parser.error(f"--faults takes 0..1 and --fault-families {', '.join(FAMILIES)}")
    if args.show is not None:
        for index, (name, text) in enumerate(inputs(args.show + 1, args.seed, args.faults, families)):
            if index == args.show:
                print(f"{name}: {text}" if name.startswith("fault-") else text, end="")
        return
    started = time.monotonic()
    step = max(1, args.count // 20)

    def progress(done: int) -> None:
        if done % step == 0:
            print(f"  {done}/{args.count} in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)

    command = " ".join(["python", "benchmarks/fuzz.py", *sys.argv[1:]])
    hogs = (os.cpu_count() or 1) if args.load else 0
    with cpu_hog(hogs) as pids:
        outcomes = campaign(args.count, args.seed, args.budget, args.jobs, args.kill_after,
                            args.memory_limit or None, progress, args.max_seconds, args.faults,
                            families)
        load = (f"{len(pids)} busy-loop processes beside it (one per core); load average "
                f"{os.getloadavg()[0]:.1f} at the end") if pids else ""
    if len(outcomes) < args.count:
        print(f"stopped after --max-seconds: inputs 0..{len(outcomes) - 1} of {args.count} ran")
    text = summary(outcomes, args.budget, STRAY, command, load)
    print(text)
    wall = f"{time.monotonic() - started:.0f} s"
    print(f"wall {wall}")
    if args.docs:
        figures.write_section("fuzz", "Fuzz: generated and mutated inputs, faults and load",
                              [*summary_figures(text), ("whole run", wall)], name=args.docs_name,
                              facts=figures.machine(load=True), notes=[DOCS_NOTE])
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        texts = dict(inputs(args.count, args.seed, args.faults, families))
        for o in outcomes:
            if failing(o, args.budget):
                name = o.name if o.family == "check" else f"{o.name}.json"
                (args.save / name).write_text(texts[o.name])


if __name__ == "__main__":
    main()
