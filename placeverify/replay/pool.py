"""Start the ranks of a replay, watch them, and collect their JSON answers (no torch here).

Ranks are forked from a ``multiprocessing`` forkserver that has already imported torch and the
worker module (REFERENCE §5: ~1 s of ``import torch`` per process is the cold cost; later replays
in the same placeverify process fork from the warm server in a fraction of that). Each rank gets
its job as a JSON string and a ``torch.distributed.FileStore`` path in a private temporary folder
(no port is chosen by us; gloo binds loopback ports the kernel picks, ``GLOO_SOCKET_IFNAME=lo``),
and answers on a pipe with JSON bytes — nothing is unpickled from a child or from a file.

The parent is the watchdog: when a rank exits without an answer, answers with an error, or the
timeout passes, every rank's process group (each rank calls ``setsid``) is killed with SIGKILL
and reaped before the error is reported; the ranks also die with the parent (``PR_SET_PDEATHSIG``
and a thread watching the parent) and never outlive their own deadline.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from placeverify.replay.plan import RunSpec

PRELOAD = ["placeverify.replay.warm", "placeverify.cli"]  # cli: the console script is re-run as __mp_main__


class ReplayFailure(Exception):
    """The replay could not run: torch missing, a rank crashed, hung, or failed."""

    def __init__(self, kind: str, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # no_torch | crash | hang | error | unsupported
        self.message = message
        self.detail = detail


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@dataclass
class Pool:
    """A warm forkserver for replay ranks; one per placeverify process (see :func:`pool`)."""

    context: Any = None
    last_pids: list[int] = field(default_factory=list)
    runs: int = 0

    def prestart(self) -> None:
        """Start the forkserver now, so that it imports torch while this process asks Z3."""
        self.start()
        import multiprocessing.forkserver as forkserver

        forkserver.ensure_running()

    def start(self) -> None:
        if self.context is None:
            if not torch_available():
                raise ReplayFailure("no_torch", "torch is not installed: install placeverify "
                                    "with the torch extra (pip install 'placeverify[torch]')")
            loopback = "lo0" if sys.platform == "darwin" else "lo"
            os.environ["GLOO_SOCKET_IFNAME"] = loopback  # ranks talk over loopback only
            os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            context = mp.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            self.context = context

    def run(self, spec: RunSpec, timeout: float,
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """Run ``spec`` on ``spec.world`` ranks; their result documents, by rank."""
        self.start()
        world = spec.world
        job = spec.to_json()
        procs: list[Any] = []
        conns: dict[int, Connection] = {}
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        with tempfile.TemporaryDirectory(prefix="placeverify-replay-") as folder:
            store = os.path.join(folder, "store")
            try:
                for rank in range(world):
                    receive, send = self.context.Pipe(duplex=False)
                    proc = self.context.Process(
                        target=worker_entry,
                        args=(job, rank, world, store, send, os.getpid(), timeout),
                        name=f"placeverify-replay-rank-{rank}", daemon=True)
                    proc.start()
                    send.close()
                    procs.append(proc)
                    conns[rank] = receive
                self.last_pids = [p.pid for p in procs]
                self.runs += 1
                self._collect(procs, conns, results, deadline, timeout, progress)
            finally:
                self._stop(procs)
                for c in conns.values():
                    c.close()
        return [results[r] for r in range(world)]

    def _collect(self, procs: list[Any], conns: dict[int, Connection],
                 results: dict[int, dict[str, Any]], deadline: float, timeout: float,
                 progress: Callable[[str], None] | None) -> None:
        pending = dict(conns)
        sentinels = {p.sentinel: rank for rank, p in enumerate(procs)}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ranks = ", ".join(str(r) for r in sorted(pending))
                raise ReplayFailure("hang", f"the replay did not finish within {timeout:g} s "
                                    f"(no answer from rank{'s' if len(pending) > 1 else ''} "
                                    f"{ranks}): a rank hung, probably in a collective the others "
                                    "never entered")
            ready = wait([*pending.values(), *[p.sentinel for r, p in enumerate(procs)
                                               if r in pending]], timeout=min(remaining, 0.5))
            for item in ready:
                if item in sentinels:
                    rank = sentinels[item]
                    if rank in pending and not pending[rank].poll():
                        procs[rank].join(timeout=1)
                        code = procs[rank].exitcode
                        raise ReplayFailure("crash", f"rank {rank} exited (code {code}) without "
                                            "an answer")
                    continue
                rank = next(r for r, c in pending.items() if c is item)
                try:
                    doc = json.loads(pending[rank].recv_bytes().decode("utf-8"))
                except (EOFError, OSError, ValueError):
                    code = procs[rank].exitcode
                    raise ReplayFailure("crash", f"rank {rank} exited (code {code}) without an "
                                        "answer") from None
                if "progress" in doc:
                    if progress is not None:
                        progress(str(doc["progress"]))
                    continue
                if not doc.get("ok"):
                    kind = "unsupported" if doc.get("unsupported") else "error"
                    raise ReplayFailure(kind, f"rank {rank} failed: {doc.get('error')}",
                                        doc.get("traceback"))
                results[rank] = doc
                del pending[rank]

    @staticmethod
    def _stop(procs: list[Any]) -> None:
        """Kill every rank's process group that is still alive, then reap them."""
        for p in procs:
            if p.is_alive():
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)  # the rank and anything it started
                with contextlib.suppress(OSError):
                    p.kill()
        for p in procs:
            p.join(timeout=10)


def worker_entry(job: str, rank: int, world: int, store: str, conn: Connection, main_pid: int,
                 timeout: float) -> None:
    """The ranks' target: a name the parent can hand to the forkserver without importing torch."""
    from placeverify.replay.worker import rank_main

    rank_main(job, rank, world, store, conn, main_pid, timeout)


_POOL: Pool | None = None


def pool() -> Pool:
    global _POOL
    if _POOL is None:
        _POOL = Pool()
    return _POOL
