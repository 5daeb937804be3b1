"""What a torch backend run is and how it fails: the job a backend runs, the failure it reports,
and the signals held back while a rank is started (no torch here)."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, Protocol

from placeverify.errors import PlaceverifyError

POLL_SECONDS = 0.05
GRACE_SECONDS = 30.0  # a rank outlives the run's deadline by at most this (the parent kills it first)
# A rank that failed because a peer went away: gloo's "Connection closed by peer" / "reset by
# peer" from its TCP pairs, a broken pipe, a refused connection. Named only if no rank has a
# failure of its own (the replay's pool and the measurement's subprocesses alike).
PEER_ERROR = re.compile(r"closed by peer|reset by peer|Broken pipe|Connection refused|"
                        r"ECONNRESET|EPIPE|gloo/transport", re.IGNORECASE)
FIRST_FAILURE_GRACE = 5.0  # how long the failed ranks get to finish dying, for their status


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
