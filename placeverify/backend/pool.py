"""Replay ranks forked from a warm ``multiprocessing`` forkserver (:class:`Pool`, one per process)."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import math
import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import multiprocessing.resource_tracker as resource_tracker
import multiprocessing.util
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from placeverify.backend import janitor
from placeverify.backend.available import torch_available
from placeverify.backend.contract import (
    FIRST_FAILURE_GRACE,
    GRACE_SECONDS,
    PEER_ERROR,
    POLL_SECONDS,
    BackendFailure,
    FailureKind,
    ReplayJob,
    blocked_signals,
)
from placeverify.backend.follow import SERVER_PARENT_ENV, alive, watch_parent

# A Unix socket's path is at most 107 bytes (sockaddr_un.sun_path, NUL included); the forkserver's
# is <TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX.
SOCKET_PATH_MAX = 107
SOCKET_NAME = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
REPLAY_WORKER = "placeverify.replay.worker"  # defines rank_main(job, rank, world, store, conn, ...)
# Imported by the forkserver before any rank is forked; placeverify.cli because the console
# script is re-run as __mp_main__.
REPLAY_PRELOAD = ["placeverify.replay.warm", "placeverify.cli"]
SERVER_DEATH_SECONDS = 2.0  # how long a forkserver that closed its pipes may take to show as dead


def server_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver, if one was started."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def short_socket_folder(system: str = "/tmp") -> None:
    """multiprocessing keeps the forkserver's socket in a folder under the temporary directory
    (``multiprocessing.util.get_temp_dir``, made once per process). Under a long ``TMPDIR`` (a
    test runner's per-test folder) the socket's path does not fit in a Unix address and the
    replay could not start ("AF_UNIX path too long"); that folder then goes in ``system``
    instead. The run's own folders stay under ``TMPDIR``."""
    if len(os.fsencode(tempfile.gettempdir())) + SOCKET_NAME <= SOCKET_PATH_MAX:
        return
    if not os.access(system, os.W_OK | os.X_OK):
        return  # nowhere shorter: multiprocessing's own error says why
    saved = tempfile.tempdir
    tempfile.tempdir = system
    try:
        multiprocessing.util.get_temp_dir()  # made now, in ``system``, and kept for the process
    finally:
        tempfile.tempdir = saved


@dataclass
class Pool:
    """A warm forkserver for replay ranks; one per placeverify process (see :func:`pool`)."""

    context: Any = None
    last_pids: list[int] = field(default_factory=list)
    runs: int = 0
    server: int | None = None  # the forkserver's pid, as told to the janitor

    def prestart(self) -> None:
        """Start the forkserver now, so that it imports torch while this process asks Z3."""
        self.start()

    def _ensure_server(self) -> None:
        """Start the forkserver (and multiprocessing's resource tracker) if it is not running,
        with Ctrl-C blocked: a signal inherits into the new process blocked, so a Ctrl-C to the
        terminal's process group does not interrupt the server's import of torch (printing a
        traceback) before the server has set it aside. The janitor is told of the server: a
        parent killed outright has it, and every rank it forked, killed."""
        janitor.start()  # first: a kill from here on leaves nothing behind
        short_socket_folder()
        # multiprocessing's folder for the server's socket (made here, once per process): its
        # own exit handler removes it, the janitor does if this process is killed outright (a
        # SIGKILL while the server started left it behind in a fault fuzz run)
        janitor.register(multiprocessing.util.get_temp_dir())
        resource_tracker.ensure_running()  # first: it unblocks SIGINT after starting itself
        if threading.current_thread() is threading.main_thread():  # follow.die_with_server_parent
            os.environ[SERVER_PARENT_ENV] = str(os.getpid())
        with blocked_signals(signal.SIGINT):
            forkserver.ensure_running()
        pid = server_pid()
        if pid is not None and pid != self.server:
            if self.server is not None:
                janitor.forget(self.server)  # multiprocessing reaped it and started this one
            janitor.serve_ranks(pid)
            self.server = pid

    def shutdown(self) -> None:
        """Stop the forkserver and every process it forked, registered or not (a Ctrl-C can land
        after the server forked a rank but before its handle reached this process); the next
        run starts a new server. Used when a run is interrupted, and at exit."""
        pid = server_pid()
        if pid is None:
            return
        janitor.kill_server(pid)  # it outlives its parent while a rank holds its pipe
        with contextlib.suppress(OSError):
            forkserver._forkserver._stop()  # type: ignore[attr-defined]
        janitor.forget(pid)
        self.server = None

    def start(self) -> None:
        if self.context is None:
            if not torch_available():
                raise BackendFailure(FailureKind.NO_TORCH, "torch is not installed: install "
                                     "placeverify with the torch extra "
                                     "(pip install 'placeverify[torch]')")
            loopback = "lo0" if sys.platform == "darwin" else "lo"
            os.environ["GLOO_SOCKET_IFNAME"] = loopback  # ranks talk over loopback only
            os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            context = mp.get_context("forkserver")
            context.set_forkserver_preload(REPLAY_PRELOAD)
            self.context = context
            atexit.register(self.shutdown)  # a server still importing torch outlives its EOF
        self._ensure_server()

    def run(self, spec: ReplayJob, timeout: float,
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """Run ``spec`` on ``spec.world`` ranks; their result documents, by rank."""
        self.start()
        world = spec.world
        job = spec.to_json()
        procs: list[Any] = []
        conns: dict[int, Connection] = {}
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        janitor.start()
        folder = tempfile.mkdtemp(prefix="placeverify-replay-")
        # Who removes what if this process is killed outright: the run's folder, and the
        # folder of the forkserver's socket (multiprocessing removes it at exit).
        leave = [folder, multiprocessing.util.get_temp_dir()]
        for path in leave:
            janitor.register(path)
        store = os.path.join(folder, "store")
        try:
            for rank in range(world):
                receive, send = self.context.Pipe(duplex=False)
                proc = self.context.Process(
                    target=worker_entry,
                    args=(REPLAY_WORKER, job, rank, world, store, send, os.getpid(), timeout,
                          leave),
                    name=f"placeverify-replay-rank-{rank}", daemon=True)
                try:
                    start_interruptibly(proc)
                except (OSError, EOFError) as err:  # the forkserver died or was killed
                    raise BackendFailure(FailureKind.CRASH, f"the process that starts the ranks "
                                         f"(a multiprocessing forkserver) was lost while rank "
                                         f"{rank} started ({type(err).__name__}: {err}); the "
                                         "next replay starts a new one") from None
                send.close()
                procs.append(proc)
                janitor.watch(proc.pid)
                conns[rank] = receive
            self.last_pids = [p.pid for p in procs]
            self.runs += 1
            self._collect(procs, conns, results, deadline, timeout, progress)
        except BaseException as stop:
            if not isinstance(stop, Exception):  # Ctrl-C, SIGTERM (Terminated), exit
                self._stop(procs)
                self.shutdown()
            raise
        finally:
            self._stop(procs)
            for c in conns.values():
                c.close()
            janitor.remove(folder)
        return [results[r] for r in range(world)]

    def _collect(self, procs: list[Any], conns: dict[int, Connection],
                 results: dict[int, dict[str, Any]], deadline: float, timeout: float,
                 progress: Callable[[str], None] | None) -> None:
        """Every rank's answer into ``results``, or the run's root cause. When one rank fails,
        its peers fail too ("Connection closed by peer"), and under load a peer's error may
        arrive before the failed rank's own death or error. A rank's own failure (a death
        without an answer, an error of its own) is the answer at once; after one that only says
        a peer went away, the others get a moment (:data:`FIRST_FAILURE_GRACE`) to answer or
        die, and the first own failure among them is named, else that first peer's loss."""
        pending = dict(conns)
        sentinels = {p.sentinel: rank for rank, p in enumerate(procs)}
        failures: list[tuple[bool, BackendFailure]] = []  # (only a peer's loss?, failure)
        settle = math.inf  # when the first failure's grace ends
        while pending and time.monotonic() < settle:
            self._check_server()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if failures:
                    break
                ranks = ", ".join(str(r) for r in sorted(pending))
                raise BackendFailure(FailureKind.HANG, f"the replay did not finish within {timeout:g} s "
                                    f"(no answer from rank{'s' if len(pending) > 1 else ''} "
                                    f"{ranks}): a rank hung, probably in a collective the others "
                                    "never entered")
            ready = wait([*pending.values(), *[p.sentinel for r, p in enumerate(procs)
                                               if r in pending]],
                         timeout=max(0.0, min(remaining, 0.5, settle - time.monotonic())))
            for item in ready:
                rank = sentinels[item] if item in sentinels else \
                    next((r for r, c in pending.items() if c is item), None)
                if rank is None or rank not in pending:
                    continue
                failed = self._answer(rank, item in sentinels, procs, pending, results, progress)
                if failed is not None:
                    failures.append(failed)
                    del pending[rank]
                    # a rank's own failure is the answer; a peer's loss waits for its cause
                    settle = min(settle, time.monotonic() + (FIRST_FAILURE_GRACE if failed[0]
                                                             else 0.0))
        if failures:
            raise min(failures, key=lambda f: f[0])[1]

    def _answer(self, rank: int, died: bool, procs: list[Any], pending: dict[int, Connection],
                results: dict[int, dict[str, Any]],
                progress: Callable[[str], None] | None) -> tuple[bool, BackendFailure] | None:
        """What ``rank`` said (its result, into ``results``; a progress line) or how it failed:
        (whether the failure only says a peer went away, the failure)."""
        if died:
            if pending[rank].poll():  # it answered before it ended: read the answer first
                return self._answer(rank, False, procs, pending, results, progress)
            procs[rank].join(timeout=1)
            code = procs[rank].exitcode
            # 255: multiprocessing's status when the server sent none (it died; its pipes close
            # a moment before it shows as dead)
            self._check_server(SERVER_DEATH_SECONDS if code == 255 else 0.0)
            return False, BackendFailure(FailureKind.CRASH, f"rank {rank} exited (code {code}) "
                                         "without an answer")
        try:
            doc = json.loads(pending[rank].recv_bytes().decode("utf-8"))
        except (EOFError, OSError, ValueError):
            return False, BackendFailure(FailureKind.CRASH, f"rank {rank} exited (code "
                                         f"{procs[rank].exitcode}) without an answer")
        if "progress" in doc:
            if progress is not None:
                progress(str(doc["progress"]))
            return None
        if not doc.get("ok"):
            kind = FailureKind.UNSUPPORTED if doc.get("unsupported") else FailureKind.ERROR
            error = str(doc.get("error"))
            return bool(PEER_ERROR.search(error)), BackendFailure(
                kind, f"rank {rank} failed: {error}", doc.get("traceback"))
        results[rank] = doc
        del pending[rank]
        return None

    def _check_server(self, wait: float = 0.0) -> None:
        """Fail now if the forkserver died while its ranks run (waiting up to ``wait`` seconds
        for it to show as dead): a rank's handle (its sentinel and exit status) lives in the
        server, and an orphaned rank would run on to its deadline."""
        until = time.monotonic() + wait
        while self.server is not None and alive(self.server) and time.monotonic() < until:
            time.sleep(0.02)
        if self.server is not None and not alive(self.server):
            pid, self.server = self.server, None
            janitor.forget(pid)
            raise BackendFailure(FailureKind.CRASH, f"the process that starts the ranks (a "
                                 f"multiprocessing forkserver, pid {pid}) was lost while the ranks "
                                 "ran; the next replay starts a new one")

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
            if not p.is_alive():
                janitor.forget(p.pid)


def start_interruptibly(proc: Any) -> None:
    """``proc.start()``, in a thread while this one waits: starting a rank waits for the
    forkserver to finish importing torch (seconds), and a Ctrl-C that the kernel hands to another
    thread of this process (rich's, the janitor's) would not interrupt that wait; a short
    join does. An interrupted start is finished off by :meth:`Pool.shutdown`."""
    failed: list[BaseException] = []

    def start() -> None:
        try:
            proc.start()
        except BaseException as error:  # handed to the waiting thread
            failed.append(error)

    thread = threading.Thread(target=start, name="placeverify-rank-start", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(POLL_SECONDS)
    if failed:
        raise failed[0]


def worker_entry(worker: str, job: str, rank: int, world: int, store: str, conn: Connection,
                 main_pid: int, timeout: float, leave: list[str]) -> None:
    """The ranks' target: a name the parent can hand to the forkserver without importing torch;
    the worker module (already imported by the warm server) runs the rank. The rank gets its own
    process group (the parent kills the group) and follows the parent (:func:`watch_parent`)."""
    with contextlib.suppress(OSError):
        os.setsid()
    watch_parent(main_pid, leave, time.monotonic() + timeout + GRACE_SECONDS)
    importlib.import_module(worker).rank_main(job, rank, world, store, conn, main_pid, timeout)


_POOL: Pool | None = None


def pool() -> Pool:
    """The replay pool of this placeverify process, started on first use."""
    global _POOL
    if _POOL is None:
        _POOL = Pool()
    return _POOL
