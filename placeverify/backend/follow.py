"""In a rank: follow the run's parent process, and leave (removing the run's folders) when it is gone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from placeverify.backend.contract import STOP_SIGNALS

PARENT_POLL_SECONDS = 0.2  # how often a rank looks for its parent
# How long an orphaned rank waits for its main process to be gone. Tearing down a killed process
# that holds torch can take seconds on a loaded machine; a rank that gives up first leaves the
# run's folders behind (seen once at 2 s in a full test run). Waiting longer costs nothing when
# the main process lives: it kills its ranks' process groups itself.
ORPHAN_GRACE_SECONDS = 10.0
WATCH_ENV = "PLACEVERIFY_RANK_WATCH"  # a measure rank's watch_parent arguments, as JSON
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SERVER_PARENT_ENV = "PLACEVERIFY_SERVER_PARENT"  # the pid that starts a replay forkserver


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


def die_with_server_parent() -> None:
    """In the replay forkserver, first of all (before it imports torch): SIGKILL from the kernel
    when the placeverify process that started it dies, and exit now if it already has. Until
    that process has told the janitor the server's pid, nothing else would stop a server whose
    parent was killed outright, and its import of torch takes many seconds on a loaded machine.
    Only a server started from a main thread says so (:data:`SERVER_PARENT_ENV`): the signal
    follows the thread that forked it."""
    parent = os.environ.get(SERVER_PARENT_ENV, "")
    if not parent.isdigit():
        return
    _parent_death_signal(signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent died before the prctl
        os._exit(0)


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
