"""Remove a run's temporary folders even when the placeverify process is killed outright.

A process killed with SIGKILL runs none of its cleanup, and its ranks can only partly stand in
for it: a rank that the kill catches while it is still being started (forked, but not yet
running its first line of placeverify code) knows nothing of the run's folders. So the first
backend run of a placeverify process starts one small janitor process (``python -m
placeverify.backend.janitor``) in its own session, out of reach of the terminal's Ctrl-C and
hang-up, and tells it on a pipe which folders are live:

- ``+PATH`` a folder the run made; ``-PATH`` one the run removed itself; ``!PID`` a rank the
  run started (its own process group when it has made one); ``^PID`` a server that forks ranks
  (the replay's forkserver: it and every process it forked, registered or not, are killed);
  ``~PID`` a rank or server the run stopped and reaped itself; ``.`` the process's exit handlers
  have run, multiprocessing's among them (it removes the forkserver's folder; the janitor must not
  remove it under it), and have stopped the ranks and servers: ``.`` is sent by
  multiprocessing's last exit finalizer (``multiprocessing.util.Finalize`` with
  :data:`EXIT_PRIORITY`, below the priority -100 of its temporary folder's removal), so a kill
  anywhere before it still leaves the janitor everything. A folder still registered at ``.`` is
  one whose owner's cleanup was cut short (a second signal inside a ``finally``): the janitor
  removes it at the end of file that follows, and the process waits for the janitor to exit.

The pipe's only writer is the placeverify process, and the kernel closes it when that process
ends, however it ends, only once the process can no longer run code. At end of file the janitor
kills every server still registered with every process it forked, and every rank still
registered (its process group, then the process), removes every folder still registered, and
exits. A rank follows its parent by itself (``watch_parent``), but
only while it runs Python: one blocked in native code that holds the interpreter lock (a
collective's rendezvous with a peer that is gone) runs neither its signal handler nor its watch
thread until its own timeout; the janitor, a separate process, does not wait for it. The
janitor imports only the standard library.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

MODULE = "placeverify.backend.janitor"
EXIT_PRIORITY = -1000  # after multiprocessing's own exit finalizers (its temporary folder: -100)


@dataclass
class Left:
    """What is still registered at end of file."""

    folders: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    servers: set[int] = field(default_factory=set)


def serve(stream: IO[str]) -> Left:
    """Read registrations until end of file; what is still registered then."""
    left = Left()
    for line in stream:
        command, rest = line[:1], line[1:].rstrip("\n")
        if command == "+" and rest:
            left.folders.add(rest)
        elif command == "-":
            left.folders.discard(rest)
        elif command in "!^~" and rest.isdigit() and int(rest) > 1:
            pid = int(rest)
            if command == "!":
                left.ranks.add(pid)
            elif command == "^":
                left.servers.add(pid)
            else:
                left.ranks.discard(pid)
                left.servers.discard(pid)
        elif command == ".":  # the exit handlers stopped the ranks; a folder left is removed
            left.ranks.clear()
            left.servers.clear()
    return left


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, from /proc (none where there is no /proc)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "stat"), encoding="ascii", errors="replace") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if len(fields) > 1 and fields[1] == str(pid):
                found.append(int(entry.name))
    return sorted(found)


def kill_group(pid: int) -> None:
    """SIGKILL ``pid``'s own process group (a rank and what it started), then ``pid`` itself (a
    rank killed before it made its group)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def kill_server(pid: int) -> None:
    """SIGKILL server ``pid`` and every process it forked: stopped first, so that it forks no
    more while its children are found (they are its children only while it lives)."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)
    for child in children(pid):
        kill_group(child)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)  # in the parent's group: never killpg


def main() -> int:
    left = serve(sys.stdin)
    for server in sorted(left.servers):
        kill_server(server)  # and a rank forked just before the end, not yet registered
    for pid in sorted(left.ranks):
        kill_group(pid)
    for path in sorted(left.folders):
        shutil.rmtree(path, ignore_errors=True)
    return 0


class Janitor:
    """The placeverify side: starts the janitor on first use and registers folders with it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the janitor now (before the folders it is to watch exist)."""
        self._send("")

    def _send(self, line: str) -> None:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                root = str(Path(__file__).resolve().parents[2])
                env = dict(os.environ)
                env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
                self._process = subprocess.Popen(
                    [sys.executable, "-m", MODULE], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, text=True,
                    start_new_session=True)
                multiprocessing.util.Finalize(None, self.close, exitpriority=EXIT_PRIORITY)
            stdin = self._process.stdin
            assert stdin is not None
            if line:
                with contextlib.suppress(OSError):
                    stdin.write(line + "\n")
                    stdin.flush()

    def close(self) -> None:
        """At exit, after every other exit handler of multiprocessing: end the janitor's input, so
        that it checks and exits now."""
        with self._lock:
            process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if process.stdin is not None:
                process.stdin.write(".\n")
                process.stdin.close()
            process.wait(timeout=5)

    def register(self, folder: str | os.PathLike[str]) -> None:
        """Have ``folder`` removed if this process ends without removing it."""
        path = os.path.abspath(folder)
        if "\n" not in path:
            self._send("+" + path)

    def release(self, folder: str | os.PathLike[str]) -> None:
        """``folder`` was removed (or handed on): forget it."""
        path = os.path.abspath(folder)
        if "\n" not in path and self._process is not None:
            self._send("-" + path)

    def watch(self, pid: int) -> None:
        """Have rank ``pid`` (and its process group) killed if this process ends first."""
        self._send(f"!{pid}")

    def serve(self, pid: int) -> None:
        """Have server ``pid`` and every process it forked killed if this process ends first."""
        self._send(f"^{pid}")

    def forget(self, pid: int) -> None:
        """Rank or server ``pid`` was stopped and reaped: forget it (its id may be reused)."""
        if self._process is not None:
            self._send(f"~{pid}")


_JANITOR = Janitor()


def start() -> None:
    _JANITOR.start()


def register(folder: str | os.PathLike[str]) -> None:
    _JANITOR.register(folder)


def release(folder: str | os.PathLike[str]) -> None:
    _JANITOR.release(folder)


def remove(folder: str | os.PathLike[str]) -> None:
    """Remove a registered ``folder`` and forget it; one that could not be removed whole (a
    process still writing into it) stays registered, for the janitor to remove at the end."""
    shutil.rmtree(folder, ignore_errors=True)
    if not os.path.lexists(folder):
        _JANITOR.release(folder)


def watch(pid: int) -> None:
    _JANITOR.watch(pid)


def serve_ranks(pid: int) -> None:
    _JANITOR.serve(pid)


def forget(pid: int) -> None:
    _JANITOR.forget(pid)


if __name__ == "__main__":
    sys.exit(main())
