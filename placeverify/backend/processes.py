"""Measure ranks: one fresh ``python -m`` interpreter per rank, its job and result in JSON files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import placeverify
from placeverify.backend import janitor
from placeverify.backend.available import torch_available
from placeverify.backend.contract import (
    FIRST_FAILURE_GRACE,
    GRACE_SECONDS,
    PEER_ERROR,
    POLL_SECONDS,
    BackendFailure,
    FailureKind,
    MeasureJob,
    blocked_signals,
)
from placeverify.backend.follow import WATCH_ENV

MEASURE_WORKER = "placeverify.measure.worker"  # python -m MODULE JOB RANK STORE OUT
STDERR_TAIL = 2000


def _reason(path: Path) -> str:
    """The error a worker died of: the last ``SomethingError: message`` line of its stderr (torch
    prefixes each line with ``[rankN]:``), or its last line; never the whole traceback."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", line).rstrip() for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*", line):
            return line[:STDERR_TAIL]
    return lines[-1][:STDERR_TAIL] if lines else ""




def failure_path(out_path: str | os.PathLike[str]) -> str:
    """Where a measure rank writing ``rankN.json`` records what it died of (``rankN.failure.json``)."""
    return str(Path(out_path).with_suffix(".failure.json"))


@dataclass(frozen=True)
class RankFailure:
    """One rank's death: what it said it died of and when (monotonic; None if it said nothing:
    killed, aborted, a failure before its handler), and whether it only saw a peer go away."""

    rank: int
    error: str
    at: float | None
    secondary: bool


