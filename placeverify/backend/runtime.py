"""Start the ranks of a torch backend, watch them, and collect their JSON answers (no torch here).

Both backends run one process per rank, meet through a ``torch.distributed.FileStore`` in a
private temporary folder (no port is chosen by us; gloo binds loopback ports the kernel picks),
and answer in JSON — nothing is unpickled from a child or from a file (REFERENCE §5). They start
their ranks in one of two ways:

- :class:`Pool` (``placeverify replay``): ranks are forked from a ``multiprocessing`` forkserver
  that has already imported torch and the worker module (~1 s of ``import torch`` per process is
  the cold cost; later replays in the same placeverify process fork from the warm server in a
  fraction of that). Each rank gets its job as a JSON string and answers on a pipe.
- :func:`run_jobs` (``placeverify measure``): each rank is a fresh ``python -m`` subprocess (it
  measures its own import), reads its job from a JSON file and writes its result to another.

In both the parent is the watchdog: the first rank to fail stops the others at once, a run that
outlives its deadline (a mismatched collective hangs) is stopped as a whole, a forkserver lost
while its ranks run fails the run at once, and only the processes started here are killed, by their
handles (a forked rank's whole process group: each rank calls ``setsid``). A rank is started with
the stop signals held back until its handle is kept (a forkserver rank's start, which waits for the
server's import of torch, in a thread, so that Ctrl-C interrupts the wait); an interrupted replay
also kills the forkserver and every process it forked. Every failure is one :class:`BackendFailure`
whose :class:`FailureKind` says what happened; a measurement's names the rank that failed first of
its own accord (each rank records its exception and its time). The run's folder is removed and its
ranks killed on every way out of the parent that runs Python: an answer, a failure, Ctrl-C, and
SIGTERM or SIGHUP (which the command turns into an exception,
:func:`placeverify.console.stop_cleanly_on_signals`). A parent killed outright (SIGKILL) runs
nothing: a janitor process (:mod:`placeverify.backend.janitor`) removes the run's folders when the
parent's end closes its pipe, and each rank watches the parent (:func:`watch_parent`): when it is
gone the rank removes the run's folders too, and exits; no rank outlives its own deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import multiprocessing.resource_tracker as resource_tracker
import multiprocessing.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

import placeverify
from placeverify.backend import janitor
from placeverify.backend.available import torch_available
from placeverify.errors import PlaceverifyError

REPLAY_WORKER = "placeverify.replay.worker"  # defines rank_main(job, rank, world, store, conn, ...)
# Imported by the forkserver before any rank is forked; placeverify.cli because the console
# script is re-run as __mp_main__.
REPLAY_PRELOAD = ["placeverify.replay.warm", "placeverify.cli"]
MEASURE_WORKER = "placeverify.measure.worker"  # python -m MODULE JOB RANK STORE OUT
POLL_SECONDS = 0.05
SERVER_DEATH_SECONDS = 2.0  # how long a forkserver that closed its pipes may take to show as dead
STDERR_TAIL = 2000
PARENT_POLL_SECONDS = 0.2  # how often a rank looks for its parent
# How long an orphaned rank waits for its main process to be gone. Tearing down a killed process
# that holds torch can take seconds on a loaded machine; a rank that gives up first leaves the
# run's folders behind (seen once at 2 s in a full test run). Waiting longer costs nothing when
# the main process lives: it kills its ranks' process groups itself.
ORPHAN_GRACE_SECONDS = 10.0
GRACE_SECONDS = 30.0  # a rank outlives the run's deadline by at most this (the parent kills it first)
WATCH_ENV = "PLACEVERIFY_RANK_WATCH"  # a measure rank's watch_parent arguments, as JSON
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class FailureKind(StrEnum):
    """Why a backend run failed (the ``error.kind`` of ``placeverify replay --json``)."""

    NO_TORCH = "no_torch"
    CRASH = "crash"  # a rank exited without an answer
    HANG = "hang"  # the deadline passed
    ERROR = "error"  # a rank answered with an error
    UNSUPPORTED = "unsupported"  # a rank met something the backend does not model


class BackendFailure(PlaceverifyError):
    """The torch backend could not run: torch missing, a rank crashed, hung, or failed."""

    def __init__(self, kind: FailureKind, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.detail = detail


class ReplayJob(Protocol):
    """What :meth:`Pool.run` needs of a replay run spec (:class:`placeverify.replay.plan.RunSpec`)."""

    @property
    def world(self) -> int: ...

    def to_json(self) -> str: ...


class MeasureJob(Protocol):
    """What :func:`run_jobs` needs of a measure run spec
    (:class:`placeverify.cost.implementations.spec.RunSpec`)."""

    @property
    def world(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...

    def label(self) -> str: ...


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def blocked_signals(*signals: int) -> Iterator[None]:
    """Hold ``signals`` (all of :data:`STOP_SIGNALS` by default) back while a child is started
    and registered, so that a Ctrl-C cannot land between the fork and the handle that lets
    this process stop the child; one that arrives meanwhile is delivered at the end. A child
    inherits the blocked set: a rank unblocks it (:func:`watch_parent`). Main thread only."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "pthread_sigmask"):
        yield
        return
    held = set(signals or STOP_SIGNALS)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def server_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver, if one was started."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


