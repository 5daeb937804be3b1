"""Start one worker process per rank, watch them, and collect their JSON results.

Robustness (REFERENCE §5): ranks meet through a ``FileStore`` in a private temporary folder (no
ports); each worker passes ``timeout=`` to ``init_process_group``, and this parent is the
watchdog: the first rank to fail stops the others at once, and a run that outlives its deadline
(a mismatched collective hangs) is stopped as a whole. Only the processes started here are
killed, by their handles. Results come back as JSON files; nothing is unpickled. This module
does not import torch, so a missing torch is reported before anything starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import placeverify
from placeverify.measure.spec import RunSpec

POLL_SECONDS = 0.05
STDERR_TAIL = 2000


class BackendError(Exception):
    """The torch backend could not run: torch missing, a rank crashed or hung."""


def torch_available() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or masked installation
        return False


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


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.kill()
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def run_workers(spec: RunSpec, *, timeout: float,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run ``spec`` on ``spec.world`` processes; the per-rank results, in rank order."""
    return run_jobs([spec], timeout=timeout, progress=progress)[0]


def run_jobs(specs: list[RunSpec], *, timeout: float,
             progress: Callable[[str], None] | None = None) -> list[list[dict[str, Any]]]:
    """Run several specs of one world size in the same processes, one after the other (torch is
    imported once per rank); for each spec, the per-rank results in rank order."""
    if not specs:
        return []
    worlds = {spec.world for spec in specs}
    if len(worlds) != 1:
        raise ValueError(f"specs of one job share a world size, got {sorted(worlds)}")
    world = worlds.pop()
    if not torch_available():
        raise BackendError("torch is not installed; install placeverify with the 'torch' extra "
                           "(pip install 'placeverify[torch]')")
    folder = Path(tempfile.mkdtemp(prefix="placeverify-measure-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        spec_path = folder / "job.json"
        spec_path.write_text(json.dumps({"specs": [s.to_json() for s in specs],
                                         "timeout": timeout}), encoding="utf-8")
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
        root = str(Path(placeverify.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        for rank in range(world):
            err = open(folder / f"rank{rank}.err", "wb")  # noqa: SIM115 (closed below)
            try:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "placeverify.measure.worker", str(spec_path), str(rank),
                     str(folder / "store"), str(folder / f"rank{rank}.json")],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                    cwd=folder))
            finally:
                err.close()
        if progress is not None:
            progress(f"started {world} ranks: " + "; ".join(s.label() for s in specs))
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in processes]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank = failed[0]
                _stop(processes)
                detail = _reason(folder / f"rank{rank}.err")
                raise BackendError(f"rank {rank} of {world} exited with status {codes[rank]}"
                                   + (f": {detail}" if detail else ""))
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                hung = [r for r, c in enumerate(codes) if c is None]
                _stop(processes)
                raise BackendError(
                    f"rank(s) {', '.join(map(str, hung))} of {world} did not finish within "
                    f"{timeout:g} s (a hung collective?); all ranks were stopped")
            time.sleep(POLL_SECONDS)
        documents = []
        for rank in range(world):
            path = folder / f"rank{rank}.json"
            try:
                documents.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as error:
                raise BackendError(f"rank {rank} finished without a readable result: {error}") \
                    from None
        return [[doc["runs"][index] for doc in documents] for index in range(len(specs))]
    finally:
        _stop(processes)
        shutil.rmtree(folder, ignore_errors=True)