def _rank_failure(folder: Path, rank: int) -> RankFailure | None:
    try:
        doc = json.loads(Path(failure_path(folder / f"rank{rank}.json")).read_text(encoding="utf-8"))
        error, at = str(doc["error"]), float(doc["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return RankFailure(rank, error, at, bool(PEER_ERROR.search(error)))


def _first_failure(folder: Path, processes: list[subprocess.Popen[bytes]]) -> BackendFailure:
    """The root cause of a failed measurement: the rank that failed first of its own accord,
    whatever order the deaths reached this process in. A rank's own exception (recorded with its
    time) or a death with nothing said (a signal, an abort) ranks above an error that only says a
    peer went away; among equals the earliest wins (a death with nothing said at the moment this
    process saw it). Then every rank is stopped."""
    seen = time.monotonic()
    until = seen + FIRST_FAILURE_GRACE
    codes = [p.poll() for p in processes]
    failures: list[RankFailure] = []

    def gather() -> None:
        failures.clear()
        for rank, code in enumerate(codes):
            recorded = _rank_failure(folder, rank)
            if recorded is not None:
                failures.append(recorded)
            elif code not in (None, 0) and not (folder / f"rank{rank}.json").exists():
                failures.append(RankFailure(rank, _reason(folder / f"rank{rank}.err"), None, False))

    gather()
    # The first to fail is often the last to exit (its teardown outlasts its peers' errors):
    # give a rank that recorded its own failure, or every failed rank, a moment to finish dying.
    while time.monotonic() < until and any(codes[f.rank] is None for f in failures):
        time.sleep(POLL_SECONDS)
        codes = [p.poll() for p in processes]
        gather()
    _stop_processes(processes)
    first = min(failures, key=lambda f: (f.secondary, seen if f.at is None else f.at, f.rank))
    code = codes[first.rank]
    status = f"exited with status {code}" if code is not None else "failed"
    detail = first.error or _reason(folder / f"rank{first.rank}.err")
    return BackendFailure(FailureKind.CRASH, f"rank {first.rank} of {len(processes)} {status}"
                          + (f": {detail}" if detail else ""))


def _stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """Kill every subprocess rank that is still running, then reap them."""
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
            janitor.forget(proc.pid)


def _rank_environment(folder: Path, timeout: float) -> dict[str, str]:
    """A rank's environment: one thread per library, this checkout first on the path, and how
    to follow this process (:func:`placeverify.backend.follow.watch_parent_from_env`)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env[WATCH_ENV] = json.dumps({"parent": os.getpid(), "leave": [str(folder)],
                                 "seconds": timeout + GRACE_SECONDS})
    root = str(Path(placeverify.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _start_rank(processes: list[subprocess.Popen[bytes]], spec_path: Path, rank: int,
                folder: Path, env: dict[str, str], worker: Sequence[str]) -> None:
    """Start rank ``rank`` with its stderr in ``rankN.err``; it is in ``processes`` (and the
    janitor's list) before a Ctrl-C can land."""
    err = open(folder / f"rank{rank}.err", "wb")  # noqa: SIM115 (closed below)
    try:
        with blocked_signals():
            processes.append(subprocess.Popen(
                [sys.executable, *worker, str(spec_path), str(rank),
                 str(folder / "store"), str(folder / f"rank{rank}.json")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                cwd=folder))
            janitor.watch(processes[-1].pid)
    finally:
        err.close()


def _watch(processes: list[subprocess.Popen[bytes]], folder: Path, timeout: float) -> None:
    """Wait until every rank has ended; a failed rank (the first to fail is named) or the
    deadline stops them all."""
    world = len(processes)
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in processes]
        # A rank that wrote its whole result (the worker renames it into place) and then died
        # in its teardown (gloo's threads can abort the process at exit) measured all it was
        # asked to: only a rank that died without its result failed.
        failed = [r for r, c in enumerate(codes)
                  if c not in (None, 0) and not (folder / f"rank{r}.json").exists()]
        if failed:
            raise _first_failure(folder, processes)
        if all(c is not None for c in codes):
            return
        if time.monotonic() > deadline:
            hung = [r for r, c in enumerate(codes) if c is None]
            _stop_processes(processes)
            raise BackendFailure(
                FailureKind.HANG,
                f"rank(s) {', '.join(map(str, hung))} of {world} did not finish within "
                f"{timeout:g} s (a hung collective?); all ranks were stopped")
        time.sleep(POLL_SECONDS)


def run_workers(spec: MeasureJob, *, timeout: float,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run ``spec`` on ``spec.world`` processes; the per-rank results, in rank order."""
    return run_jobs([spec], timeout=timeout, progress=progress)[0]


def run_jobs(specs: Sequence[MeasureJob], *, timeout: float,
             progress: Callable[[str], None] | None = None, peak: bool = False,
             device: str = "cpu", worker: Sequence[str] = ("-m", MEASURE_WORKER)
             ) -> list[list[dict[str, Any]]]:
    """Run several specs of one world size in the same processes, one after the other (torch is
    imported once per rank); for each spec, the per-rank results in rank order. With ``peak`` the
    ranks also meter the allocator's live bytes phase by phase (slower on CPU: the profiler
    records every allocation); ``device`` is where the model lives (``cuda``: every rank on the
    current GPU, collectives still over gloo, which takes CUDA tensors); ``worker`` is what
    the interpreter runs with a rank's four arguments (a script that wraps the measure worker
    around another model: ``benchmarks/models/worker.py``)."""
    if not specs:
        return []
    worlds = {spec.world for spec in specs}
    if len(worlds) != 1:
        raise ValueError(f"specs of one job share a world size, got {sorted(worlds)}")
    world = worlds.pop()
    if not torch_available():
        raise BackendFailure(FailureKind.NO_TORCH, "torch is not installed; install placeverify "
                             "with the 'torch' extra (pip install 'placeverify[torch]')")
    janitor.start()
    folder = Path(tempfile.mkdtemp(prefix="placeverify-measure-"))
    janitor.register(folder)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        spec_path = folder / "job.json"
        spec_path.write_text(json.dumps({"specs": [s.to_json() for s in specs],
                                         "timeout": timeout, "peak": peak, "device": device}),
                             encoding="utf-8")
        env = _rank_environment(folder, timeout)
        for rank in range(world):
            _start_rank(processes, spec_path, rank, folder, env, worker)
        if progress is not None:
            progress(f"started {world} ranks: " + "; ".join(s.label() for s in specs))
        _watch(processes, folder, timeout)
        documents = []
        for rank in range(world):
            path = folder / f"rank{rank}.json"
            try:
                documents.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as error:
                raise BackendFailure(FailureKind.ERROR, f"rank {rank} finished without a readable "
                                     f"result: {error}") from None
        return [[doc["runs"][index] for doc in documents] for index in range(len(specs))]
    finally:
        _stop_processes(processes)
        janitor.remove(folder)
