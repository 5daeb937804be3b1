"""The replay forkserver follows the process that started it from its first line
(backend/follow.die_with_server_parent, run by replay/warm.py before torch is imported): a parent
killed outright before it told the janitor the server's pid leaves no server importing torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from placeverify.backend.follow import SERVER_PARENT_ENV, alive

ROOT = Path(__file__).resolve().parents[1]
# C stands for the server: it follows its parent, then sleeps as a server importing torch would
CHILD = ("from placeverify.backend.follow import die_with_server_parent\n"
         "die_with_server_parent()\n"
         "print('following', flush=True)\n"
         "import time; time.sleep(60)\n")
# P stands for placeverify: it starts C naming itself (or another pid) and prints C's pid
PARENT = ("import os, subprocess, sys, time\n"
          f"env = dict(os.environ, {SERVER_PARENT_ENV}=sys.argv[1] or str(os.getpid()))\n"
          "child = subprocess.Popen([sys.executable, '-c', sys.argv[2]], env=env)\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(60)\n")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def _start(parent_pid: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, parent_pid, CHILD], env=env,
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def _gone_within(pid: int, seconds: float) -> bool:
    until = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < until:
        time.sleep(0.05)
    return not alive(pid)


def test_a_server_dies_with_its_parent_killed_outright() -> None:
    parent, child = _start("")
    try:
        time.sleep(1.0)  # C has followed P (or is about to: then it sees P gone and exits)
        assert alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        assert _gone_within(child, 5)
    finally:
        parent.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_server_whose_parent_is_already_gone_exits_at_once() -> None:
    # named parent 1 is not C's parent: as if P died before C's first line ran
    parent, child = _start("1")
    try:
        assert _gone_within(child, 5)
    finally:
        parent.kill()
        parent.wait(timeout=30)
