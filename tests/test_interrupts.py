"""Ctrl-C stops a replay at once, and nothing of the run outlives it (issue 36, item 3).

A terminal's Ctrl-C is SIGINT to the whole foreground process group; ``kill -INT`` is SIGINT to
the parent alone. Each test starts a real ``replay --steps 100`` in a session of its own (as a
shell's job), signals it at one moment of the run — while the forkserver is still importing torch
(the ranks are being started), or once the ranks run — and then checks that the command exits
130 (143 for SIGTERM, as ``placeverify --help`` documents) within a few seconds and that 5 s
later no process of the run is alive: none that carries the test's marker in its environment
(the forkserver, its ranks, multiprocessing's resource tracker and the janitor all inherit it)
and none left in the command's session or process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")]

ROOT = Path(__file__).resolve().parents[1]
BUG = ROOT / "examples" / "bugs" / "zero1-no-allgather.place"
FORKSERVER = "multiprocessing.forkserver"
MEASURE_WORKER = "placeverify.measure.worker"
MEASURE = ROOT / "examples" / "measure" / "ddp.place"
EXIT: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("trace") / "t.json"
    made = subprocess.run([sys.executable, "-m", "placeverify", "check", "--trace", str(path),
                           str(BUG)], cwd=ROOT, env=environment(""), capture_output=True)
    assert made.returncode == 1 and path.is_file(), made.stderr.decode()
    return path


def environment(marker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env.update(PLACEVERIFY_INTERRUPT_TEST=marker,
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    return env


def processes() -> dict[int, tuple[int, int, int, str]]:
    """Every live process: pid -> (parent pid, process group, session, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[3]), command)
    return found


def of_the_run(leader: int, marker: str) -> dict[int, str]:
    """The live processes of the run that ``leader`` leads: its descendants, its session and
    process group, and anything carrying ``marker`` in its environment (a rank makes a session
    of its own, and an orphan's parent is init)."""
    table = processes()
    found = {pid for pid, (_, group, session, _) in table.items()
             if leader in (pid, group, session)}
    for pid in table:
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.add(pid)
        except OSError:
            continue
    grew = True
    while grew:
        children = {pid for pid, (parent, *_rest) in table.items() if parent in found}
        grew = not children <= found
        found |= children
    return {pid: table[pid][3] for pid in found if pid in table}


def ranks(leader: int, marker: str) -> list[int]:
    """The run's ranks: the processes forked by its forkserver that run a rank (each makes a
    session of its own first)."""
    run = of_the_run(leader, marker)
    table = processes()
    servers = {pid for pid, command in run.items()
               if FORKSERVER in command and table.get(pid, (0,))[0] == leader}
    return [pid for pid in run if pid in table and table[pid][0] in servers
            and table[pid][2] == pid]


def forkserver_started(leader: int, marker: str) -> bool:
    table = processes()
    return any(FORKSERVER in command and table.get(pid, (0,))[0] == leader
               for pid, command in of_the_run(leader, marker).items())


def until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def default_signals() -> None:
    # A test run in the background inherits an ignored SIGINT; restore the default.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def measure_ranks(leader: int, marker: str) -> list[int]:
    return [pid for pid, command in of_the_run(leader, marker).items() if MEASURE_WORKER in command]


def interrupt(args: list[str], signum: int, *, group: bool, moment: str) -> None:
    """Run ``placeverify ARGS``, signal it at ``moment`` (the replay's forkserver or the first
    measure rank exists; or two ranks run) and check how it ends and what it leaves."""
    marker = uuid.uuid4().hex
    measure = args[0] == "measure"
    proc = subprocess.Popen([sys.executable, "-m", "placeverify", *args], cwd=ROOT,
                            env=environment(marker), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_signals)
    try:
        if moment == "start" and measure:
            ready = until(lambda: len(measure_ranks(proc.pid, marker)) >= 1, 60)
        elif moment == "start":
            ready = until(lambda: forkserver_started(proc.pid, marker), 60)
        else:
            ready = until(lambda: len((measure_ranks if measure else ranks)(proc.pid, marker))
                          >= 2, 120)
            time.sleep(1.0)  # the ranks are training
        assert ready and proc.poll() is None, "the replay did not get to the moment to stop it"
        if group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        signalled = time.monotonic()
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the replay ran on 30 s after the signal")
        took = time.monotonic() - signalled
        time.sleep(5)
        left = of_the_run(proc.pid, marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in of_the_run(proc.pid, marker):  # never leave this test's own orphans behind
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pid, signal.SIGKILL)
    text = stderr.decode()
    assert left == {}, f"alive 5 s after the replay stopped: {left}"
    assert proc.returncode == EXIT[signum], text
    assert took < 5, f"the replay took {took:.1f} s to stop"
    assert "Traceback" not in text, text


def replay(trace: Path) -> list[str]:
    return ["replay", "--steps", "100", "--timeout", "300", str(trace)]


@pytest.mark.parametrize("moment", ["start", "run"])
@pytest.mark.parametrize("group", [False, True], ids=["parent", "group"])
def test_ctrl_c_stops_a_replay_and_everything_it_started(trace_file: Path, group: bool,
                                                          moment: str) -> None:
    interrupt(replay(trace_file), signal.SIGINT, group=group, moment=moment)


@pytest.mark.parametrize("group", [False, True], ids=["parent", "group"])
def test_sigterm_stops_a_replay_while_its_ranks_start(trace_file: Path, group: bool) -> None:
    interrupt(replay(trace_file), signal.SIGTERM, group=group, moment="start")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("moment", ["start", "run"])
@pytest.mark.parametrize("group", [False, True], ids=["parent", "group"])
def test_a_signal_stops_a_measurement_and_its_ranks(group: bool, moment: str,
                                                     signum: int) -> None:
    pytest.importorskip("torch")
    interrupt(["measure", str(MEASURE), "--timeout", "300"], signum, group=group, moment=moment)


def test_a_forkserver_killed_while_its_ranks_run_is_reported_at_once(trace_file: Path) -> None:
    """The ranks' handles live in the forkserver: losing it is a crash of the run, said so
    within seconds (not a hang reported at the end of the timeout, nor a rank's exit code)."""
    marker = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "placeverify", "replay", "--steps", "100",
                             "--timeout", "300", str(trace_file)], cwd=ROOT,
                            env=environment(marker), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert until(lambda: len(ranks(proc.pid, marker)) >= 2, 120), "the ranks did not start"
        table = processes()
        server = next(pid for pid, command in of_the_run(proc.pid, marker).items()
                      if FORKSERVER in command and table[pid][0] == proc.pid)
        os.kill(server, signal.SIGKILL)
        killed = time.monotonic()
        stdout, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed
        time.sleep(5)
        left = of_the_run(proc.pid, marker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = stdout.decode()
    assert proc.returncode == 5, text
    assert took < 15, f"the loss was reported after {took:.1f} s"
    assert "forkserver" in text and "lost while the ranks ran" in text, text
    assert left == {}, f"alive 5 s after the replay stopped: {left}"
