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

from placeverify.backend.contract import BackendFailure, FailureKind, MeasureJob, ReplayJob
from placeverify.backend.follow import watch_parent, watch_parent_from_env
from placeverify.backend.pool import Pool, pool, worker_entry
from placeverify.backend.processes import failure_path, run_jobs, run_workers

__all__ = ["BackendFailure", "FailureKind", "MeasureJob", "Pool", "ReplayJob", "failure_path",
           "pool", "run_jobs", "run_workers", "watch_parent", "watch_parent_from_env",
           "worker_entry"]