# ---- forked ranks: the warm pool ---------------------------------------------------------------


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
        resource_tracker.ensure_running()  # first: it unblocks SIGINT after starting itself
        with blocked_signals(signal.SIGINT):
            forkserver.ensure_running()
        pid = server_pid()
        if pid is not None and pid != self.server:
            if self.server is not None:
                janitor.forget(self.server)  # multiprocessing reaped it and started this one
            janitor.start()
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
            shutil.rmtree(folder, ignore_errors=True)
            janitor.release(folder)
        return [results[r] for r in range(world)]

    def _collect(self, procs: list[Any], conns: dict[int, Connection],
                 results: dict[int, dict[str, Any]], deadline: float, timeout: float,
                 progress: Callable[[str], None] | None) -> None:
        pending = dict(conns)
        sentinels = {p.sentinel: rank for rank, p in enumerate(procs)}
        while pending:
            self._check_server()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ranks = ", ".join(str(r) for r in sorted(pending))
                raise BackendFailure(FailureKind.HANG, f"the replay did not finish within {timeout:g} s "
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
                        # 255: multiprocessing's status when the server sent none (it died;
                        # its pipes close a moment before it shows as dead)
                        self._check_server(SERVER_DEATH_SECONDS if code == 255 else 0.0)
                        raise BackendFailure(FailureKind.CRASH, f"rank {rank} exited (code {code}) "
                                             "without an answer")
                    continue
                rank = next(r for r, c in pending.items() if c is item)
                try:
                    doc = json.loads(pending[rank].recv_bytes().decode("utf-8"))
                except (EOFError, OSError, ValueError):
                    code = procs[rank].exitcode
                    raise BackendFailure(FailureKind.CRASH, f"rank {rank} exited (code {code}) "
                                         "without an answer") from None
                if "progress" in doc:
                    if progress is not None:
                        progress(str(doc["progress"]))
                    continue
                if not doc.get("ok"):
                    kind = FailureKind.UNSUPPORTED if doc.get("unsupported") else FailureKind.ERROR
                    raise BackendFailure(kind, f"rank {rank} failed: {doc.get('error')}",
                                        doc.get("traceback"))
                results[rank] = doc
                del pending[rank]

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


# ---- in a rank: follow the parent ---------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and, where /proc says, is not a zombie (a parent killed
    outright stays a zombie until its own parent reaps it, and signal 0 still reaches it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists (the number was reused by another user's process: cannot tell)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _parent_death_signal(signum: int) -> None:
    """Linux: have the kernel send ``signum`` to this process when its parent dies (prctl)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def watch_parent(main_pid: int, leave: Sequence[str], deadline: float | None = None) -> None:
    """In a rank: exit when the run's parent process ``main_pid`` is gone, first removing the
    folders in ``leave`` (a parent killed outright removes nothing); exit past ``deadline``.

    Three ways to notice, the first to fire wins: the kernel's parent-death signal (SIGTERM,
    Linux; the direct parent is the forkserver for a replay rank, which exits with the main
    process), handled between two bytecodes of the main thread; a thread that looks every
    :data:`PARENT_POLL_SECONDS` (a main thread blocked in a collective runs no handler); and the
    same look now, for a parent that died while this process started. The folders are removed
    only when ``main_pid`` itself is dead (waiting up to :data:`ORPHAN_GRACE_SECONDS` for it to
    finish dying): a rank whose forkserver died under a living parent just exits, and the
    parent, seeing it crash, cleans up.
    """
    direct = os.getppid()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked while it was started

    def leave_if_orphaned(code: int) -> None:
        if alive(main_pid) and os.getppid() == direct:
            return
        # A forkserver sees its main process's pipe close, and exits, while the kernel is still
        # tearing that process down: give it a moment to finish dying before deciding.
        until = time.monotonic() + ORPHAN_GRACE_SECONDS
        while alive(main_pid) and time.monotonic() < until:
            time.sleep(0.02)
        if not alive(main_pid):
            for folder in leave:
                shutil.rmtree(folder, ignore_errors=True)
        os._exit(code)

    def on_signal(_signum: int, _frame: Any) -> None:
        leave_if_orphaned(3)
        os._exit(128 + signal.SIGTERM)  # terminated while the parent lives: as the default does

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_SECONDS)
            leave_if_orphaned(3)
            if deadline is not None and time.monotonic() > deadline:
                os._exit(4)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        _parent_death_signal(signal.SIGTERM)
    leave_if_orphaned(3)  # after the prctl: a parent that died before it is seen here
    threading.Thread(target=watch, name="placeverify-parent-watch", daemon=True).start()


def watch_parent_from_env() -> None:
    """A measure rank's :func:`watch_parent`, with the arguments :func:`run_jobs` put in its
    environment (nothing happens without them: a rank started by hand has no parent to follow)."""
    text = os.environ.get(WATCH_ENV)
    if not text:
        return
    args = json.loads(text)
    watch_parent(int(args["parent"]), [str(f) for f in args["leave"]],
                 time.monotonic() + float(args["seconds"]))


_POOL: Pool | None = None


def pool() -> Pool:
    """The replay pool of this placeverify process, started on first use."""
    global _POOL
    if _POOL is None:
        _POOL = Pool()
    return _POOL


# ---- subprocess ranks: one fresh interpreter per rank ------------------------------------------


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


# A rank that failed because a peer went away: gloo's "Connection closed by peer" / "reset by
# peer" from its TCP pairs, a broken pipe, a refused connection. Named only if no rank has a
# failure of its own.
PEER_ERROR = re.compile(r"closed by peer|reset by peer|Broken pipe|Connection refused|"
                        r"ECONNRESET|EPIPE|gloo/transport", re.IGNORECASE)
FIRST_FAILURE_GRACE = 5.0  # how long the failed ranks get to finish dying, for their status


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


def run_workers(spec: MeasureJob, *, timeout: float,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run ``spec`` on ``spec.world`` processes; the per-rank results, in rank order."""
    return run_jobs([spec], timeout=timeout, progress=progress)[0]


def run_jobs(specs: Sequence[MeasureJob], *, timeout: float,
             progress: Callable[[str], None] | None = None, peak: bool = False,
             device: str = "cpu") -> list[list[dict[str, Any]]]:
    """Run several specs of one world size in the same processes, one after the other (torch is
    imported once per rank); for each spec, the per-rank results in rank order. With ``peak`` the
    ranks also meter the allocator's live bytes phase by phase (slower on CPU: the profiler
    records every allocation); ``device`` is where the model lives (``cuda``: every rank on the
    current GPU, collectives still over gloo, which takes CUDA tensors)."""
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
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
        env[WATCH_ENV] = json.dumps({"parent": os.getpid(), "leave": [str(folder)],
                                     "seconds": timeout + GRACE_SECONDS})
        root = str(Path(placeverify.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        for rank in range(world):
            err = open(folder / f"rank{rank}.err", "wb")  # noqa: SIM115 (closed below)
            try:
                with blocked_signals():  # the rank is in `processes` before a Ctrl-C lands
                    processes.append(subprocess.Popen(
                        [sys.executable, "-m", MEASURE_WORKER, str(spec_path), str(rank),
                         str(folder / "store"), str(folder / f"rank{rank}.json")],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                        cwd=folder))
                    janitor.watch(processes[-1].pid)
            finally:
                err.close()
        if progress is not None:
            progress(f"started {world} ranks: " + "; ".join(s.label() for s in specs))
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in processes]
            # A rank that wrote its whole result (the worker renames it into place) and then
            # died in its teardown (gloo's threads can abort the process at exit) measured all
            # it was asked to: only a rank that died without its result failed.
            failed = [r for r, c in enumerate(codes)
                      if c not in (None, 0) and not (folder / f"rank{r}.json").exists()]
            if failed:
                raise _first_failure(folder, processes)
            if all(c is not None for c in codes):
                break
            if time.monotonic() > deadline:
                hung = [r for r, c in enumerate(codes) if c is None]
                _stop_processes(processes)
                raise BackendFailure(
                    FailureKind.HANG,
                    f"rank(s) {', '.join(map(str, hung))} of {world} did not finish within "
                    f"{timeout:g} s (a hung collective?); all ranks were stopped")
            time.sleep(POLL_SECONDS)
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
        shutil.rmtree(folder, ignore_errors=True)
        janitor.release(folder)
